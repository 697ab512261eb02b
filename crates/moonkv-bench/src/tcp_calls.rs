//! `moonkv bench tcp`: the loopback TCP floor of one call, by size. A client thread writes
//! `size` bytes and waits for a 16-byte answer; a server thread reads the `size` bytes and
//! answers. No protocol, no allocation while measuring, default socket settings, one
//! connection per client. This is the fastest any request-answer data plane can move one
//! object of that size through loopback TCP on this machine, round trip included, where the
//! streaming probe of `bench store` has no round trips at all. `bench-upstream.sh` runs it in
//! every round, so the socket cells can be read as a fraction of it.

use moonkv_proto::units::format_size;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Bytes of the answer to each call.
const ANSWER: usize = 16;

/// `moonkv bench tcp`.
#[derive(clap::Args, Debug)]
pub struct TcpBenchArgs {
    /// Bytes each call carries (comma separated), e.g. `4KiB,1MiB`; 0 is a bare round trip.
    #[arg(long, value_delimiter = ',', default_value = "4KiB,512KiB,1MiB,4MiB,16MiB,64MiB",
          value_parser = moonkv_proto::units::size_flag)]
    sizes: Vec<u64>,
    /// Concurrent clients, one connection and one thread each (comma separated: one run per
    /// value).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    clients: Vec<usize>,
    /// Calling time per run.
    #[arg(long, default_value = "300ms", value_parser = super::parse_duration)]
    duration: Duration,
    /// Runs per size and client count; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// One JSON object per size and client count (`{"op":"tcp_call","size":…,"clients":…,
    /// "gb_per_s":…,"calls_per_s":…}`) instead of a table.
    #[arg(long)]
    json: bool,
}

/// What one run measured, all clients together.
#[derive(Clone, Copy, Debug)]
struct Rate {
    calls_per_s: f64,
    bytes_per_s: f64,
}

/// Measures and prints one line per size and client count.
pub fn run(args: TcpBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.repeat > 0, "--repeat must be positive");
    anyhow::ensure!(
        args.clients.iter().all(|&c| c > 0),
        "--clients: every value must be positive"
    );
    if !args.json {
        println!(
            "| bytes per call | clients | calls/s | GB/s | min–max GB/s of {} runs |",
            args.repeat
        );
        println!("|--:|--:|--:|--:|--:|");
    }
    for &clients in &args.clients {
        for &size in &args.sizes {
            let size = usize::try_from(size)
                .map_err(|_| anyhow::anyhow!("--sizes: {size} is too large for this machine"))?;
            let mut rates = (0..args.repeat)
                .map(|_| measure(size, clients, args.duration))
                .collect::<anyhow::Result<Vec<Rate>>>()?;
            rates.sort_by(|a, b| a.calls_per_s.total_cmp(&b.calls_per_s));
            let median = rates[rates.len() / 2];
            let gb = |r: &Rate| r.bytes_per_s / 1e9;
            if args.json {
                println!(
                    r#"{{"op":"tcp_call","size":{size},"clients":{clients},"gb_per_s":{:.4},"calls_per_s":{:.1}}}"#,
                    gb(&median),
                    median.calls_per_s
                );
            } else {
                println!(
                    "| {} | {clients} | {:.0} | {:.2} | {:.2}–{:.2} |",
                    format_size(size as u64),
                    median.calls_per_s,
                    gb(&median),
                    gb(&rates[0]),
                    gb(&rates[rates.len() - 1])
                );
            }
        }
    }
    Ok(())
}

/// One run: `clients` connections, each making calls of `size` bytes for `duration`.
fn measure(size: usize, clients: usize, duration: Duration) -> anyhow::Result<Rate> {
    let pairs = super::tcp::loopback_pairs(clients, true)?;
    let start_line = Barrier::new(2 * clients);
    let (calls, longest) = std::thread::scope(|scope| {
        let mut callers = Vec::with_capacity(clients);
        for (client, server) in pairs {
            let start_line = &start_line;
            scope.spawn(move || serve(server, size, start_line));
            callers.push(scope.spawn(move || call(client, size, duration, start_line)));
        }
        super::tcp::totals(callers, "a probe client")
    })?;
    let secs = longest.as_secs_f64().max(f64::MIN_POSITIVE);
    Ok(Rate {
        calls_per_s: calls as f64 / secs,
        bytes_per_s: (calls as f64 * size as f64) / secs,
    })
}

/// Calls until the deadline, then closes the connection (the server's EOF); returns the calls
/// made and the time they took.
fn call(
    mut stream: TcpStream,
    size: usize,
    duration: Duration,
    start_line: &Barrier,
) -> anyhow::Result<(u64, Duration)> {
    // A call of 0 bytes still sends one byte, so the server has something to answer.
    let data = vec![0x5au8; size.max(1)];
    let mut answer = [0u8; ANSWER];
    start_line.wait();
    let started = Instant::now();
    let mut calls = 0u64;
    while calls == 0 || started.elapsed() < duration {
        stream.write_all(&data)?;
        stream.read_exact(&mut answer)?;
        calls += 1;
    }
    Ok((calls, started.elapsed()))
}

/// Reads each call whole and answers it, until EOF.
fn serve(mut stream: TcpStream, size: usize, start_line: &Barrier) {
    let mut sink = vec![0u8; size.max(1)];
    let answer = [0xa5u8; ANSWER];
    start_line.wait();
    loop {
        if stream.read_exact(&mut sink).is_err() || stream.write_all(&answer).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_is_answered_and_counted() {
        for (size, clients) in [(0, 1), (64 << 10, 2)] {
            let rate = measure(size, clients, Duration::from_millis(30)).unwrap();
            assert!(rate.calls_per_s > 10.0, "{size} B, {clients}: {rate:?}");
            assert_eq!(rate.bytes_per_s > 0.0, size > 0, "{rate:?}");
        }
    }
}
