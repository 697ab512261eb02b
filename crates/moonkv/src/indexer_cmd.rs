//! `moonkv indexer`: the prefix index KV-aware routers query, and `moonkv indexer hash`, which
//! prints the block hashes of a token sequence.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use moonkv_indexer::hash::{Chain, HashProfile, HashProfileSpec, DEFAULT_SEED, VLLM_SHA256_CBOR};
use moonkv_indexer::http::{Server, DEFAULT_PORT};
use moonkv_indexer::ids::BlockHash;
use moonkv_indexer::Indexer;

const EXAMPLES: &str = "\
Examples:
  # serve the API on Conductor's port, with sources registered over HTTP
  moonkv indexer --http-port 13333

  # start with static sources (POST /register bodies in a JSON file)
  moonkv indexer --config sources.json

  # register a vLLM engine (PYTHONHASHSEED=0) and a moonkv master for the same instance
  curl -s localhost:13333/register -d '{\"type\": \"vLLM\", \"endpoint\": \"tcp://10.0.0.5:5557\",
    \"replay_endpoint\": \"tcp://10.0.0.5:5558\", \"modelname\": \"llama\",
    \"instance_id\": \"vllm-0\", \"block_size\": 16}'
  curl -s localhost:13333/register -d '{\"type\": \"moonkv\", \"endpoint\": \"tcp://10.0.0.9:5557\",
    \"admin\": \"10.0.0.9:9003\", \"modelname\": \"llama\", \"instance_id\": \"vllm-0\",
    \"block_size\": 16}'

  # ask how much of a prompt each instance holds, per tier
  curl -s localhost:13333/query -d '{\"model\": \"llama\", \"block_size\": 16,
    \"token_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]}'

  # the vLLM block hashes of a token sequence (seed 0, 4 tokens per block)
  moonkv indexer hash --block-size 4 --tokens 1,2,3,4,5,6,7,8";

/// `moonkv indexer`.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES, args_conflicts_with_subcommands = true)]
pub struct IndexerArgs {
    #[command(subcommand)]
    command: Option<IndexerCommand>,
    /// Port of the HTTP API (0 picks a free one).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    http_port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    host: std::net::IpAddr,
    /// A JSON file of sources to register at start: `{"sources": [<register body>, ...]}`.
    #[arg(long)]
    config: Option<String>,
    /// Blocks the chain cache keeps (fast key -> digest), so queries skip SHA-256 for blocks
    /// already hashed; 64 bytes of table each (48 a slot, a quarter of slots kept free).
    /// 0 turns the cache off.
    #[arg(long, env = moonkv_indexer::index::chains::CHAIN_CACHE_ENV,
          default_value_t = moonkv_indexer::index::chains::DEFAULT_CHAIN_CACHE_BLOCKS,
          value_parser = moonkv_indexer::index::ChainCache::parse_blocks)]
    chain_cache_blocks: usize,
}

#[derive(Subcommand, Debug)]
enum IndexerCommand {
    /// Print the block hashes of a token sequence, one line per full block.
    Hash(HashArgs),
}

#[derive(Args, Debug)]
struct HashArgs {
    /// Token ids, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    /// Tokens per block.
    #[arg(long)]
    block_size: u32,
    /// Hash profile: vllm_sha256_cbor or sglang_sha256.
    #[arg(long, default_value = VLLM_SHA256_CBOR)]
    profile: String,
    /// vLLM's PYTHONHASHSEED (vllm_sha256_cbor only).
    #[arg(long)]
    seed: Option<String>,
    /// LoRA adapter name (hashed into every block by vLLM).
    #[arg(long)]
    lora_name: Option<String>,
    /// Cache salt (hashed into the first block by vLLM).
    #[arg(long)]
    cache_salt: Option<String>,
    /// Print JSON: the root and each block's full digest and 64-bit hash.
    #[arg(long)]
    json: bool,
}

/// Runs `moonkv indexer`.
pub fn run(args: IndexerArgs) -> anyhow::Result<()> {
    match args.command {
        Some(IndexerCommand::Hash(h)) => hash(h),
        None => serve(
            args.host,
            args.http_port,
            args.config,
            args.chain_cache_blocks,
        ),
    }
}

fn hash(args: HashArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.block_size > 0, "--block-size must be positive");
    let is_vllm = args.profile == VLLM_SHA256_CBOR;
    let spec = HashProfileSpec {
        name: args.profile.clone(),
        seed: match (&args.seed, is_vllm) {
            (Some(s), _) => Some(s.clone()),
            (None, true) => Some(DEFAULT_SEED.into()),
            (None, false) => None,
        },
    };
    let profile = HashProfile::from_spec(&spec)?;
    let mut chain = Chain::new(
        &profile,
        &args.tokens,
        args.block_size as usize,
        args.lora_name.as_deref(),
        args.cache_salt.as_deref(),
    );
    let mut blocks = Vec::new();
    while let Some(d) = chain.next_digest() {
        blocks.push(d);
    }
    if args.json {
        let out = serde_json::json!({
            "profile": spec,
            "root": profile.root().map(|r| moonkv_indexer::hash::hex(&r)),
            "blocks": blocks.iter().map(|d| serde_json::json!({
                "digest": moonkv_indexer::hash::hex(d),
                "hash": BlockHash::from_digest(d).0,
            })).collect::<Vec<_>>(),
        });
        println!("{out}");
    } else {
        for d in &blocks {
            println!(
                "{} {}",
                BlockHash::from_digest(d).0,
                moonkv_indexer::hash::hex(d)
            );
        }
    }
    Ok(())
}

fn serve(
    host: std::net::IpAddr,
    port: u16,
    config: Option<String>,
    chain_cache_blocks: usize,
) -> anyhow::Result<()> {
    let indexer = Arc::new(Indexer::with_chain_cache(chain_cache_blocks));
    if let Some(path) = &config {
        let sources = moonkv_indexer::config::load(path)?;
        for spec in sources.sources {
            let what = format!(
                "{} source {} for {}",
                spec.source_type.as_str(),
                spec.endpoint,
                spec.instance_id
            );
            indexer
                .register(spec)
                .with_context(|| format!("{path}: {what}"))?;
        }
    }
    let rt = crate::runtime(2)?;
    rt.block_on(async move {
        let server = Server::bind(SocketAddr::new(host, port), Arc::clone(&indexer)).await?;
        let addr = server.local_addr()?;
        let shutdown = crate::shutdown_signal();
        crate::print_ready(&[("http", addr.to_string())]);
        tracing::info!(%addr, sources = indexer.source_count(), "indexer serving");
        server.serve(shutdown).await?;
        anyhow::Ok(())
    })
}
