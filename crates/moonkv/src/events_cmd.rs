//! `moonkv events`: follow a master's KV event stream.
//!
//! - `tail` prints one line per event (one JSON object with `--json`).
//! - `index` keeps a placement index, exact across losses and master restarts through the
//!   master's `/kv_events/snapshot` (the procedure in `docs/events.md`), and reports its size
//!   and counters every `--interval` seconds.
//!
//! Both are blocking loops over [`Subscriber`]; they need no async runtime. Events go to
//! stdout; sequence gaps, publisher restarts and unreadable messages go to stderr as lines
//! starting with `!!`, so a script reading stdout sees events only. `--count` and
//! `--timeout` bound a run; a timeout is an error only when the run had a goal (`--count`,
//! `--once-synced`) it did not reach.

use anyhow::Context;
use moonkv_events::subscriber::{PlacementEntry, SyncCounters, DEFAULT_RECV_TIMEOUT};
use moonkv_events::{
    format_event_line, DecodedEvent, DecodedMessage, Delivery, HttpSnapshotSource, IndexSync,
    Medium, SequenceVerdict, SnapshotSource, Subscriber, SubscriberCounters,
};
use moonkv_proto::units::{duration_flag, positive_duration_flag};
use serde::Serialize;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `moonkv events`.
#[derive(clap::Args, Debug)]
pub struct EventsArgs {
    #[command(subcommand)]
    command: EventsCommand,
}

#[derive(clap::Subcommand, Debug)]
enum EventsCommand {
    /// Print every event as it arrives (gaps and restarts as `!!` lines on stderr).
    Tail(TailArgs),
    /// Keep a placement index (recovered through the master's snapshot) and report it.
    Index(IndexArgs),
}

/// Where to subscribe and when to stop; shared by `tail` and `index`.
#[derive(clap::Args, Debug)]
struct StreamOptions {
    /// ZMQ endpoint of the master's event publisher (`kv_events_bind_endpoint`).
    #[arg(long, default_value = "tcp://127.0.0.1:5557")]
    endpoint: String,
    /// Exit after receiving this many events.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Exit after this many seconds; an error if a goal (--count, --once-synced) is unmet.
    #[arg(long, value_name = "DURATION", value_parser = positive_duration_flag)]
    timeout: Option<Duration>,
}

/// `moonkv events tail`.
#[derive(clap::Args, Debug)]
struct TailArgs {
    #[command(flatten)]
    stream: StreamOptions,
    /// One JSON object per event, with the message's `sequence`, instead of text.
    #[arg(long)]
    json: bool,
}

/// `moonkv events index`.
#[derive(clap::Args, Debug)]
struct IndexArgs {
    #[command(flatten)]
    stream: StreamOptions,
    /// The master's admin HTTP address (`host:port`), where snapshots are fetched.
    #[arg(long, default_value = "127.0.0.1:9003")]
    admin: String,
    /// Follow without snapshots: after any loss the index is wiped and rebuilt from new
    /// events, so objects stored before the loss are missing until stored again.
    #[arg(long)]
    no_snapshot: bool,
    /// Index only this tenant.
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
    /// Seconds between status lines; 0 prints none.
    #[arg(long, value_name = "DURATION", default_value = "5", value_parser = duration_flag)]
    interval: Duration,
    /// Status lines as JSON.
    #[arg(long)]
    json: bool,
    /// Exit as soon as the index is live (snapshot applied, nothing missing since).
    #[arg(long)]
    once_synced: bool,
    /// On exit, print the whole index and its counters as one JSON document (instead of
    /// the final status line).
    #[arg(long)]
    dump_json: bool,
}

/// Runs `moonkv events ...` until its goal, its timeout, or SIGINT/SIGTERM.
pub fn run(args: EventsArgs) -> anyhow::Result<()> {
    let stop = stop_on_signal();
    match args.command {
        EventsCommand::Tail(args) => tail(&args, &stop),
        EventsCommand::Index(args) => index(&args, &stop),
    }
}

/// A flag raised by SIGINT or SIGTERM, so the loops can finish their output (a final
/// status line or `--dump-json`) instead of dying mid-line.
fn stop_on_signal() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(rt) => {
            let spawned = std::thread::Builder::new()
                .name("signals".into())
                .spawn(move || {
                    rt.block_on(crate::wait_for_signal());
                    flag.store(true, Ordering::Relaxed);
                });
            if let Err(e) = spawned {
                tracing::debug!(error = %e, "no signal thread; Ctrl-C ends the process at once");
            }
        }
        Err(e) => tracing::debug!(error = %e, "no signal runtime; Ctrl-C ends the process at once"),
    }
    stop
}

/// The stop conditions common to both commands.
struct Bounds {
    count: Option<u64>,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
}

impl Bounds {
    fn new(options: &StreamOptions) -> Self {
        Bounds {
            count: options.count,
            timeout: options.timeout,
            deadline: options.timeout.map(|t| Instant::now() + t),
        }
    }

    fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn count_reached(&self, events: u64) -> bool {
        self.count.is_some_and(|n| events >= n)
    }

    /// The error for a run that timed out before receiving `--count` events.
    fn check_count(&self, events: u64) -> anyhow::Result<()> {
        match self.count {
            Some(n) if events < n => anyhow::bail!(
                "timed out after {:.1} s: {events} of {n} events received",
                self.timeout.unwrap_or_default().as_secs_f64()
            ),
            _ => Ok(()),
        }
    }
}

fn connect(endpoint: &str) -> anyhow::Result<Subscriber> {
    Subscriber::connect(endpoint, DEFAULT_RECV_TIMEOUT)
        .with_context(|| format!("cannot subscribe to {endpoint}"))
}

/// Writes the `!!` lines for anything a reader of the stream must not miss.
fn report_trouble(delivery: &Delivery) {
    match delivery {
        Delivery::Idle => {}
        Delivery::Malformed {
            sequence: Some(seq),
            error,
        } => eprintln!("!! unreadable message at sequence {seq} skipped: {error}"),
        Delivery::Malformed {
            sequence: None,
            error,
        } => eprintln!("!! unreadable message skipped: {error}"),
        Delivery::Message { message, verdict } => {
            if let Some(line) = discontinuity_line(message.sequence, *verdict) {
                eprintln!("{line}");
            }
            if message.rejected_events > 0 {
                let why = message
                    .first_rejection
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                eprintln!(
                    "!! {} unreadable event(s) in sequence {} skipped: {why}",
                    message.rejected_events, message.sequence
                );
            }
        }
    }
}

fn discontinuity_line(sequence: u64, verdict: SequenceVerdict) -> Option<String> {
    match verdict {
        SequenceVerdict::Gap { missed } => Some(format!(
            "!! sequence gap: {missed} sequence number(s) missing before {sequence} \
             (last seen {}); events were lost",
            sequence - missed - 1
        )),
        SequenceVerdict::Restart { previous } => Some(format!(
            "!! publisher restart: sequence {sequence} after {previous}; \
             sequences and event ids begin again at 1"
        )),
        SequenceVerdict::First | SequenceVerdict::InOrder => None,
    }
}

/// One `--json` line of `tail`: the event plus the sequence of the message carrying it.
#[derive(Serialize)]
struct JsonEvent<'a> {
    sequence: u64,
    #[serde(flatten)]
    event: &'a DecodedEvent,
}

/// Ends quietly when the reader of stdout went away (`moonkv events tail | head`).
fn finish_write(result: io::Result<()>) -> anyhow::Result<bool> {
    match result {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("cannot write to stdout"),
    }
}

fn tail(args: &TailArgs, stop: &AtomicBool) -> anyhow::Result<()> {
    let mut subscriber = connect(&args.stream.endpoint)?;
    let bounds = Bounds::new(&args.stream);
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut printed = 0u64;
    while !stop.load(Ordering::Relaxed) && !bounds.expired() {
        let delivery = subscriber.poll()?;
        report_trouble(&delivery);
        let Delivery::Message { message, .. } = &delivery else {
            continue;
        };
        let (written, done) = write_events(&mut out, message, args.json, &bounds, &mut printed);
        if !finish_write(written.and_then(|()| out.flush()))? || done {
            return Ok(());
        }
    }
    if stop.load(Ordering::Relaxed) {
        return Ok(());
    }
    bounds.check_count(printed)
}

/// Prints a message's events up to `--count`; returns the write result and whether the
/// count has been reached.
fn write_events(
    out: &mut impl Write,
    message: &DecodedMessage,
    json: bool,
    bounds: &Bounds,
    printed: &mut u64,
) -> (io::Result<()>, bool) {
    for event in &message.events {
        let written = if json {
            let line = JsonEvent {
                sequence: message.sequence,
                event,
            };
            serde_json::to_writer(&mut *out, &line)
                .map_err(io::Error::from)
                .and_then(|()| out.write_all(b"\n"))
        } else {
            writeln!(out, "{}", format_event_line(event))
        };
        if written.is_err() {
            return (written, false);
        }
        *printed += 1;
        if bounds.count_reached(*printed) {
            return (Ok(()), true);
        }
    }
    (Ok(()), false)
}

/// What `index` reports every interval (and, with the entries, on `--dump-json`).
#[derive(Serialize)]
struct IndexStatus {
    /// The index is believed exact (not waiting for a snapshot).
    live: bool,
    /// Objects readable on at least one medium.
    objects: usize,
    /// Objects readable in memory.
    cpu: usize,
    /// Objects readable on disk.
    disk: usize,
    /// Transport and decoding counters.
    subscriber: SubscriberCounters,
    /// Recovery counters.
    sync: SyncCounters,
}

impl IndexStatus {
    fn of(subscriber: &Subscriber, sync: &IndexSync, entries: &[PlacementEntry]) -> Self {
        IndexStatus {
            live: sync.is_live(),
            objects: entries.len(),
            cpu: readable_on(entries, Medium::Cpu),
            disk: readable_on(entries, Medium::Disk),
            subscriber: subscriber.counters(),
            sync: sync.counters(),
        }
    }

    fn line(&self) -> String {
        let s = &self.subscriber;
        let last = s
            .last_sequence
            .map_or_else(|| "-".to_string(), |q| q.to_string());
        format!(
            "{} objects={} cpu={} disk={} | events={} applied={} gaps={} missed={} restarts={} \
             recoveries={} recovery_failures={} malformed={} last_sequence={last}",
            if self.live { "live" } else { "recovering" },
            self.objects,
            self.cpu,
            self.disk,
            s.events,
            self.sync.applied_events,
            s.gaps,
            s.missed_sequences,
            s.restarts,
            s.recoveries,
            s.recovery_failures,
            s.malformed,
        )
    }
}

/// How many of `entries` are readable on `medium`.
fn readable_on(entries: &[PlacementEntry], medium: Medium) -> usize {
    entries.iter().filter(|e| e.media.contains(medium)).count()
}

/// `--dump-json`: the status plus every indexed object.
#[derive(Serialize)]
struct IndexDump<'a> {
    #[serde(flatten)]
    status: IndexStatus,
    entries: &'a [PlacementEntry],
}

fn index(args: &IndexArgs, stop: &AtomicBool) -> anyhow::Result<()> {
    let source = if args.no_snapshot {
        None
    } else {
        let source = HttpSnapshotSource::new(&args.admin)
            .with_context(|| format!("bad --admin {:?}", args.admin))?
            .with_authorization(
                moonkv_client::util::secret_from_env().and_then(|s| s.bearer_header()),
            );
        Some(Box::new(source) as Box<dyn SnapshotSource + Send>)
    };
    let sync = IndexSync::new(source, args.tenant.clone());
    let mut subscriber = connect(&args.stream.endpoint)?.with_index(sync);
    let bounds = Bounds::new(&args.stream);
    let mut next_report = (!args.interval.is_zero()).then(|| Instant::now() + args.interval);
    let mut synced = false;
    while !stop.load(Ordering::Relaxed) && !bounds.expired() {
        let delivery = subscriber.poll()?;
        report_trouble(&delivery);
        synced = subscriber.sync().is_some_and(IndexSync::is_live);
        if (args.once_synced && synced) || bounds.count_reached(subscriber.counters().events) {
            break;
        }
        if next_report.is_some_and(|at| Instant::now() >= at) {
            if !print_status(&subscriber, args.json)? {
                return Ok(());
            }
            next_report = Some(Instant::now() + args.interval);
        }
    }
    finish_index(args, &subscriber)?;
    let events = subscriber.counters().events;
    let goal_met = (args.once_synced && synced) || bounds.count_reached(events);
    let has_goal = args.once_synced || bounds.count.is_some();
    if has_goal && !goal_met && bounds.expired() && !stop.load(Ordering::Relaxed) {
        let mut unmet = Vec::new();
        if args.once_synced {
            unmet.push(format!(
                "the index never became live (is --admin {} right?)",
                args.admin
            ));
        }
        if let Some(n) = bounds.count {
            unmet.push(format!("{events} of {n} events received"));
        }
        anyhow::bail!(
            "timed out after {:.1} s: {}",
            bounds.timeout.unwrap_or_default().as_secs_f64(),
            unmet.join("; ")
        );
    }
    Ok(())
}

fn sync_of(subscriber: &Subscriber) -> anyhow::Result<&IndexSync> {
    subscriber
        .sync()
        .context("the subscriber lost its index (a bug)")
}

/// Prints one status line; false when stdout is gone.
fn print_status(subscriber: &Subscriber, json: bool) -> anyhow::Result<bool> {
    let sync = sync_of(subscriber)?;
    let status = IndexStatus::of(subscriber, sync, &sync.index().entries());
    let line = if json {
        serde_json::to_string(&status)?
    } else {
        status.line()
    };
    let mut out = io::stdout().lock();
    finish_write(writeln!(out, "{line}").and_then(|()| out.flush()))
}

/// The last output of `index`: the dump, or one final status line.
fn finish_index(args: &IndexArgs, subscriber: &Subscriber) -> anyhow::Result<()> {
    if !args.dump_json {
        print_status(subscriber, args.json)?;
        return Ok(());
    }
    let sync = sync_of(subscriber)?;
    let entries = sync.index().entries();
    let dump = IndexDump {
        status: IndexStatus::of(subscriber, sync, &entries),
        entries: &entries,
    };
    let mut out = io::BufWriter::new(io::stdout().lock());
    let written = serde_json::to_writer(&mut out, &dump)
        .map_err(io::Error::from)
        .and_then(|()| writeln!(out))
        .and_then(|()| out.flush());
    finish_write(written).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use moonkv_events::PlacementIndex;

    #[test]
    fn durations_parse_as_fractional_seconds() {
        assert_eq!(duration_flag("0"), Ok(Duration::ZERO));
        assert_eq!(duration_flag("0.25"), Ok(Duration::from_millis(250)));
        assert!(duration_flag("-1").is_err());
        assert!(duration_flag("soon").is_err());
        assert!(positive_duration_flag("0").is_err());
        assert_eq!(positive_duration_flag("2"), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn loud_lines_name_gaps_and_restarts() {
        let gap = discontinuity_line(12, SequenceVerdict::Gap { missed: 3 }).unwrap();
        assert!(gap.starts_with("!! sequence gap: 3 "), "{gap}");
        assert!(gap.contains("before 12 (last seen 8)"), "{gap}");
        let restart = discontinuity_line(1, SequenceVerdict::Restart { previous: 40 }).unwrap();
        assert!(restart.starts_with("!! publisher restart: sequence 1 after 40"));
        assert_eq!(discontinuity_line(5, SequenceVerdict::InOrder), None);
    }

    #[test]
    fn medium_counts_come_from_the_entries() {
        let mut index = PlacementIndex::new();
        index.store("b", "t", "x", Medium::Cpu);
        index.store("b", "t", "x", Medium::Disk);
        index.store("b", "t", "y", Medium::Disk);
        let entries = index.entries();
        assert_eq!(entries.len(), 2);
        assert_eq!(readable_on(&entries, Medium::Cpu), 1);
        assert_eq!(readable_on(&entries, Medium::Disk), 2);
    }
}
