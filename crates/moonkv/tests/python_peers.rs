//! An independent Python peer checks the emission table of a real master. The peer of the
//! event bytes runs the testkit's `publish_fixture` binary and lives in
//! `crates/moonkv-testkit/tests/python_peers.rs`.

use std::path::Path;

#[test]
fn python_peer_checks_the_emission_table_of_a_real_master() {
    moonkv_testkit::peer::run("emission_peer.py", Path::new(env!("CARGO_BIN_EXE_moonkv")));
}
