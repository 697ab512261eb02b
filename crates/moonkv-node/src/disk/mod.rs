//! A node's disk tier: one directory, one file per disk replica (`format`), a byte budget.
//!
//! Files are written to `<id>.mkv.tmp`, synced, then renamed to `<id>.mkv`, so a crash never
//! leaves a half-written file under a final name; leftover `.tmp` files are removed at start.
//! Reads verify the header, the length and the payload checksum before a byte leaves the node.
//! The directory keeps its disk id in `moonkv-disk.id`, so a restarted node mounts the same disk
//! and can hand its files back to the master.

mod error;
pub mod format;
pub mod guard;

pub use error::{with_cause, DiskError, DiskFault, FileError, WriteError};
use format::{FileHeader, FIXED_LEN, MAX_TENANT_LEN};
use moonkv_proto::types::DiskFile;
use moonkv_proto::{ReplicaId, SegmentId, Uuid};
use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// Name of the file holding the disk id.
pub const ID_FILE: &str = "moonkv-disk.id";
const FILE_SUFFIX: &str = ".mkv";
const TMP_SUFFIX: &str = ".mkv.tmp";
/// File ids deleted recently, remembered so a write finishing after its deletion is undone.
const RECENT_DELETIONS: usize = 1 << 16;
/// Bytes moved per step between the socket and the file.
const STEP: usize = 1 << 20;

/// A disk directory served by a node.
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    id: SegmentId,
    capacity: u64,
    /// Bytes of files on disk plus writes in progress.
    used: AtomicU64,
    recently_deleted: Mutex<(HashSet<u64>, VecDeque<u64>)>,
    /// Held while the store lives: no other node serves this directory.
    lock: Mutex<guard::DirLock>,
}

impl DiskStore {
    /// Opens `dir` with a budget of `capacity` bytes: checks that it exists and is writable,
    /// loads (or creates) its disk id, removes leftover temporary files and lists the replica
    /// files found (invalid ones are removed). Errors name the directory.
    pub fn open(dir: &Path, capacity: u64) -> Result<(DiskStore, Vec<DiskFile>), DiskError> {
        let shown = dir.display();
        if capacity == 0 {
            return Err(DiskError::ZeroCapacity { dir: dir.into() });
        }
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(DiskError::NotADirectory { dir: dir.into() }),
            Err(source) => {
                return Err(DiskError::Unusable {
                    dir: dir.into(),
                    source,
                })
            }
        }
        probe_writable(dir)?;
        let lock = guard::DirLock::acquire(dir)?;
        let id = load_or_create_id(dir)?;
        let store = DiskStore {
            dir: dir.to_path_buf(),
            id,
            capacity,
            used: AtomicU64::new(0),
            recently_deleted: Mutex::new((HashSet::new(), VecDeque::new())),
            lock: Mutex::new(lock),
        };
        let (files, bytes) = store.scan(true)?;
        let free = guard::free_space(dir).map_err(|source| DiskError::FreeSpace {
            dir: dir.into(),
            source,
        })?;
        let available = free.saturating_add(bytes);
        if capacity > available {
            return Err(DiskError::CapacityAboveFree {
                dir: dir.into(),
                capacity,
                available,
                free,
                existing: bytes,
            });
        }
        store.used.store(bytes, Ordering::Release);
        tracing::info!(dir = %shown, files = files.len(), bytes, capacity, "disk opened");
        Ok((store, files))
    }

    /// Names this node's data-plane endpoint in the lock file, for the error a second node on
    /// the directory gets.
    pub fn record_holder(&self, endpoint: &str) {
        if let Err(e) = self.lock.lock().record(Some(endpoint)) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot update the lock file");
        }
    }

    /// The disk id (persisted in the directory).
    pub fn id(&self) -> SegmentId {
        self.id
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The byte budget.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes in use (files and writes in progress).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Lists valid replica files; with `cleanup`, removes temporary and invalid files. Returns
    /// the files and their total size.
    pub fn scan(&self, cleanup: bool) -> Result<(Vec<DiskFile>, u64), DiskError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|source| DiskError::List {
            dir: self.dir.clone(),
            source,
        })?;
        let mut files = Vec::new();
        let mut bytes = 0u64;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let path = entry.path();
            if name.ends_with(TMP_SUFFIX) {
                if cleanup {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            let Some(file_id) = parse_file_name(name) else {
                continue;
            };
            match read_header(&path) {
                Some((header, len)) if header.file_id == file_id && len == header.file_len() => {
                    bytes += len;
                    files.push(DiskFile {
                        tenant: header.tenant,
                        key: header.key,
                        size: header.size,
                        replica_id: ReplicaId(file_id),
                    });
                }
                _ if cleanup => {
                    tracing::warn!(file = %path.display(), "removing an invalid replica file");
                    let _ = std::fs::remove_file(&path);
                }
                _ => {}
            }
        }
        files.sort_by_key(|f| f.replica_id);
        Ok((files, bytes))
    }

    fn path_of(&self, file_id: u64) -> PathBuf {
        self.dir.join(format!("{file_id:016x}{FILE_SUFFIX}"))
    }

    fn tmp_path_of(&self, file_id: u64) -> PathBuf {
        self.dir.join(format!("{file_id:016x}{TMP_SUFFIX}"))
    }

    fn reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|t| *t <= self.capacity)
            })
            .is_ok()
    }

    fn release(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(bytes))
            });
    }

    /// Writes file `file_id` with `size` payload bytes taken from `source`. On a disk failure
    /// the remaining payload is still consumed, so the caller's stream stays in step
    /// ([`WriteError::Disk`]); only a failure of `source` itself leaves it out of step
    /// ([`WriteError::Payload`]).
    pub async fn write_from<R: AsyncRead + Unpin>(
        &self,
        file_id: u64,
        tenant: &str,
        key: &str,
        size: u64,
        source: &mut R,
    ) -> Result<(), WriteError> {
        let mut header = FileHeader {
            tenant: tenant.to_string(),
            key: key.to_string(),
            file_id,
            size,
            payload_crc: 0,
        };
        let charge = header.file_len();
        if tenant.len() > MAX_TENANT_LEN || key.len() > moonkv_proto::MAX_KEY_LEN {
            drain(source, size).await.map_err(WriteError::Payload)?;
            return Err(FileError::NameTooLong {
                tenant_len: tenant.len(),
                key_len: key.len(),
            }
            .into());
        }
        if !self.reserve(charge) {
            drain(source, size).await.map_err(WriteError::Payload)?;
            return Err(FileError::Full {
                needed: charge,
                capacity: self.capacity,
            }
            .into());
        }
        let tmp = self.tmp_path_of(file_id);
        let written = self.write_tmp(&tmp, &mut header, source).await;
        let result = match written {
            Ok(()) => self.publish(&tmp, file_id).await.map_err(WriteError::from),
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.release(charge);
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        result
    }

    async fn write_tmp<R: AsyncRead + Unpin>(
        &self,
        tmp: &Path,
        header: &mut FileHeader,
        source: &mut R,
    ) -> Result<(), WriteError> {
        // After a file error the payload keeps being read (see `write_from`); the first error
        // is what the caller is told.
        let mut file = tokio::fs::File::create(tmp).await.inspect_err(|e| {
            tracing::warn!(file = %tmp.display(), error = %e, "cannot create replica file");
        });
        if let Ok(f) = &mut file {
            if let Err(e) = f.write_all(&header.encode()).await {
                file = Err(e);
            }
        }
        let mut crc = crc32fast::Hasher::new();
        let mut buf = vec![0u8; STEP.min(header.size as usize).max(1)];
        let mut left = header.size;
        while left > 0 {
            let take = left.min(buf.len() as u64) as usize;
            source
                .read_exact(&mut buf[..take])
                .await
                .map_err(WriteError::Payload)?;
            left -= take as u64;
            crc.update(&buf[..take]);
            if let Ok(f) = &mut file {
                if let Err(e) = f.write_all(&buf[..take]).await {
                    tracing::warn!(file = %tmp.display(), error = %e, "replica file write failed");
                    file = Err(e);
                }
            }
        }
        let write_failed = |source| FileError::Write {
            path: tmp.to_path_buf(),
            source,
        };
        let mut f = file.map_err(write_failed)?;
        header.payload_crc = crc.finalize();
        let finished = async {
            f.seek(io::SeekFrom::Start(0)).await?;
            f.write_all(&header.encode()).await?;
            f.sync_all().await
        }
        .await;
        finished.map_err(|e| {
            tracing::warn!(file = %tmp.display(), error = %e, "replica file sync failed");
            write_failed(e).into()
        })
    }

    /// Renames the synced temporary file to its final name.
    async fn publish(&self, tmp: &Path, file_id: u64) -> Result<(), FileError> {
        let path = self.path_of(file_id);
        crate::failpoints::hit(crate::failpoints::DISK_BEFORE_RENAME);
        if let Ok(old) = tokio::fs::metadata(&path).await {
            self.release(old.len());
        }
        if let Err(source) = tokio::fs::rename(tmp, &path).await {
            return Err(FileError::Write { path, source });
        }
        if let Ok(dir) = tokio::fs::File::open(&self.dir).await {
            let _ = dir.sync_all().await;
        }
        if self.was_deleted(file_id) {
            // The master removed this replica while it was being written.
            self.delete(file_id);
        }
        Ok(())
    }

    /// Reads file `file_id`, which must hold exactly `size` payload bytes, verifying its header
    /// and checksum before returning any byte.
    pub async fn read_verified(&self, file_id: u64, size: u64) -> Result<Vec<u8>, FileError> {
        let path = self.path_of(file_id);
        let shown = path.clone();
        tokio::task::spawn_blocking(move || read_file(&path, file_id, size))
            .await
            .unwrap_or_else(|joined| {
                Err(FileError::Read {
                    path: shown,
                    source: io::Error::other(joined),
                })
            })
    }

    /// Opens file `file_id` for a streamed read of exactly `size` payload bytes: its header and
    /// length are verified now, its payload checksum by the caller as it streams
    /// ([`FileStream`]).
    pub async fn open_stream(&self, file_id: u64, size: u64) -> Result<FileStream, FileError> {
        let path = self.path_of(file_id);
        let shown = path.clone();
        let opened = tokio::task::spawn_blocking(move || open_checked(&path, file_id, size))
            .await
            .unwrap_or_else(|joined| {
                Err(FileError::Read {
                    path: shown,
                    source: io::Error::other(joined),
                })
            })?;
        let (file, header, path) = opened;
        Ok(FileStream {
            file: tokio::fs::File::from_std(file),
            left: header.size,
            crc: crc32fast::Hasher::new(),
            expected: header.payload_crc,
            path,
        })
    }

    /// Deletes file `file_id` (a missing file is fine) and remembers the id for a while.
    pub fn delete(&self, file_id: u64) {
        {
            let mut recent = self.recently_deleted.lock();
            if recent.0.insert(file_id) {
                recent.1.push_back(file_id);
                if recent.1.len() > RECENT_DELETIONS {
                    if let Some(old) = recent.1.pop_front() {
                        recent.0.remove(&old);
                    }
                }
            }
        }
        let path = self.path_of(file_id);
        if let Ok(meta) = std::fs::metadata(&path) {
            if std::fs::remove_file(&path).is_ok() {
                self.release(meta.len());
            }
        }
    }

    /// Deletes every file in `ids`, then syncs the directory so the removals survive a crash.
    pub async fn delete_all(&self, ids: &[u64]) {
        for id in ids {
            self.delete(*id);
        }
        match tokio::fs::File::open(&self.dir).await {
            Ok(dir) => {
                if let Err(e) = dir.sync_all().await {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "directory sync after deletions failed");
                }
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot open the directory to sync it")
            }
        }
    }

    fn was_deleted(&self, file_id: u64) -> bool {
        self.recently_deleted.lock().0.contains(&file_id)
    }
}

/// Reads and discards `len` bytes.
async fn drain<R: AsyncRead + Unpin>(source: &mut R, len: u64) -> io::Result<()> {
    let copied = tokio::io::copy(&mut source.take(len), &mut tokio::io::sink()).await?;
    if copied < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "payload ended early",
        ));
    }
    Ok(())
}

fn parse_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(FILE_SUFFIX)?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
        .filter(|id| *id != 0)
}

/// The verified header of a file and the file's length.
fn read_header(path: &Path) -> Option<(FileHeader, u64)> {
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let mut fixed = [0u8; FIXED_LEN];
    file.read_exact(&mut fixed).ok()?;
    let (t, k) = FileHeader::variable_len(&fixed)?;
    let mut variable = vec![0u8; t + k];
    file.read_exact(&mut variable).ok()?;
    Some((FileHeader::decode(&fixed, &variable)?, len))
}

/// A replica file being read in steps; the payload checksum is computed as it goes and checked
/// by [`FileStream::finish`].
#[derive(Debug)]
pub struct FileStream {
    file: tokio::fs::File,
    left: u64,
    crc: crc32fast::Hasher,
    expected: u32,
    path: PathBuf,
}

impl FileStream {
    /// Reads the next step of the payload into `buf` (at most its length); an empty slice once
    /// the payload is done.
    pub async fn next<'b>(&mut self, buf: &'b mut [u8]) -> Result<&'b [u8], FileError> {
        let take = (self.left.min(buf.len() as u64)) as usize;
        let chunk = &mut buf[..take];
        if let Err(source) = self.file.read_exact(chunk).await {
            return Err(FileError::Truncated {
                path: self.path.clone(),
                source,
            });
        }
        self.left -= take as u64;
        self.crc.update(chunk);
        Ok(chunk)
    }

    /// Payload bytes not read yet.
    pub fn remaining(&self) -> u64 {
        self.left
    }

    /// Checks the payload checksum once every byte was read.
    pub fn finish(self) -> Result<(), FileError> {
        if self.left == 0 && self.crc.finalize() == self.expected {
            return Ok(());
        }
        tracing::warn!(file = %self.path.display(), "replica file checksum mismatch");
        Err(FileError::Corrupt {
            path: self.path,
            reason: "payload checksum mismatch",
        })
    }
}

/// Opens a replica file and verifies its header and length against the request; the file is
/// left positioned at the payload.
fn open_checked(
    path: &Path,
    file_id: u64,
    size: u64,
) -> Result<(std::fs::File, FileHeader, PathBuf), FileError> {
    let unreadable = |source| FileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let truncated = |source| FileError::Truncated {
        path: path.to_path_buf(),
        source,
    };
    let corrupt = |reason| FileError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(FileError::NotFound {
                path: path.to_path_buf(),
            })
        }
        Err(e) => return Err(unreadable(e)),
    };
    let len = file.metadata().map_err(unreadable)?.len();
    let mut fixed = [0u8; FIXED_LEN];
    file.read_exact(&mut fixed).map_err(truncated)?;
    let (t, k) =
        FileHeader::variable_len(&fixed).ok_or_else(|| corrupt("not a replica file header"))?;
    let mut variable = vec![0u8; t + k];
    file.read_exact(&mut variable).map_err(truncated)?;
    let header =
        FileHeader::decode(&fixed, &variable).ok_or_else(|| corrupt("header checksum mismatch"))?;
    if header.file_id != file_id || header.size != size || header.file_len() != len {
        return Err(corrupt("header does not match the file or the request"));
    }
    Ok((file, header, path.to_path_buf()))
}

fn read_file(path: &Path, file_id: u64, size: u64) -> Result<Vec<u8>, FileError> {
    let unreadable = |source| FileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let truncated = |source| FileError::Truncated {
        path: path.to_path_buf(),
        source,
    };
    let corrupt = |reason| FileError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(FileError::NotFound {
                path: path.to_path_buf(),
            })
        }
        Err(e) => return Err(unreadable(e)),
    };
    let len = file.metadata().map_err(unreadable)?.len();
    let mut fixed = [0u8; FIXED_LEN];
    file.read_exact(&mut fixed).map_err(truncated)?;
    let (t, k) =
        FileHeader::variable_len(&fixed).ok_or_else(|| corrupt("not a replica file header"))?;
    let mut variable = vec![0u8; t + k];
    file.read_exact(&mut variable).map_err(truncated)?;
    let header =
        FileHeader::decode(&fixed, &variable).ok_or_else(|| corrupt("header checksum mismatch"))?;
    if header.file_id != file_id || header.size != size || header.file_len() != len {
        return Err(corrupt("header does not match the file or the request"));
    }
    let size = usize::try_from(size).map_err(|e| unreadable(io::Error::other(e)))?;
    let mut data = Vec::new();
    data.try_reserve_exact(size)
        .map_err(|e| unreadable(io::Error::new(io::ErrorKind::OutOfMemory, e)))?;
    data.resize(size, 0);
    file.read_exact(&mut data).map_err(truncated)?;
    if crc32fast::hash(&data) != header.payload_crc {
        tracing::warn!(file = %path.display(), "replica file checksum mismatch");
        return Err(corrupt("payload checksum mismatch"));
    }
    Ok(data)
}

fn probe_writable(dir: &Path) -> Result<(), DiskError> {
    let probe = dir.join(".moonkv-write-probe");
    let attempt = std::fs::File::create(&probe)
        .and_then(|mut f| f.write_all(b"probe"))
        .and_then(|()| std::fs::remove_file(&probe));
    attempt.map_err(|source| DiskError::NotWritable {
        dir: dir.to_path_buf(),
        source,
    })
}

fn load_or_create_id(dir: &Path) -> Result<SegmentId, DiskError> {
    let path = dir.join(ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Uuid::parse(text.trim())
            .map(SegmentId)
            .ok_or(DiskError::BadId { path }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let id = SegmentId::random();
            let tmp = dir.join(format!("{ID_FILE}.tmp"));
            let written =
                std::fs::write(&tmp, format!("{id}\n")).and_then(|()| std::fs::rename(&tmp, &path));
            match written {
                Ok(()) => Ok(id),
                Err(source) => Err(DiskError::WriteId { path, source }),
            }
        }
        Err(source) => Err(DiskError::ReadId { path, source }),
    }
}

#[cfg(test)]
pub(crate) mod tests;
