//! The disk tier through the binary: `moonkv up --disk-dir`, `put --disk`, `ls`, `stat`, and a
//! node refusing an unusable directory.

use moonkv_testkit::{output_of, Moonkv};
use std::process::Output;
use std::time::{Duration, Instant};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

fn moonkv(master: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    output_of(MOONKV.client(master, args), stdin.unwrap_or_default())
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("moonkv-disk-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).unwrap();
    path
}

fn files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "mkv"))
        .count()
}

#[test]
fn up_with_a_disk_writes_through_and_stat_shows_the_disk() {
    let dir = temp_dir("up");
    let dir_arg = dir.to_str().unwrap();
    let up = MOONKV.start(&[
        "up",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--kv-events-bind-endpoint",
        "tcp://127.0.0.1:0",
        "--segment-size",
        "64MiB",
        "--disk-dir",
        dir_arg,
        "--disk-capacity",
        "16MiB",
    ]);
    let master = up.field("rpc");
    let payload: Vec<u8> = (0..100_000u32).map(|i| (i * 11 % 253) as u8).collect();
    let put = moonkv(&master, &["put", "--disk", "k", "-"], Some(&payload));
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    assert_eq!(files(&dir), 1, "the disk replica is a file");

    let ls = moonkv(&master, &["ls", "--json"], None);
    let listing: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let media: Vec<&str> = listing["objects"][0]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["medium"].as_str().unwrap())
        .collect();
    assert_eq!(media, vec!["cpu", "disk"]);

    let admin = up.field("admin");
    let stat = moonkv(&master, &["stat", "--json", "--admin", &admin], None);
    let stat: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap();
    assert_eq!(stat["disk_capacity_bytes"], 16.0 * 1048576.0);
    assert_eq!(stat["disk_allocated_bytes"], 100_000.0 + 4096.0);
    let disks: Vec<&serde_json::Value> = stat["segments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["medium"] == "disk")
        .collect();
    assert_eq!(disks.len(), 1);
    assert_eq!(disks[0]["status"], "OK");
    let text = moonkv(&master, &["stat", "--admin", &admin], None);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("disk 16.0 MiB"), "{text}");

    let get = moonkv(&master, &["get", "k"], None);
    assert_eq!(get.stdout, payload);
    let rm = moonkv(&master, &["rm", "--force", "k"], None);
    assert!(rm.status.success());
    let until = Instant::now() + Duration::from_secs(30);
    while files(&dir) > 0 {
        assert!(Instant::now() < until, "the file was never deleted");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_with_a_missing_disk_directory_stops_naming_it() {
    let missing = std::env::temp_dir().join("moonkv-disk-cli-no-such-directory");
    let out = MOONKV
        .command(&[
            "node",
            "--master",
            "127.0.0.1:1",
            "--disk-dir",
            missing.to_str().unwrap(),
            "--disk-capacity",
            "1GiB",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("moonkv-disk-cli-no-such-directory"), "{err}");

    let lone = MOONKV
        .command(&["node", "--disk-dir", "/tmp"])
        .output()
        .unwrap();
    assert!(!lone.status.success(), "--disk-dir needs --disk-capacity");
}
