//! The comparison tables of a benchmark report (markdown), read back into bar-chart data: one
//! group of bars per table row, moonkv's bar beside each comparator's.

/// A markdown table and what names it in the report.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Table {
    /// The bold lead of the paragraph above the table ("Batches of 128 × 4 KiB"), or else the
    /// section heading.
    pub title: String,
    /// What the paragraph above says the figures are in ("keys/s" from "…), keys/s:").
    pub unit_hint: Option<String>,
    /// 1-based line of the table's header in the report.
    pub line: usize,
    /// Column names.
    pub header: Vec<String>,
    /// Cells, row by row.
    pub rows: Vec<Vec<String>>,
}

/// A group label and one value per series (`None`: that cell has no figure).
pub(crate) type Group = (String, Vec<Option<f64>>);

/// One bar chart: groups of bars, one bar per series.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chart {
    /// File name without `.svg`.
    pub stem: String,
    /// Caption.
    pub title: String,
    /// What the bars measure.
    pub unit: String,
    /// Series names; moonkv first.
    pub series: Vec<String>,
    /// One group per table row.
    pub groups: Vec<Group>,
    /// Line of the source table.
    pub line: usize,
}

fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(|c| c.trim().to_string()).collect()
}

fn is_separator(line: &str) -> bool {
    let t = line.trim();
    t.starts_with('|') && t.chars().all(|c| "|-: ".contains(c)) && t.contains('-')
}

/// The text between the first pair of `**`, and what follows the last `)` or `**` up to `:`.
fn bold_lead(line: &str) -> Option<(String, Option<String>)> {
    let rest = line.strip_prefix("**")?;
    let (bold, after) = rest.split_once("**")?;
    let tail = after.trim().trim_end_matches(':');
    let unit = tail
        .rsplit_once("),")
        .map(|(_, u)| u.trim().to_string())
        .filter(|u| !u.is_empty() && u.len() <= 12);
    Some((bold.trim().to_string(), unit))
}

/// Every table of `report`, with its title.
pub(crate) fn tables(report: &str) -> Vec<Table> {
    let lines: Vec<&str> = report.lines().collect();
    let mut heading = String::new();
    let mut lead: Option<(String, Option<String>)> = None;
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let heading_text = ["## ", "### ", "#### "]
            .iter()
            .find_map(|p| line.strip_prefix(p));
        if let Some(h) = heading_text {
            heading = h.trim().to_string();
            lead = None;
        } else if let Some(b) = bold_lead(line) {
            lead = Some(b);
        }
        let starts_table = line.trim_start().starts_with('|')
            && lines.get(i + 1).is_some_and(|next| is_separator(next));
        if !starts_table {
            i += 1;
            continue;
        }
        let header = cells(line);
        let mut rows = Vec::new();
        let mut j = i + 2;
        while j < lines.len() && lines[j].trim_start().starts_with('|') {
            rows.push(cells(lines[j]));
            j += 1;
        }
        let (title, unit_hint) = match &lead {
            Some((bold, unit)) => (bold.clone(), unit.clone()),
            None => (heading.clone(), None),
        };
        out.push(Table {
            title,
            unit_hint,
            line: i + 1,
            header,
            rows,
        });
        i = j;
    }
    out
}

/// A figure as the tables print it: `1,669,822`, `**4.81×**`, `56%`; `None` for `–`.
pub(crate) fn number(cell: &str) -> Option<f64> {
    let cleaned: String = cell
        .chars()
        .filter(|c| !matches!(c, '*' | ',' | '×' | '%' | ' '))
        .collect();
    cleaned.parse().ok()
}

fn column(table: &Table, name: &str) -> Option<usize> {
    table.header.iter().position(|h| h == name)
}

/// Lower-case, dash-separated: a file name from a title.
pub(crate) fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// The charts of one table, or none when it compares nothing.
pub(crate) fn charts_of(table: &Table) -> Vec<Chart> {
    if let (Some(shape), Some(ours), Some(theirs)) = (
        column(table, "shape"),
        column(table, "keys/s"),
        column(table, "upstream keys/s"),
    ) {
        return vec![master_chart(table, shape, ours, theirs)];
    }
    if let (Some(ours), Some(redis)) = (column(table, "GB/s"), column(table, "Redis GB/s")) {
        return data_plane_charts(table, ours, redis);
    }
    if let (Some(op), Some(ours), Some(theirs)) = (
        column(table, "op"),
        column(table, "moonkv"),
        column(table, "upstream"),
    ) {
        return upstream_charts(table, op, ours, theirs);
    }
    Vec::new()
}

fn master_chart(table: &Table, shape: usize, ours: usize, theirs: usize) -> Chart {
    Chart {
        stem: slug(&table.title),
        title: format!("{}: moonkv vs upstream's master (keys/s)", table.title),
        unit: "keys/s".into(),
        series: vec!["moonkv".into(), "upstream".into()],
        groups: table
            .rows
            .iter()
            .map(|r| (r[shape].clone(), vec![number(&r[ours]), number(&r[theirs])]))
            .collect(),
        line: table.line,
    }
}

/// moonkv, Redis and the raw TCP ceiling (recovered from "of TCP ceiling"), one chart per op.
fn data_plane_charts(table: &Table, ours: usize, redis: usize) -> Vec<Chart> {
    let (size, clients, op) = (
        column(table, "size"),
        column(table, "clients"),
        column(table, "op"),
    );
    let ceiling = column(table, "of TCP ceiling");
    let mut ops: Vec<String> = Vec::new();
    for r in &table.rows {
        let name = op.map_or_else(String::new, |i| r[i].clone());
        if !ops.contains(&name) {
            ops.push(name);
        }
    }
    let mut series = vec!["moonkv".to_string(), "Redis".to_string()];
    if ceiling.is_some() {
        series.push("raw TCP".into());
    }
    ops.into_iter()
        .map(|name| {
            let groups = table
                .rows
                .iter()
                .filter(|r| op.is_none_or(|i| r[i] == name))
                .map(|r| {
                    let label = match (size, clients) {
                        (Some(s), Some(c)) => format!("{} ×{}", r[s], r[c]),
                        (Some(s), None) => r[s].clone(),
                        _ => String::new(),
                    };
                    let moonkv = number(&r[ours]);
                    let mut values = vec![moonkv, number(&r[redis])];
                    if let Some(c) = ceiling {
                        let tcp = match (moonkv, number(&r[c])) {
                            (Some(v), Some(pct)) if pct > 0.0 => {
                                Some((v * 100.0 / pct * 100.0).round() / 100.0)
                            }
                            _ => None,
                        };
                        values.push(tcp);
                    }
                    (label, values)
                })
                .collect();
            let suffix = if name.is_empty() {
                String::new()
            } else {
                format!(" {name}")
            };
            Chart {
                stem: slug(&format!("{}{suffix}", table.title)),
                title: format!(
                    "Data plane,{suffix}: moonkv vs Redis vs raw TCP (GB/s; {})",
                    table.title
                ),
                unit: "GB/s".into(),
                series: series.clone(),
                groups,
                line: table.line,
            }
        })
        .collect()
}

/// moonkv against upstream; rows that name their own unit ("batch_put_from, GB/s") are charted
/// apart from the rest.
fn upstream_charts(table: &Table, op: usize, ours: usize, theirs: usize) -> Vec<Chart> {
    let size = column(table, "size");
    let mut by_unit: Vec<(String, Vec<Group>)> = Vec::new();
    for r in &table.rows {
        let (name, unit) = match r[op].rsplit_once(", ") {
            Some((name, unit)) => (name.to_string(), unit.to_string()),
            None => (
                r[op].clone(),
                table.unit_hint.clone().unwrap_or_else(|| "value".into()),
            ),
        };
        let label = match size {
            Some(s) => format!("{name} {}", r[s]),
            None => name,
        };
        let entry = (label, vec![number(&r[ours]), number(&r[theirs])]);
        match by_unit.iter_mut().find(|(u, _)| *u == unit) {
            Some((_, groups)) => groups.push(entry),
            None => by_unit.push((unit, vec![entry])),
        }
    }
    let several = by_unit.len() > 1;
    by_unit
        .into_iter()
        .map(|(unit, groups)| {
            let stem = if several {
                slug(&format!("{} {unit}", table.title))
            } else {
                slug(&table.title)
            };
            Chart {
                stem,
                title: format!("Python API, {}: moonkv vs upstream ({unit})", table.title),
                unit,
                series: vec!["moonkv".into(), "upstream".into()],
                groups,
                line: table.line,
            }
        })
        .collect()
}

/// Every chart of `report`; stems made unique in report order.
pub(crate) fn charts(report: &str) -> Vec<Chart> {
    let mut out: Vec<Chart> = Vec::new();
    for table in tables(report) {
        for mut chart in charts_of(&table) {
            let base = chart.stem.clone();
            let mut n = 2;
            while out.iter().any(|c| c.stem == chart.stem) {
                chart.stem = format!("{base}-{n}");
                n += 1;
            }
            out.push(chart);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "\
### Master over the wire

| shape | keys/s | calls/s | upstream keys/s | × upstream |
|---|--:|--:|--:|--:|
| put 1×1 | 9,899 | 9,899 | 3,936 | 2.51× |
| get 1×1 | 19,395 | 19,395 | 8,025 | 2.42× |

### Data plane

**Latest run** (something):

| size | clients | op | GB/s | Redis GB/s | of TCP ceiling |
|--:|--:|---|--:|--:|--:|
| 1 MiB | 1 | put | 4.46 | 3.97 | 56% |
| 1 MiB | 1 | get | 5.47 | 4.17 | 68% |

| raw loopback TCP, write size | connections | GB/s |
|--:|--:|--:|
| 4 KiB | 1 | 2.11 |

### Results

**Batches of 32 × 128 KiB** (`batch --batch 32`):

| op | moonkv | upstream | × |
|---|--:|--:|--:|
| batch_put_from, GB/s | 1.10 | 1.10 | **1.00×** |
| batch_is_exist of 32, keys/s | 164,337 | 93,300 | 1.76× |

**Single objects, 1 thread** (`dataplane --clients 1`), GB/s:

| op | size | moonkv | upstream |
|---|--:|--:|--:|
| get_into | 1 MiB | 2.42 | – |
";

    #[test]
    fn figures_parse_as_printed() {
        assert_eq!(number("1,669,822"), Some(1_669_822.0));
        assert_eq!(number("**4.81×**"), Some(4.81));
        assert_eq!(number("56%"), Some(56.0));
        assert_eq!(number("–"), None);
        assert_eq!(slug("Batches of 32 × 128 KiB"), "batches-of-32-128-kib");
    }

    #[test]
    fn each_comparison_table_becomes_its_charts() {
        let charts = charts(REPORT);
        let stems: Vec<&str> = charts.iter().map(|c| c.stem.as_str()).collect();
        assert_eq!(
            stems,
            [
                "master-over-the-wire",
                "latest-run-put",
                "latest-run-get",
                "batches-of-32-128-kib-gb-s",
                "batches-of-32-128-kib-keys-s",
                "single-objects-1-thread",
            ],
            "the TCP probe table compares nothing and is left out"
        );
        assert_eq!(
            charts[0].groups,
            [
                ("put 1×1".to_string(), vec![Some(9899.0), Some(3936.0)]),
                ("get 1×1".to_string(), vec![Some(19395.0), Some(8025.0)]),
            ]
        );
        assert_eq!(charts[1].series, ["moonkv", "Redis", "raw TCP"]);
        assert_eq!(
            charts[1].groups,
            [(
                "1 MiB ×1".to_string(),
                vec![Some(4.46), Some(3.97), Some(7.96)]
            )]
        );
        assert_eq!(charts[3].unit, "GB/s");
        assert_eq!(charts[4].groups[0].0, "batch_is_exist of 32");
        assert_eq!(charts[5].unit, "GB/s", "from the paragraph above the table");
        assert_eq!(
            charts[5].groups[0],
            ("get_into 1 MiB".to_string(), vec![Some(2.42), None])
        );
        assert_eq!(charts[5].line, 32);
    }
}
