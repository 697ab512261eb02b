//! The disk store against a real directory: round trips, restart listing, and every way a file
//! can be bad (missing, truncated, corrupted, wrong size), a full budget, and unusable
//! directories.

use super::*;
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
        .map_err(|e| e.expect("the source is a slice"))
}

#[tokio::test]
async fn files_round_trip_and_are_listed_after_a_restart() {
    let dir = TempDir::new("round");
    let (store, files) = DiskStore::open(&dir.0, 1 << 30).unwrap();
    assert!(files.is_empty());
    let data = payload(3 << 20);
    write(&store, 7, "k/1", &data).await.unwrap();
    write(&store, 8, "k/2", b"x").await.unwrap();
    assert_eq!(
        store.read_verified(7, data.len() as u64).await.unwrap(),
        data
    );
    assert_eq!(store.read_verified(8, 1).await.unwrap(), b"x");
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
        again.read_verified(7, data.len() as u64).await,
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
    assert_eq!(store.read_verified(1, size).await, Err(DiskFault::Corrupt));
    assert_eq!(store.read_verified(2, size).await, Err(DiskFault::Corrupt));
    assert_eq!(store.read_verified(3, size).await, Err(DiskFault::Corrupt));
    assert_eq!(
        store.read_verified(4, size - 1).await,
        Err(DiskFault::Corrupt),
        "size mismatch"
    );
    assert_eq!(store.read_verified(9, size).await, Err(DiskFault::NotFound));
    assert_eq!(store.read_verified(4, size).await.unwrap(), data);

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
    assert!(matches!(fault, Err(Ok(DiskFault::Full))), "{fault:?}");
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

#[test]
fn unusable_directories_fail_with_a_clear_message() {
    let missing = std::env::temp_dir().join("moonkv-no-such-dir-for-sure");
    let err = DiskStore::open(&missing, 1 << 20).unwrap_err();
    assert_eq!(err.code, ErrorCode::FILE_NOT_FOUND);
    assert!(err.message.contains("moonkv-no-such-dir-for-sure"), "{err}");

    let dir = TempDir::new("file");
    let file = dir.0.join("plain");
    std::fs::write(&file, b"x").unwrap();
    let err = DiskStore::open(&file, 1 << 20).unwrap_err();
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert!(err.message.contains("not a directory"), "{err}");

    // /proc refuses new files even to root.
    let err = DiskStore::open(Path::new("/proc"), 1 << 20).unwrap_err();
    assert_eq!(err.code, ErrorCode::FILE_WRITE_FAIL);
    assert!(
        err.message.contains("/proc") && err.message.contains("not writable"),
        "{err}"
    );

    assert_eq!(
        DiskStore::open(&dir.0, 0).unwrap_err().code,
        ErrorCode::INVALID_PARAMS
    );
    std::fs::write(dir.0.join(ID_FILE), "garbage").unwrap();
    let err = DiskStore::open(&dir.0, 1 << 20).unwrap_err();
    assert!(err.message.contains(ID_FILE), "{err}");
}
