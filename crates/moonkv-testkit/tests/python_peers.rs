//! An independent Python peer checks the bytes of the event stream against `docs/events.md`.
//! Cargo builds this package's `publish_fixture` binary for the test. The emission-table peer
//! needs the `moonkv` binary, so it lives in `crates/moonkv/tests/python_peers.rs`.

use std::path::Path;

#[test]
fn python_peer_checks_event_bytes_from_the_publisher() {
    moonkv_testkit::peer::run(
        "events_peer.py",
        Path::new(env!("CARGO_BIN_EXE_publish_fixture")),
    );
}
