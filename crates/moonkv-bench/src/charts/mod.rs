//! `moonkv bench charts`: the comparison tables of a benchmark report (`docs/benchmarks.md`, or
//! what `scripts/bench.sh` wrote) as SVG bar charts, moonkv beside each comparator per cell.
//! It reads the recorded figures only; nothing is measured again.
//!
//! - `tables`: markdown tables back into chart data (master vs upstream, data plane vs Redis
//!   and raw TCP, the Python API vs upstream's client).
//! - `render`: one chart as SVG.

mod render;
mod tables;

use std::io::Write;
use std::path::PathBuf;

/// Arguments of `moonkv bench charts`.
#[derive(clap::Args, Debug)]
pub struct ChartsArgs {
    /// The benchmark report to read.
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub from: PathBuf,
    /// Directory the SVG files go to (created if missing).
    #[arg(long, default_value = "docs/charts")]
    pub out: PathBuf,
}

/// Renders every comparison table of `args.from` into `args.out`; prints one line per chart.
pub fn run(args: ChartsArgs) -> anyhow::Result<()> {
    let report = std::fs::read_to_string(&args.from)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", args.from.display()))?;
    let charts = tables::charts(&report);
    if charts.is_empty() {
        anyhow::bail!(
            "{} has no comparison table (moonkv beside upstream, Redis or raw TCP)",
            args.from.display()
        );
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", args.out.display()))?;
    let mut stdout = std::io::stdout().lock();
    for chart in &charts {
        let path = args.out.join(format!("{}.svg", chart.stem));
        std::fs::write(&path, render::svg(chart)?)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
        // A closed stdout (`| head`) only loses the listing.
        let _ = writeln!(
            stdout,
            "{}  (table at {}:{})",
            path.display(),
            args.from.display(),
            chart.line
        );
    }
    Ok(())
}

/// Every chart of `report` as (file name, SVG text).
pub fn render_all(report: &str) -> anyhow::Result<Vec<(String, String)>> {
    tables::charts(report)
        .iter()
        .map(|c| Ok((format!("{}.svg", c.stem), render::svg(c)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The charts committed under docs/charts are the ones the recorded figures draw, and
    /// docs/benchmarks.md shows each of them (`scripts/bench.sh charts` redraws them).
    #[test]
    fn committed_charts_match_the_figures_of_the_report() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        let report = std::fs::read_to_string(docs.join("benchmarks.md")).unwrap();
        let charts = render_all(&report).unwrap();
        assert!(charts.len() >= 8, "{} charts", charts.len());
        let mut committed: Vec<String> = std::fs::read_dir(docs.join("charts"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        committed.sort();
        let mut drawn: Vec<String> = charts.iter().map(|(name, _)| name.clone()).collect();
        drawn.sort();
        assert_eq!(committed, drawn, "run scripts/bench.sh charts");
        for (name, svg) in &charts {
            let on_disk = std::fs::read_to_string(docs.join("charts").join(name)).unwrap();
            assert!(
                on_disk == *svg,
                "docs/charts/{name} is stale: run scripts/bench.sh charts"
            );
            assert!(
                report.contains(&format!("](charts/{name})")),
                "docs/benchmarks.md does not show charts/{name}"
            );
        }
    }
}
