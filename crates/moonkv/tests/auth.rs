//! Shared-secret authentication of the master protocol, end to end with the real binaries.

mod common;

use common::{http, http_with, RawClient};
use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::{Hello, KeyRequest, Request};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

const SECRET: &str = "correct-horse-battery-staple-42";

fn secret_file(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("secret");
    std::fs::write(&path, body).unwrap();
    path
}

struct Master {
    child: std::process::Child,
    rpc: String,
    admin: String,
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_master(secret_path: &std::path::Path) -> Master {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moonkv"))
        .args([
            "master",
            "--rpc-port",
            "0",
            "--metrics-port",
            "0",
            "--auth-secret-file",
        ])
        .arg(secret_path)
        .env("RUST_LOG", "debug")
        .env_remove("MOONKV_AUTH_SECRET")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    Master {
        child,
        rpc: ready["rpc"].as_str().unwrap().into(),
        admin: ready["admin"].as_str().unwrap().into(),
    }
}

fn cli(master: &str, secret: Option<&str>, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_moonkv"));
    cmd.args(args)
        .env("MOONKV_MASTER", master)
        .env_remove("MOONKV_AUTH_SECRET");
    if let Some(s) = secret {
        cmd.env("MOONKV_AUTH_SECRET", s);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
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

    // A raw client that skips the proof cannot issue requests.
    let mut raw = std::net::TcpStream::connect(&master.rpc).unwrap();
    raw.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
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
    raw.write_all(&out).unwrap();
    let mut c = RawClient {
        stream: raw,
        next_id: 0,
    };
    let (code, _) = c.read_frame().expect("hello answer carries a challenge");
    assert_eq!(code, 0);
    let (code, _) = c.read_frame().expect("request refused");
    assert_eq!(code, moonkv_proto::ErrorCode::ILLEGAL_CLIENT.as_i32());
    assert!(c.read_frame().is_none(), "connection closed");

    // Mutating admin endpoints need the secret; reads stay open.
    let (status, _) = http(&master.admin, "POST", "/api/v1/remove_all?force=true", "");
    assert_eq!(status, 401);
    let (status, _) = http_with(
        &master.admin,
        "POST",
        "/api/v1/remove_all",
        "",
        "Authorization: Bearer wrong\r\n",
    );
    assert_eq!(status, 401);
    let bearer = format!("Authorization: Bearer {SECRET}\r\n");
    let (status, body) = http_with(
        &master.admin,
        "POST",
        "/api/v1/remove_all?force=true",
        "",
        &bearer,
    );
    assert_eq!(status, 200, "{body}");
    let (status, _) = http(&master.admin, "GET", "/get_all_keys", "");
    assert_eq!(status, 200);

    // The secret never shows in metrics or logs.
    let (_, metrics) = http(&master.admin, "GET", "/metrics", "");
    assert!(!metrics.contains(SECRET));
    let _ = master.child.kill();
    let _ = master.child.wait();
    let mut logs = String::new();
    master
        .child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
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
    let out = Command::new(env!("CARGO_BIN_EXE_moonkv"))
        .args([
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
    let out = Command::new(env!("CARGO_BIN_EXE_moonkv"))
        .args([
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
