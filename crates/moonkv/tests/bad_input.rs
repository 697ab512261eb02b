//! Bad input at every decoder that reads from outside the process: data-plane headers (codec
//! and a real node), protocol frames at a real master, and configuration files and values.
//! Nothing may panic, hang or take a server down; configuration errors name a key.

use moonkv_client::{ReplicateConfig, Store, StoreConfig};
use moonkv_dataplane::header::{
    check_range, RequestHeader, ResponseHeader, REQUEST_LEN, RESPONSE_LEN,
};
use moonkv_master::server::{MasterConfig, CONFIG_KEYS};
use moonkv_testkit::payload::Rng;
use moonkv_testkit::wire::RawStream;
use moonkv_testkit::{http_get, Moonkv};
use proptest::prelude::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn data_plane_request_headers_decode_or_refuse(bytes in proptest::array::uniform32(any::<u8>()),
                                                   tail in proptest::array::uniform16(any::<u8>()),
                                                   valid_prefix in any::<bool>()) {
        let mut raw = [0u8; REQUEST_LEN];
        raw[..32].copy_from_slice(&bytes);
        raw[32..].copy_from_slice(&tail);
        if valid_prefix {
            raw[..5].copy_from_slice(b"MKVD\x01");
        }
        match RequestHeader::decode(&raw) {
            Ok(h) => {
                prop_assert_eq!(&raw[..5], b"MKVD\x01");
                prop_assert_eq!(&h.request_id.to_be_bytes()[..], &raw[8..16]);
                prop_assert_eq!(&h.length.to_be_bytes()[..], &raw[40..48]);
            }
            Err(request_id) => prop_assert_eq!(&request_id.to_be_bytes()[..], &raw[8..16]),
        }
    }

    #[test]
    fn data_plane_response_headers_decode_or_refuse(bytes in proptest::array::uniform24(any::<u8>()),
                                                    valid_prefix in any::<bool>()) {
        let mut raw: [u8; RESPONSE_LEN] = bytes;
        if valid_prefix {
            raw[..5].copy_from_slice(b"MKVR\x01");
        }
        if let Some(h) = ResponseHeader::decode(&raw) {
            prop_assert_eq!(&h.length.to_be_bytes()[..], &raw[16..24]);
        }
    }

    #[test]
    fn data_plane_ranges_are_inside_or_refused(base in any::<u64>(), size in any::<u64>(),
                                               address in any::<u64>(), length in any::<u64>()) {
        if let Ok(offset) = check_range(base, size, address, length) {
            prop_assert!(address >= base);
            prop_assert_eq!(offset as u64, address - base);
            prop_assert!(offset as u64 + length <= size);
        }
    }

    #[test]
    fn config_values_never_panic_and_errors_name_the_key(key in config_key(), value in json_value()) {
        let mut config = MasterConfig::ephemeral();
        if let Err(e) = config.apply(&key, &value) {
            prop_assert_eq!(&e.key, &key);
            prop_assert!(!e.reason.is_empty());
        } else if let Err(e) = config.validate() {
            prop_assert!(is_config_key(&e.key), "validate blamed `{}`", e.key);
        }
    }

    #[test]
    fn config_documents_never_panic_and_errors_name_a_key(doc in json_document(), yaml in any::<bool>()) {
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        check_config_file(&text, if yaml { "yaml" } else { "json" })?;
    }

    #[test]
    fn config_files_of_random_text_never_panic(text in "\\PC{0,200}", yaml in any::<bool>()) {
        check_config_file(&text, if yaml { "yaml" } else { "json" })?;
    }
}

fn is_config_key(key: &str) -> bool {
    key == "config_path" || CONFIG_KEYS.iter().any(|k| k.name == key)
}

fn check_config_file(text: &str, ext: &str) -> Result<(), TestCaseError> {
    let dir = std::env::temp_dir().join(format!("moonkv-config-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| TestCaseError::fail(e.to_string()))?;
    // One file per case: the proptests run in parallel.
    static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("master-{n}.{ext}"));
    std::fs::write(&path, text).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut config = MasterConfig::ephemeral();
    let result = config.load_file(&path).and_then(|()| config.validate());
    let _ = std::fs::remove_file(&path);
    if let Err(e) = result {
        prop_assert!(!e.reason.is_empty(), "{e}");
        // Either an accepted key with a bad value, an unknown key named as given, or the file.
        let named = is_config_key(&e.key) || text.contains(e.key.as_str());
        prop_assert!(
            named,
            "error names `{}`, which is not in the file: {e}",
            e.key
        );
    }
    Ok(())
}

fn config_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(CONFIG_KEYS.iter().map(|k| k.name.to_string()).collect::<Vec<_>>()),
        1 => "[a-z_]{0,24}",
        1 => Just("enable_oplog".to_string()),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,12}".prop_map(Value::String),
        "[0-9]{1,21}(ms|s|m|h|d)?".prop_map(Value::String),
        "tcp://127\\.0\\.0\\.1:[0-9]{1,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json_document() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => proptest::collection::btree_map(config_key(), json_value(), 0..6)
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        1 => json_value(),
    ]
}

/// Random byte streams at a real node's data port: each connection ends cleanly, and the node
/// keeps serving real transfers afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_survives_random_data_plane_bytes() {
    let m = MOONKV.master(&[]);
    let n = MOONKV.node(&m.field("rpc"), "seg-fuzz", "16MiB");
    let data = n.field("data");
    let store = Store::connect(StoreConfig::new(m.field("rpc")))
        .await
        .unwrap();
    store
        .put("before", b"intact", &ReplicateConfig::default())
        .await
        .unwrap();
    let mut rng = Rng(0xdada);
    tokio::task::spawn_blocking(move || {
        for case in 0..300 {
            let mut bytes: Vec<u8> = (0..rng.below(200)).map(|_| rng.next_u64() as u8).collect();
            if case % 2 == 0 && bytes.len() >= 5 {
                // Valid magic and version, so the fields behind them are exercised too.
                bytes[..5].copy_from_slice(b"MKVD\x01");
            }
            send_and_drain(&data, &bytes);
        }
    })
    .await
    .unwrap();
    assert_eq!(store.get("before").await.unwrap(), b"intact");
    store
        .put("after", b"still serving", &ReplicateConfig::default())
        .await
        .unwrap();
    assert_eq!(store.get("after").await.unwrap(), b"still serving");
}

/// Random frames at a real master, before and after a valid hello: the master answers or
/// closes that connection, and keeps serving everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_master_survives_random_frames() {
    let m = MOONKV.master(&[]);
    let rpc = m.field("rpc");
    let admin = m.field("admin");
    let mut rng = Rng(0xf4a3e);
    let target = rpc.clone();
    tokio::task::spawn_blocking(move || {
        for case in 0..300u64 {
            if case % 2 == 0 {
                // A valid hello first, then a request frame with a random opcode and body.
                let mut raw = RawStream::after_hello(&target);
                let body: Vec<u8> = (0..rng.below(64)).map(|_| rng.next_u64() as u8).collect();
                let mut frame = Vec::new();
                frame.extend_from_slice(&((13 + body.len()) as u32).to_be_bytes());
                frame.push(1);
                frame.extend_from_slice(&case.to_be_bytes());
                frame.extend_from_slice(&(rng.below(50) as i32).to_be_bytes());
                frame.extend_from_slice(&body);
                drain(&mut raw.stream, &frame);
            } else {
                let bytes: Vec<u8> = (0..rng.below(64)).map(|_| rng.next_u64() as u8).collect();
                send_and_drain(&target, &bytes);
            }
        }
    })
    .await
    .unwrap();
    assert!(http_get(&admin, "/health").is_some());
    let store = Store::connect(StoreConfig::new(rpc)).await.unwrap();
    assert!(!store.exists("nothing").await.unwrap());
}

/// Writes `bytes`, half-closes, and reads whatever comes back until the peer closes or stays
/// silent for a second.
fn send_and_drain(addr: &str, bytes: &[u8]) {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        panic!("{addr} stopped accepting connections");
    };
    drain(&mut stream, bytes);
}

fn drain(stream: &mut TcpStream, bytes: &[u8]) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 4096];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}
