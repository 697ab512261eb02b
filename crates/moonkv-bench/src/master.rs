//! `moonkv bench master`: metadata-only load on a master, in the shape of the upstream
//! master_bench. Fake segments are mounted (numbers only, never touched), then each shape runs
//! `clients × threads` workers for a fixed time over one operation.
//!
//! Targets: a running master (`--master`), a fresh master started in this process for each
//! shape (`--spawn`), or the engine called directly with no network (`--in-process`).

use super::load::{self, LoadSettings, ShapeResult};
use super::report;
use super::shape::Shape;
use super::target::{self, MetaTarget};
use moonkv_client::master_client::blocking::Connection;
use moonkv_master::engine::{Engine, EngineConfig, NoopSink, SystemClock};
use moonkv_master::server::{self, MasterConfig};
use moonkv_proto::msg::{PingRequest, UnmountSegmentRequest};
use moonkv_proto::{ClientId, Segment};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the benchmark's segment owner pings (the master's default TTL is 10 s).
const PING_PERIOD: Duration = Duration::from_secs(1);

/// `moonkv bench master`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["master", "spawn", "in_process"])))]
pub struct MasterBenchArgs {
    /// RPC address of a running master (HOST:PORT). Keys written are removed and the fake
    /// segments unmounted after each shape.
    #[arg(long, value_name = "ADDR")]
    master: Option<String>,
    /// Start a fresh master in this process for each shape (127.0.0.1, ephemeral port,
    /// default settings) and measure it over loopback TCP.
    #[arg(long)]
    spawn: bool,
    /// Call the engine directly, no network and no serialization: the engine's ceiling.
    #[arg(long)]
    in_process: bool,
    /// With `--spawn`: also run every shape on a master with HA on, elected through the etcd at
    /// these endpoints (`host:port[;host:port]`), interleaved with the HA-off runs (off, on,
    /// then on, off, ...), and print the HA-on / HA-off ratio per shape.
    #[arg(long, value_name = "ENDPOINTS", requires = "spawn")]
    compare_ha: Option<String>,
    /// Shapes to run, `OP:CxT[:bB]` with OP one of put, get, batch-put, batch-get (comma
    /// separated or repeated). Default: the eight shapes of the upstream comparison.
    #[arg(long = "shape", value_delimiter = ',', value_name = "SHAPE")]
    shapes: Vec<Shape>,
    /// Measured time per shape (e.g. 10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    duration: Duration,
    /// Runs per shape (each on a fresh master or engine, or back to back on `--master`); the
    /// median run by keys/s is reported with the spread of all runs.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Fake segments to mount.
    #[arg(long, default_value_t = 128)]
    segments: u64,
    /// Size of each fake segment, in GiB.
    #[arg(long, default_value_t = 64)]
    segment_gib: u64,
    /// Object size announced by every put, in bytes.
    #[arg(long, default_value_t = 4096)]
    value_size: u64,
    /// Keys each worker writes before a get shape and then reads in a cycle.
    #[arg(long, default_value_t = 10_000)]
    prefill: u64,
    /// Tab-separated comparator figures (`shape keys_per_s latency_us target_ratio`) to print
    /// next to the results.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// What the baseline figures are, for the column headers.
    #[arg(long, default_value = "upstream")]
    baseline_name: String,
    /// Print one JSON object per shape instead of the table.
    #[arg(long)]
    json: bool,
}

impl MasterBenchArgs {
    fn settings(&self) -> anyhow::Result<LoadSettings> {
        anyhow::ensure!(self.segments > 0, "--segments must be positive");
        anyhow::ensure!(self.value_size > 0, "--value-size must be positive");
        let segment_size = self
            .segment_gib
            .checked_mul(1 << 30)
            .filter(|s| *s > 0 && s.checked_add(self.segments << 44).is_some())
            .ok_or_else(|| anyhow::anyhow!("--segment-gib must be between 1 and 1048575"))?;
        Ok(LoadSettings {
            duration: self.duration,
            segments: self.segments,
            segment_size,
            value_size: self.value_size,
            prefill: self.prefill,
        })
    }
}

/// Runs the shapes against the chosen target and prints the table.
pub fn run(args: MasterBenchArgs) -> anyhow::Result<()> {
    let settings = args.settings()?;
    let baselines = match &args.baseline {
        Some(path) => report::load_baselines(path)?,
        None => Default::default(),
    };
    let shapes = if args.shapes.is_empty() {
        Shape::upstream_matrix()
    } else {
        args.shapes.clone()
    };
    let mut results = Vec::with_capacity(shapes.len());
    let emit = |r: &ShapeResult| {
        if args.json {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        }
        tracing::info!(
            shape = %r.shape,
            keys_per_s = r.keys_per_s as u64,
            mean_us = r.mean_us,
            p99_us = r.p99_us,
            errors = r.errors,
            "shape done"
        );
    };
    anyhow::ensure!(args.repeat > 0, "--repeat must be positive");
    let rt = if args.spawn {
        Some(crate::runtime(0)?)
    } else {
        None
    };
    let remote = args.master.as_deref().map(resolve).transpose()?;
    let mut ratios = Vec::new();
    for shape in &shapes {
        let mut runs = Vec::with_capacity(args.repeat);
        let mut ha_runs = Vec::with_capacity(args.repeat);
        for round in 0..args.repeat {
            let r = if let (Some(rt), Some(etcd)) = (&rt, &args.compare_ha) {
                // Alternate the order so neither mode always runs on a warmer machine.
                let ha_first = round % 2 == 1;
                let mut pair = Vec::with_capacity(2);
                for ha in [ha_first, !ha_first] {
                    let config = if ha {
                        ha_config(etcd)?
                    } else {
                        MasterConfig::ephemeral()
                    };
                    pair.push((ha, spawn_and_run(rt, config, *shape, &settings)?));
                }
                let (ha, off): (Vec<_>, Vec<_>) = pair.into_iter().partition(|(ha, _)| *ha);
                let mut ha_result = ha.into_iter().map(|(_, r)| r).next().expect("an HA run");
                ha_result.mode = "spawn+ha".into();
                emit(&ha_result);
                ha_runs.push(ha_result);
                off.into_iter()
                    .map(|(_, r)| r)
                    .next()
                    .expect("an HA-off run")
            } else if let Some(rt) = &rt {
                spawn_and_run(rt, MasterConfig::ephemeral(), *shape, &settings)?
            } else if let Some(addr) = remote {
                run_on_wire(addr, *shape, &settings, "wire", true)?
            } else {
                run_on_engine(&Arc::new(new_engine()), *shape, &settings)?
            };
            emit(&r);
            runs.push(r);
        }
        let off = ShapeResult::median(runs);
        let on = ShapeResult::median(ha_runs);
        if let (Some(off), Some(on)) = (&off, &on) {
            ratios.push((off.shape.clone(), on.keys_per_s / off.keys_per_s.max(1e-9)));
        }
        results.extend(off);
        results.extend(on);
    }
    if !args.json {
        print!(
            "{}",
            report::shape_table(&results, &baselines, &args.baseline_name)
        );
        for (shape, ratio) in &ratios {
            println!("HA on / HA off  {shape:<16} {ratio:.3}");
        }
    }
    let failed: u64 = results.iter().map(|r| r.errors).sum();
    if failed > 0 {
        tracing::warn!(failed, "some calls failed; their keys are not counted");
    }
    Ok(())
}

/// Starts a master in this process with `config`, runs one shape on it, shuts it down.
fn spawn_and_run(
    rt: &tokio::runtime::Runtime,
    config: MasterConfig,
    shape: Shape,
    settings: &LoadSettings,
) -> anyhow::Result<ShapeResult> {
    let ha = config.enable_ha;
    let master = rt.block_on(server::start(config))?;
    if ha {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !master.gate().serving() {
            if Instant::now() > deadline {
                rt.block_on(master.shutdown());
                anyhow::bail!("the HA master was not elected leader within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let outcome = run_on_wire(master.rpc_addr(), shape, settings, "spawn", false);
    rt.block_on(master.shutdown());
    outcome
}

/// An ephemeral master with HA on, alone in a cluster of its own on `etcd`.
fn ha_config(etcd: &str) -> anyhow::Result<MasterConfig> {
    let mut config = MasterConfig::ephemeral();
    config.enable_ha = true;
    config.etcd_endpoints = etcd.to_string();
    config.cluster_id = format!("bench-{:08x}", super::nonce() as u32);
    config.validate()?;
    Ok(config)
}

fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("cannot resolve --master {addr}: {e}"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("--master {addr} resolves to no address"))
}

/// An engine with default settings and no event sink, as `moonkv master` builds it.
pub fn new_engine() -> Engine {
    Engine::new(
        EngineConfig::default(),
        Arc::new(SystemClock),
        Arc::new(NoopSink),
    )
}

/// Mounts the fake segments on `engine` and runs one shape on it directly.
pub fn run_on_engine(
    engine: &Arc<Engine>,
    shape: Shape,
    settings: &LoadSettings,
) -> anyhow::Result<ShapeResult> {
    let nonce = super::nonce();
    let owner = ClientId::new(nonce, 1);
    target::mount_all(&**engine, owner, &target::fake_segments(nonce, settings))?;
    let targets = vec![engine.clone(); shape.clients];
    tracing::info!(%shape, "running in-process");
    load::run_shape(
        &targets,
        shape,
        settings,
        &key_space(nonce),
        "in-process",
        false,
    )
}

fn key_space(nonce: u64) -> String {
    format!("mkb{:08x}", nonce as u32)
}

/// Mounts the fake segments through one connection, keeps their owner alive with pings and runs
/// one shape. With `cleanup` (a shared master) the keys are removed and the segments unmounted
/// afterwards; a spawned master is simply dropped.
fn run_on_wire(
    addr: SocketAddr,
    shape: Shape,
    settings: &LoadSettings,
    mode: &str,
    cleanup: bool,
) -> anyhow::Result<ShapeResult> {
    let session = Session::open(addr, settings)?;
    tracing::info!(%shape, %addr, "running over the wire");
    let connected: anyhow::Result<Vec<Arc<Connection>>> = (0..shape.clients)
        .map(|c| super::connect(addr, &format!("moonkv-bench-{c}")).map(Arc::new))
        .collect();
    let result = connected.and_then(|targets| {
        let key_space = key_space(super::nonce());
        load::run_shape(&targets, shape, settings, &key_space, mode, cleanup)
    });
    session.close(cleanup);
    result
}

/// The benchmark's segment owner on a master: mounted segments plus a heartbeat thread.
struct Session {
    control: Arc<Connection>,
    owner: ClientId,
    segments: Vec<Segment>,
    stop: Arc<AtomicBool>,
    pinger: Option<JoinHandle<()>>,
}

impl Session {
    fn open(addr: SocketAddr, settings: &LoadSettings) -> anyhow::Result<Session> {
        let control = Arc::new(super::connect(addr, "moonkv-bench-control")?);
        let nonce = super::nonce();
        let owner = ClientId::new(nonce, 1);
        let segments = target::fake_segments(nonce, settings);
        let started = Instant::now();
        target::mount_all(&*control, owner, &segments)
            .map_err(|e| anyhow::anyhow!("mounting the fake segments failed: {e}"))?;
        tracing::info!(
            segments = segments.len(),
            ms = started.elapsed().as_millis() as u64,
            "fake segments mounted"
        );
        let stop = Arc::new(AtomicBool::new(false));
        let pinger = {
            let (control, stop) = (control.clone(), stop.clone());
            std::thread::Builder::new()
                .name("moonkv-bench-ping".into())
                .spawn(move || heartbeat(&control, owner, &stop))?
        };
        Ok(Session {
            control,
            owner,
            segments,
            stop,
            pinger: Some(pinger),
        })
    }

    fn close(mut self, unmount: bool) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(p) = self.pinger.take() {
            let _ = p.join();
        }
        if !unmount {
            return;
        }
        for s in &self.segments {
            let req = UnmountSegmentRequest {
                segment_id: s.id,
                client_id: self.owner,
            };
            if let Err(e) = self.control.unmount_segment(&req) {
                tracing::warn!(error = %e, "unmounting a fake segment failed");
                break;
            }
        }
    }
}

fn heartbeat(control: &Connection, owner: ClientId, stop: &AtomicBool) {
    let req = PingRequest {
        client_id: owner,
        mounted_segments: 0,
    };
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        if last.elapsed() >= PING_PERIOD {
            last = Instant::now();
            if let Err(e) = control.ping(&req) {
                tracing::warn!(error = %e, "benchmark heartbeat failed");
            }
        }
    }
}
