//! A user-space TCP relay that shapes a link where the kernel has no `netem`: every chunk of
//! bytes it forwards is held for a one-way delay (plus jitter), and with probability `loss` it
//! is held for a retransmission timeout more, as a lost segment costs a TCP stream. The byte
//! stream itself is never changed, as TCP guarantees: what a lossy link does to a connection is
//! delay it.
//!
//! One thread per direction reads, a second one writes each chunk when its time has come, so
//! the relay adds latency without capping throughput (chunks are up to 64 KiB).
//!
//! `moonkv bench relay` runs one from the command line (the cross-host benchmark script puts
//! it between a client and a node host); tests use [`Relay`] directly.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a relay shapes its link (each direction the same).
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// One-way delay of every chunk.
    pub delay: Duration,
    /// Up to this much more, uniformly.
    pub jitter: Duration,
    /// Probability that a chunk is "lost" and delivered a retransmission timeout late.
    pub loss: f64,
    /// What a loss costs (Linux's minimum RTO is 200 ms).
    pub retransmit: Duration,
}

impl Shape {
    /// A link of `rtt` round-trip time, no loss.
    pub fn rtt(rtt: Duration) -> Shape {
        Shape {
            delay: rtt / 2,
            jitter: Duration::ZERO,
            loss: 0.0,
            retransmit: Duration::from_millis(200),
        }
    }

    /// The same link, losing `loss` (0..1) of its chunks.
    pub fn with_loss(mut self, loss: f64) -> Shape {
        self.loss = loss;
        self
    }

    fn hold(&self) -> Duration {
        let mut hold = self.delay;
        if !self.jitter.is_zero() {
            hold += self.jitter.mul_f64(rand_unit());
        }
        if self.loss > 0.0 && rand_unit() < self.loss {
            hold += self.retransmit;
        }
        hold
    }
}

fn rand_unit() -> f64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// A running relay: `listen` → `target`, shaped; stops accepting when dropped (open
/// connections end with their peers).
pub struct Relay {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    shape: Arc<parking_lot::Mutex<Shape>>,
}

impl Relay {
    /// Listens on `listen` (port 0 picks one) and forwards every connection to `target`.
    pub fn start(listen: &str, target: SocketAddr, shape: Shape) -> std::io::Result<Relay> {
        let listener = TcpListener::bind(listen)?;
        let address = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let shape = Arc::new(parking_lot::Mutex::new(shape));
        let shaping = shape.clone();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((inbound, _)) => {
                        let _ = inbound.set_nonblocking(false);
                        if let Ok(outbound) =
                            TcpStream::connect_timeout(&target, Duration::from_secs(5))
                        {
                            let _ = inbound.set_nodelay(true);
                            let _ = outbound.set_nodelay(true);
                            pipe(&inbound, &outbound, shaping.clone());
                            pipe(&outbound, &inbound, shaping.clone());
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(Relay {
            address,
            stop,
            shape,
        })
    }

    /// Shapes every chunk from now on (open connections included) as `shape` says.
    pub fn set_shape(&self, shape: Shape) {
        *self.shape.lock() = shape;
    }

    /// Where callers connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Forwards `from` → `to`, each chunk held as `shape` says, in order.
fn pipe(from: &TcpStream, to: &TcpStream, shape: Arc<parking_lot::Mutex<Shape>>) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        // Chunks leave in order: a late chunk holds back the ones after it, as in TCP.
        let mut last = Instant::now();
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let hold = shape.lock().hold();
                    let due = (Instant::now() + hold).max(last);
                    last = due;
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (due, chunk) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// `moonkv bench relay`.
#[derive(clap::Args, Debug)]
pub struct RelayArgs {
    /// Address to listen on, e.g. `10.1.0.254:7000`.
    #[arg(long)]
    listen: String,
    /// Address to forward to.
    #[arg(long)]
    target: SocketAddr,
    /// Round-trip time the relay adds, e.g. `1ms`, `100us` as `0.1ms`.
    #[arg(long, default_value = "1ms", value_parser = moonkv_proto::units::duration_flag)]
    rtt: Duration,
    /// Fraction of chunks delivered a retransmission (200 ms) late, e.g. `0.005`.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
}

/// Runs a relay until the process is stopped; prints a ready line with its address.
pub fn run(args: RelayArgs) -> anyhow::Result<()> {
    anyhow::ensure!((0.0..1.0).contains(&args.loss), "--loss must be in [0, 1)");
    let relay = Relay::start(
        &args.listen,
        args.target,
        Shape::rtt(args.rtt).with_loss(args.loss),
    )?;
    println!("{{\"event\":\"ready\",\"relay\":\"{}\"}}", relay.address());
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_arrive_intact_and_late_by_the_delay() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = server.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut buf = vec![0u8; 1 << 20];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        });
        let relay =
            Relay::start("127.0.0.1:0", target, Shape::rtt(Duration::from_millis(40))).unwrap();
        let mut c = TcpStream::connect(relay.address()).unwrap();
        let sent: Vec<u8> = (0..1u32 << 20).map(|i| (i * 13) as u8).collect();
        let started = Instant::now();
        c.write_all(&sent).unwrap();
        let mut back = vec![0u8; sent.len()];
        c.read_exact(&mut back).unwrap();
        assert_eq!(back, sent);
        // Out and back: at least one round trip.
        assert!(started.elapsed() >= Duration::from_millis(40));
    }
}
