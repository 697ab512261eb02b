//! Eviction, pins and stalled writes: cases 51–57, fix 5.

use super::*;

/// Puts `n` objects named `{prefix}{i}`, one millisecond apart so their (expired) leases are
/// ordered by index.
fn fill(h: &Harness, prefix: &str, n: usize, size: u64, config: &ReplicateConfig) {
    for i in 0..n {
        let key = format!("{prefix}{i}");
        let descs = h.put_start_with(&key, size, config.clone()).unwrap();
        h.put_end(&key, &descs).unwrap();
        h.advance(1);
    }
}

fn alive(h: &Harness, prefix: &str, n: usize) -> Vec<bool> {
    (0..n)
        .map(|i| h.engine.all_keys("").contains(&format!("{prefix}{i}")))
        .collect()
}

fn trigger_by_failed_allocation(h: &Harness) {
    assert_eq!(
        code(h.put_start("too-big", 17 * MIB)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
}

fn config_for_eviction(hw: f64, ratio: f64) -> EngineConfig {
    let mut h = Harness::config();
    h.eviction_high_watermark_ratio = hw;
    h.eviction_ratio = ratio;
    h
}

fn harness_with(config: EngineConfig) -> Harness {
    let h = Harness::bare(config);
    h.mount("seg-0", BASE, 16 * MIB);
    h
}

#[test]
fn case_51_evicts_exactly_the_oldest_five_percent() {
    let h = harness_with(config_for_eviction(1.0, 0.05));
    fill(&h, "k", 400, 40_000, &ReplicateConfig::default());
    trigger_by_failed_allocation(&h);
    let report = h.engine.run_eviction();
    assert_eq!(report.evicted_keys, 20);
    let live = alive(&h, "k", 400);
    assert!(live[..20].iter().all(|l| !l), "the 20 oldest leases go");
    assert!(live[20..].iter().all(|l| *l));
    let stats = h.engine.stats();
    assert_eq!(
        (
            stats.evicted_key_count,
            stats.evictions_total,
            stats.attempted_evictions
        ),
        (20, 1, 1)
    );
    assert_eq!(stats.evicted_size_bytes, 20 * 40_000);
}

#[test]
fn case_52_target_equal_to_lower_bound() {
    let used = 250.0 * 64_000.0 / (16.0 * MIB as f64);
    let h = harness_with(config_for_eviction(used - 0.0999, 0.0));
    fill(&h, "k", 250, 64_000, &ReplicateConfig::default());
    assert_eq!(h.engine.run_eviction().evicted_keys, 25);
}

#[test]
fn case_53_soft_pinned_fill_in_after_all_unpinned() {
    let h = harness_with(config_for_eviction(0.0, 0.8));
    let pinned = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        ..Default::default()
    };
    // The pinned objects are older: pin beats age.
    fill(&h, "p", 10, 640_000, &pinned);
    fill(&h, "u", 10, 640_000, &ReplicateConfig::default());
    assert_eq!(h.engine.run_eviction().evicted_keys, 16);
    assert!(alive(&h, "u", 10).iter().all(|l| !l));
    assert_eq!(alive(&h, "p", 10), [vec![false; 6], vec![true; 4]].concat());
}

#[test]
fn case_54_groups_are_evicted_together_unless_a_member_is_leased() {
    let h = harness_with(config_for_eviction(1.0, 0.1));
    let group = |g: &str| ReplicateConfig {
        group_ids: Some(vec![g.into()]),
        ..Default::default()
    };
    fill(&h, "g2-", 2, 64, &group("g2"));
    fill(&h, "g1-", 2, 64, &group("g1"));
    fill(&h, "x", 6, 64, &ReplicateConfig::default());
    h.get("g2-1").unwrap();
    trigger_by_failed_allocation(&h);
    let report = h.engine.run_eviction();
    assert_eq!(report.evicted_keys, 2, "one pick evicts the whole group");
    assert_eq!(
        alive(&h, "g2-", 2),
        vec![true, true],
        "a leased member protects its group"
    );
    assert_eq!(alive(&h, "g1-", 2), vec![false, false]);
    assert!(alive(&h, "x", 6).iter().all(|l| *l));
}

#[test]
fn case_55_eviction_makes_room_but_spares_leased_objects() {
    let h = Harness::new();
    h.put("hot", MIB);
    for i in 0..40 {
        h.get("hot").unwrap();
        let key = format!("k{i}");
        let descs = match h.put_start(&key, MIB) {
            Ok(d) => d,
            Err(e) => {
                assert_eq!(e.code, ErrorCode::NO_AVAILABLE_HANDLE);
                assert!(h.engine.run_eviction().evicted_keys > 0);
                h.put_start(&key, MIB).unwrap()
            }
        };
        h.put_end(&key, &descs).unwrap();
        h.advance(1);
    }
    assert!(h.get("hot").is_ok());
    assert!(h.engine.stats().evicted_key_count >= 24);
}

#[test]
fn case_56_hard_pins_never_go_and_soft_pins_only_if_allowed() {
    for allow in [false, true] {
        // Watermark 0 with ratio 1: pass 2 asks for more than the unpinned objects can give.
        let config = EngineConfig {
            allow_evict_soft_pinned_objects: allow,
            ..config_for_eviction(0.0, 1.0)
        };
        let h = harness_with(config);
        let hard = ReplicateConfig {
            with_hard_pin: true,
            ..Default::default()
        };
        let soft = ReplicateConfig {
            soft_pin_action: SoftPinAction::Enable,
            ..Default::default()
        };
        fill(&h, "hard", 1, 64, &hard);
        fill(&h, "soft", 1, 64, &soft);
        fill(&h, "plain", 1, 64, &ReplicateConfig::default());
        trigger_by_failed_allocation(&h);
        h.engine.run_eviction();
        assert_eq!(alive(&h, "hard", 1), vec![true]);
        assert_eq!(alive(&h, "plain", 1), vec![false]);
        assert_eq!(
            alive(&h, "soft", 1),
            vec![!allow],
            "allow_evict_soft_pinned_objects={allow}"
        );
    }
}

#[test]
fn case_57_soft_pin_deadline_is_fixed_at_the_first_readable_end() {
    let h = Harness::new();
    let cfg = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(1000),
        ..Default::default()
    };
    let descs = h.put_start_with("k", 64, cfg).unwrap();
    h.put_end("k", &descs).unwrap();
    h.advance(500);
    h.put_end("k", &descs).unwrap();
    h.get("k").unwrap();
    assert_eq!(h.engine.stats().soft_pin_key_count, 1);
    h.advance(500);
    assert_eq!(
        h.engine.stats().soft_pin_key_count,
        0,
        "repeated End and reads did not extend it"
    );
    h.get("k").unwrap();
    assert_eq!(
        h.engine.stats().soft_pin_key_count,
        0,
        "reads never reactivate an expired pin"
    );
}

#[test]
fn below_watermark_without_flag_nothing_happens() {
    let h = Harness::new();
    h.put("k", MIB);
    assert_eq!(h.engine.run_eviction(), EvictionReport::default());
    assert!(h.get("k").is_ok());
}

#[test]
fn fix_5_stalled_write_is_reclaimed_without_memory_pressure() {
    let h = Harness::new();
    let release = h.engine.config().put_start_release_timeout_ms;
    h.put_start("zombie", MIB).unwrap();
    h.put("fine", 64);
    let started = h.clock.now_ms();
    let sweep_period = 1_000;
    let mut reclaimed_at = None;
    while reclaimed_at.is_none() {
        h.advance(sweep_period);
        h.ping(h.client);
        h.engine.tick();
        if h.engine.stats().stalled_writes_reclaimed == 1 {
            reclaimed_at = Some(h.clock.now_ms());
        }
    }
    let at = reclaimed_at.unwrap_or_default();
    assert!(at > started + release && at <= started + release + sweep_period);
    assert_eq!(code(h.get("zombie")), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(
        h.engine.stats().allocated_bytes,
        64,
        "the zombie's buffer is back"
    );
    assert_eq!(
        h.engine.stats().attempted_evictions,
        0,
        "no memory pressure was involved"
    );
    assert!(h.get("fine").is_ok());
}

#[test]
fn stalled_in_place_upsert_loses_the_object() {
    let h = Harness::new();
    h.put("k", 64);
    h.engine
        .upsert_start(&h.start_req("", "k", 64, ReplicateConfig::default()))
        .unwrap();
    h.advance(h.engine.config().put_start_release_timeout_ms + 1);
    assert_eq!(h.engine.sweep_stalled_writes(), 1);
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
}
