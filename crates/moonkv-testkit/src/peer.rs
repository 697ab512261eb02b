//! The independent Python peers of `tests/peer/` (pyzmq + msgpack from PyPI; `.ci/run`
//! installs them from tests/peer/requirements.txt).

use std::path::Path;
use std::process::Command;

/// Runs `tests/peer/<script> <arg>` and asserts that every check passed.
pub fn run(script: &str, arg: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/peer")
        .join(script);
    let out = Command::new("python3")
        .arg(&script)
        .arg(arg)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run python3 ({e}); install Python 3 and `pip install -r \
                 tests/peer/requirements.txt`"
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("ModuleNotFoundError") {
        panic!(
            "Python peer dependencies missing: run `pip install -r tests/peer/requirements.txt`\n\
             {stderr}"
        );
    }
    assert!(
        out.status.success(),
        "{} failed:\n{stdout}\n{stderr}",
        script.display()
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}
