//! The disk store against a real directory: round trips, restart listing, and every way a file
//! can be bad (missing, truncated, corrupted, wrong size), a full budget, failing writes and
//! payloads, and unusable directories.

use super::*;
use moonkv_proto::ErrorCode;
use std::sync::atomic::AtomicUsize;

/// A fresh directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!(
            "moonkv-disk-{tag}-{}-{n}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn payload(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8)
        .collect()
}

async fn write(
    store: &DiskStore,
    id: u64,
    key: &str,
    data: &[u8],
) -> std::result::Result<(), DiskFault> {
    let mut source = data;
    store
        .write_from(id, "t", key, data.len() as u64, &mut source)
        .await
        .map_err(|e| match e {
            WriteError::Disk(e) => e.fault(),
            WriteError::Payload(e) => panic!("the source is a slice: {e}"),
        })
}

/// Why reading file `id` of `size` bytes is refused.
async fn refusal(store: &DiskStore, id: u64, size: u64) -> FileError {
    match store.read_verified(id, size).await {
        Ok(_) => panic!("file {id} was served"),
        Err(e) => e,
    }
}

/// Reads file `id` of `size` bytes; the fault of a refusal.
async fn read(store: &DiskStore, id: u64, size: u64) -> std::result::Result<Vec<u8>, DiskFault> {
    store.read_verified(id, size).await.map_err(|e| e.fault())
}

#[tokio::test]
async fn files_round_trip_and_are_listed_after_a_restart() {
    let dir = TempDir::new("round");
    let (store, files) = DiskStore::open(&dir.0, 1 << 30).unwrap();
    assert!(files.is_empty());
    let data = payload(3 << 20);
    write(&store, 7, "k/1", &data).await.unwrap();
    write(&store, 8, "k/2", b"x").await.unwrap();
    assert_eq!(read(&store, 7, data.len() as u64).await.unwrap(), data);
    assert_eq!(read(&store, 8, 1).await.unwrap(), b"x");
    let used = store.used();
    assert!(used > data.len() as u64);
    let id = store.id();
    drop(store);

    let (again, files) = DiskStore::open(&dir.0, 1 << 30).unwrap();
    assert_eq!(again.id(), id, "the disk id is kept in the directory");
    assert_eq!(again.used(), used);
    let listed: Vec<(String, String, u64, u64)> = files
        .into_iter()
        .map(|f| (f.tenant, f.key, f.size, f.replica_id.0))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("t".into(), "k/1".into(), data.len() as u64, 7),
            ("t".into(), "k/2".into(), 1, 8)
        ]
    );
    again.delete(7);
    again.delete(7);
    assert_eq!(
        read(&again, 7, data.len() as u64).await,
        Err(DiskFault::NotFound)
    );
    assert!(again.used() < 4096);
}

#[tokio::test]
async fn bad_files_are_refused_never_served() {
    let dir = TempDir::new("bad");
    let (store, _) = DiskStore::open(&dir.0, 1 << 30).unwrap();
    let data = payload(100_000);
    for id in 1..=4 {
        write(&store, id, "k", &data).await.unwrap();
    }
    let path = |id: u64| store.path_of(id);
    // A flipped payload byte.
    let mut bytes = std::fs::read(path(1)).unwrap();
    let at = bytes.len() - 500;
    bytes[at] ^= 1;
    std::fs::write(path(1), &bytes).unwrap();
    // A truncated file.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path(2))
        .unwrap();
    f.set_len(50_000).unwrap();
    // A damaged header.
    let mut bytes = std::fs::read(path(3)).unwrap();
    bytes[21] ^= 0x40;
    std::fs::write(path(3), &bytes).unwrap();

    let size = data.len() as u64;
    // Each bad file is refused as corrupt, by the check meant to catch it.
    let cases = [
        (1, "payload checksum mismatch"),
        // The length check catches a truncated file before its payload is read.
        (2, "header does not match the file or the request"),
        (3, "header checksum mismatch"),
    ];
    for (id, why) in cases {
        let refused = refusal(&store, id, size).await;
        assert_eq!(refused.fault(), DiskFault::Corrupt, "file {id}");
        assert!(
            matches!(refused, FileError::Corrupt { reason, .. } if reason == why),
            "file {id}: {refused}"
        );
    }
    assert_eq!(
        read(&store, 4, size - 1).await,
        Err(DiskFault::Corrupt),
        "size mismatch"
    );
    let missing = refusal(&store, 9, size).await;
    assert_eq!(missing.fault(), DiskFault::NotFound);
    assert!(
        missing.to_string().contains("0000000000000009.mkv"),
        "{missing}"
    );
    assert_eq!(read(&store, 4, size).await.unwrap(), data);

    // At restart, the truncated and damaged-header files are dropped; the payload flip is only
    // visible to a read (scanning does not read payloads).
    std::fs::write(dir.0.join("0000000000000063.mkv.tmp"), b"half").unwrap();
    drop(store);
    let (_, files) = DiskStore::open(&dir.0, 1 << 30).unwrap();
    let ids: Vec<u64> = files.iter().map(|f| f.replica_id.0).collect();
    assert_eq!(ids, vec![1, 4]);
    assert!(!dir.0.join("0000000000000063.mkv.tmp").exists());
}

#[tokio::test]
async fn a_full_budget_refuses_the_write_and_keeps_the_stream_in_step() {
    let dir = TempDir::new("full");
    let (store, _) = DiskStore::open(&dir.0, 10_000).unwrap();
    write(&store, 1, "k", &payload(5000)).await.unwrap();
    let big = payload(6000);
    let mut stream: &[u8] = &[&big[..], b"NEXT"].concat();
    let fault = store.write_from(2, "t", "k", 6000, &mut stream).await;
    assert!(
        matches!(
            fault,
            Err(WriteError::Disk(FileError::Full {
                capacity: 10_000,
                ..
            }))
        ),
        "{fault:?}"
    );
    assert_eq!(stream, b"NEXT", "exactly the payload was consumed");
    assert!(!store.path_of(2).exists());
    assert!(!store.tmp_path_of(2).exists());
    store.delete(1);
    assert_eq!(store.used(), 0);
    write(&store, 2, "k", &big).await.unwrap();
}

#[tokio::test]
async fn a_write_finishing_after_its_deletion_is_undone() {
    let dir = TempDir::new("late");
    let (store, _) = DiskStore::open(&dir.0, 1 << 20).unwrap();
    store.delete(5);
    write(&store, 5, "k", b"late").await.unwrap();
    assert!(!store.path_of(5).exists());
    assert_eq!(store.used(), 0);
}

#[tokio::test]
async fn a_failing_payload_is_told_apart_and_leaves_nothing_behind() {
    let dir = TempDir::new("payload");
    let (store, _) = DiskStore::open(&dir.0, 1 << 20).unwrap();
    let mut short: &[u8] = b"only part";
    let failed = store.write_from(3, "t", "k", 1000, &mut short).await;
    let Err(WriteError::Payload(cause)) = failed else {
        panic!("a short payload is the caller's failure: {failed:?}");
    };
    assert_eq!(cause.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(!store.path_of(3).exists());
    assert!(!store.tmp_path_of(3).exists());
    assert_eq!(store.used(), 0);
}

#[tokio::test]
async fn a_failing_file_keeps_its_cause_and_the_stream_in_step() {
    let dir = TempDir::new("unwritable");
    let (store, _) = DiskStore::open(&dir.0, 1 << 20).unwrap();
    // A directory where the temporary file would go: creating the file fails.
    std::fs::create_dir(store.tmp_path_of(4)).unwrap();
    let mut stream: &[u8] = b"payloadNEXT";
    let failed = store.write_from(4, "t", "k", 7, &mut stream).await;
    let Err(WriteError::Disk(e)) = failed else {
        panic!("the disk failed, not the caller: {failed:?}");
    };
    assert_eq!(e.fault(), DiskFault::WriteFailed);
    assert!(
        std::error::Error::source(&e).is_some(),
        "the I/O cause is kept: {e:?}"
    );
    assert!(with_cause(&e).contains(".mkv.tmp"), "{}", with_cause(&e));
    assert_eq!(stream, b"NEXT", "exactly the payload was consumed");
    assert_eq!(store.used(), 0);
    assert!(!store.path_of(4).exists());
}

/// `DiskStore::open`'s error as the node reports it.
fn open_error(dir: &Path, capacity: u64) -> (DiskError, moonkv_proto::Error) {
    let typed = DiskStore::open(dir, capacity).unwrap_err();
    let reported = DiskStore::open(dir, capacity).unwrap_err().into();
    (typed, reported)
}

#[test]
fn unusable_directories_fail_with_a_clear_message() {
    let missing = std::env::temp_dir().join("moonkv-no-such-dir-for-sure");
    let (typed, err) = open_error(&missing, 1 << 20);
    assert_eq!(err.code, ErrorCode::FILE_NOT_FOUND);
    assert!(err.message.contains("moonkv-no-such-dir-for-sure"), "{err}");
    let DiskError::Unusable { source, .. } = &typed else {
        panic!("{typed:?}");
    };
    assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
    assert!(err.message.ends_with(&format!(": {source}")), "{err}");

    let dir = TempDir::new("file");
    let file = dir.0.join("plain");
    std::fs::write(&file, b"x").unwrap();
    let (typed, err) = open_error(&file, 1 << 20);
    assert!(
        matches!(typed, DiskError::NotADirectory { .. }),
        "{typed:?}"
    );
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert!(err.message.contains("not a directory"), "{err}");

    // /proc refuses new files even to root.
    let (typed, err) = open_error(Path::new("/proc"), 1 << 20);
    assert!(matches!(typed, DiskError::NotWritable { .. }), "{typed:?}");
    assert_eq!(err.code, ErrorCode::FILE_WRITE_FAIL);
    assert!(
        err.message.contains("/proc") && err.message.contains("not writable"),
        "{err}"
    );

    assert_eq!(open_error(&dir.0, 0).1.code, ErrorCode::INVALID_PARAMS);
    std::fs::write(dir.0.join(ID_FILE), "garbage").unwrap();
    let (typed, err) = open_error(&dir.0, 1 << 20);
    assert!(matches!(typed, DiskError::BadId { .. }), "{typed:?}");
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert!(err.message.contains(ID_FILE), "{err}");
}
