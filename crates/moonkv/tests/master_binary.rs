//! The real `moonkv master` binary on an ephemeral port, driven with raw frames as
//! docs/protocol.md describes.

use moonkv_proto::msg::*;
use moonkv_proto::types::*;
use moonkv_proto::{ClientId, ErrorCode};
use moonkv_testkit::wire::{self, fake_segment, RawStream};
use moonkv_testkit::Moonkv;
use std::time::{Duration, Instant};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

#[test]
fn master_serves_mount_put_get_remove_and_leases_over_tcp() {
    let master = MOONKV.master(&["--default-kv-lease-ttl", "300ms"]);
    let c = wire::connect(&master.field("rpc"));
    let me = ClientId::new(1, 1);
    c.request::<()>(&Request::MountSegment(MountSegmentRequest {
        segment: fake_segment(1),
        client_id: me,
        keeps_catalog: false,
    }))
    .unwrap();
    let ping: PingResponse = c
        .request(&Request::Ping(PingRequest {
            client_id: me,
            mounted_segments: 0,
        }))
        .unwrap();
    assert_eq!(ping.client_status, ClientStatus::Ok);

    let start = PutStartRequest {
        client_id: me,
        tenant: String::new(),
        key: "k1".into(),
        size: 4096,
        config: ReplicateConfig::default(),
    };
    let replicas: Vec<ReplicaDescriptor> = c.request(&Request::PutStart(start)).unwrap();
    assert_eq!(replicas.len(), 1);
    assert_ne!(replicas[0].id.0, 0);
    assert_eq!(replicas[0].status, ReplicaStatus::Processing);
    let ids: Vec<_> = replicas.iter().map(|r| r.id).collect();
    let end = EndRequest {
        client_id: me,
        tenant: String::new(),
        key: "k1".into(),
        replica_type: ReplicaType::All,
        replica_ids: ids.clone(),
        checksum: None,
    };
    c.request::<()>(&Request::PutEnd(end)).unwrap();

    let got: GetReplicaListResponse = c
        .request(&Request::GetReplicaList(KeyRequest {
            tenant: String::new(),
            key: "k1".into(),
        }))
        .unwrap();
    assert_eq!(got.replicas[0].id, ids[0]);
    assert_eq!(got.replicas[0].status, ReplicaStatus::Complete);
    assert_eq!(got.lease_ttl_ms, 300);

    // The read lease blocks a plain Remove until it expires; the loop is bounded.
    let remove = RemoveRequest {
        tenant: String::new(),
        key: "k1".into(),
        force: false,
    };
    let err = c
        .request::<()>(&Request::Remove(remove.clone()))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::OBJECT_HAS_LEASE);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.request::<()>(&Request::Remove(remove.clone())) {
            Ok(()) => break,
            Err(e) if e.code == ErrorCode::OBJECT_HAS_LEASE && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("remove failed: {e}"),
        }
    }
    let missing = c.request::<GetReplicaListResponse>(&Request::GetReplicaList(KeyRequest {
        tenant: String::new(),
        key: "k1".into(),
    }));
    assert_eq!(missing.unwrap_err().code, ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn pipelined_requests_are_all_answered_by_id() {
    let master = MOONKV.master(&[]);
    let mut c = RawStream::after_hello(&master.field("rpc"));
    let mut out = Vec::new();
    for id in 100..150u64 {
        let req = Request::ExistKey(KeyRequest {
            tenant: String::new(),
            key: format!("k{id}"),
        });
        moonkv_proto::frame::encode_request(&mut out, id, &req).unwrap();
    }
    c.write(&out);
    let mut seen = Vec::new();
    for _ in 100..150 {
        let answer = c.read_frame().expect("an answer per request");
        assert_eq!(answer.code, 0);
        assert_eq!(
            answer.body,
            vec![0xc2],
            "ExistKey of a missing key answers false"
        );
        seen.push(answer.request_id);
    }
    seen.sort();
    assert_eq!(seen, (100..150).collect::<Vec<_>>());
}

#[test]
fn malformed_bodies_keep_the_connection_and_bad_frames_close_only_theirs() {
    let master = MOONKV.master(&[]);
    let mut c = RawStream::after_hello(&master.field("rpc"));
    // A PutStart opcode with a body that is not a PutStart request.
    let mut out = Vec::new();
    moonkv_proto::frame::encode_value(
        &mut out,
        moonkv_proto::frame::FrameKind::Request,
        5,
        Op::PutStart as i32,
        &"junk",
    )
    .unwrap();
    c.write(&out);
    let answer = c.read_frame().unwrap();
    assert_eq!(answer.code, ErrorCode::INVALID_PARAMS.as_i32());
    assert_eq!(answer.request_id, 5);
    let mut out = Vec::new();
    let exists = Request::ExistKey(KeyRequest {
        tenant: String::new(),
        key: "x".into(),
    });
    moonkv_proto::frame::encode_request(&mut out, 6, &exists).unwrap();
    c.write(&out);
    let answer = c.read_frame().expect("an answer after a malformed body");
    assert_eq!(answer.request_id, 6);
    let exists: bool = wire::decode(&answer).unwrap();
    assert!(!exists, "connection still serves after a malformed body");

    // An oversized length closes this connection with an error frame.
    c.write(&[0xff, 0xff, 0xff, 0xff, 1]);
    let answer = c.read_frame().unwrap();
    assert_eq!(answer.code, ErrorCode::INVALID_PARAMS.as_i32());
    assert!(
        c.read_frame().is_none(),
        "connection closed after a bad frame"
    );

    // A request before the hello is refused.
    let mut raw = RawStream::connect(&master.field("rpc"));
    let mut out = Vec::new();
    moonkv_proto::frame::encode_request(
        &mut out,
        1,
        &Request::ServiceReady(ServiceReadyRequest {}),
    )
    .unwrap();
    raw.write(&out);
    let answer = raw.read_frame().expect("a refusal");
    assert_eq!(answer.code, ErrorCode::INVALID_PARAMS.as_i32());

    // Other connections are unaffected.
    let fresh = wire::connect(&master.field("rpc"));
    let version: String = fresh
        .request(&Request::ServiceReady(ServiceReadyRequest {}))
        .unwrap();
    assert!(!version.is_empty());
}

#[test]
fn bad_configuration_fails_at_start_naming_the_key() {
    // Each bad flag value: the master refuses to start, naming the key and why.
    for (flag, value, key, why) in [
        ("--eviction-ratio", "1.5", "eviction_ratio", "out of range"),
        ("--shard-count", "0", "shard_count", "out of range"),
        ("--shard-count", "many", "shard_count", "whole number"),
    ] {
        let out = MOONKV
            .command(&[
                "master",
                flag,
                value,
                "--rpc-port",
                "0",
                "--metrics-port",
                "0",
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(key) && stderr.contains(why), "{stderr}");
    }

    let dir = std::env::temp_dir().join(format!("moonkv-bin-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("master.yaml");
    std::fs::write(&path, "default_kv_lease_ttl: 5000\nmade_up_key: 3\n").unwrap();
    let out = MOONKV
        .command(&[
            "master",
            "--config-path",
            path.to_str().unwrap(),
            "--rpc-port",
            "0",
            "--metrics-port",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("made_up_key"));
    std::fs::remove_dir_all(&dir).ok();
}
