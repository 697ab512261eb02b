//! `moonkv bench events`: the event stream's rate end to end (publisher → Rust subscriber on
//! loopback), and what publishing costs the master (the same in-process put load with the
//! real publisher hook as the engine's sink, against the no-op sink).

use super::load::{LoadSettings, ShapeResult};
use super::report::{grouped, micros};
use super::shape::Shape;
use super::stream::{paced_loopback, PacedReport};
use crate::loopback::{run_loopback, LoopbackOptions};
use moonkv_events::{Delivery, Subscriber};
use moonkv_master::engine::{AvailabilitySink, Engine, EngineConfig, NoopSink, SystemClock};
use moonkv_master::server::events::EventHook;
use moonkv_master::server::KvEventsSettings;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `moonkv bench events`.
#[derive(clap::Args, Debug)]
pub struct EventsBenchArgs {
    /// Events pushed through publisher → subscriber in each loopback run.
    #[arg(long, default_value_t = 2_000_000)]
    events: u64,
    /// Offered rates (events/s) of the paced loopback runs, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1000000")]
    rates: Vec<u64>,
    /// Object key length of the loopback events, in bytes.
    #[arg(long, default_value_t = 32)]
    key_len: usize,
    /// Measured time of each master-rate run (events off, on, on with a subscriber).
    #[arg(long, default_value = "5s", value_parser = super::parse_duration)]
    duration: Duration,
    /// Rounds of the master-rate comparison; the median run of each sink is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Load of the master-rate comparison (in-process engine; puts emit one event each).
    #[arg(long, default_value = "put:1x1")]
    shape: Shape,
    /// Run only the loopback stream measurement or only the master-rate comparison.
    #[arg(long, value_enum, default_value_t = Part::All)]
    part: Part,
    /// Print JSON instead of the tables.
    #[arg(long)]
    json: bool,
}

/// Which measurements `bench events` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// Both.
    All,
    /// Publisher → subscriber on loopback.
    Loopback,
    /// The master's put rate with events off and on.
    MasterRate,
}

/// One loopback run: the unpaced firehose or a paced stream.
#[derive(Debug, Serialize)]
struct LoopbackRow {
    /// How the events were offered.
    load: String,
    /// Publisher queue bound (0 = unbounded).
    queue_capacity: usize,
    report: PacedReport,
}

/// One master-rate run (or the median of several).
#[derive(Debug, Serialize)]
struct SinkRow {
    sink: &'static str,
    load: ShapeResult,
    published_events: u64,
    dropped_events: u64,
    received_events: Option<u64>,
}

/// Runs both measurements and prints them.
pub fn run(args: EventsBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.events > 0, "--events must be positive");
    let mut loopback = Vec::new();
    let capacities = match args.part {
        Part::MasterRate => vec![],
        _ => vec![0, moonkv_events::DEFAULT_QUEUE_CAPACITY],
    };
    for queue_capacity in capacities {
        tracing::info!(
            events = args.events,
            queue_capacity,
            "loopback firehose run"
        );
        let opts = LoopbackOptions {
            events: args.events,
            key_len: args.key_len,
            queue_capacity,
            deadline: Duration::from_secs(120),
        };
        let r = run_loopback(&opts)?;
        let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        let report = PacedReport {
            offered_per_s: f64::INFINITY,
            published: r.published,
            received: r.received,
            dropped: r.dropped,
            missed_sequences: r.missed_sequences,
            publish_per_s: rate(r.published, r.publish_seconds),
            end_to_end_per_s: r.events_per_second,
            completed: r.completed,
        };
        loopback.push(LoopbackRow {
            load: "firehose".into(),
            queue_capacity,
            report,
        });
    }
    if args.part != Part::MasterRate {
        for &rate in &args.rates {
            tracing::info!(events = args.events, rate, "loopback paced run");
            let report = paced_loopback(args.events, rate, args.key_len)?;
            loopback.push(LoopbackRow {
                load: format!("paced {}/s", grouped(rate as f64)),
                queue_capacity: moonkv_events::DEFAULT_QUEUE_CAPACITY,
                report,
            });
        }
    }

    let settings = LoadSettings {
        duration: args.duration,
        segments: 128,
        segment_size: 64 << 30,
        value_size: 4096,
        prefill: 10_000,
    };
    let mut sinks = Vec::new();
    if args.part != Part::Loopback {
        anyhow::ensure!(args.repeat > 0, "--repeat must be positive");
        let kinds = [Hook::Off, Hook::On, Hook::OnWithSubscriber];
        // Rounds interleave the three sinks so drift in the machine's load hits all of them.
        let mut runs: Vec<Vec<SinkRow>> = kinds.iter().map(|_| Vec::new()).collect();
        for _ in 0..args.repeat {
            for (i, hook) in kinds.iter().enumerate() {
                runs[i].push(run_sink(*hook, args.shape, &settings)?);
            }
        }
        sinks.extend(runs.into_iter().filter_map(SinkRow::median));
    }

    if args.json {
        let out = serde_json::json!({ "loopback": loopback, "master_rate": sinks });
        println!("{out}");
        return Ok(());
    }
    if !loopback.is_empty() {
        print_loopback(&loopback, args.key_len);
    }
    if !sinks.is_empty() {
        print_sinks(&sinks);
    }
    Ok(())
}

impl SinkRow {
    /// The median run by keys/s, with the spread of all runs in its load figures.
    fn median(mut runs: Vec<SinkRow>) -> Option<SinkRow> {
        runs.sort_by(|a, b| a.load.keys_per_s.total_cmp(&b.load.keys_per_s));
        let (min, max) = (runs.first()?.load.keys_per_s, runs.last()?.load.keys_per_s);
        let n = runs.len();
        let mut median = runs.swap_remove(n / 2);
        median.load.runs = n;
        median.load.keys_per_s_min = min;
        median.load.keys_per_s_max = max;
        Some(median)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Hook {
    Off,
    On,
    OnWithSubscriber,
}

impl Hook {
    fn name(self) -> &'static str {
        match self {
            Hook::Off => "off (no-op sink)",
            Hook::On => "on, no subscriber",
            Hook::OnWithSubscriber => "on, subscriber draining",
        }
    }
}

fn hook_settings() -> KvEventsSettings {
    KvEventsSettings {
        enabled: true,
        bind_endpoint: "tcp://127.0.0.1:0".into(),
        backend_id: "moonkv-bench".into(),
        ..KvEventsSettings::default()
    }
}

/// Runs `shape` on a fresh engine whose sink is the no-op sink or a live publisher hook.
fn run_sink(hook: Hook, shape: Shape, settings: &LoadSettings) -> anyhow::Result<SinkRow> {
    let name = hook.name();
    let publisher = match hook {
        Hook::Off => None,
        Hook::On | Hook::OnWithSubscriber => Some(Arc::new(EventHook::start(&hook_settings())?)),
    };
    let sink: Arc<dyn AvailabilitySink> = match &publisher {
        Some(p) => p.clone(),
        None => Arc::new(NoopSink),
    };
    let drain = match (&publisher, hook) {
        (Some(p), Hook::OnWithSubscriber) => Some(Drain::start(p)?),
        _ => None,
    };
    let engine = Arc::new(Engine::new(
        EngineConfig::default(),
        Arc::new(SystemClock),
        sink,
    ));
    tracing::info!(sink = name, %shape, "master rate run");
    let load = super::master::run_on_engine(&engine, shape, settings)?;
    let (mut published_events, mut dropped_events) = (0, 0);
    if let Some(p) = &publisher {
        let status = wait_for_empty_queue(p);
        published_events = status.published_events;
        dropped_events = status.dropped_events;
    }
    let received_events = drain.map(|d| d.finish(published_events));
    if let Some(p) = publisher {
        p.shutdown();
    }
    Ok(SinkRow {
        sink: name,
        load,
        published_events,
        dropped_events,
        received_events,
    })
}

fn wait_for_empty_queue(hook: &EventHook) -> moonkv_events::PublisherStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = hook.status();
        if status.queue_len == 0 || Instant::now() >= deadline {
            return status;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A subscriber thread that decodes everything the hook publishes.
struct Drain {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Drain {
    fn start(hook: &EventHook) -> anyhow::Result<Drain> {
        let endpoint = hook
            .endpoint()
            .ok_or_else(|| anyhow::anyhow!("the event hook has no endpoint"))?;
        let mut subscriber = Subscriber::connect(&endpoint, Duration::from_millis(20))?;
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, received) = (stop.clone(), received.clone());
            std::thread::Builder::new()
                .name("moonkv-bench-sub".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match subscriber.poll() {
                            Ok(Delivery::Message { message, .. }) => {
                                received.fetch_add(message.events.len() as u64, Ordering::Relaxed);
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "benchmark subscriber failed");
                                return;
                            }
                        }
                    }
                })?
        };
        // ZMQ's slow joiner: give the subscription time to reach the publisher.
        std::thread::sleep(Duration::from_millis(300));
        Ok(Drain {
            stop,
            received,
            thread,
        })
    }

    /// Waits (bounded) for the subscriber to catch up with `published`, then stops it.
    fn finish(self, published: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = (self.received.load(Ordering::Relaxed), Instant::now());
        while Instant::now() < deadline {
            let now = self.received.load(Ordering::Relaxed);
            if now >= published {
                break;
            }
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > Duration::from_millis(500) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.received.load(Ordering::Relaxed)
    }
}

fn print_loopback(rows: &[LoopbackRow], key_len: usize) {
    println!(
        "Event stream, publisher → Rust subscriber over loopback TCP ({key_len}-byte keys):\n"
    );
    println!("| load | queue capacity | published | received | dropped | missed seq | publish calls/s | end-to-end events/s | completed |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|---|");
    for row in rows {
        let r = &row.report;
        let capacity = match row.queue_capacity {
            0 => "unbounded".to_string(),
            n => grouped(n as f64),
        };
        println!(
            "| {} | {capacity} | {} | {} | {} | {} | {} | {} | {} |",
            row.load,
            grouped(r.published as f64),
            grouped(r.received as f64),
            grouped(r.dropped as f64),
            grouped(r.missed_sequences as f64),
            grouped(r.publish_per_s),
            grouped(r.end_to_end_per_s),
            if r.completed { "yes" } else { "**no**" },
        );
    }
}

fn print_sinks(rows: &[SinkRow]) {
    let off = rows.first().map_or(0.0, |r| r.load.keys_per_s);
    println!(
        "\nMaster rate with events off vs on (in-process engine, {}; the median run of each):\n",
        rows[0].load.shape
    );
    let runs = rows.first().map_or(1, |r| r.load.runs);
    println!("| events | keys/s | min–max of {runs} runs | × off | mean µs | p99 µs | published | dropped | received |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in rows {
        let ratio = if off > 0.0 {
            r.load.keys_per_s / off
        } else {
            0.0
        };
        println!(
            "| {} | {} | {}–{} | {ratio:.3}× | {} | {} | {} | {} | {} |",
            r.sink,
            grouped(r.load.keys_per_s),
            grouped(r.load.keys_per_s_min),
            grouped(r.load.keys_per_s_max),
            micros(r.load.mean_us),
            micros(r.load.p99_us),
            grouped(r.published_events as f64),
            grouped(r.dropped_events as f64),
            r.received_events
                .map_or("–".to_string(), |n| grouped(n as f64)),
        );
    }
}
