//! Markdown tables of benchmark results, optionally side by side with comparator figures.

use super::load::ShapeResult;
use std::collections::HashMap;
use std::path::Path;

/// Comparator figures for one shape (from a baseline file).
#[derive(Clone, Debug, PartialEq)]
pub struct Baseline {
    /// Keys per second of the comparator.
    pub keys_per_s: f64,
    /// Mean call latency of the comparator, in microseconds (`None` if not given).
    pub latency_us: Option<f64>,
    /// Wanted ratio of our keys/s to the comparator's.
    pub target_ratio: f64,
}

/// Reads a baseline file: one `shape<TAB>keys_per_s<TAB>latency_us<TAB>target_ratio` per line
/// (`-` for an unknown latency); blank lines and `#` comments are skipped.
pub fn load_baselines(path: &Path) -> anyhow::Result<HashMap<String, Baseline>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the baseline file {}: {e}", path.display()))?;
    parse_baselines(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn parse_baselines(text: &str) -> anyhow::Result<HashMap<String, Baseline>> {
    let mut out = HashMap::new();
    for (no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').map(str::trim).collect();
        let number = |i: usize| -> anyhow::Result<f64> {
            fields
                .get(i)
                .and_then(|f| f.replace(',', "").parse::<f64>().ok())
                .ok_or_else(|| anyhow::anyhow!("line {}: field {} is not a number", no + 1, i + 1))
        };
        let shape = fields[0]
            .parse::<super::shape::Shape>()
            .map_err(anyhow::Error::msg)?;
        out.insert(
            shape.to_string(),
            Baseline {
                keys_per_s: number(1)?,
                latency_us: match fields.get(2) {
                    Some(&"-") => None,
                    _ => Some(number(2)?),
                },
                target_ratio: number(3)?,
            },
        );
    }
    Ok(out)
}

/// `1234567.8` → `1,234,568`.
pub fn grouped(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Latency with a precision that suits its size.
pub fn micros(us: f64) -> String {
    if us < 10.0 {
        format!("{us:.2}")
    } else if us < 1000.0 {
        format!("{us:.1}")
    } else {
        grouped(us)
    }
}

/// The results as a markdown table; with baselines, adds the comparator (called `name`) and
/// the ratio to it.
pub fn shape_table(
    results: &[ShapeResult],
    baselines: &HashMap<String, Baseline>,
    name: &str,
) -> String {
    let compare = !baselines.is_empty();
    let runs = results.iter().map(|r| r.runs).max().unwrap_or(1);
    let mut t = String::from("| shape | mode | keys/s |");
    if runs > 1 {
        t.push_str(&format!(" min–max of {runs} runs |"));
    }
    t.push_str(" calls/s | mean µs | p50 µs | p99 µs | errors |");
    if compare {
        t.push_str(&format!(
            " {name} keys/s | {name} µs | × {name} | target | met |"
        ));
    }
    t.push('\n');
    t.push_str("|---|---|--:|");
    if runs > 1 {
        t.push_str("--:|");
    }
    t.push_str("--:|--:|--:|--:|--:|");
    if compare {
        t.push_str("--:|--:|--:|--:|---|");
    }
    t.push('\n');
    for r in results {
        let keys = grouped(r.keys_per_s);
        t.push_str(&format!("| {} | {} | {keys} |", r.shape, r.mode));
        if runs > 1 {
            let (lo, hi) = (grouped(r.keys_per_s_min), grouped(r.keys_per_s_max));
            t.push_str(&format!(" {lo}–{hi} |"));
        }
        t.push_str(&format!(
            " {} | {} | {} | {} | {} |",
            grouped(r.calls_per_s),
            micros(r.mean_us),
            micros(r.p50_us),
            micros(r.p99_us),
            r.errors
        ));
        if compare {
            match baselines.get(&r.shape) {
                Some(b) => {
                    let ratio = r.keys_per_s / b.keys_per_s;
                    let met = if ratio >= b.target_ratio {
                        "yes"
                    } else {
                        "**no**"
                    };
                    t.push_str(&format!(
                        " {} | {} | {:.2}× | ≥{}× | {} |",
                        grouped(b.keys_per_s),
                        b.latency_us.map_or("–".to_string(), micros),
                        ratio,
                        b.target_ratio,
                        met
                    ));
                }
                None => t.push_str(" – | – | – | – | – |"),
            }
        }
        t.push('\n');
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_grouped() {
        assert_eq!(grouped(0.0), "0");
        assert_eq!(grouped(999.4), "999");
        assert_eq!(grouped(1000.0), "1,000");
        assert_eq!(grouped(1_234_567.8), "1,234,568");
        assert_eq!(micros(3.456), "3.46");
        assert_eq!(micros(125.04), "125.0");
        assert_eq!(micros(1717.0), "1,717");
    }

    #[test]
    fn baselines_parse_and_compare() {
        let b = parse_baselines(
            "# comment\nput:1x1\t3,936\t254\t3\n\nbatch-get:2x1:b8\t153958\t104\t2\n",
        )
        .unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b["put:1x1:b1"].keys_per_s, 3936.0);
        assert!(parse_baselines("put:1x1\tfast\t1\t1").is_err());
        assert_eq!(
            parse_baselines("get:1x1\t1000000\t-\t1").unwrap()["get:1x1:b1"].latency_us,
            None
        );
        let r = ShapeResult {
            shape: "put:1x1:b1".into(),
            mode: "spawn".into(),
            keys_per_s: 11_808.0,
            calls_per_s: 11_808.0,
            rpcs_per_s: 23_616.0,
            mean_us: 84.0,
            p50_us: 80.0,
            p99_us: 150.0,
            max_us: 900.0,
            keys: 118_080,
            errors: 0,
            seconds: 10.0,
            runs: 1,
            keys_per_s_min: 11_808.0,
            keys_per_s_max: 11_808.0,
        };
        let table = shape_table(&[r], &b, "upstream");
        assert!(table.contains("| 3.00× | ≥3× | yes |"), "{table}");
        assert!(!table.contains("runs"), "{table}");
    }
}
