//! A grant dies with its replica: tenant A's write and read grants, kept after A's object was
//! removed, neither overwrite nor read the bytes of tenant B's object that the master put in
//! the same range. Real `moonkv master` and `moonkv node` with secrets, on loopback.

use moonkv_client::store::{Store, StoreConfig};
use moonkv_dataplane::DataConnection;
use moonkv_proto::auth::Secret;
use moonkv_proto::msg::{EndRequest, PutStartRequest};
use moonkv_proto::{ErrorCode, ReplicaDescriptor, ReplicaType, ReplicateConfig};
use moonkv_testkit::{Moonkv, Proc};
use std::path::PathBuf;
use std::time::Duration;

const SECRET: &str = "stale-grant-test-shared-secret-01";
const GRANT_SECRET: &str = "stale-grant-test-grant-secret-001";
const LIMIT: Duration = Duration::from_secs(10);
const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));
const SIZE: usize = 64 << 10;

fn secret() -> Secret {
    Secret::new(SECRET.as_bytes().to_vec()).unwrap()
}

fn start(args: &[&str]) -> Proc {
    let mut cmd = MOONKV.command(args);
    cmd.env_remove("MOONKV_AUTH_SECRET")
        .env_remove("MOONKV_AUTH_SECRET_FILE")
        .env_remove("MOONKV_GRANT_SECRET")
        .env_remove("MOONKV_GRANT_SECRET_FILE");
    Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"))
}

struct Files(PathBuf);

impl Files {
    fn new() -> Files {
        let dir = std::env::temp_dir().join(format!("moonkv-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), SECRET).unwrap();
        std::fs::write(dir.join("grant"), GRANT_SECRET).unwrap();
        Files(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn store(master: &str, tenant: &str) -> Store {
    let mut config = StoreConfig::new(master);
    config.tenant = tenant.into();
    config.auth_secret = Some(secret());
    Store::connect(config).await.unwrap()
}

/// PutStart, the bytes, PutEnd by hand, keeping the write grant the master issued.
async fn put_keeping_grant(store: &Store, key: &str, value: &[u8]) -> ReplicaDescriptor {
    let master = store.master();
    let replicas = master
        .put_start(PutStartRequest {
            client_id: master.client_id(),
            tenant: store.tenant().into(),
            key: key.into(),
            size: value.len() as u64,
            config: ReplicateConfig::default(),
        })
        .await
        .unwrap();
    let replica = replicas[0].clone();
    let grant = replica.grant.clone().expect("a secured master hands out grants");
    let mut conn = DataConnection::connect(&replica.endpoint, LIMIT, Some(&secret()))
        .await
        .unwrap();
    conn.write(replica.segment_id, replica.address, value, &grant)
        .await
        .unwrap();
    master
        .put_end(EndRequest {
            client_id: master.client_id(),
            tenant: store.tenant().into(),
            key: key.into(),
            replica_type: ReplicaType::All,
            replica_ids: vec![replica.id],
            checksum: None,
        })
        .await
        .unwrap();
    replica
}

async fn read_grant(store: &Store, key: &str) -> ReplicaDescriptor {
    let list = store.replicas(key).await.unwrap();
    list.replicas[0].clone()
}

#[test]
fn grants_of_a_removed_replica_are_worthless_on_the_next_tenants_object() {
    let files = Files::new();
    let (secret_file, grant_file) = (files.path("secret"), files.path("grant"));
    let master = start(&[
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--auth-secret-file",
        &secret_file,
        "--grant-secret-file",
        &grant_file,
    ]);
    let rpc = master.field("rpc");
    let _node = start(&[
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "8MiB",
        "--auth-secret-file",
        &secret_file,
        "--grant-secret-file",
        &grant_file,
    ]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let alice = store(&rpc, "alice").await;
        let bob = store(&rpc, "bob").await;
        let alice_bytes = vec![0xA1; SIZE];
        let written = put_keeping_grant(&alice, "a", &alice_bytes).await;
        let read = read_grant(&alice, "a").await;
        assert_eq!(alice.get("a").await.unwrap(), alice_bytes);
        alice.remove("a", true).await.unwrap();

        let bob_bytes = vec![0xB2; SIZE];
        bob.put("b", &bob_bytes, &ReplicateConfig::default())
            .await
            .unwrap();
        let bobs = read_grant(&bob, "b").await;
        assert_eq!(
            (bobs.segment_id, bobs.address),
            (written.segment_id, written.address),
            "the master reuses the freed range (otherwise this test shows nothing)"
        );

        let mut conn = DataConnection::connect(&written.endpoint, LIMIT, Some(&secret()))
            .await
            .unwrap();
        let stale_write = conn
            .write(
                written.segment_id,
                written.address,
                &vec![0xEE; SIZE],
                written.grant.as_deref().unwrap(),
            )
            .await
            .expect_err("a removed replica's write grant must not write");
        assert_eq!(stale_write.code, ErrorCode::ILLEGAL_CLIENT, "{stale_write}");
        assert_eq!(bob.get("b").await.unwrap(), bob_bytes, "bob reads his own bytes");

        for grant in [&read.grant, &written.grant] {
            let mut out = vec![0u8; SIZE];
            let stale_read = conn
                .read(
                    written.segment_id,
                    written.address,
                    &mut out,
                    grant.as_deref().unwrap(),
                )
                .await
                .expect_err("a removed replica's grant must not read");
            assert_eq!(stale_read.code, ErrorCode::ILLEGAL_CLIENT, "{stale_read}");
            assert!(out.iter().all(|b| *b == 0), "no byte of bob's object leaked");
        }
        // The connection stayed usable for honest requests.
        let mut out = vec![0u8; SIZE];
        conn.read(
            bobs.segment_id,
            bobs.address,
            &mut out,
            bobs.grant.as_deref().unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(out, bob_bytes);
    });
}
