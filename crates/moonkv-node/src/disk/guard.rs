//! Ownership and honesty of a disk directory: an exclusive lock held for as long as the node
//! serves it (a second node on the same directory fails at start, naming the holder), and the
//! filesystem's free space, which bounds the byte budget a node may promise.

use super::DiskError;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Name of the lock file; it holds the holder's pid and data-plane endpoint.
pub const LOCK_FILE: &str = "moonkv-disk.lock";

/// How long a node waits for a lock held by its own process (an earlier node of this process
/// still shutting down on the same directory).
const SAME_PROCESS_WAIT: Duration = Duration::from_secs(5);

/// The exclusive lock on a disk directory; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct DirLock {
    file: File,
}

impl DirLock {
    /// Takes the lock of `dir`, or fails naming who holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, DiskError> {
        let path = dir.join(LOCK_FILE);
        let unusable = |source| DiskError::Lock {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(unusable)?;
        let started = Instant::now();
        loop {
            match try_lock(&file) {
                Ok(true) => break,
                Ok(false) => {
                    let holder = read_holder(&path);
                    let ours = holder_pid(&holder) == Some(std::process::id());
                    if ours && started.elapsed() < SAME_PROCESS_WAIT {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    return Err(DiskError::InUse {
                        dir: dir.to_path_buf(),
                        holder: if holder.is_empty() {
                            "an unknown process".into()
                        } else {
                            holder
                        },
                    });
                }
                Err(e) => return Err(unusable(e)),
            }
        }
        let mut lock = DirLock { file };
        lock.record(None).map_err(unusable)?;
        Ok(lock)
    }

    /// Writes the holder (this process, and its data-plane endpoint once known) into the file.
    pub fn record(&mut self, endpoint: Option<&str>) -> io::Result<()> {
        let mut text = format!("pid {}", std::process::id());
        if let Some(endpoint) = endpoint {
            text.push_str(&format!(", data plane {endpoint}"));
        }
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(text.as_bytes())?;
        self.file.write_all(b"\n")?;
        self.file.sync_data()
    }
}

/// An exclusive, non-blocking `flock` on `file`: false when another open file holds it.
fn try_lock(file: &File) -> io::Result<bool> {
    use rustix::fs::{flock, FlockOperation};
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn read_holder(path: &Path) -> String {
    let mut text = String::new();
    let _ = File::open(path).and_then(|mut f| f.read_to_string(&mut text));
    text.trim().chars().take(200).collect()
}

fn holder_pid(holder: &str) -> Option<u32> {
    let rest = holder.strip_prefix("pid ")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Bytes an unprivileged writer may still use on the filesystem holding `dir`.
pub fn free_space(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let stat = rustix::fs::statvfs(path.as_c_str())?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_pids_are_read_back() {
        assert_eq!(holder_pid("pid 42, data plane 127.0.0.1:9"), Some(42));
        assert_eq!(holder_pid("pid 7"), Some(7));
        assert_eq!(holder_pid("garbage"), None);
    }

    #[test]
    fn a_held_lock_is_refused_without_waiting_and_free_once_released() {
        let path = std::env::temp_dir().join(format!("moonkv-flock-{}", std::process::id()));
        let open = || File::create(&path).unwrap();
        let (first, second) = (open(), open());
        assert!(try_lock(&first).unwrap());
        assert!(!try_lock(&second).unwrap(), "held by another open file");
        drop(first);
        assert!(try_lock(&second).unwrap());
        drop(second);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn free_space_is_reported_and_bad_paths_fail() {
        let here = std::env::temp_dir();
        assert!(free_space(&here).unwrap() > 0);
        assert!(free_space(Path::new("/definitely/not/here")).is_err());
        let nul = free_space(Path::new("bad\0path")).unwrap_err();
        assert_eq!(nul.kind(), io::ErrorKind::InvalidInput);
    }
}
