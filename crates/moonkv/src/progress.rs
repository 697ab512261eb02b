//! A progress bar on stderr for transfers that take more than a moment (terminals only).

use moonkv_proto::units::format_size;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Transfers shorter than this never show a bar.
const SHOW_AFTER: Duration = Duration::from_millis(300);
const REDRAW: Duration = Duration::from_millis(100);
const WIDTH: usize = 30;

/// A running progress display; [`Progress::finish`] clears it.
pub struct Progress {
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    /// Starts a display fed by the returned counter when `wanted` and stderr is a terminal.
    /// `total` (bytes) gives a bar; without it only bytes and rate are shown.
    pub fn start(
        label: &str,
        total: Option<u64>,
        wanted: bool,
    ) -> (Option<Arc<AtomicU64>>, Progress) {
        let stop = Arc::new(AtomicBool::new(false));
        if !wanted || !std::io::stderr().is_terminal() {
            return (None, Progress { stop, task: None });
        }
        let counter = Arc::new(AtomicU64::new(0));
        let (label, seen, done) = (label.to_string(), counter.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let started = Instant::now();
            tokio::time::sleep(SHOW_AFTER).await;
            while !done.load(Ordering::Relaxed) {
                let line = render(
                    &label,
                    seen.load(Ordering::Relaxed),
                    total,
                    started.elapsed(),
                );
                draw(&line);
                tokio::time::sleep(REDRAW).await;
            }
        });
        (
            Some(counter),
            Progress {
                stop,
                task: Some(task),
            },
        )
    }

    /// Stops the display and clears its line.
    pub async fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(task) = self.task.take() {
            let _ = task.await;
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

fn draw(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r\x1b[2K{line}");
    let _ = err.flush();
}

/// One line: label, bar (with a total), bytes so far and the average rate.
fn render(label: &str, done: u64, total: Option<u64>, elapsed: Duration) -> String {
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-3);
    let moved = format!("{}/s", format_size(rate as u64));
    match total.filter(|t| *t > 0) {
        Some(total) => {
            let fraction = (done as f64 / total as f64).min(1.0);
            let filled = (fraction * WIDTH as f64) as usize;
            format!(
                "{label} [{}{}] {:>3.0}% {} / {}  {moved}",
                "=".repeat(filled),
                " ".repeat(WIDTH - filled),
                fraction * 100.0,
                format_size(done.min(total)),
                format_size(total)
            )
        }
        None => format!("{label} {}  {moved}", format_size(done)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_shows_bar_percentage_and_rate() {
        let line = render("put k", 50 << 20, Some(100 << 20), Duration::from_secs(1));
        assert!(line.contains(" 50%"), "{line}");
        assert!(line.contains(&"=".repeat(WIDTH / 2)), "{line}");
        assert!(line.contains("/s"), "{line}");
        let over = render("get k", 300, Some(100), Duration::from_secs(1));
        assert!(
            over.contains("100%"),
            "retries never push the bar past the end: {over}"
        );
        let open = render("get k", 1 << 20, None, Duration::from_secs(2));
        assert!(!open.contains('%'), "{open}");
    }
}
