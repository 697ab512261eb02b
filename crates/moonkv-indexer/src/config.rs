//! Static sources: a JSON file registered at start, in the shape of `POST /register` bodies.
//!
//! ```json
//! {"sources": [
//!   {"type": "vLLM", "endpoint": "tcp://10.0.0.5:5557", "replay_endpoint": "tcp://10.0.0.5:5558",
//!    "modelname": "llama", "instance_id": "vllm-0", "block_size": 16},
//!   {"type": "moonkv", "endpoint": "tcp://10.0.0.9:5557", "admin": "10.0.0.9:9003",
//!    "modelname": "llama", "instance_id": "vllm-0", "block_size": 16}
//! ]}
//! ```

use serde::Deserialize;

use crate::api::SourceSpec;
use crate::error::IndexerError;

/// The file's contents.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticSources {
    /// The sources to register.
    pub sources: Vec<SourceSpec>,
}

/// Reads and parses `path`.
pub fn load(path: &str) -> Result<StaticSources, IndexerError> {
    let err = |reason: String| IndexerError::Config {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_and_bad_files_say_why() {
        let dir =
            std::env::temp_dir().join(format!("moonkv-indexer-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.json");
        let example = include_str!("config.rs")
            .lines()
            .skip_while(|l| !l.contains("```json"))
            .skip(1)
            .take_while(|l| !l.contains("```"))
            .map(|l| l.trim_start_matches("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&good, example).unwrap();
        let s = load(good.to_str().unwrap()).unwrap();
        assert_eq!(s.sources.len(), 2);
        assert_eq!(s.sources[1].admin.as_deref(), Some("10.0.0.9:9003"));
        let bad = dir.join("bad.json");
        std::fs::write(&bad, r#"{"sources": [{"type": "vLLM"}]}"#).unwrap();
        let e = load(bad.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("missing field"), "{e}");
        assert!(load("/nonexistent/sources.json").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
