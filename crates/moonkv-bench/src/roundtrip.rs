//! `moonkv bench roundtrip`: one round trip between two threads on each local transport a
//! same-host caller could reach its node by: TCP loopback (`TCP_NODELAY`, as the data plane
//! sets it) and a Unix stream socket. Blocking reads and writes of a fixed-size message each
//! way and nothing else, so the difference between the two rows is the transport's own cost:
//! the TCP stack, and on loopback the receiving side's processing, which runs inside the
//! sender's system call. The runs of the two transports alternate, the order reversed every
//! other round; the median of `--repeat` runs is reported.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// `moonkv bench roundtrip`.
#[derive(clap::Args, Debug)]
pub struct RoundtripBenchArgs {
    /// Bytes sent each way per round trip.
    #[arg(long, default_value = "64", value_parser = moonkv_proto::units::size_flag)]
    size: u64,
    /// Measured time per run.
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    duration: Duration,
    /// Runs per transport; the median is reported.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// One JSON object per transport (`{"op":"roundtrip","transport":…,"p50_us":…}`).
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Tcp,
    Unix,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp loopback",
            Transport::Unix => "unix socket",
        }
    }
}

/// One end of a connected pair.
trait Duplex: Read + Write + Send {}
impl Duplex for TcpStream {}
impl Duplex for UnixStream {}

/// A connected pair of `transport`.
fn pair(transport: Transport) -> anyhow::Result<(Box<dyn Duplex>, Box<dyn Duplex>)> {
    Ok(match transport {
        Transport::Tcp => {
            let (client, server) = super::tcp::loopback_pairs(1, true)?
                .pop()
                .ok_or_else(|| anyhow::anyhow!("no loopback pair"))?;
            (Box::new(client), Box::new(server))
        }
        Transport::Unix => {
            let (a, b) = UnixStream::pair()?;
            (Box::new(a), Box::new(b))
        }
    })
}

/// Round trips of `size` bytes each way for `duration`: µs per round trip (mean), and how many.
fn measure(transport: Transport, size: usize, duration: Duration) -> anyhow::Result<(f64, u64)> {
    let (mut near, mut far) = pair(transport)?;
    std::thread::scope(|scope| {
        let echo = scope.spawn(move || -> io::Result<()> {
            let mut buf = vec![0u8; size];
            loop {
                match far.read_exact(&mut buf) {
                    Ok(()) => far.write_all(&buf)?,
                    // The measuring end closed: done.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        });
        let mut buf = vec![0x5au8; size];
        let started = Instant::now();
        let mut trips = 0u64;
        let measured = loop {
            near.write_all(&buf)?;
            near.read_exact(&mut buf)?;
            trips += 1;
            let elapsed = started.elapsed();
            if elapsed >= duration {
                break elapsed;
            }
        };
        drop(near);
        echo.join()
            .map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
        Ok((measured.as_secs_f64() * 1e6 / trips as f64, trips))
    })
}

/// Measures both transports and prints one line each.
pub fn run(args: RoundtripBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.repeat > 0, "--repeat must be positive");
    let size = usize::try_from(args.size)
        .ok()
        .filter(|&s| s > 0 && s <= 64 << 20)
        .ok_or_else(|| anyhow::anyhow!("--size: {} is not between 1 byte and 64 MiB", args.size))?;
    let mut runs: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..args.repeat {
        let mut order = [Transport::Tcp, Transport::Unix];
        if round % 2 == 1 {
            order.reverse();
        }
        for transport in order {
            let (us, _) = measure(transport, size, args.duration)?;
            runs[transport as usize].push(us);
        }
    }
    if !args.json {
        println!(
            "| transport | µs per round trip ({} B each way), median | min–max of {} runs |",
            size, args.repeat
        );
        println!("|---|--:|--:|");
    }
    for transport in [Transport::Tcp, Transport::Unix] {
        let us = &mut runs[transport as usize];
        us.sort_by(f64::total_cmp);
        let median = us[us.len() / 2];
        if args.json {
            println!(
                r#"{{"op":"roundtrip","transport":"{}","size":{size},"p50_us":{median:.2}}}"#,
                transport.name()
            );
        } else {
            println!(
                "| {} | {median:.1} | {:.1}–{:.1} |",
                transport.name(),
                us[0],
                us[us.len() - 1]
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_transports_carry_round_trips_and_end_when_the_measuring_side_closes() {
        for transport in [Transport::Tcp, Transport::Unix] {
            let (us, trips) = measure(transport, 4096, Duration::from_millis(20)).unwrap();
            assert!(
                trips > 0 && us.is_finite() && us > 0.0,
                "{transport:?}: {us} µs"
            );
        }
    }
}
