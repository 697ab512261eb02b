//! Why the disk tier failed: the directory as a whole ([`DiskError`], told to the operator when
//! the node starts, as an [`ErrorCode`]) or one replica file ([`FileError`], answered to the
//! caller as a data-plane status through its [`DiskFault`]).

use moonkv_proto::{Error, ErrorCode};
use std::io;
use std::path::PathBuf;

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

/// A disk directory that cannot be used (or listed).
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The budget is zero bytes.
    #[error("disk capacity for {} must be greater than zero", dir.display())]
    ZeroCapacity {
        /// The directory.
        dir: PathBuf,
    },
    /// The path exists but is a file.
    #[error("disk directory {} is not a directory", dir.display())]
    NotADirectory {
        /// The path.
        dir: PathBuf,
    },
    /// The path cannot be looked up (usually: it does not exist).
    #[error("disk directory {} cannot be used", dir.display())]
    Unusable {
        /// The path.
        dir: PathBuf,
        /// Why the lookup failed.
        #[source]
        source: io::Error,
    },
    /// A probe file cannot be created, written or removed.
    #[error("disk directory {} is not writable", dir.display())]
    NotWritable {
        /// The directory.
        dir: PathBuf,
        /// Why the probe failed.
        #[source]
        source: io::Error,
    },
    /// The directory cannot be listed.
    #[error("cannot list disk directory {}", dir.display())]
    List {
        /// The directory.
        dir: PathBuf,
        /// Why listing failed.
        #[source]
        source: io::Error,
    },
    /// The disk id file holds something else than a disk id.
    #[error(
        "{} does not hold a disk id; remove it to give the directory a new identity",
        path.display()
    )]
    BadId {
        /// The id file.
        path: PathBuf,
    },
    /// The disk id file cannot be read.
    #[error("cannot read {}", path.display())]
    ReadId {
        /// The id file.
        path: PathBuf,
        /// Why reading failed.
        #[source]
        source: io::Error,
    },
    /// The lock file cannot be opened or locked.
    #[error("cannot lock {}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Another node serves the directory.
    #[error(
        "disk directory {} is in use by another node ({holder}); one directory is served by one node at a time",
        dir.display()
    )]
    InUse {
        /// The directory.
        dir: PathBuf,
        /// Who holds the lock, as its lock file says.
        holder: String,
    },
    /// The budget exceeds what the filesystem can hold.
    #[error(
        "--disk-capacity {} ({capacity} bytes) exceeds the space available for {}: {} ({available} bytes: {free} free on the filesystem plus {existing} in replica files already there)",
        moonkv_proto::units::format_size(*capacity),
        dir.display(),
        moonkv_proto::units::format_size(*available)
    )]
    CapacityAboveFree {
        /// The directory.
        dir: PathBuf,
        /// The budget asked for.
        capacity: u64,
        /// Free space plus existing files.
        available: u64,
        /// Free space on the filesystem.
        free: u64,
        /// Bytes of replica files found.
        existing: u64,
    },
    /// The filesystem's free space cannot be read.
    #[error("cannot read the free space of {}", dir.display())]
    FreeSpace {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A new disk id cannot be stored.
    #[error("cannot write {}", path.display())]
    WriteId {
        /// The id file.
        path: PathBuf,
        /// Why writing failed.
        #[source]
        source: io::Error,
    },
}

impl DiskError {
    /// The upstream-compatible code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            DiskError::ZeroCapacity { .. }
            | DiskError::NotADirectory { .. }
            | DiskError::BadId { .. }
            | DiskError::CapacityAboveFree { .. } => ErrorCode::INVALID_PARAMS,
            DiskError::InUse { .. } | DiskError::Lock { .. } => ErrorCode::FILE_LOCK_FAIL,
            DiskError::FreeSpace { .. } => ErrorCode::FILE_OPEN_FAIL,
            DiskError::Unusable { .. } => ErrorCode::FILE_NOT_FOUND,
            DiskError::NotWritable { .. } | DiskError::WriteId { .. } => ErrorCode::FILE_WRITE_FAIL,
            DiskError::List { .. } | DiskError::ReadId { .. } => ErrorCode::FILE_READ_FAIL,
        }
    }
}

impl From<DiskError> for Error {
    fn from(e: DiskError) -> Self {
        Error::new(e.code(), with_cause(&e))
    }
}

/// One replica file that cannot be served or stored.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// No file with the requested id.
    #[error("replica file {} does not exist", path.display())]
    NotFound {
        /// Where the file would be.
        path: PathBuf,
    },
    /// The file does not hold what was asked for, or fails its checksum.
    #[error("replica file {} is corrupt: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Which check failed.
        reason: &'static str,
    },
    /// The file ends before its header or payload does.
    #[error("replica file {} is truncated", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The failed read.
        #[source]
        source: io::Error,
    },
    /// The disk budget has no room for the file.
    #[error("the disk budget of {capacity} bytes has no room for {needed} more")]
    Full {
        /// Bytes the file needs.
        needed: u64,
        /// The budget.
        capacity: u64,
    },
    /// The tenant or key is longer than a file header can carry.
    #[error("tenant ({tenant_len} bytes) or key ({key_len} bytes) too long for a replica file")]
    NameTooLong {
        /// Tenant length.
        tenant_len: usize,
        /// Key length.
        key_len: usize,
    },
    /// The file cannot be opened or read.
    #[error("cannot read replica file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why reading failed.
        #[source]
        source: io::Error,
    },
    /// The file cannot be created, written, synced or renamed into place.
    #[error("cannot write replica file {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why writing failed.
        #[source]
        source: io::Error,
    },
}

impl FileError {
    /// How the data plane answers this error.
    pub fn fault(&self) -> DiskFault {
        match self {
            FileError::NotFound { .. } => DiskFault::NotFound,
            FileError::Corrupt { .. } | FileError::Truncated { .. } => DiskFault::Corrupt,
            FileError::Full { .. } => DiskFault::Full,
            FileError::Read { .. } => DiskFault::ReadFailed,
            FileError::NameTooLong { .. } | FileError::Write { .. } => DiskFault::WriteFailed,
        }
    }
}

/// Why [`super::DiskStore::write_from`] failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The disk refused or failed the file; the payload was consumed all the same, so the
    /// caller's stream is still in step.
    #[error(transparent)]
    Disk(#[from] FileError),
    /// Reading the payload from the caller failed; the stream is out of step.
    #[error("reading the payload failed")]
    Payload(#[source] io::Error),
}

/// The error's text followed by its immediate cause, as one line for an operator or a log.
pub fn with_cause(e: &dyn std::error::Error) -> String {
    match e.source() {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}
