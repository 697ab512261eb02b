//! `moonkv bench indexer`: the prefix index's memory per block, event ingest on one core, the
//! latency of a long query on a loaded index, and query throughput on several threads. All
//! in-process (no HTTP, no sockets): the figures are the index's own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moonkv_indexer::api::{EngineHashes, QueryRequest, SourceSpec, SourceType, TokenIds};
use moonkv_indexer::hash::{Chain, HashProfile};
use moonkv_indexer::ids::BlockHash;
use moonkv_indexer::keys::KeyFormat;
use moonkv_indexer::source::engine::EngineBlocks;
use moonkv_indexer::wire::decode_batch;
use moonkv_indexer::Indexer;
use rmp::encode as w;
use serde::Serialize;

use super::histogram::Histogram;
use super::memory::rss_bytes;

/// `moonkv bench indexer`.
#[derive(clap::Args, Debug)]
pub struct IndexerBenchArgs {
    /// Blocks loaded into the index.
    #[arg(long, default_value_t = 10_000_000)]
    blocks: u64,
    /// Engine sources (one instance each) the blocks are spread over.
    #[arg(long, default_value_t = 8)]
    sources: u32,
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// Blocks per `BlockStored` event (vLLM stores a request's new blocks in one event).
    #[arg(long, default_value_t = 64)]
    blocks_per_event: usize,
    /// Blocks ingested in the recompute-mode run (hashes recomputed from tokens).
    #[arg(long, default_value_t = 1_000_000)]
    recompute_blocks: u64,
    /// Tokens of the long query.
    #[arg(long, default_value_t = 32_768)]
    long_query_tokens: usize,
    /// Long queries timed.
    #[arg(long, default_value_t = 2_000)]
    long_queries: usize,
    /// Tokens of each query in the throughput run.
    #[arg(long, default_value_t = 512)]
    query_tokens: usize,
    /// Threads of the throughput run.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Length of the throughput run.
    #[arg(long, default_value = "5s", value_parser = super::parse_duration)]
    duration: Duration,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    blocks: u64,
    block_size: u32,
    rss_growth_bytes: u64,
    bytes_per_block: f64,
    estimated_index_bytes: u64,
    ingest_blocks_per_s: f64,
    recompute_ingest_blocks_per_s: f64,
    long_query_tokens: usize,
    long_query_matched_tokens: u64,
    long_query_p50_us: f64,
    long_query_p99_us: f64,
    long_query_max_us: f64,
    query_tokens: usize,
    threads: usize,
    queries_per_s: f64,
}

fn spec(i: u32, block_size: u32, mode: EngineHashes) -> SourceSpec {
    SourceSpec {
        endpoint: format!("tcp://bench-{i}:5557"),
        replay_endpoint: None,
        source_type: SourceType::Vllm,
        modelname: "bench".into(),
        lora_name: None,
        tenant_id: None,
        instance_id: format!("engine-{i}"),
        block_size,
        dp_rank: 0,
        additionalsalt: None,
        hash_profile: None,
        engine_hashes: mode,
        key_format: KeyFormat::Auto,
        admin: None,
    }
}

/// A vLLM map-era batch holding one `BlockStored` of `hashes` after `parent`.
fn encode(out: &mut Vec<u8>, hashes: &[u64], parent: Option<u64>, tokens: &[u32], bs: u32) {
    out.clear();
    let ok = (|| -> Result<(), Box<dyn std::error::Error>> {
        w::write_array_len(out, 3)?;
        w::write_f64(out, 0.0)?;
        w::write_array_len(out, 1)?;
        w::write_map_len(out, 5)?;
        w::write_str(out, "type")?;
        w::write_str(out, "BlockStored")?;
        w::write_str(out, "block_hashes")?;
        w::write_array_len(out, hashes.len() as u32)?;
        for &h in hashes {
            w::write_uint(out, h)?;
        }
        w::write_str(out, "parent_block_hash")?;
        match parent {
            Some(p) => {
                w::write_uint(out, p)?;
            }
            None => w::write_nil(out)?,
        }
        w::write_str(out, "token_ids")?;
        w::write_array_len(out, tokens.len() as u32)?;
        for &t in tokens {
            w::write_uint(out, u64::from(t))?;
        }
        w::write_str(out, "block_size")?;
        w::write_uint(out, u64::from(bs))?;
        w::write_uint(out, 0)?;
        Ok(())
    })();
    debug_assert!(ok.is_ok());
}

/// A cheap deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Decodes and applies `payload` on one thread; returns blocks applied.
fn ingest(blocks: &mut EngineBlocks, ix: &Indexer, payload: &[u8]) -> anyhow::Result<usize> {
    let batch = decode_batch(payload)?;
    let mut n = 0;
    for ev in &batch.events {
        n += blocks
            .apply(ix.index(), ev)
            .map_err(|r| anyhow::anyhow!("event refused: {r}"))?;
    }
    Ok(n)
}

/// Runs the benchmark.
pub fn run(args: IndexerBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.sources > 0 && args.block_size > 0 && args.blocks_per_event > 0);
    let bs = args.block_size;
    let profile = HashProfile::vllm("0");
    let ix = Arc::new(Indexer::new());
    let mut engines = Vec::new();
    for i in 0..args.sources {
        let s = spec(i, bs, EngineHashes::Trust);
        let slot = ix.add(s.clone(), &profile)?;
        engines.push(EngineBlocks::new(slot, s, profile.clone()));
    }
    let rss_before = rss_bytes()?;

    // 1. Load: trusted hashes (the engine runs the profile), decoded from MessagePack.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let tokens: Vec<u32> = (0..args.blocks_per_event as u32 * bs).collect();
    let mut hashes = vec![0u64; args.blocks_per_event];
    let mut payload = Vec::new();
    let mut loaded = 0u64;
    let mut ingest_time = Duration::ZERO;
    let mut parent = None;
    while loaded < args.blocks {
        let n = (args.blocks - loaded).min(args.blocks_per_event as u64) as usize;
        for h in hashes.iter_mut().take(n) {
            *h = rng.next();
        }
        encode(
            &mut payload,
            &hashes[..n],
            parent,
            &tokens[..n * bs as usize],
            bs,
        );
        // chains of 16 events (1,024 blocks), then a new root
        parent = if rng.next().is_multiple_of(16) {
            None
        } else {
            Some(hashes[n - 1])
        };
        let which = (loaded / args.blocks_per_event as u64) as usize % engines.len();
        let engine = &mut engines[which];
        let started = Instant::now();
        loaded += ingest(engine, &ix, &payload)? as u64;
        ingest_time += started.elapsed();
    }
    // the long query's own chain, held by engine 0 in GPU
    let query_tokens: Vec<u32> = (0..args.long_query_tokens as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 8) % 150_000)
        .collect();
    let chain: Vec<u64> = Chain::new(&profile, &query_tokens, bs as usize, None, None)
        .map(|h: BlockHash| h.0)
        .collect();
    for part in chain.chunks(args.blocks_per_event) {
        encode(&mut payload, part, None, &[], bs);
        ingest(&mut engines[0], &ix, &payload)?;
    }
    let rss_growth = rss_bytes()?.saturating_sub(rss_before);
    let total_blocks = ix.index().blocks() as u64;
    tracing::info!(total_blocks, rss_growth, "index loaded");

    // 2. Recompute-mode ingest: SHA-256 per block from tokens, in a fresh index.
    let rix = Indexer::new();
    let rs = spec(0, bs, EngineHashes::Recompute);
    let rslot = rix.add(rs.clone(), &profile)?;
    let mut rblocks = EngineBlocks::new(rslot, rs, profile.clone());
    let mut rtime = Duration::ZERO;
    let mut rdone = 0u64;
    let mut rparent = None;
    while rdone < args.recompute_blocks {
        let n = args.blocks_per_event;
        for h in hashes.iter_mut() {
            *h = rng.next();
        }
        let toks: Vec<u32> = (0..n as u32 * bs)
            .map(|_| (rng.next() % 150_000) as u32)
            .collect();
        encode(&mut payload, &hashes[..n], rparent, &toks, bs);
        rparent = Some(hashes[n - 1]);
        let started = Instant::now();
        rdone += ingest(&mut rblocks, &rix, &payload)? as u64;
        rtime += started.elapsed();
    }
    drop(rblocks);
    drop(rix);

    // 3. Long queries on the loaded index, one thread.
    let request = |tokens: Vec<u32>| QueryRequest {
        model: "bench".into(),
        block_size: bs,
        token_ids: TokenIds(tokens),
        tenant_id: None,
        instance_id: None,
        lora_name: None,
        cache_salt: None,
        additional_salt: None,
    };
    let long = request(query_tokens.clone());
    let mut hist = Histogram::default();
    let mut matched = 0;
    for _ in 0..args.long_queries {
        let started = Instant::now();
        let answer = ix.query(&long)?;
        hist.record(started.elapsed());
        matched = answer["default"]
            .get("engine-0")
            .map_or(0, |m| m.longest_matched);
    }

    // 4. Throughput: `threads` threads querying prefixes of the loaded chain.
    let short = Arc::new(request(
        query_tokens[..args.query_tokens.min(query_tokens.len())].to_vec(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..args.threads)
        .map(|_| {
            let (ix, short, stop, done) = (ix.clone(), short.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        if ix.query(&short).is_ok() {
                            n += 1;
                        }
                    }
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(args.duration);
    stop.store(true, Ordering::Relaxed);
    for t in workers {
        t.join()
            .map_err(|_| anyhow::anyhow!("a query thread panicked"))?;
    }
    let qps = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();

    let report = Report {
        blocks: total_blocks,
        block_size: bs,
        rss_growth_bytes: rss_growth,
        bytes_per_block: rss_growth as f64 / total_blocks.max(1) as f64,
        estimated_index_bytes: ix.index().heap_bytes() as u64,
        ingest_blocks_per_s: loaded as f64 / ingest_time.as_secs_f64(),
        recompute_ingest_blocks_per_s: rdone as f64 / rtime.as_secs_f64(),
        long_query_tokens: args.long_query_tokens,
        long_query_matched_tokens: matched,
        long_query_p50_us: hist.quantile_us(0.5),
        long_query_p99_us: hist.quantile_us(0.99),
        long_query_max_us: hist.max_us(),
        query_tokens: short.token_ids.0.len(),
        threads: args.threads,
        queries_per_s: qps,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(r: &Report) {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!("indexed blocks          {}", r.blocks);
    println!(
        "memory (RSS growth)     {:.0} MiB, {:.0} B/block (estimate of the maps: {:.0} MiB)",
        mib(r.rss_growth_bytes),
        r.bytes_per_block,
        mib(r.estimated_index_bytes)
    );
    println!(
        "ingest, one core        {:.2} M blocks/s (decode + apply, trusted hashes)",
        r.ingest_blocks_per_s / 1e6
    );
    println!(
        "ingest, one core        {:.2} M blocks/s (decode + SHA-256 per block, recompute)",
        r.recompute_ingest_blocks_per_s / 1e6
    );
    println!(
        "{}-token query          p50 {:.0} us, p99 {:.0} us, max {:.0} us (matched {} tokens)",
        r.long_query_tokens,
        r.long_query_p50_us,
        r.long_query_p99_us,
        r.long_query_max_us,
        r.long_query_matched_tokens
    );
    println!(
        "{}-token queries        {:.0}/s on {} threads",
        r.query_tokens, r.queries_per_s, r.threads
    );
}
