//! Independent peers written in Python (pyzmq + msgpack from PyPI) check the event stream and
//! the protocol document: `.ci/run` installs them from tests/peer/requirements.txt.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python_peer(script: &str, arg: &Path) {
    let script = repo_root().join("tests/peer").join(script);
    let out = Command::new("python3").arg(&script).arg(arg).output().unwrap_or_else(|e| {
        panic!("cannot run python3 ({e}); install Python 3 and `pip install -r tests/peer/requirements.txt`")
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("ModuleNotFoundError") {
        panic!("Python peer dependencies missing: run `pip install -r tests/peer/requirements.txt`\n{stderr}");
    }
    assert!(
        out.status.success(),
        "{} failed:\n{stdout}\n{stderr}",
        script.display()
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

#[test]
fn python_peer_checks_the_emission_table_of_a_real_master() {
    python_peer("emission_peer.py", Path::new(env!("CARGO_BIN_EXE_moonkv")));
}

#[test]
fn python_peer_checks_event_bytes_from_the_publisher() {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_moonkv"))
        .parent()
        .expect("target dir")
        .to_path_buf();
    let fixture = bin_dir.join("examples/publish_fixture");
    if !fixture.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "-p",
                "moonkv-events",
                "--example",
                "publish_fixture",
            ])
            .current_dir(repo_root())
            .status()
            .expect("build publish_fixture");
        assert!(status.success());
    }
    python_peer("events_peer.py", &fixture);
}
