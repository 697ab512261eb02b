//! Operators' dashboards against a live cluster: every metric upstream's Grafana dashboard
//! queries (in scope) is served by a real master, and every query of moonkv's own dashboard
//! (`monitoring/grafana/moonkv.json`) names a metric a real master or node serves.

use moonkv_proto::msg::*;
use moonkv_testkit::{http, output_of, wire, Moonkv, Proc};
use std::collections::BTreeSet;

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

/// The metric names the panels of upstream's dashboard (`monitoring/grafana/dashboards/
/// mooncake.json` in kvcache-ai/Mooncake) query, less the out-of-scope families (copy, move and
/// tasks, NVMe-oF, snapshots, `query_ip`, `replica_clear`, `evict_disk_replica`).
const UPSTREAM_DASHBOARD: &[&str] = &[
    // Cluster overview
    "master_active_clients",
    "master_key_count",
    "master_soft_pin_key_count",
    "master_allocated_bytes",
    "master_total_capacity_bytes",
    "master_allocated_file_size_bytes",
    "master_total_file_capacity_bytes",
    // RPC rates and failures
    "master_put_start_requests_total",
    "master_put_end_requests_total",
    "master_put_revoke_requests_total",
    "master_get_replica_list_requests_total",
    "master_get_replica_list_by_regex_requests_total",
    "master_exist_key_requests_total",
    "master_remove_requests_total",
    "master_remove_by_regex_requests_total",
    "master_remove_all_requests_total",
    "master_ping_requests_total",
    "master_put_start_failures_total",
    "master_put_start_alloc_failures_total",
    "master_put_end_failures_total",
    "master_put_revoke_failures_total",
    "master_get_replica_list_failures_total",
    "master_get_replica_list_by_regex_failures_total",
    "master_exist_key_failures_total",
    "master_remove_failures_total",
    "master_ping_failures_total",
    "master_remove_by_regex_failures_total",
    "master_remove_all_failures_total",
    // Segment lifecycle
    "master_mount_segment_requests_total",
    "master_unmount_segment_requests_total",
    "master_remount_segment_requests_total",
    // Eviction
    "master_attempted_evictions_total",
    "master_successful_evictions_total",
    "master_attempted_evictions_mem",
    "master_successful_evictions_mem",
    "master_evicted_key_count",
    "master_evicted_key_count_mem",
    "master_evicted_size_bytes",
    "master_evicted_size_bytes_mem",
    // Promotion on hit (the disk tier's)
    "master_promotion_in_flight",
    "master_promotion_admitted_total",
    "master_promotion_completed_total",
    "master_promotion_failed_total",
    "master_promotion_cancelled_total",
    "master_promotion_expired_total",
    "master_promotion_completed_bytes_total",
    "master_promotion_rejected_frequency_total",
    "master_promotion_rejected_watermark_total",
    "master_promotion_rejected_cap_total",
    // Cache hits
    "mem_cache_hit_nums_",
    "file_cache_hit_nums_",
    "mem_cache_hit_bytes_total",
    "file_cache_hit_bytes_total",
    "mem_cache_nums_",
    "file_cache_nums_",
    "valid_get_nums_",
    "total_get_nums_",
    // PutStart discard / staging
    "master_put_start_discard_cnt",
    "master_put_start_release_cnt",
    "master_put_start_discarded_staging_size",
    // Batch operations
    "master_batch_put_start_requests_total",
    "master_batch_put_end_requests_total",
    "master_batch_put_revoke_requests_total",
    "master_batch_get_replica_list_requests_total",
    "master_batch_exist_key_requests_total",
    "master_batch_put_start_items_total",
    "master_batch_put_end_items_total",
    "master_batch_get_replica_list_items_total",
    "master_batch_exist_key_items_total",
    // Value sizes
    "master_value_size_bytes_bucket",
];

/// A master and one node with its `/metrics` on, after a small workload: one put, one get, a
/// batch exist of two keys (one present) and a get of a missing key.
struct Cluster {
    master: Proc,
    node: Proc,
}

impl Cluster {
    fn start() -> Cluster {
        let master = MOONKV.master(&[]);
        let rpc = master.field("rpc");
        let node = Proc::start(MOONKV.node_command(
            &rpc,
            "node-a",
            "64MiB",
            &["--metrics-addr", "127.0.0.1:0"],
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let put = output_of(MOONKV.client(&rpc, &["put", "greeting", "-"]), &[7u8; 5000]);
        assert!(
            put.status.success(),
            "{}",
            String::from_utf8_lossy(&put.stderr)
        );
        let get = output_of(MOONKV.client(&rpc, &["get", "greeting"]), &[]);
        assert_eq!(get.stdout, vec![7u8; 5000]);
        let missing = output_of(MOONKV.client(&rpc, &["get", "nope"]), &[]);
        assert!(!missing.status.success());
        let c = wire::connect(&rpc);
        let exists = c
            .request::<Vec<moonkv_proto::ItemResult<bool>>>(&Request::BatchExistKey(KeysRequest {
                tenant: String::new(),
                keys: vec!["greeting".into(), "nope".into()],
            }))
            .unwrap();
        assert_eq!(exists.len(), 2);
        Cluster { master, node }
    }

    fn master_metrics(&self) -> String {
        let (status, body) = http(&self.master.field("admin"), "GET", "/metrics", "");
        assert_eq!(status, 200);
        body
    }

    fn node_metrics(&self) -> String {
        let (status, body) = http(&self.node.field("metrics"), "GET", "/metrics", "");
        assert_eq!(status, 200);
        body
    }
}

/// Sample names in Prometheus text (a histogram's `_bucket`, `_sum`, `_count` included).
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split([' ', '{']).next())
        .map(str::to_string)
        .collect()
}

/// The value of the sample whose name and labels are exactly `series`.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let (name, v) = l.rsplit_once(' ')?;
            (name == series).then(|| v.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no sample {series}"))
}

/// The `# TYPE` upstream gives `name`, as served.
fn declared_type(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix("# TYPE ")?;
        let (n, t) = rest.split_once(' ')?;
        (n == name).then(|| t.to_string())
    })
}

#[test]
fn every_name_of_upstreams_dashboard_is_served() {
    let cluster = Cluster::start();
    let served = sample_names(&cluster.master_metrics());
    let missing: Vec<&str> = UPSTREAM_DASHBOARD
        .iter()
        .copied()
        .filter(|name| !served.contains(*name))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of the {} names upstream's dashboard queries are not on the master's /metrics: {}",
        missing.len(),
        UPSTREAM_DASHBOARD.len(),
        missing.join(", ")
    );
}

#[test]
fn upstreams_names_count_what_upstream_counts() {
    let cluster = Cluster::start();
    let text = cluster.master_metrics();
    // Counters upstream names without `_total` keep their names and their type.
    for name in [
        "mem_cache_hit_nums_",
        "valid_get_nums_",
        "total_get_nums_",
        "master_evicted_key_count",
        "master_put_start_discard_cnt",
    ] {
        assert_eq!(
            declared_type(&text, name).as_deref(),
            Some("counter"),
            "{name}"
        );
    }
    assert_eq!(
        declared_type(&text, "mem_cache_nums_").as_deref(),
        Some("gauge")
    );
    // Two reads (one found, in memory) and one put of 5000 bytes.
    assert_eq!(value(&text, "total_get_nums_"), 2.0);
    assert_eq!(value(&text, "valid_get_nums_"), 1.0);
    assert_eq!(value(&text, "mem_cache_hit_nums_"), 1.0);
    assert_eq!(value(&text, "mem_cache_hit_bytes_total"), 5000.0);
    assert_eq!(value(&text, "file_cache_hit_nums_"), 0.0);
    assert_eq!(value(&text, "mem_cache_nums_"), 1.0);
    assert_eq!(value(&text, "file_cache_nums_"), 0.0);
    // Upstream's size buckets: 5000 bytes lands above 4 KiB, within 64 KiB.
    assert_eq!(
        value(&text, "master_value_size_bytes_bucket{le=\"4096.0\"}"),
        0.0
    );
    assert_eq!(
        value(&text, "master_value_size_bytes_bucket{le=\"65536.0\"}"),
        1.0
    );
    assert_eq!(value(&text, "master_value_size_bytes_count"), 1.0);
    // A batch counts its keys as items; ExistKey answers per key, so nothing failed.
    assert_eq!(value(&text, "master_batch_exist_key_requests_total"), 1.0);
    assert_eq!(value(&text, "master_batch_exist_key_items_total"), 2.0);
    assert_eq!(value(&text, "master_batch_exist_key_failures_total"), 0.0);
}

#[test]
fn the_node_reports_its_data_plane() {
    let cluster = Cluster::start();
    let text = cluster.node_metrics();
    assert_eq!(value(&text, "node_data_requests_total{op=\"write\"}"), 1.0);
    assert_eq!(value(&text, "node_data_bytes_total{op=\"write\"}"), 5000.0);
    assert_eq!(value(&text, "node_data_requests_total{op=\"read\"}"), 1.0);
    assert_eq!(value(&text, "node_data_bytes_total{op=\"read\"}"), 5000.0);
    assert_eq!(
        value(&text, "node_data_request_failures_total{op=\"read\"}"),
        0.0
    );
    assert_eq!(
        value(&text, "node_data_request_seconds_count{op=\"read\"}"),
        1.0
    );
    assert!(value(&text, "node_data_connections_opened_total") >= 1.0);
    // The test's store and node share this machine: the bytes went as same-host copies.
    assert_eq!(value(&text, "node_data_same_host_requests_total"), 2.0);
    assert_eq!(value(&text, "node_segments"), 1.0);
    assert_eq!(value(&text, "node_segment_capacity_bytes"), 67108864.0);
    assert_eq!(value(&text, "node_refused_handshakes_total"), 0.0);
    assert_eq!(value(&text, "node_range_lock_waits_total"), 0.0);
}

/// moonkv's own dashboard and the alerts beside it.
const MOONKV_DASHBOARD: &str = include_str!("../../../monitoring/grafana/moonkv.json");
const MOONKV_ALERTS: &str = include_str!("../../../monitoring/prometheus/alerts.yml");

/// Metric names a PromQL expression reads: identifiers that are neither functions, keywords,
/// label names (inside `{}` or after `by`/`without`/`on`/`ignoring`) nor numbers.
fn promql_names(expr: &str) -> Vec<String> {
    const KEYWORDS: [&str; 8] = [
        "by", "without", "on", "ignoring", "bool", "and", "or", "unless",
    ];
    // Aggregations may put `by (...)` between their name and their parenthesis.
    const AGGREGATIONS: [&str; 8] = [
        "sum", "avg", "min", "max", "count", "topk", "bottomk", "quantile",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let skip_to = |i: &mut usize, close: char| {
        while *i < chars.len() && chars[*i] != close {
            *i += 1;
        }
        *i += 1;
    };
    let mut skip_group = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' => skip_to(&mut i, '}'),
            '[' => skip_to(&mut i, ']'),
            '"' | '\'' => {
                i += 1;
                skip_to(&mut i, c);
            }
            '(' if skip_group => {
                skip_to(&mut i, ')');
                skip_group = false;
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    let exponent = chars[i] == 'e' || chars[i] == 'E';
                    i += 1;
                    if exponent && i < chars.len() && (chars[i] == '-' || chars[i] == '+') {
                        i += 1;
                    }
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i]))
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next] == ' ' {
                    next += 1;
                }
                let call = next < chars.len() && chars[next] == '(';
                if KEYWORDS.contains(&word.as_str()) {
                    skip_group = matches!(word.as_str(), "by" | "without" | "on" | "ignoring");
                } else if !call && !AGGREGATIONS.contains(&word.as_str()) {
                    names.push(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Every `expr` of the dashboard's panels (rows included), with its panel's title.
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<&serde_json::Value> =
        dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = stack.pop() {
        if let Some(inner) = panel["panels"].as_array() {
            stack.extend(inner);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("every target has an expr");
            out.push((
                panel["title"].as_str().unwrap_or("?").to_string(),
                expr.to_string(),
            ));
        }
    }
    out
}

#[test]
fn promql_names_finds_metrics_and_nothing_else() {
    assert_eq!(
        promql_names(
            "histogram_quantile(0.99, sum by (instance, le) (rate(node_x_bucket{op=\"read\"}[5m])))"
        ),
        ["node_x_bucket"]
    );
    assert_eq!(
        promql_names("100 * rate(a_total[$__rate_interval]) / clamp_min(b, 1e-9) > 0.5 and c"),
        ["a_total", "b", "c"]
    );
}

#[test]
fn moonkvs_dashboard_and_alerts_read_only_served_metrics() {
    let dashboard: serde_json::Value =
        serde_json::from_str(MOONKV_DASHBOARD).expect("monitoring/grafana/moonkv.json is JSON");
    let mut queries = dashboard_queries(&dashboard);
    for line in MOONKV_ALERTS.lines() {
        if let Some(expr) = line.trim().strip_prefix("expr: ") {
            queries.push(("alerts.yml".into(), expr.to_string()));
        }
    }
    assert!(queries.len() > 60, "{} queries", queries.len());
    let cluster = Cluster::start();
    let mut served = sample_names(&cluster.master_metrics());
    served.extend(sample_names(&cluster.node_metrics()));
    let mut missing = BTreeSet::new();
    let mut checked = BTreeSet::new();
    for (title, expr) in &queries {
        let names = promql_names(expr);
        assert!(!names.is_empty(), "{title}: no metric in {expr}");
        for name in names {
            if !served.contains(&name) {
                missing.insert(format!("{name} ({title})"));
            }
            checked.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "{} of the {} metrics moonkv's dashboard and alerts read are not served by a master or node: {}",
        missing.len(),
        checked.len(),
        missing.into_iter().collect::<Vec<_>>().join(", ")
    );
}
