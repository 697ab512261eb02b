//! The admin HTTP endpoints of a real `moonkv master`, with upstream paths and shapes.

use moonkv_proto::msg::*;
use moonkv_proto::ClientId;
use moonkv_testkit::wire::{self, fake_segment, put_meta};
use moonkv_testkit::{http, signal, Moonkv};
use std::time::Duration;

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

#[test]
fn admin_endpoints_report_the_master_state() {
    let master = MOONKV.start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let admin = master.field("admin");
    let c = wire::connect(&master.field("rpc"));
    let me = ClientId::new(3, 3);
    c.request::<()>(&Request::MountSegment(MountSegmentRequest {
        segment: fake_segment(1),
        client_id: me,
        keeps_catalog: false,
    }))
    .unwrap();
    put_meta(&c, me, "", "alpha", 1000);
    put_meta(&c, me, "", "beta", 1000);
    put_meta(&c, me, "other", "gamma", 1000);

    let (status, body) = http(&admin, "GET", "/health", "");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["status"],
        "ok"
    );

    let (status, body) = http(&admin, "GET", "/metrics", "");
    assert_eq!(status, 200);
    for name in [
        "master_put_start_requests_total 3",
        "master_put_end_requests_total 3",
        "master_key_count 3",
        "master_total_capacity_bytes 67108864",
        "master_get_replica_list_latency_seconds_bucket",
        "segment_allocated_bytes{segment=\"seg-1\"}",
        "kv_events_dropped_events_total 0",
    ] {
        assert!(body.contains(name), "metrics lack {name}:\n{body}");
    }

    let (_, body) = http(&admin, "GET", "/get_all_keys", "");
    assert_eq!(body, "alpha\nbeta\n", "default tenant only");
    let (_, body) = http(&admin, "GET", "/get_all_keys?tenant_id=other", "");
    assert_eq!(body, "gamma\n");
    let (_, body) = http(&admin, "GET", "/get_all_segments", "");
    assert_eq!(body, "seg-1\n");

    let (status, body) = http(&admin, "GET", "/get_segments_detail", "");
    assert_eq!(status, 200);
    let detail: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(detail["total_segments"], 1);
    assert_eq!(detail["segments"][0]["segment_name"], "seg-1");
    assert_eq!(detail["segments"][0]["base_address"], "0x10000000");
    assert_eq!(detail["segments"][0]["status"], "OK");
    assert!(
        detail["segments"][0]["allocator_used_bytes"]
            .as_u64()
            .unwrap()
            >= 3000
    );

    let (status, body) = http(&admin, "GET", "/query_key?key=alpha", "");
    assert_eq!(status, 200, "{body}");
    let q: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(q["success"], true);
    assert_eq!(q["data"][0]["size_"], 1000);
    let (status, body) = http(&admin, "GET", "/query_key?key=nope", "");
    assert_eq!(status, 404);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["error_code"],
        -704
    );
    let (status, _) = http(&admin, "GET", "/query_key", "");
    assert_eq!(status, 400);

    let (status, body) = http(&admin, "GET", "/api/v1/tenant_quotas", "");
    assert_eq!(status, 409, "quotas need multi-tenant mode: {body}");

    let (status, body) = http(&admin, "GET", "/kv_events/status", "");
    assert_eq!(status, 200);
    let ev: serde_json::Value = serde_json::from_str(&body).unwrap();
    for field in [
        "enabled",
        "published_batches",
        "published_events",
        "dropped_events",
        "skipped_keyless_events",
    ] {
        assert!(ev.get(field).is_some(), "status lacks {field}: {body}");
    }
    assert_eq!(ev["enabled"], false);

    // query_key takes no read lease (a look must not pin a key): a non-forced remove_all of
    // the default tenant removes alpha too.
    let (status, body) = http(&admin, "POST", "/api/v1/remove_all?tenant_id=default", "");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["removed_count"],
        2
    );
    let (_, body) = http(&admin, "POST", "/api/v1/remove_all?force=true", "");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["removed_count"],
        1,
        "the other tenant's"
    );
    let (_, body) = http(&admin, "GET", "/get_all_keys?tenant_id=other", "");
    assert_eq!(body, "");
}

#[test]
fn tenant_quotas_work_in_multi_tenant_mode() {
    let master = MOONKV.start(&[
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--enable-multi-tenants",
        "true",
    ]);
    let admin = master.field("admin");
    let (status, body) = http(
        &admin,
        "PUT",
        "/api/v1/tenant_quotas?tenant_id=team-a",
        r#"{"requested_quota_bytes": 1000}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(&admin, "GET", "/api/v1/tenant_quotas?tenant_id=team-a", "");
    assert_eq!(status, 200);
    let snap: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(snap["data"]["requested_quota_bytes"], 1000);
    let (status, _) = http(
        &admin,
        "PUT",
        "/api/v1/tenant_quotas?tenant_id=team-a",
        "not json",
    );
    assert_eq!(status, 400);
    let (status, _) = http(
        &admin,
        "DELETE",
        "/api/v1/tenant_quotas?tenant_id=team-a",
        "",
    );
    assert_eq!(status, 200);
    let (status, _) = http(
        &admin,
        "DELETE",
        "/api/v1/tenant_quotas?tenant_id=team-a",
        "",
    );
    assert_eq!(status, 404);
}

#[test]
fn sigterm_shuts_the_master_down_cleanly() {
    let mut master = MOONKV.start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    signal(master.pid(), "TERM").expect("SIGTERM");
    let status = master.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "exit status {status}");
}
