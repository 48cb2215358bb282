//! `crius images pulls`: the image pulls (and imports) under way in the running crius, each with
//! its blobs: bytes done of total, rate, and how long a blob has had no data.
//!
//! In a terminal it redraws every `interval` until interrupted. Piped, it prints one snapshot
//! as plain lines, or with `--watch` one snapshot per interval separated by a blank line. Rates
//! are measured between two snapshots when there is a previous one, else averaged since the
//! blob's (or pull's) first byte.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{IsTerminal as _, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::admin::PullView;

/// A blob is shown as stalled after this long without data.
const STALLED: Duration = Duration::from_secs(2);

/// Runs the view: redraws in a terminal, prints lines otherwise.
pub fn run(socket: &Path, watch: bool, interval: Duration) -> anyhow::Result<()> {
    let terminal = std::io::stdout().is_terminal();
    let mut previous: Option<(Instant, Vec<PullView>)> = None;
    loop {
        let now = super::images::pulls(socket)?;
        let at = Instant::now();
        let text = render(
            &now,
            previous
                .as_ref()
                .map(|(t, p)| (p.as_slice(), at.duration_since(*t))),
        );
        let mut out = std::io::stdout().lock();
        if terminal {
            // Home and clear, then the snapshot: a redraw without scrolling.
            write!(out, "\x1b[H\x1b[2J{text}")?;
        } else {
            write!(out, "{text}")?;
        }
        out.flush()?;
        if !(terminal || watch) {
            return Ok(());
        }
        if !terminal {
            writeln!(out)?;
        }
        drop(out);
        previous = Some((at, now));
        std::thread::sleep(interval);
    }
}

/// One snapshot as text; `previous` (with the time since it) gives instantaneous rates.
pub fn render(now: &[PullView], previous: Option<(&[PullView], Duration)>) -> String {
    if now.is_empty() {
        return "no pulls under way\n".to_string();
    }
    let before: HashMap<(&str, &str), u64> = previous
        .map(|(p, _)| {
            p.iter()
                .flat_map(|pull| {
                    pull.blobs
                        .iter()
                        .map(move |b| ((pull.image.as_str(), b.digest.as_str()), b.done_bytes))
                })
                .collect()
        })
        .unwrap_or_default();
    let pulls_before: HashMap<&str, u64> = previous
        .map(|(p, _)| p.iter().map(|x| (x.image.as_str(), x.done_bytes)).collect())
        .unwrap_or_default();
    let dt = previous.map(|(_, dt)| dt).filter(|d| !d.is_zero());
    let rate = |done: u64, prior: Option<u64>, since: Duration| -> f64 {
        match (prior, dt) {
            (Some(p), Some(dt)) => done.saturating_sub(p) as f64 / dt.as_secs_f64(),
            _ if since.is_zero() => 0.0,
            _ => done as f64 / since.as_secs_f64(),
        }
    };
    let mut out = String::new();
    for pull in now {
        let elapsed = Duration::from_millis(pull.elapsed_ms);
        let r = rate(
            pull.done_bytes,
            pulls_before.get(pull.image.as_str()).copied(),
            elapsed,
        );
        let _ = writeln!(
            out,
            "{}  {}  {}/s  {}",
            pull.image,
            amount(pull.done_bytes, pull.total_bytes),
            mb(r as u64),
            secs(elapsed)
        );
        for blob in &pull.blobs {
            let short = blob.digest.get(..19).unwrap_or(&blob.digest);
            let state = if blob.done_bytes >= blob.total_bytes {
                "done".to_string()
            } else if Duration::from_millis(blob.stalled_ms) >= STALLED {
                format!("stalled {}", secs(Duration::from_millis(blob.stalled_ms)))
            } else {
                let r = rate(
                    blob.done_bytes,
                    before
                        .get(&(pull.image.as_str(), blob.digest.as_str()))
                        .copied(),
                    Duration::from_millis(blob.receiving_ms),
                );
                format!("{}/s", mb(r as u64))
            };
            let _ = writeln!(
                out,
                "  {short}  {}  {state}",
                amount(blob.done_bytes, blob.total_bytes)
            );
        }
    }
    out
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn amount(done: u64, total: u64) -> String {
    match done.saturating_mul(100).checked_div(total) {
        Some(percent) => format!("{:.1} of {} ({percent}%)", done as f64 / 1e6, mb(total)),
        None => mb(done),
    }
}

fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::BlobView;

    fn pull(done: [u64; 3], stalled: u64) -> PullView {
        let blob = |i: usize, total: u64| BlobView {
            digest: format!(
                "sha256:{}",
                char::from(b'a' + i as u8).to_string().repeat(64)
            ),
            done_bytes: done[i],
            total_bytes: total,
            receiving_ms: 2000,
            stalled_ms: if i == 2 { stalled } else { 0 },
        };
        PullView {
            image: "127.0.0.1:5000/big:v1".into(),
            done_bytes: done.iter().sum(),
            total_bytes: 30_000_000,
            elapsed_ms: 4000,
            blobs: vec![
                blob(0, 10_000_000),
                blob(1, 10_000_000),
                blob(2, 10_000_000),
            ],
        }
    }

    #[test]
    fn a_snapshot_shows_each_blob_and_its_state() {
        let first = [pull([10_000_000, 4_000_000, 1_000_000], 5000)];
        let text = render(&first, None);
        assert_eq!(
            text,
            "127.0.0.1:5000/big:v1  15.0 of 30.0 MB (50%)  3.8 MB/s  4 s\n\
             \x20 sha256:aaaaaaaaaaaa  10.0 of 10.0 MB (100%)  done\n\
             \x20 sha256:bbbbbbbbbbbb  4.0 of 10.0 MB (40%)  2.0 MB/s\n\
             \x20 sha256:cccccccccccc  1.0 of 10.0 MB (10%)  stalled 5 s\n"
        );
        // One second later: the rate is what came in that second.
        let second = [pull([10_000_000, 5_000_000, 1_000_000], 6000)];
        let text = render(&second, Some((&first, Duration::from_secs(1))));
        assert!(text.contains("5.0 of 10.0 MB (50%)  1.0 MB/s"), "{text}");
        assert!(
            text.starts_with("127.0.0.1:5000/big:v1  16.0 of 30.0 MB (53%)  1.0 MB/s"),
            "{text}"
        );
        assert_eq!(render(&[], None), "no pulls under way\n");
    }
}
