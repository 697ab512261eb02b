//! The real `moonkv` binary as a child process: spawned with ephemeral loopback ports, ready
//! once it printed its ready line, SIGKILLed when dropped.

use crate::KitError;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a process may take to print its ready line on a loaded machine.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The `moonkv` binary under test.
///
/// Cargo names the binary only to integration tests of the package that builds it, so the
/// test passes its path in: `const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));`.
#[derive(Clone, Copy, Debug)]
pub struct Moonkv {
    exe: &'static str,
}

impl Moonkv {
    /// The binary at `exe`.
    pub const fn at(exe: &'static str) -> Moonkv {
        Moonkv { exe }
    }

    /// The binary's path.
    pub fn path(&self) -> &'static str {
        self.exe
    }

    /// `moonkv <args>`, not started yet.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.exe);
        cmd.args(args);
        cmd
    }

    /// `moonkv <args>` as a client of the master at `master` (`MOONKV_MASTER`), not started yet.
    pub fn client(&self, master: &str, args: &[&str]) -> Command {
        let mut cmd = self.command(args);
        cmd.env("MOONKV_MASTER", master);
        cmd
    }

    /// Starts `moonkv <args>` and waits for its ready line; panics with its log if it fails.
    pub fn start(&self, args: &[&str]) -> Proc {
        Proc::start(self.command(args)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `moonkv master` with ephemeral ports (unless `extra` names them) plus `extra` flags.
    pub fn master(&self, extra: &[&str]) -> Proc {
        let mut args = vec!["master"];
        if !extra.contains(&"--rpc-port") {
            args.extend(["--rpc-port", "0"]);
        }
        if !extra.contains(&"--metrics-port") {
            args.extend(["--metrics-port", "0"]);
        }
        args.extend_from_slice(extra);
        self.start(&args)
    }

    /// Restarts a master on fixed ports, retrying while the old ports are still being released.
    pub fn master_again(&self, extra: &[&str]) -> Proc {
        let mut args = vec!["master"];
        args.extend_from_slice(extra);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match Proc::start(self.command(&args)) {
                Ok(p) => return p,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("master restart: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// `moonkv node` with one segment of `segment_size` named `name`, data plane on loopback.
    pub fn node(&self, master_rpc: &str, name: &str, segment_size: &str) -> Proc {
        Proc::start(self.node_command(master_rpc, name, segment_size, &[]))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Moonkv::node`] with its fault points set (`FAILPOINTS`, `name=actions;...`, see
    /// `moonkv_node::failpoints`).
    pub fn node_with_failpoints(
        &self,
        master_rpc: &str,
        name: &str,
        segment_size: &str,
        failpoints: &str,
    ) -> Proc {
        let mut cmd = self.node_command(master_rpc, name, segment_size, &[]);
        cmd.env("FAILPOINTS", failpoints);
        Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The command of [`Moonkv::node`] plus `extra` flags, not started yet (for a disk
    /// directory, say, or an environment of its own).
    pub fn node_command(
        &self,
        master_rpc: &str,
        name: &str,
        segment_size: &str,
        extra: &[&str],
    ) -> Command {
        let mut cmd = self.command(&[
            "node",
            "--master",
            master_rpc,
            "--segment-size",
            segment_size,
            "--segment-name",
            name,
            "--data-bind",
            "127.0.0.1:0",
            "--host-id",
            name,
        ]);
        cmd.args(extra);
        cmd
    }
}

/// A `moonkv` child process with its stderr in a log file; SIGKILLed when dropped.
pub struct Proc {
    child: Child,
    /// The ready line's fields.
    pub ready: serde_json::Value,
    log_path: PathBuf,
}

/// Numbers the log files of the processes this test binary starts.
static LOGS: AtomicU64 = AtomicU64::new(0);

impl Drop for Proc {
    fn drop(&mut self) {
        // A frozen process must be thawed to die promptly on every platform.
        let _ = signal(self.pid(), "CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log_path);
    }
}

impl Proc {
    /// Starts `cmd` (stdout and stderr are taken over) and waits for its ready line; `Err`
    /// with its log if it exits or prints something else first.
    pub fn start(mut cmd: Command) -> Result<Proc, KitError> {
        // stderr goes to a file, so a process that fails to start can say why.
        let log_path = std::env::temp_dir().join(format!(
            "moonkv-test-{}-{}.log",
            std::process::id(),
            LOGS.fetch_add(1, Ordering::Relaxed)
        ));
        let log = std::fs::File::create(&log_path)
            .map_err(KitError::io(format!("create {}", log_path.display())))?;
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(KitError::io(format!("spawn {what}")))?;
        let stdout = child.stdout.take().expect("stdout was piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(READY_WITHIN).unwrap_or_default();
        let ready = serde_json::from_str::<serde_json::Value>(&line)
            .ok()
            .filter(|ready| ready["event"] == "ready");
        let Some(ready) = ready else {
            // A process that printed something else is usually exiting and still writing why:
            // it gets a moment to finish before it is killed.
            let exit_by = Instant::now() + Duration::from_secs(2);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < exit_by {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let _ = std::fs::remove_file(&log_path);
            return Err(KitError::NotReady {
                what,
                first_line: line,
                log: log.trim().to_string(),
            });
        };
        Ok(Proc {
            child,
            ready,
            log_path,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A field of the ready line, e.g. `rpc`, `admin`, `data`, `kv_events`; panics if absent.
    pub fn field(&self, name: &str) -> String {
        match self.ready[name].as_str() {
            Some(value) => value.to_string(),
            None => panic!("the ready line has no `{name}`: {}", self.ready),
        }
    }

    /// SIGSTOP: the process stops answering but keeps its sockets open.
    pub fn freeze(&self) {
        signal(self.pid(), "STOP").expect("SIGSTOP");
        // SIGSTOP reaches a process's threads asynchronously: one still running could answer
        // one more request. Return only once every thread is stopped.
        let tasks = format!("/proc/{}/task", self.pid());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let states: Vec<String> = std::fs::read_dir(&tasks)
                .map(|dir| {
                    dir.flatten()
                        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
                        .filter_map(|stat| {
                            stat.rsplit_once(')')
                                .and_then(|(_, rest)| rest.split_whitespace().next())
                                .map(str::to_string)
                        })
                        .collect()
                })
                .unwrap_or_default();
            if !states.is_empty() && states.iter().all(|s| s == "T" || s == "t") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "process {} did not stop: {states:?}",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGCONT after [`Proc::freeze`].
    pub fn thaw(&self) {
        signal(self.pid(), "CONT").expect("SIGCONT");
    }

    /// SIGKILL and reap.
    pub fn kill(self) {
        drop(self);
    }

    /// SIGKILLs the process, reaps it and returns everything it logged.
    pub fn stop_and_read_log(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::fs::read_to_string(&self.log_path).expect("read the process log")
    }

    /// Waits for the process to exit by itself; panics after `within`.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "process {} did not exit within {within:?}",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to end itself at fault point `point` (a `return` action: exit code
    /// `moonkv_node::failpoints::EXIT_CODE`, the point named on stderr); panics with its log if it
    /// exits otherwise or not within `within`.
    pub fn expect_failpoint_exit(&mut self, point: &str, within: Duration) {
        let status = self.wait_exit(within);
        let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        assert_eq!(
            status.code(),
            Some(moonkv_node::failpoints::EXIT_CODE),
            "process {} ended with {status} instead of at {point}: {}",
            self.pid(),
            log.trim()
        );
        assert!(
            log.contains(&format!("failpoint {point}: exiting")),
            "process {} exited with the fault-point code but not at {point}: {}",
            self.pid(),
            log.trim()
        );
    }

    /// Resident set size in KiB (`VmRSS` of /proc/PID/status).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS line")
    }
}

/// Runs `cmd` to completion with `stdin` as its whole input.
pub fn output_of(mut cmd: Command, stdin: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("wait for the command")
}

/// Sends `SIG<name>` to `pid` with kill(1).
pub fn signal(pid: u32, name: &str) -> Result<(), KitError> {
    let status = Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .map_err(KitError::io(format!("kill -s {name} {pid}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(KitError::Signal {
            signal: name.to_string(),
            pid,
        })
    }
}

/// `N` distinct loopback ports that were free a moment ago (for processes that must come back
/// on the same addresses); all are held at once, so they differ.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().expect("bound address").port())
}

/// One loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_bindable() {
        let ports: [u16; 4] = free_ports();
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 4, "{ports:?}");
        assert!(ports.iter().all(|&p| p != 0));
    }

    #[test]
    fn a_process_that_never_gets_ready_is_reported_with_its_log() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo not-json; echo the reason >&2"]);
        match Proc::start(cmd).err().expect("no ready line") {
            KitError::NotReady {
                first_line, log, ..
            } => assert!(
                first_line.contains("not-json") && log.contains("the reason"),
                "{first_line:?} {log:?}"
            ),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn the_ready_line_fields_are_read_and_a_missing_one_is_named() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            r#"echo '{"event":"ready","rpc":"127.0.0.1:9"}'; exec sleep 60"#,
        ]);
        let p = Proc::start(cmd).unwrap();
        assert_eq!(p.field("rpc"), "127.0.0.1:9");
        let missing = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.field("admin")));
        assert!(missing.is_err());
    }
}
