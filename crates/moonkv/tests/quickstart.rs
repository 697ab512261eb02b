//! The README quick start, run as a user would: `moonkv up`, then the client commands.

use moonkv_testkit::{output_of, Moonkv};
use std::process::Output;

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

fn moonkv(master: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    output_of(MOONKV.client(master, args), stdin.unwrap_or_default())
}

/// Asserts that a client command succeeded, showing what it printed to stderr if not.
fn succeeded(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `moonkv up` on ephemeral ports with a 64 MiB segment, and `extra` flags.
fn up(extra: &[&str]) -> moonkv_testkit::Proc {
    let mut args = vec![
        "up",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--kv-events-bind-endpoint",
        "tcp://127.0.0.1:0",
        "--segment-size",
        "64MiB",
    ];
    args.extend_from_slice(extra);
    MOONKV.start(&args)
}

#[test]
fn up_then_put_get_ls_stat_rm() {
    let up = up(&[]);
    let master = up.field("rpc");
    assert!(
        up.field("kv_events").starts_with("tcp://127.0.0.1:"),
        "events on by default"
    );
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();

    let put = moonkv(&master, &["put", "greeting", "-"], Some(&payload));
    succeeded(&put);
    let get = moonkv(&master, &["get", "greeting"], None);
    assert!(get.status.success());
    assert_eq!(get.stdout, payload, "byte-exact round trip through the CLI");

    let ls = moonkv(&master, &["ls", "--json"], None);
    let listing: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(listing["objects"][0]["key"], "greeting");
    assert_eq!(listing["objects"][0]["size"], 200_000);

    let stat = moonkv(&master, &["stat", "--admin", &up.field("admin")], None);
    let text = String::from_utf8_lossy(&stat.stdout);
    assert!(stat.status.success() && text.contains("keys 1"), "{text}");

    let missing = moonkv(&master, &["get", "nope"], None);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("OBJECT_NOT_FOUND"));

    let again = moonkv(&master, &["put", "greeting", "-"], Some(b"x"));
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("OBJECT_ALREADY_EXISTS"));

    // The get above holds a read lease: a plain rm is refused, --force removes.
    let rm = moonkv(&master, &["rm", "greeting"], None);
    assert!(String::from_utf8_lossy(&rm.stderr).contains("OBJECT_HAS_LEASE"));
    let rm = moonkv(&master, &["rm", "--force", "greeting"], None);
    succeeded(&rm);
    let gone = moonkv(&master, &["get", "greeting"], None);
    assert!(String::from_utf8_lossy(&gone.stderr).contains("OBJECT_NOT_FOUND"));
}

/// The node `moonkv up` runs lives exactly as long as its master, which never expires it: a
/// pause of the whole process past the client TTL (a stopped process, a suspended VM) costs it
/// no object when the process resumes, though it keeps no catalog to regain them from.
#[test]
fn a_paused_up_keeps_its_objects_when_it_resumes() {
    use std::time::Duration;
    let up = up(&["--client-live-ttl-sec", "1"]);
    let master = up.field("rpc");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let put = moonkv(&master, &["put", "kept", "-"], Some(&payload));
    succeeded(&put);
    // Frozen well past the TTL: on resume the master's sweep (every second) finds the node's
    // heartbeat overdue, and would have unmounted its segment and dropped the object.
    up.freeze();
    std::thread::sleep(Duration::from_millis(2_500));
    up.thaw();
    // Three sweeps after the resume.
    std::thread::sleep(Duration::from_millis(3_000));
    let get = moonkv(&master, &["get", "kept"], None);
    succeeded(&get);
    assert_eq!(get.stdout, payload);
    let stat = moonkv(&master, &["stat", "--admin", &up.field("admin")], None);
    let text = String::from_utf8_lossy(&stat.stdout);
    assert!(stat.status.success() && text.contains("keys 1"), "{text}");
    // And it still takes writes.
    let put = moonkv(&master, &["put", "after", "-"], Some(b"x"));
    succeeded(&put);
}
