//! `moonkv bench` runs end to end in each mode with short durations and every call succeeds;
//! against a shared master it leaves no keys and no segments behind.

use moonkv_testkit::{http, Moonkv};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

/// Runs `moonkv bench master <args> --json` and returns one JSON object per shape.
fn bench_master(args: &[&str]) -> Vec<serde_json::Value> {
    let out = MOONKV
        .command(&[
            "bench",
            "master",
            "--json",
            "--duration",
            "300ms",
            "--prefill",
            "300",
        ])
        .args(["--segments", "4"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run moonkv bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}

fn assert_all_succeeded(results: &[serde_json::Value], shapes: usize) {
    assert_eq!(results.len(), shapes, "{results:?}");
    for r in results {
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["keys"].as_u64().unwrap_or(0) > 0, "{r}");
        assert!(r["p99_us"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    }
}

// Two threads on one connection (1x2) exercise the shared-connection reply hand-off.
const SHAPES: &str = "put:1x2,get:2x1,batch-put:1x1:b8,batch-get:1x2:b16";

#[test]
fn spawned_master_every_shape_succeeds() {
    let results = bench_master(&["--spawn", "--shape", SHAPES]);
    assert_all_succeeded(&results, 4);
    assert_eq!(results[0]["shape"], "put:1x2:b1");
    assert_eq!(results[0]["mode"], "spawn");
}

#[test]
fn in_process_engine_every_shape_succeeds() {
    let results = bench_master(&["--in-process", "--shape", SHAPES]);
    assert_all_succeeded(&results, 4);
    assert_eq!(results[3]["mode"], "in-process");
}

#[test]
fn shared_master_is_left_clean() {
    let master = MOONKV.master(&[]);
    let results = bench_master(&["--master", &master.field("rpc"), "--shape", SHAPES]);
    assert_all_succeeded(&results, 4);
    let (status, metrics) = http(&master.field("admin"), "GET", "/metrics", "");
    assert_eq!(status, 200);
    assert!(metrics.contains("master_key_count 0"), "{metrics}");
    assert!(
        metrics.contains("master_total_capacity_bytes 0"),
        "{metrics}"
    );
}

#[test]
fn bad_shapes_are_refused() {
    let out = MOONKV
        .command(&[
            "bench",
            "master",
            "--in-process",
            "--shape",
            "batch-put:2x1",
        ])
        .output()
        .expect("run moonkv bench");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("batch size"));
}

/// The data-plane benchmark against an in-process master and node (no Redis): one small size,
/// both ops, a short probe; it prints the table with both rows and the probe's.
#[test]
fn store_bench_prints_a_table() {
    let out = MOONKV
        .command(&["bench", "store", "--spawn", "--duration", "200ms"])
        .args([
            "--sizes",
            "64KiB",
            "--concurrency",
            "2",
            "--segment-size",
            "64MiB",
        ])
        .args(["--tcp-connections", "1"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run moonkv bench store");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench store failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| size | clients | op | GB/s |"),
        "{stdout}"
    );
    for op in ["put", "get"] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| 64 KiB | 2 | {op} |")))
            .unwrap_or_else(|| panic!("no {op} row in\n{stdout}"));
        let ops_per_s: f64 = row
            .split('|')
            .nth(6)
            .unwrap()
            .trim()
            .replace(',', "")
            .parse()
            .unwrap();
        assert!(ops_per_s > 0.0, "{row}");
    }
    assert!(
        stdout.contains("| raw loopback TCP, write size | connections | GB/s |"),
        "{stdout}"
    );
}
