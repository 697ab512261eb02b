//! Shared-secret authentication of the master protocol, end to end with the real binaries.

use moonkv_client::master_client::blocking;
use moonkv_proto::auth::Secret;
use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::{Hello, KeyRequest, Request};
use moonkv_proto::ErrorCode;
use moonkv_testkit::wire::RawStream;
use moonkv_testkit::{http, http_with, output_of, Moonkv, Proc};
use std::time::Duration;

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));
const SECRET: &str = "correct-horse-battery-staple-42";
/// Bound of a blocking connect and its reads.
const LIMIT: Duration = Duration::from_secs(30);

fn secret_file(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("secret");
    std::fs::write(&path, body).unwrap();
    path
}

struct Master {
    proc: Proc,
    rpc: String,
    admin: String,
}

fn start_master(secret_path: &std::path::Path) -> Master {
    let mut cmd = MOONKV.command(&[
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--auth-secret-file",
    ]);
    cmd.arg(secret_path)
        .env("RUST_LOG", "debug")
        .env_remove("MOONKV_AUTH_SECRET");
    let proc = Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"));
    Master {
        rpc: proc.field("rpc"),
        admin: proc.field("admin"),
        proc,
    }
}

fn cli(master: &str, secret: Option<&str>, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut cmd = MOONKV.client(master, args);
    cmd.env_remove("MOONKV_AUTH_SECRET");
    if let Some(s) = secret {
        cmd.env("MOONKV_AUTH_SECRET", s);
    }
    output_of(cmd, stdin)
}

#[test]
fn clients_must_prove_the_shared_secret() {
    let dir = std::env::temp_dir().join(format!("moonkv-auth-{}", std::process::id()));
    let path = secret_file(&dir, &format!("{SECRET}\n"));
    let mut master = start_master(&path);

    // Right secret: a metadata round trip works (ExistKey through `ls`).
    let ok = cli(&master.rpc, Some(SECRET), &["ls", "--json"], b"");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    // No secret: a clear refusal naming how to fix it.
    let none = cli(&master.rpc, None, &["ls"], b"");
    assert!(!none.status.success());
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(
        err.contains("ILLEGAL_CLIENT") && err.contains("MOONKV_AUTH_SECRET"),
        "{err}"
    );

    // Wrong secret: refused.
    let wrong = cli(
        &master.rpc,
        Some("wrong-secret-but-long-enough"),
        &["ls"],
        b"",
    );
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("ILLEGAL_CLIENT"));

    // The blocking client: refused without the secret or with a wrong one, served with it.
    let refused = blocking::Connection::connect(&master.rpc, "test", None, Some(LIMIT))
        .err()
        .expect("no secret, no connection");
    assert_eq!(refused.code, ErrorCode::ILLEGAL_CLIENT, "{refused}");
    assert!(refused.message.contains("MOONKV_AUTH_SECRET"), "{refused}");
    let wrong_secret = Secret::new(b"wrong-secret-but-long-enough".to_vec()).unwrap();
    let refused =
        blocking::Connection::connect(&master.rpc, "test", Some(&wrong_secret), Some(LIMIT))
            .err()
            .expect("a wrong secret, no connection");
    assert_eq!(refused.code, ErrorCode::ILLEGAL_CLIENT, "{refused}");
    let secret = Secret::new(SECRET.as_bytes().to_vec()).unwrap();
    let proven = blocking::Connection::connect(&master.rpc, "test", Some(&secret), Some(LIMIT))
        .expect("the right secret is accepted");
    let exists: bool = proven
        .request(&Request::ExistKey(KeyRequest {
            tenant: String::new(),
            key: "k".into(),
        }))
        .unwrap();
    assert!(!exists);

    // A raw client that skips the proof cannot issue requests.
    let mut raw = RawStream::connect(&master.rpc);
    let mut out = Vec::new();
    let hello = Hello {
        magic: "moonkv".into(),
        protocol_version: 1,
        client_name: "raw".into(),
        auth: None,
    };
    frame::encode_value(&mut out, FrameKind::Hello, 0, 0, &hello).unwrap();
    frame::encode_request(
        &mut out,
        1,
        &Request::ExistKey(KeyRequest {
            tenant: String::new(),
            key: "k".into(),
        }),
    )
    .unwrap();
    raw.write(&out);
    let answer = raw.read_frame().expect("hello answer carries a challenge");
    assert_eq!(answer.code, 0);
    let answer = raw.read_frame().expect("request refused");
    assert_eq!(answer.code, ErrorCode::ILLEGAL_CLIENT.as_i32());
    assert!(raw.read_frame().is_none(), "connection closed");

    // Mutating admin endpoints need the secret.
    let (status, _) = http(&master.admin, "POST", "/api/v1/remove_all?force=true", "");
    assert_eq!(status, 401);
    let (status, _) = http_with(
        &master.admin,
        "POST",
        "/api/v1/remove_all",
        "",
        &[("Authorization", "Bearer wrong")],
    );
    assert_eq!(status, 401);
    let bearer = format!("Bearer {SECRET}");
    let (status, body) = http_with(
        &master.admin,
        "POST",
        "/api/v1/remove_all?force=true",
        "",
        &[("Authorization", &bearer)],
    );
    assert_eq!(status, 200, "{body}");
    // Reads that reveal keys or ids need it too; the others stay open.
    for path in [
        "/get_all_keys",
        "/query_key?key=k",
        "/get_segments_detail",
        "/kv_events/snapshot",
    ] {
        let (status, _) = http(&master.admin, "GET", path, "");
        assert_eq!(status, 401, "{path} without the secret");
        let (status, body) = http_with(
            &master.admin,
            "GET",
            path,
            "",
            &[("Authorization", &bearer)],
        );
        assert_ne!(status, 401, "{path} with the secret: {body}");
    }
    for path in [
        "/health",
        "/metrics",
        "/kv_events/status",
        "/get_all_segments",
    ] {
        let (status, _) = http(&master.admin, "GET", path, "");
        assert_eq!(status, 200, "{path} stays open");
    }

    // The secret never shows in metrics or logs.
    let (_, metrics) = http(&master.admin, "GET", "/metrics", "");
    assert!(!metrics.contains(SECRET));
    let logs = master.proc.stop_and_read_log();
    assert!(
        logs.contains("authentication failed"),
        "failed attempts are logged"
    );
    assert!(!logs.contains(SECRET), "secret leaked into logs");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_short_or_missing_secret_file_stops_the_master() {
    let dir = std::env::temp_dir().join(format!("moonkv-auth-bad-{}", std::process::id()));
    let path = secret_file(&dir, "short");
    let out = MOONKV
        .command(&[
            "master",
            "--rpc-port",
            "0",
            "--metrics-port",
            "0",
            "--auth-secret-file",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("auth_secret_file"));
    let out = MOONKV
        .command(&[
            "master",
            "--rpc-port",
            "0",
            "--metrics-port",
            "0",
            "--auth-secret-file",
            "/nonexistent/secret",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/secret"));
    std::fs::remove_dir_all(&dir).ok();
}
