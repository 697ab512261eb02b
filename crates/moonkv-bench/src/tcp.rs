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
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut pairs = Vec::with_capacity(connections);
    for _ in 0..connections {
        let sender = TcpStream::connect(addr)?;
        let (receiver, _) = listener.accept()?;
        pairs.push((sender, receiver));
    }
    let start_line = Barrier::new(2 * connections);
    let received: Vec<anyhow::Result<(u64, Duration)>> = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(connections);
        for (sender, receiver) in pairs {
            let start_line = &start_line;
            scope.spawn(move || send(sender, buffer, duration, start_line));
            handles.push(scope.spawn(move || receive(receiver, buffer, start_line)));
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("probe receiver panicked")))
            })
            .collect()
    });
    let (mut bytes, mut longest) = (0u64, Duration::ZERO);
    for r in received {
        let (b, elapsed) = r?;
        bytes += b;
        longest = longest.max(elapsed);
    }
    Ok(bytes as f64 / longest.as_secs_f64().max(f64::MIN_POSITIVE))
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
