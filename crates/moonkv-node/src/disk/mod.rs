//! A node's disk tier: one directory, one file per disk replica (`format`), a byte budget.
//!
//! Files are written to `<id>.mkv.tmp`, synced, then renamed to `<id>.mkv`, so a crash never
//! leaves a half-written file under a final name; leftover `.tmp` files are removed at start.
//! Reads verify the header, the length and the payload checksum before a byte leaves the node.
//! The directory keeps its disk id in `moonkv-disk.id`, so a restarted node mounts the same disk
//! and can hand its files back to the master.

pub mod format;

use format::{FileHeader, FIXED_LEN, MAX_TENANT_LEN};
use moonkv_proto::types::DiskFile;
use moonkv_proto::{Error, ErrorCode, ReplicaId, Result, SegmentId, Uuid};
use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};
use std::io::{Read, Write};
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

/// Why a disk operation failed, as the data plane reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFault {
    /// No file with this id.
    NotFound,
    /// The file exists but its header, length or checksum is wrong.
    Corrupt,
    /// The disk budget has no room.
    Full,
    /// The file could not be read.
    ReadFailed,
    /// The file could not be written or synced.
    WriteFailed,
}

/// A disk directory served by a node.
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    id: SegmentId,
    capacity: u64,
    /// Bytes of files on disk plus writes in progress.
    used: AtomicU64,
    recently_deleted: Mutex<(HashSet<u64>, VecDeque<u64>)>,
}

fn fail(code: ErrorCode, message: String) -> Error {
    Error::new(code, message)
}

impl DiskStore {
    /// Opens `dir` with a budget of `capacity` bytes: checks that it exists and is writable,
    /// loads (or creates) its disk id, removes leftover temporary files and lists the replica
    /// files found (invalid ones are removed). Errors name the directory.
    pub fn open(dir: &Path, capacity: u64) -> Result<(DiskStore, Vec<DiskFile>)> {
        let shown = dir.display();
        if capacity == 0 {
            return Err(fail(
                ErrorCode::INVALID_PARAMS,
                format!("disk capacity for {shown} must be greater than zero"),
            ));
        }
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(fail(
                    ErrorCode::INVALID_PARAMS,
                    format!("disk directory {shown} is not a directory"),
                ))
            }
            Err(e) => {
                return Err(fail(
                    ErrorCode::FILE_NOT_FOUND,
                    format!("disk directory {shown} cannot be used: {e}"),
                ))
            }
        }
        probe_writable(dir)?;
        let id = load_or_create_id(dir)?;
        let store = DiskStore {
            dir: dir.to_path_buf(),
            id,
            capacity,
            used: AtomicU64::new(0),
            recently_deleted: Mutex::new((HashSet::new(), VecDeque::new())),
        };
        let (files, bytes) = store.scan(true)?;
        store.used.store(bytes, Ordering::Release);
        tracing::info!(dir = %shown, files = files.len(), bytes, capacity, "disk opened");
        Ok((store, files))
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
    pub fn scan(&self, cleanup: bool) -> Result<(Vec<DiskFile>, u64)> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| {
            fail(
                ErrorCode::FILE_READ_FAIL,
                format!("cannot list disk directory {}: {e}", self.dir.display()),
            )
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
    /// the remaining payload is still consumed (the caller's stream stays in step) and the
    /// fault is returned; an error of `source` itself is returned as `Err(Err(io))`.
    pub async fn write_from<R: AsyncRead + Unpin>(
        &self,
        file_id: u64,
        tenant: &str,
        key: &str,
        size: u64,
        source: &mut R,
    ) -> std::result::Result<(), std::result::Result<DiskFault, std::io::Error>> {
        let mut header = FileHeader {
            tenant: tenant.to_string(),
            key: key.to_string(),
            file_id,
            size,
            payload_crc: 0,
        };
        let charge = header.file_len();
        if tenant.len() > MAX_TENANT_LEN || key.len() > moonkv_proto::MAX_KEY_LEN {
            drain(source, size).await.map_err(Err)?;
            return Err(Ok(DiskFault::WriteFailed));
        }
        if !self.reserve(charge) {
            drain(source, size).await.map_err(Err)?;
            return Err(Ok(DiskFault::Full));
        }
        let tmp = self.tmp_path_of(file_id);
        let written = self.write_tmp(&tmp, &mut header, source).await;
        let result = match written {
            Ok(()) => self.publish(&tmp, file_id).await,
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
    ) -> std::result::Result<(), std::result::Result<DiskFault, std::io::Error>> {
        let mut file = match tokio::fs::File::create(tmp).await {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(file = %tmp.display(), error = %e, "cannot create replica file");
                None
            }
        };
        if let Some(f) = file.as_mut() {
            if f.write_all(&header.encode()).await.is_err() {
                file = None;
            }
        }
        let mut crc = crc32fast::Hasher::new();
        let mut buf = vec![0u8; STEP.min(header.size as usize).max(1)];
        let mut left = header.size;
        while left > 0 {
            let take = left.min(buf.len() as u64) as usize;
            source.read_exact(&mut buf[..take]).await.map_err(Err)?;
            left -= take as u64;
            crc.update(&buf[..take]);
            if let Some(f) = file.as_mut() {
                if let Err(e) = f.write_all(&buf[..take]).await {
                    tracing::warn!(file = %tmp.display(), error = %e, "replica file write failed");
                    file = None;
                }
            }
        }
        let Some(mut f) = file else {
            return Err(Ok(DiskFault::WriteFailed));
        };
        header.payload_crc = crc.finalize();
        let finished = async {
            f.seek(std::io::SeekFrom::Start(0)).await?;
            f.write_all(&header.encode()).await?;
            f.sync_all().await
        }
        .await;
        finished.map_err(|e| {
            tracing::warn!(file = %tmp.display(), error = %e, "replica file sync failed");
            Ok(DiskFault::WriteFailed)
        })
    }

    /// Renames the synced temporary file to its final name.
    async fn publish(
        &self,
        tmp: &Path,
        file_id: u64,
    ) -> std::result::Result<(), std::result::Result<DiskFault, std::io::Error>> {
        let path = self.path_of(file_id);
        if let Ok(old) = tokio::fs::metadata(&path).await {
            self.release(old.len());
        }
        tokio::fs::rename(tmp, &path)
            .await
            .map_err(|_| Ok(DiskFault::WriteFailed))?;
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
    pub async fn read_verified(
        &self,
        file_id: u64,
        size: u64,
    ) -> std::result::Result<Vec<u8>, DiskFault> {
        let path = self.path_of(file_id);
        tokio::task::spawn_blocking(move || read_file(&path, file_id, size))
            .await
            .unwrap_or(Err(DiskFault::ReadFailed))
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

    fn was_deleted(&self, file_id: u64) -> bool {
        self.recently_deleted.lock().0.contains(&file_id)
    }
}

/// Reads and discards `len` bytes.
async fn drain<R: AsyncRead + Unpin>(source: &mut R, len: u64) -> std::io::Result<()> {
    let copied = tokio::io::copy(&mut source.take(len), &mut tokio::io::sink()).await?;
    if copied < len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
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

fn read_file(path: &Path, file_id: u64, size: u64) -> std::result::Result<Vec<u8>, DiskFault> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(DiskFault::NotFound),
        Err(_) => return Err(DiskFault::ReadFailed),
    };
    let len = file.metadata().map_err(|_| DiskFault::ReadFailed)?.len();
    let mut fixed = [0u8; FIXED_LEN];
    file.read_exact(&mut fixed)
        .map_err(|_| DiskFault::Corrupt)?;
    let (t, k) = FileHeader::variable_len(&fixed).ok_or(DiskFault::Corrupt)?;
    let mut variable = vec![0u8; t + k];
    file.read_exact(&mut variable)
        .map_err(|_| DiskFault::Corrupt)?;
    let header = FileHeader::decode(&fixed, &variable).ok_or(DiskFault::Corrupt)?;
    if header.file_id != file_id || header.size != size || header.file_len() != len {
        return Err(DiskFault::Corrupt);
    }
    let size = usize::try_from(size).map_err(|_| DiskFault::ReadFailed)?;
    let mut data = Vec::new();
    data.try_reserve_exact(size)
        .map_err(|_| DiskFault::ReadFailed)?;
    data.resize(size, 0);
    file.read_exact(&mut data).map_err(|_| DiskFault::Corrupt)?;
    if crc32fast::hash(&data) != header.payload_crc {
        tracing::warn!(file = %path.display(), "replica file checksum mismatch");
        return Err(DiskFault::Corrupt);
    }
    Ok(data)
}

fn probe_writable(dir: &Path) -> Result<()> {
    let probe = dir.join(".moonkv-write-probe");
    let attempt = std::fs::File::create(&probe)
        .and_then(|mut f| f.write_all(b"probe"))
        .and_then(|()| std::fs::remove_file(&probe));
    attempt.map_err(|e| {
        fail(
            ErrorCode::FILE_WRITE_FAIL,
            format!("disk directory {} is not writable: {e}", dir.display()),
        )
    })
}

fn load_or_create_id(dir: &Path) -> Result<SegmentId> {
    let path = dir.join(ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Uuid::parse(text.trim()).map(SegmentId).ok_or_else(|| {
            fail(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{} does not hold a disk id; remove it to give the directory a new identity",
                    path.display()
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = SegmentId(moonkv_client::util::random_client_id().0);
            let tmp = dir.join(format!("{ID_FILE}.tmp"));
            std::fs::write(&tmp, format!("{id}\n"))
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|e| {
                    fail(
                        ErrorCode::FILE_WRITE_FAIL,
                        format!("cannot write {}: {e}", path.display()),
                    )
                })?;
            Ok(id)
        }
        Err(e) => Err(fail(
            ErrorCode::FILE_READ_FAIL,
            format!("cannot read {}: {e}", path.display()),
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests;
