//! One [`Chart`] as an SVG bar chart (plotters' SVG backend): a group of bars per cell, moonkv
//! first, each bar labelled with its figure; a log scale when the figures span two orders of
//! magnitude or more.

use super::tables::Chart;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Each system keeps its color in every chart.
fn color(series: &str) -> RGBColor {
    match series {
        "moonkv" => RGBColor(31, 119, 180),
        "upstream" => RGBColor(255, 127, 14),
        "Redis" => RGBColor(214, 39, 40),
        _ => RGBColor(127, 127, 127),
    }
}
const BAR_PX: u32 = 26;
const HEIGHT: u32 = 420;

/// A figure as a bar label: 3 significant digits, thousands as `k`, millions as `M`.
pub(crate) fn short(v: f64) -> String {
    let (scaled, suffix) = if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let digits = if scaled >= 100.0 {
        0
    } else if scaled >= 10.0 {
        1
    } else {
        2
    };
    format!("{scaled:.digits$}{suffix}")
}

fn group_px(chart: &Chart) -> u32 {
    let label = chart
        .groups
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0) as u32;
    (chart.series.len() as u32 * BAR_PX + 20).max(label * 7 + 14)
}

/// The SVG text of `chart`.
pub(crate) fn svg(chart: &Chart) -> anyhow::Result<String> {
    let width = (90 + chart.groups.len() as u32 * group_px(chart)).max(520);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, HEIGHT)).into_drawing_area();
        draw(chart, &root).map_err(|e| anyhow::anyhow!("drawing {}: {e}", chart.stem))?;
        root.present()
            .map_err(|e| anyhow::anyhow!("drawing {}: {e}", chart.stem))?;
    }
    Ok(out)
}

type DrawResult = Result<(), DrawingAreaErrorKind<std::io::Error>>;

fn draw(chart: &Chart, root: &DrawingArea<SVGBackend<'_>, Shift>) -> DrawResult {
    root.fill(&WHITE)?;
    let values: Vec<f64> = chart
        .groups
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let max = values.iter().copied().fold(0.0, f64::max).max(1e-9);
    let min = values.iter().copied().fold(max, f64::min);
    let n = chart.groups.len().max(1) as f64;
    let builder = |root| {
        let mut b = ChartBuilder::on(root);
        b.caption(&chart.title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(34)
            .y_label_area_size(64);
        b
    };
    if max / min >= 100.0 {
        let mut ctx =
            builder(root).build_cartesian_2d(0f64..n, (min / 2.0..max * 3.0).log_scale())?;
        ctx.configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(format!("{} (log scale)", chart.unit))
            .y_label_formatter(&|v| short(*v))
            .draw()?;
        bars(chart, &mut ctx, min / 2.0)?;
        labels(chart, &ctx, root, min / 2.0)?;
        legend(&mut ctx)
    } else {
        let mut ctx = builder(root).build_cartesian_2d(0f64..n, 0f64..max * 1.18)?;
        ctx.configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(chart.unit.as_str())
            .y_label_formatter(&|v| short(*v))
            .draw()?;
        bars(chart, &mut ctx, 0.0)?;
        labels(chart, &ctx, root, 0.0)?;
        legend(&mut ctx)
    }
}

/// The x extent of bar `s` of group `g`.
fn bar_span(chart: &Chart, g: usize, s: usize) -> (f64, f64) {
    let k = chart.series.len() as f64;
    let width = 0.8 / k;
    let left = g as f64 + 0.1 + s as f64 * width;
    (left, left + width * 0.92)
}

fn bars<Y>(
    chart: &Chart,
    ctx: &mut ChartContext<
        '_,
        SVGBackend<'_>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, Y>,
    >,
    floor: f64,
) -> DrawResult
where
    Y: Ranged<ValueType = f64>,
{
    for (s, name) in chart.series.iter().enumerate() {
        let color = color(name);
        let rects: Vec<_> = chart
            .groups
            .iter()
            .enumerate()
            .filter_map(|(g, (_, v))| {
                let value = v.get(s).copied().flatten()?;
                let (x0, x1) = bar_span(chart, g, s);
                Some(Rectangle::new(
                    [(x0, floor), (x1, value.max(floor))],
                    color.filled(),
                ))
            })
            .collect();
        ctx.draw_series(rects)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    Ok(())
}

/// Figures above the bars and group labels under the axis.
fn labels<Y>(
    chart: &Chart,
    ctx: &ChartContext<'_, SVGBackend<'_>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>,
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    floor: f64,
) -> DrawResult
where
    Y: Ranged<ValueType = f64>,
{
    let figure = ("sans-serif", 10)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    let group = ("sans-serif", 12)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    for (g, (label, values)) in chart.groups.iter().enumerate() {
        for (s, value) in values.iter().enumerate() {
            let Some(value) = value else { continue };
            let (x0, x1) = bar_span(chart, g, s);
            let (px, py) = ctx.backend_coord(&((x0 + x1) / 2.0, value.max(floor)));
            root.draw(&Text::new(short(*value), (px, py - 2), figure.clone()))?;
        }
        let (px, py) = ctx.backend_coord(&(g as f64 + 0.5, floor));
        root.draw(&Text::new(label.clone(), (px, py + 6), group.clone()))?;
    }
    Ok(())
}

fn legend<'a, Y>(
    ctx: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, Y>,
    >,
) -> DrawResult
where
    Y: Ranged<ValueType = f64>,
{
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_short() {
        assert_eq!(short(1_669_822.0), "1.67M");
        assert_eq!(short(34_094.0), "34.1k");
        assert_eq!(short(9_899.0), "9899");
        assert_eq!(short(4.46), "4.46");
    }

    #[test]
    fn a_chart_shows_every_figure_and_label() {
        let chart = Chart {
            stem: "t".into(),
            title: "Data plane: put (GB/s)".into(),
            unit: "GB/s".into(),
            series: vec!["moonkv".into(), "Redis".into(), "raw TCP".into()],
            groups: vec![
                ("1 MiB ×1".into(), vec![Some(4.46), Some(3.97), Some(7.96)]),
                ("4 MiB ×1".into(), vec![Some(7.51), None, Some(9.05)]),
            ],
            line: 1,
        };
        let text = svg(&chart).unwrap();
        assert!(text.starts_with("<svg"));
        for needle in [
            "Data plane: put (GB/s)",
            "1 MiB ×1",
            "4 MiB ×1",
            "4.46",
            "3.97",
            "9.05",
            "moonkv",
            "Redis",
            "raw TCP",
        ] {
            assert!(text.contains(needle), "no {needle} in the chart");
        }
        // Five bars (one cell has no Redis figure) and the legend's three swatches.
        let bars = ["#1F77B4", "#D62728", "#7F7F7F"]
            .iter()
            .map(|c| text.matches(&format!("fill=\"{c}\"")).count())
            .sum::<usize>();
        assert_eq!(bars, 5 + 3, "{text}");
    }
}
