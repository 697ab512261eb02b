//! `moonkv bench echo`: the loopback round-trip floor of this machine. The same blocking client
//! and the same kind of tokio runtime as `bench master --spawn`, against a server that answers
//! every request frame with an empty response and does nothing else. What a single-key shape
//! measures above this floor is the master's own work.

use super::histogram::Histogram;
use super::report::{grouped, micros};
use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::{HelloAck, Op, ServiceReadyRequest};
use moonkv_proto::PROTOCOL_VERSION;
use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `moonkv bench echo`.
#[derive(clap::Args, Debug)]
pub struct EchoBenchArgs {
    /// Connections to measure with, one thread each (comma separated: one run per value).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    clients: Vec<usize>,
    /// Measured time per run.
    #[arg(long, default_value = "5s", value_parser = super::parse_duration)]
    duration: Duration,
    /// Runs per client count; the median by round trips/s is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
}

/// Runs the echo server on an ephemeral port and measures round trips.
pub fn run(args: EchoBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.repeat > 0, "--repeat must be positive");
    let rt = crate::runtime(0)?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    rt.spawn(serve(listener));
    println!("| connections × threads | round trips/s | min–max of {} runs | mean µs | p50 µs | p99 µs |", args.repeat);
    println!("|---|--:|--:|--:|--:|--:|");
    for &clients in &args.clients {
        anyhow::ensure!(clients > 0, "--clients must be positive");
        let mut runs = (0..args.repeat)
            .map(|_| measure(addr, clients, args.duration))
            .collect::<anyhow::Result<Vec<_>>>()?;
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (lo, hi) = (runs[0].0, runs[runs.len() - 1].0);
        let (rate, latency) = &runs[runs.len() / 2];
        println!(
            "| {clients}×1 | {} | {}–{} | {} | {} | {} |",
            grouped(*rate),
            grouped(lo),
            grouped(hi),
            micros(latency.mean_us()),
            micros(latency.quantile_us(0.5)),
            micros(latency.quantile_us(0.99)),
        );
    }
    Ok(())
}

fn measure(
    addr: SocketAddr,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<(f64, Histogram)> {
    let connections = (0..clients)
        .map(|c| super::connect(addr, &format!("moonkv-bench-echo-{c}")).map(Arc::new))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let start_line = Barrier::new(clients);
    let results: Vec<anyhow::Result<(u64, f64, Histogram)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = connections
            .iter()
            .map(|conn| {
                let start_line = &start_line;
                scope.spawn(move || {
                    let mut latency = Histogram::default();
                    start_line.wait();
                    let started = Instant::now();
                    let deadline = started + duration;
                    let (mut now, mut calls) = (started, 0u64);
                    while now < deadline {
                        conn.call::<_, ()>(Op::ServiceReady, &ServiceReadyRequest {})?;
                        let after = Instant::now();
                        latency.record(after - now);
                        now = after;
                        calls += 1;
                    }
                    Ok((calls, (now - started).as_secs_f64(), latency))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("echo client panicked")))
            })
            .collect()
    });
    let mut latency = Histogram::default();
    let (mut calls, mut seconds) = (0u64, 0f64);
    for r in results {
        let (c, s, h) = r?;
        calls += c;
        seconds = seconds.max(s);
        latency.merge(&h);
    }
    Ok((calls as f64 / seconds.max(f64::MIN_POSITIVE), latency))
}

/// Accepts connections forever (the runtime is dropped at exit).
async fn serve(listener: tokio::net::TcpListener) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Err(e) = echo(stream).await {
                tracing::debug!(error = %e, "echo connection closed");
            }
        });
    }
}

/// The real server's I/O loop without the work: parse every whole frame in the buffer, answer
/// each with an empty response, one write per read.
async fn echo(stream: tokio::net::TcpStream) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let (mut reader, mut writer) = stream.into_split();
    let mut input = Vec::with_capacity(64 * 1024);
    let mut output = Vec::with_capacity(64 * 1024);
    loop {
        if reader.read_buf(&mut input).await? == 0 {
            return Ok(());
        }
        let mut consumed = 0;
        while let Some((f, used)) =
            frame::decode(&input[consumed..], frame::DEFAULT_MAX_FRAME_BYTES)?
        {
            consumed += used;
            if f.kind == FrameKind::Hello {
                let ack = HelloAck {
                    protocol_version: PROTOCOL_VERSION,
                    server_version: "echo".into(),
                    max_frame_bytes: frame::DEFAULT_MAX_FRAME_BYTES,
                    challenge: None,
                    server_proof: None,
                    admin_addr: None,
                    local_socket: None,
                };
                frame::encode_ok(&mut output, f.request_id, &ack)?;
            } else {
                frame::encode_ok(&mut output, f.request_id, &())?;
            }
        }
        input.drain(..consumed);
        writer.write_all(&output).await?;
        output.clear();
    }
}
