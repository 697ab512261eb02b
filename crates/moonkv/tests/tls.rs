//! Optional TLS on the master protocol and the data plane, end to end with the real binaries.
//! Certificates are generated per run: a throwaway CA, a server certificate for 127.0.0.1 and
//! localhost, and a client certificate for mutual TLS.

use moonkv_testkit::{output_of, Moonkv, Proc};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

const SECRET: &str = "correct-horse-battery-staple-42";
/// A refused connection must be reported well within this (no hang until a long timeout).
const FAIL_FAST: Duration = Duration::from_secs(15);

/// PEM files of one test run.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `ca.pem`, `server.pem`/`server.key`, `client.pem`/`client.key` signed by that CA, and an
/// unrelated `other-ca.pem`.
fn pki(test: &str) -> Pki {
    let dir = std::env::temp_dir().join(format!("moonkv-tls-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = |name: &str| {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert, key)
    };
    let (ca_cert, ca_key) = ca("moonkv test CA");
    let (other_ca, _) = ca("some other CA");
    let leaf = |names: Vec<String>| {
        let params = CertificateParams::new(names).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_pem, server_key) = leaf(vec!["localhost".into(), "127.0.0.1".into()]);
    let (client_pem, client_key) = leaf(vec!["moonkv-client".into()]);
    for (name, body) in [
        ("ca.pem", ca_cert.pem()),
        ("other-ca.pem", other_ca.pem()),
        ("server.pem", server_pem),
        ("server.key", server_key),
        ("client.pem", client_pem),
        ("client.key", client_key),
        ("garbage.pem", "not a certificate\n".to_string()),
    ] {
        std::fs::write(dir.join(name), body).unwrap();
    }
    Pki { dir }
}

/// A `moonkv` command with the TLS and secret variables cleared, then set from `env`.
fn command(args: &[&str], env: &[(&str, &Path)]) -> Command {
    let mut cmd = MOONKV.command(args);
    for var in [
        "MOONKV_TLS_CA_FILE",
        "MOONKV_TLS_CERT_FILE",
        "MOONKV_TLS_KEY_FILE",
        "MOONKV_TLS_SERVER_NAME",
        "MOONKV_AUTH_SECRET",
        "MOONKV_AUTH_SECRET_FILE",
        "MOONKV_GRANT_SECRET",
        "MOONKV_GRANT_SECRET_FILE",
    ] {
        cmd.env_remove(var);
    }
    for (var, value) in env {
        cmd.env(var, value);
    }
    cmd
}

/// Starts a long-running `moonkv` process and waits for its ready line.
fn spawn(args: &[&str], env: &[(&str, &Path)]) -> Proc {
    Proc::start(command(args, env)).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs a client command to completion.
fn cli(master: &str, args: &[&str], stdin: &[u8], env: &[(&str, &Path)]) -> Output {
    let mut cmd = command(args, env);
    cmd.env("MOONKV_MASTER", master);
    output_of(cmd, stdin)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A master (and its node) serving TLS only, with the shared secret on as well.
fn tls_cluster(pki: &Pki, extra_master_args: &[&str], node_env: &[(&str, &Path)]) -> (Proc, Proc) {
    let secret = pki.path("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let cert = pki.path("server.pem");
    let key = pki.path("server.key");
    let mut args = vec![
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--auth-secret-file",
        secret.to_str().unwrap(),
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
    ];
    args.extend_from_slice(extra_master_args);
    let master = spawn(&args, &[]);
    let rpc = master.field("rpc");
    let mut env = vec![("MOONKV_AUTH_SECRET_FILE", secret.as_path())];
    env.extend_from_slice(node_env);
    let node = spawn(
        &[
            "node",
            "--master",
            &rpc,
            "--segment-size",
            "16MiB",
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
        ],
        &env,
    );
    (master, node)
}

#[test]
fn put_and_get_over_tls_and_clear_refusals() {
    let pki = pki("cluster");
    let ca = pki.path("ca.pem");
    let secret = pki.path("secret");
    let (master, _node) = tls_cluster(&pki, &[], &[("MOONKV_TLS_CA_FILE", &ca)]);
    let rpc = master.field("rpc");
    let trusted = [
        ("MOONKV_TLS_CA_FILE", ca.as_path()),
        ("MOONKV_AUTH_SECRET_FILE", secret.as_path()),
    ];

    // Metadata over TLS to the master, bytes over TLS to the node, secret and grants inside.
    let put = cli(&rpc, &["put", "greeting", "-"], b"hello over tls", &trusted);
    assert!(put.status.success(), "{}", stderr(&put));
    let get = cli(&rpc, &["get", "greeting"], b"", &trusted);
    assert!(get.status.success(), "{}", stderr(&get));
    assert_eq!(get.stdout, b"hello over tls");

    // The name the certificate carries works too.
    let port = rpc.rsplit_once(':').unwrap().1;
    let by_name = cli(
        &format!("localhost:{port}"),
        &["ls", "--json"],
        b"",
        &trusted,
    );
    assert!(by_name.status.success(), "{}", stderr(&by_name));

    // A plaintext client is told the master speaks TLS, at once.
    let started = Instant::now();
    let plain = cli(&rpc, &["ls"], b"", &[("MOONKV_AUTH_SECRET_FILE", &secret)]);
    assert!(!plain.status.success());
    let err = stderr(&plain);
    assert!(
        err.contains("only accepts TLS") && err.contains("MOONKV_TLS_CA_FILE"),
        "{err}"
    );
    assert!(
        started.elapsed() < FAIL_FAST,
        "took {:?}",
        started.elapsed()
    );

    // A client trusting another CA refuses the master's certificate.
    let started = Instant::now();
    let other = pki.path("other-ca.pem");
    let wrong_ca = cli(
        &rpc,
        &["ls"],
        b"",
        &[
            ("MOONKV_TLS_CA_FILE", &other),
            ("MOONKV_AUTH_SECRET_FILE", &secret),
        ],
    );
    assert!(!wrong_ca.status.success());
    let err = stderr(&wrong_ca);
    assert!(err.contains("not signed by the CA"), "{err}");
    assert!(
        started.elapsed() < FAIL_FAST,
        "took {:?}",
        started.elapsed()
    );

    // A name the certificate does not carry: the fix is named.
    let wrong_name = cli(
        &rpc,
        &["ls"],
        b"",
        &[
            ("MOONKV_TLS_CA_FILE", ca.as_path()),
            ("MOONKV_TLS_SERVER_NAME", Path::new("db.example")),
            ("MOONKV_AUTH_SECRET_FILE", secret.as_path()),
        ],
    );
    assert!(!wrong_name.status.success());
    let err = stderr(&wrong_name);
    assert!(err.contains("MOONKV_TLS_SERVER_NAME"), "{err}");

    // An unreadable CA file stops the client naming the file.
    let garbage = pki.path("garbage.pem");
    let bad_ca = cli(&rpc, &["ls"], b"", &[("MOONKV_TLS_CA_FILE", &garbage)]);
    assert!(!bad_ca.status.success());
    assert!(
        stderr(&bad_ca).contains("garbage.pem"),
        "{}",
        stderr(&bad_ca)
    );
}

#[test]
fn a_tls_client_against_a_plaintext_master_is_told_so() {
    let pki = pki("plain");
    let master = spawn(&["master", "--rpc-port", "0", "--metrics-port", "0"], &[]);
    let started = Instant::now();
    let out = cli(
        &master.field("rpc"),
        &["ls"],
        b"",
        &[("MOONKV_TLS_CA_FILE", &pki.path("ca.pem"))],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("does not speak TLS"), "{err}");
    assert!(
        started.elapsed() < FAIL_FAST,
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn mutual_tls_requires_a_client_certificate() {
    let pki = pki("mtls");
    let ca = pki.path("ca.pem");
    let client_cert = pki.path("client.pem");
    let client_key = pki.path("client.key");
    let secret = pki.path("secret");
    let mtls_env = [
        ("MOONKV_TLS_CA_FILE", ca.as_path()),
        ("MOONKV_TLS_CERT_FILE", client_cert.as_path()),
        ("MOONKV_TLS_KEY_FILE", client_key.as_path()),
    ];
    let (master, _node) = tls_cluster(
        &pki,
        &["--tls-client-ca-file", ca.to_str().unwrap()],
        &mtls_env,
    );
    let rpc = master.field("rpc");

    let mut with_cert = mtls_env.to_vec();
    with_cert.push(("MOONKV_AUTH_SECRET_FILE", &secret));
    let put = cli(&rpc, &["put", "k", "-"], b"mutual", &with_cert);
    assert!(put.status.success(), "{}", stderr(&put));
    let get = cli(&rpc, &["get", "k"], b"", &with_cert);
    assert!(get.status.success(), "{}", stderr(&get));
    assert_eq!(get.stdout, b"mutual");

    let started = Instant::now();
    let without = cli(
        &rpc,
        &["ls"],
        b"",
        &[
            ("MOONKV_TLS_CA_FILE", ca.as_path()),
            ("MOONKV_AUTH_SECRET_FILE", secret.as_path()),
        ],
    );
    assert!(!without.status.success());
    let err = stderr(&without);
    assert!(
        err.contains("requires a client certificate") && err.contains("MOONKV_TLS_CERT_FILE"),
        "{err}"
    );
    assert!(
        started.elapsed() < FAIL_FAST,
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn bad_certificate_files_stop_the_process_at_start() {
    let pki = pki("badfiles");
    let garbage = pki.path("garbage.pem");
    let key = pki.path("server.key");
    let master = command(
        &[
            "master",
            "--rpc-port",
            "0",
            "--metrics-port",
            "0",
            "--tls-cert-file",
            garbage.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
        ],
        &[],
    )
    .output()
    .unwrap();
    assert!(!master.status.success());
    let err = stderr(&master);
    assert!(
        err.contains("tls_cert_file") && err.contains("garbage.pem"),
        "{err}"
    );

    let missing_key = command(
        &[
            "master",
            "--rpc-port",
            "0",
            "--metrics-port",
            "0",
            "--tls-cert-file",
            pki.path("server.pem").to_str().unwrap(),
        ],
        &[],
    )
    .output()
    .unwrap();
    assert!(!missing_key.status.success());
    assert!(
        stderr(&missing_key).contains("tls_key_file"),
        "{}",
        stderr(&missing_key)
    );

    let node = command(
        &[
            "node",
            "--master",
            "127.0.0.1:1",
            "--tls-cert-file",
            pki.path("server.pem").to_str().unwrap(),
            "--tls-key-file",
            garbage.to_str().unwrap(),
        ],
        &[],
    )
    .output()
    .unwrap();
    assert!(!node.status.success());
    assert!(stderr(&node).contains("garbage.pem"), "{}", stderr(&node));
}

#[test]
fn up_applies_tls_to_master_and_node() {
    let pki = pki("up");
    let ca = pki.path("ca.pem");
    let cert = pki.path("server.pem");
    let key = pki.path("server.key");
    let up = spawn(
        &[
            "up",
            "--rpc-port",
            "0",
            "--metrics-port",
            "0",
            "--kv-events-bind-endpoint",
            "tcp://127.0.0.1:0",
            "--segment-size",
            "16MiB",
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
        ],
        &[("MOONKV_TLS_CA_FILE", &ca)],
    );
    let rpc = up.field("rpc");
    let env = [("MOONKV_TLS_CA_FILE", ca.as_path())];
    let put = cli(&rpc, &["put", "k", "-"], b"up over tls", &env);
    assert!(put.status.success(), "{}", stderr(&put));
    let get = cli(&rpc, &["get", "k"], b"", &env);
    assert_eq!(get.stdout, b"up over tls", "{}", stderr(&get));
}
