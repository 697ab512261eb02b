//! Edges of the command line against the real binary: config files that repeat a key, and
//! output into a pipe whose reader has gone away.

use moonkv_testkit::Moonkv;
use std::process::Stdio;

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

#[test]
fn a_config_file_that_repeats_a_key_stops_the_master_naming_the_key() {
    let dir = std::env::temp_dir().join(format!("moonkv-cli-edges-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("master.yaml");
    std::fs::write(
        &path,
        "default_kv_lease_ttl: 100\neviction_high_watermark_ratio: 0.9\ndefault_kv_lease_ttl: 5000\n",
    )
    .unwrap();
    let out = MOONKV
        .command(&[
            "master",
            "--rpc-port",
            "0",
            "--metrics-port",
            "0",
            "--config-path",
            path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !out.status.success(),
        "a repeated key must not start the master"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("default_kv_lease_ttl") && stderr.contains("more than once"),
        "{stderr}"
    );
}

#[test]
fn listing_into_a_closed_pipe_ends_quietly() {
    let master = MOONKV.start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let rpc = master.field("rpc");
    // The reader is gone before the first line is written, as with `moonkv ls | head -0`.
    let mut ls = MOONKV.client(&rpc, &["ls"]);
    ls.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = ls.spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
}
