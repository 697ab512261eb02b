//! The raw loopback TCP bandwidth probe of `bench store`: N connections through 127.0.0.1, each
//! a sender thread writing one fixed buffer over and over and a receiver thread reading into a
//! buffer of the same size and discarding it. No protocol, no round trips, no allocation while
//! measuring, default socket settings: the ceiling any data plane over loopback TCP can reach on
//! this machine.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Streams for `duration` over `connections` loopback connections with `buffer`-byte writes and
/// returns the bytes per second received, all connections together.
pub fn probe(connections: usize, buffer: usize, duration: Duration) -> anyhow::Result<f64> {
    anyhow::ensure!(
        connections > 0 && buffer > 0,
        "the probe needs connections and a buffer"
    );
    let pairs = loopback_pairs(connections, false)?;
    let start_line = Barrier::new(2 * connections);
    let (bytes, longest) = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(connections);
        for (sender, receiver) in pairs {
            let start_line = &start_line;
            scope.spawn(move || send(sender, buffer, duration, start_line));
            handles.push(scope.spawn(move || receive(receiver, buffer, start_line)));
        }
        totals(handles, "probe receiver")
    })?;
    Ok(bytes as f64 / longest.as_secs_f64().max(f64::MIN_POSITIVE))
}

/// `n` connected pairs over 127.0.0.1: (the side that connected, the side that accepted).
pub(crate) fn loopback_pairs(
    n: usize,
    nodelay: bool,
) -> anyhow::Result<Vec<(TcpStream, TcpStream)>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut pairs = Vec::with_capacity(n);
    for _ in 0..n {
        let connected = TcpStream::connect(addr)?;
        let (accepted, _) = listener.accept()?;
        connected.set_nodelay(nodelay)?;
        accepted.set_nodelay(nodelay)?;
        pairs.push((connected, accepted));
    }
    Ok(pairs)
}

/// What the counting threads of a probe measured, all together: the sum of their counts and
/// the longest time one took; the first error (or panic, naming `what`) otherwise.
pub(crate) fn totals(
    handles: Vec<std::thread::ScopedJoinHandle<'_, anyhow::Result<(u64, Duration)>>>,
    what: &str,
) -> anyhow::Result<(u64, Duration)> {
    let (mut count, mut longest) = (0u64, Duration::ZERO);
    for handle in handles {
        let (n, elapsed) = handle
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("{what} panicked")))?;
        count += n;
        longest = longest.max(elapsed);
    }
    Ok((count, longest))
}

/// Writes the buffer until the deadline, then closes the connection (the receiver's EOF).
fn send(mut stream: TcpStream, buffer: usize, duration: Duration, start_line: &Barrier) {
    let data = vec![0x5au8; buffer];
    start_line.wait();
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        if let Err(e) = stream.write_all(&data) {
            tracing::warn!(error = %e, "probe sender stopped early");
            return;
        }
    }
}

/// Reads until EOF; returns the bytes received and the time from the start line to EOF.
fn receive(
    mut stream: TcpStream,
    buffer: usize,
    start_line: &Barrier,
) -> anyhow::Result<(u64, Duration)> {
    let mut sink = vec![0u8; buffer];
    let mut bytes = 0u64;
    start_line.wait();
    let started = Instant::now();
    loop {
        match stream.read(&mut sink)? {
            0 => return Ok((bytes, started.elapsed())),
            n => bytes += n as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_moves_bytes() {
        let rate = probe(2, 64 << 10, Duration::from_millis(50)).unwrap();
        assert!(rate > 1e6, "{rate} B/s");
    }
}
