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

#[test]
fn a_put_says_how_many_replicas_it_made_and_can_demand_all() {
    let master = MOONKV.start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let rpc = master.field("rpc");
    let _node = MOONKV.start(&["node", "--master", &rpc, "--segment-size", "8MiB"]);
    let put = |args: &[&str]| {
        let mut cmd = MOONKV.client(&rpc, args);
        cmd.env_remove("MOONKV_AUTH_SECRET")
            .env_remove("MOONKV_AUTH_SECRET_FILE");
        moonkv_testkit::output_of(cmd, b"hello replicas")
    };
    // One node: room for one replica of the two asked for.
    let out = put(&["put", "--json", "--replicas", "2", "two", "-"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["replicas"], 1, "{answer}");
    assert_eq!(answer["replicas_requested"], 2, "{answer}");
    let out = put(&["put", "--replicas", "2", "two-text", "-"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("only 1 of 2 replicas"), "{text}");

    // All or nothing: the put fails and stores nothing.
    let out = put(&[
        "put",
        "--replicas",
        "2",
        "--all-replicas",
        "all-or-nothing",
        "-",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("only 1 of the 2"), "{stderr}");
    let mut get = MOONKV.client(&rpc, &["get", "all-or-nothing"]);
    get.env_remove("MOONKV_AUTH_SECRET")
        .env_remove("MOONKV_AUTH_SECRET_FILE");
    let got = moonkv_testkit::output_of(get, b"");
    assert!(!got.status.success(), "nothing may be readable");
}

#[test]
fn stat_finds_the_admin_port_the_master_announces() {
    // An ephemeral admin port: nothing to guess from the RPC address.
    let master = MOONKV.start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let rpc = master.field("rpc");
    let _node = MOONKV.start(&["node", "--master", &rpc, "--segment-size", "8MiB"]);
    let mut stat = MOONKV.client(&rpc, &["stat", "--json"]);
    stat.env_remove("MOONKV_ADMIN")
        .env_remove("MOONKV_AUTH_SECRET")
        .env_remove("MOONKV_AUTH_SECRET_FILE");
    let out = moonkv_testkit::output_of(stat, b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        answer["segments"].as_array().map(Vec::len),
        Some(1),
        "{answer}"
    );
    assert_eq!(answer["capacity_bytes"], 8.0 * 1024.0 * 1024.0, "{answer}");
    assert!(
        answer["nodes"][0]["data_plane"]["connections_opened"].is_u64(),
        "{answer}"
    );
}

#[test]
fn an_unreadable_chain_cache_size_stops_the_indexer_naming_it() {
    let out = MOONKV
        .command(&[
            "indexer",
            "--http-port",
            "0",
            "--host",
            "127.0.0.1",
            "--chain-cache-blocks",
            "lots",
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a bad size must not start the indexer"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--chain-cache-blocks") && stderr.contains("\"lots\" is not a block count"),
        "{stderr}"
    );
    // The same value from the environment is refused the same way, not replaced by a default.
    let out = MOONKV
        .command(&["indexer", "--http-port", "0", "--host", "127.0.0.1"])
        .env("MOONKV_INDEXER_CHAIN_CACHE_BLOCKS", "-5")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a bad size must not start the indexer"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("\"-5\" is not a block count"), "{stderr}");
}
