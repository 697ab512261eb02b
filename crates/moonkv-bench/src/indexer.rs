//! `moonkv bench indexer`: the prefix index's memory per block, event ingest on one core, the
//! latency of a long query on a loaded index, and query throughput on several threads. All
//! in-process (no HTTP, no sockets): the figures are the index's own.
//!
//! Every stored block carries its tokens and the hash vLLM would give it (the generator
//! computes the SHA-256 chains), so trust-mode ingest verifies and records them in the chain
//! cache as it would in production. The long queries are `--long-prompts` distinct prompts the
//! index holds (stored by one engine with their tokens), asked in turn: once with the chain
//! cache as ingest left it, once with the cache emptied before every query (the SHA-256 path).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moonkv_indexer::api::{EngineHashes, QueryRequest, SourceSpec, SourceType, TokenIds};
use moonkv_indexer::hash::{Digest32, Extra, HashProfile};
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
    /// Long queries timed, with the chain cache as ingest left it (and again with it emptied).
    #[arg(long, default_value_t = 2_000)]
    long_queries: usize,
    /// Distinct long prompts the index holds, queried in turn.
    #[arg(long, default_value_t = 64)]
    long_prompts: usize,
    /// Chain cache size in blocks (default: the indexer's).
    #[arg(long)]
    chain_cache_blocks: Option<usize>,
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
    chain_cache_blocks: u64,
    chain_cache_bytes: u64,
    ingest_blocks_per_s: f64,
    trusted_no_cache_ingest_blocks_per_s: f64,
    recompute_ingest_blocks_per_s: f64,
    long_query_tokens: usize,
    long_prompts: usize,
    long_query_matched_tokens: u64,
    long_query_p50_us: f64,
    long_query_p99_us: f64,
    long_query_max_us: f64,
    long_query_cache_hit_ratio: f64,
    cold_long_query_p50_us: f64,
    cold_long_query_p99_us: f64,
    cold_long_query_max_us: f64,
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

/// Random tokens for `n` blocks after `parent` (`None`: a new chain), with the hashes vLLM
/// gives them; returns the last block's digest.
#[allow(clippy::too_many_arguments)]
fn true_blocks(
    profile: &HashProfile,
    scratch: &mut Vec<u8>,
    rng: &mut Rng,
    parent: Option<Digest32>,
    n: usize,
    bs: usize,
    tokens: &mut Vec<u32>,
    hashes: &mut Vec<u64>,
) -> Digest32 {
    tokens.clear();
    hashes.clear();
    let mut last = parent;
    for b in 0..n {
        tokens.extend((0..bs).map(|_| (rng.next() % 150_000) as u32));
        let plain = Extra::Request {
            lora_name: None,
            cache_salt: None,
        };
        let d = profile.block_with(scratch, last.as_ref(), &tokens[b * bs..], plain);
        hashes.push(BlockHash::from_digest(&d).0);
        last = Some(d);
    }
    last.unwrap_or_default()
}

/// Runs the benchmark.
pub fn run(args: IndexerBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.sources > 0 && args.block_size > 0 && args.blocks_per_event > 0,
        "--sources, --block-size and --blocks-per-event must be positive"
    );
    anyhow::ensure!(args.long_prompts > 0, "--long-prompts must be positive");
    let bs = args.block_size;
    let bsz = bs as usize;
    let bpe = args.blocks_per_event;
    let cache_blocks = match args.chain_cache_blocks {
        Some(n) => n,
        None => {
            moonkv_indexer::index::ChainCache::blocks_from_env().map_err(|e| anyhow::anyhow!(e))?
        }
    };
    let profile = HashProfile::vllm("0");
    let ix = Arc::new(Indexer::with_chain_cache(cache_blocks));
    let mut engines = Vec::new();
    for i in 0..args.sources {
        let s = spec(i, bs, EngineHashes::Trust);
        let slot = ix.add(s.clone(), &profile)?;
        engines.push(EngineBlocks::new(slot, s, profile.clone()));
    }
    let rss_before = rss_bytes()?;

    // 1. Load: trusted hashes with their tokens, decoded from MessagePack; chains of about 16
    // events (1,024 blocks), each chain from one engine.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut scratch = Vec::new();
    let (mut tokens, mut hashes) = (Vec::new(), Vec::new());
    let mut payload = Vec::new();
    let mut loaded = 0u64;
    let mut ingest_time = Duration::ZERO;
    let mut parent: Option<(u64, Digest32)> = None;
    let mut chains = 0usize;
    while loaded < args.blocks {
        let n = (args.blocks - loaded).min(bpe as u64) as usize;
        let last = true_blocks(
            &profile,
            &mut scratch,
            &mut rng,
            parent.map(|p| p.1),
            n,
            bsz,
            &mut tokens,
            &mut hashes,
        );
        encode(&mut payload, &hashes, parent.map(|p| p.0), &tokens, bs);
        let engine = &mut engines[chains % args.sources as usize];
        parent = if rng.next().is_multiple_of(16) {
            chains += 1;
            None
        } else {
            Some((hashes[n - 1], last))
        };
        let started = Instant::now();
        loaded += ingest(engine, &ix, &payload)? as u64;
        ingest_time += started.elapsed();
    }
    // the long prompts, held by engine 0 in GPU, stored with their tokens
    let mut prompts: Vec<Vec<u32>> = Vec::with_capacity(args.long_prompts);
    let long_blocks = args.long_query_tokens / bsz;
    for _ in 0..args.long_prompts {
        let mut prompt = Vec::with_capacity(args.long_query_tokens);
        let mut parent: Option<(u64, Digest32)> = None;
        let mut done = 0;
        while done < long_blocks {
            let n = (long_blocks - done).min(bpe);
            let last = true_blocks(
                &profile,
                &mut scratch,
                &mut rng,
                parent.map(|p| p.1),
                n,
                bsz,
                &mut tokens,
                &mut hashes,
            );
            encode(&mut payload, &hashes, parent.map(|p| p.0), &tokens, bs);
            ingest(&mut engines[0], &ix, &payload)?;
            prompt.extend_from_slice(&tokens);
            parent = Some((hashes[n - 1], last));
            done += n;
        }
        // a partial tail block, as prompts have
        prompt.extend((prompt.len()..args.long_query_tokens).map(|i| i as u32));
        prompts.push(prompt);
    }
    let rss_growth = rss_bytes()?.saturating_sub(rss_before);
    let total_blocks = ix.index().blocks() as u64;
    let chain_cache_blocks = ix.index().chains().len() as u64;
    let chain_cache_bytes = ix.index().chains().heap_bytes() as u64;
    tracing::info!(total_blocks, rss_growth, chain_cache_blocks, "index loaded");

    // 2. Ingest without the chain cache (trusted hashes, nothing recomputed), and in recompute
    // mode (SHA-256 per block from tokens, recorded in the cache), each in a fresh index.
    let ingest_fresh = |mode: EngineHashes, cache: usize, rng: &mut Rng| -> anyhow::Result<f64> {
        let fix = Indexer::with_chain_cache(cache);
        let fs = spec(0, bs, mode);
        let fslot = fix.add(fs.clone(), &profile)?;
        let mut fblocks = EngineBlocks::new(fslot, fs, profile.clone());
        let (mut tokens, mut hashes, mut payload, mut scratch) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut time, mut done) = (Duration::ZERO, 0u64);
        let mut parent: Option<(u64, Digest32)> = None;
        while done < args.recompute_blocks {
            let last = true_blocks(
                &profile,
                &mut scratch,
                rng,
                parent.map(|p| p.1),
                bpe,
                bsz,
                &mut tokens,
                &mut hashes,
            );
            encode(&mut payload, &hashes, parent.map(|p| p.0), &tokens, bs);
            parent = Some((hashes[bpe - 1], last));
            let started = Instant::now();
            done += ingest(&mut fblocks, &fix, &payload)? as u64;
            time += started.elapsed();
        }
        Ok(done as f64 / time.as_secs_f64())
    };
    let trusted_no_cache = ingest_fresh(EngineHashes::Trust, 0, &mut rng)?;
    let recompute = ingest_fresh(EngineHashes::Recompute, cache_blocks, &mut rng)?;

    // 3. Long queries on the loaded index, one thread, the prompts in turn: first with the
    // chain cache as ingest left it, then with it emptied before each query.
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
    let long: Vec<QueryRequest> = prompts.iter().map(|p| request(p.clone())).collect();
    let stats = ix.index().chains().stats();
    let (hits0, misses0) = (stats.hits.get(), stats.misses.get());
    let mut hist = Histogram::default();
    let mut matched = u64::MAX;
    for q in 0..args.long_queries {
        let req = &long[q % long.len()];
        let started = Instant::now();
        let answer = ix.query(req)?;
        hist.record(started.elapsed());
        let m = answer["default"]
            .get("engine-0")
            .map_or(0, |m| m.longest_matched);
        matched = matched.min(m);
    }
    let (hits, misses) = (stats.hits.get() - hits0, stats.misses.get() - misses0);
    let mut cold = Histogram::default();
    for q in 0..args.long_queries {
        let req = &long[q % long.len()];
        ix.index().chains().clear();
        let started = Instant::now();
        ix.query(req)?;
        cold.record(started.elapsed());
    }

    // 4. Throughput: `threads` threads querying prefixes of the long prompts in turn.
    let short: Arc<Vec<QueryRequest>> = Arc::new(
        prompts
            .iter()
            .map(|p| request(p[..args.query_tokens.min(p.len())].to_vec()))
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..args.threads)
        .map(|t| {
            let (ix, short, stop, done) = (ix.clone(), short.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        if ix.query(&short[i % short.len()]).is_ok() {
                            n += 1;
                        }
                        i += 1;
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
        chain_cache_blocks,
        chain_cache_bytes,
        ingest_blocks_per_s: loaded as f64 / ingest_time.as_secs_f64(),
        trusted_no_cache_ingest_blocks_per_s: trusted_no_cache,
        recompute_ingest_blocks_per_s: recompute,
        long_query_tokens: args.long_query_tokens,
        long_prompts: args.long_prompts,
        long_query_matched_tokens: matched,
        long_query_p50_us: hist.quantile_us(0.5),
        long_query_p99_us: hist.quantile_us(0.99),
        long_query_max_us: hist.max_us(),
        long_query_cache_hit_ratio: hits as f64 / (hits + misses).max(1) as f64,
        cold_long_query_p50_us: cold.quantile_us(0.5),
        cold_long_query_p99_us: cold.quantile_us(0.99),
        cold_long_query_max_us: cold.max_us(),
        query_tokens: short[0].token_ids.0.len(),
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
        "memory (RSS growth)     {:.0} MiB, {:.0} B/block (estimate of the maps: {:.0} MiB; chain cache {} blocks, {:.0} MiB)",
        mib(r.rss_growth_bytes),
        r.bytes_per_block,
        mib(r.estimated_index_bytes),
        r.chain_cache_blocks,
        mib(r.chain_cache_bytes)
    );
    println!(
        "ingest, one core        {:.2} M blocks/s (decode + apply, trusted hashes checked and recorded in the chain cache)",
        r.ingest_blocks_per_s / 1e6
    );
    println!(
        "ingest, one core        {:.2} M blocks/s (decode + apply, trusted hashes, no chain cache)",
        r.trusted_no_cache_ingest_blocks_per_s / 1e6
    );
    println!(
        "ingest, one core        {:.2} M blocks/s (decode + SHA-256 per block, recompute)",
        r.recompute_ingest_blocks_per_s / 1e6
    );
    println!(
        "{}-token query          p50 {:.0} us, p99 {:.0} us, max {:.0} us ({} prompts in turn, matched >= {} tokens, {:.1}% of blocks from the chain cache)",
        r.long_query_tokens,
        r.long_query_p50_us,
        r.long_query_p99_us,
        r.long_query_max_us,
        r.long_prompts,
        r.long_query_matched_tokens,
        100.0 * r.long_query_cache_hit_ratio
    );
    println!(
        "{}-token query, cold     p50 {:.0} us, p99 {:.0} us, max {:.0} us (chain cache emptied before each: SHA-256 path)",
        r.long_query_tokens, r.cold_long_query_p50_us, r.cold_long_query_p99_us, r.cold_long_query_max_us
    );
    println!(
        "{}-token queries        {:.0}/s on {} threads",
        r.query_tokens, r.queries_per_s, r.threads
    );
}
