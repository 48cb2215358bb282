//! Pulls in progress and how far each has come: the bytes its blobs add up to (known once its
//! manifest is read) and the bytes already in the content store or received so far. crius
//! serves them on its metrics endpoint, so an operator sees a large pull move. Each blob a pull
//! downloads is followed too (bytes, when its first and last bytes came), which is what `crius
//! images pulls` shows per layer: its rate, and how long it has been stalled.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// One pull in progress, as [`crate::ImageStore::pulls_in_progress`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullProgress {
    /// The reference being pulled, normalised (`docker.io/library/busybox:latest`).
    pub image: String,
    /// Bytes of the config and layers present so far (downloaded, or already stored).
    pub done_bytes: u64,
    /// Bytes of the config and layers in all; 0 until the manifest is read.
    pub total_bytes: u64,
    pub elapsed: Duration,
    /// The blobs (config and layers) this pull has started on, in the order it started them.
    pub blobs: Vec<BlobProgress>,
}

/// One blob of a pull in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobProgress {
    pub digest: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// From this blob's first byte to its last so far (zero before any), for its rate.
    pub receiving: Duration,
    /// Since the last byte (or since the blob was started, if none came); zero once complete.
    pub stalled: Duration,
}

/// The counters of one pull run (shared by the callers that joined it).
#[derive(Debug)]
pub(crate) struct Tracker {
    image: String,
    started: Instant,
    total: AtomicU64,
    done: AtomicU64,
    blobs: Mutex<Vec<Arc<Blob>>>,
}

/// The counters of one blob of a pull: bytes, and milliseconds since the pull's start of the
/// blob's start, first and last bytes (`u64::MAX`: none yet).
#[derive(Debug)]
pub(crate) struct Blob {
    digest: String,
    size: u64,
    done: AtomicU64,
    started_ms: u64,
    first_ms: AtomicU64,
    last_ms: AtomicU64,
}

impl Tracker {
    pub(crate) fn set_total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn add_done(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Starts following blob `digest` of `size` bytes.
    fn blob(&self, digest: &str, size: u64) -> Arc<Blob> {
        let blob = Arc::new(Blob {
            digest: digest.to_string(),
            size,
            done: AtomicU64::new(0),
            started_ms: self.now_ms(),
            first_ms: AtomicU64::new(u64::MAX),
            last_ms: AtomicU64::new(u64::MAX),
        });
        self.blobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(blob.clone());
        blob
    }

    fn take_back(&self, bytes: u64) {
        // Never below zero: what is taken back was added by the same meter.
        let _ = self
            .done
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                Some(d.saturating_sub(bytes))
            });
    }
}

/// The pulls under way in one store.
#[derive(Debug, Default)]
pub(crate) struct Pulls(Mutex<Vec<Arc<Tracker>>>);

impl Pulls {
    /// Starts tracking a pull of `image`; it is forgotten when the returned guard drops.
    pub(crate) fn begin(self: &Arc<Self>, image: String) -> Registration {
        let tracker = Arc::new(Tracker {
            image,
            started: Instant::now(),
            total: AtomicU64::new(0),
            done: AtomicU64::new(0),
            blobs: Mutex::default(),
        });
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tracker.clone());
        Registration {
            pulls: self.clone(),
            tracker,
        }
    }

    pub(crate) fn snapshot(&self) -> Vec<PullProgress> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|t| {
                let now = t.now_ms();
                let ms = Duration::from_millis;
                let blobs = t
                    .blobs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .map(|b| {
                        let done = b.done.load(Ordering::Relaxed);
                        let first = b.first_ms.load(Ordering::Relaxed);
                        let last = b.last_ms.load(Ordering::Relaxed);
                        let (receiving, since) = if first == u64::MAX {
                            (Duration::ZERO, b.started_ms)
                        } else {
                            (ms(last.saturating_sub(first)), last)
                        };
                        BlobProgress {
                            digest: b.digest.clone(),
                            done_bytes: done,
                            total_bytes: b.size,
                            receiving,
                            stalled: if done >= b.size {
                                Duration::ZERO
                            } else {
                                ms(now.saturating_sub(since))
                            },
                        }
                    })
                    .collect();
                PullProgress {
                    image: t.image.clone(),
                    done_bytes: t.done.load(Ordering::Relaxed),
                    total_bytes: t.total.load(Ordering::Relaxed),
                    elapsed: t.started.elapsed(),
                    blobs,
                }
            })
            .collect()
    }
}

/// A pull's place in [`Pulls`], held for as long as the pull runs.
pub(crate) struct Registration {
    pulls: Arc<Pulls>,
    pub(crate) tracker: Arc<Tracker>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut list = self.pulls.0.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|t| !Arc::ptr_eq(t, &self.tracker));
    }
}

/// Counts one blob's bytes as they arrive, so a failed attempt (the next host starts from
/// zero) can take back what it counted.
#[derive(Debug)]
pub(crate) struct Meter {
    pull: Arc<Tracker>,
    blob: Arc<Blob>,
    streamed: AtomicU64,
}

impl Meter {
    /// Counts blob `digest` of `size` bytes for `pull`.
    pub(crate) fn new(pull: Arc<Tracker>, digest: &str, size: u64) -> Meter {
        let blob = pull.blob(digest, size);
        Meter {
            pull,
            blob,
            streamed: AtomicU64::new(0),
        }
    }

    pub(crate) fn add(&self, bytes: u64) {
        self.streamed.fetch_add(bytes, Ordering::Relaxed);
        self.blob.done.fetch_add(bytes, Ordering::Relaxed);
        let now = self.pull.now_ms();
        let _ = self.blob.first_ms.compare_exchange(
            u64::MAX,
            now,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        self.blob.last_ms.store(now, Ordering::Relaxed);
        self.pull.add_done(bytes);
    }

    /// Takes back what this attempt counted.
    pub(crate) fn undo(&self) {
        let n = self.streamed.swap(0, Ordering::Relaxed);
        let _ = self
            .blob
            .done
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                Some(d.saturating_sub(n))
            });
        self.pull.take_back(n);
    }

    /// The blob of `size` bytes is in the store: what this meter has not counted yet (all of
    /// it when another pull downloaded it, or it was there already) counts now.
    pub(crate) fn finish(&self, size: u64) {
        let streamed = self.streamed.swap(size, Ordering::Relaxed);
        self.blob.done.store(size, Ordering::Relaxed);
        self.pull.add_done(size.saturating_sub(streamed));
    }
}

/// Figures of one pull (for logs, metrics and the benchmark).
#[derive(Debug, Clone, Default)]
pub struct PullReport {
    pub layers: usize,
    /// Compressed bytes downloaded by this pull (blobs already present are not counted).
    pub fetched_bytes: u64,
    /// From the first download's start to the last one's end.
    pub fetch_time: Duration,
    /// Uncompressed tar bytes unpacked by this pull.
    pub unpacked_bytes: u64,
    /// From the first unpack's start to the last one's end.
    pub unpack_time: Duration,
    pub total_time: Duration,
}

#[derive(Default)]
struct Window {
    first: Option<Instant>,
    last: Option<Instant>,
    bytes: u64,
}

impl Window {
    fn add(&mut self, start: Instant, end: Instant, bytes: u64) {
        self.first = Some(self.first.map_or(start, |f| f.min(start)));
        self.last = Some(self.last.map_or(end, |l| l.max(end)));
        self.bytes += bytes;
    }
    fn span(&self) -> Duration {
        match (self.first, self.last) {
            (Some(f), Some(l)) => l.duration_since(f),
            _ => Duration::ZERO,
        }
    }
}

/// What one pull or import run fetched and unpacked, and how far it has come.
pub(crate) struct Stats {
    fetch: Mutex<Window>,
    unpack: Mutex<Window>,
    /// How far the pull has come, for [`crate::ImageStore::pulls_in_progress`].
    pub(crate) progress: Arc<Tracker>,
    /// A blob was not in the store when the pull asked for it: the pull stored it, or waited
    /// for another pull to. Its directory entry is then synced before the image is recorded.
    pub(crate) stored: AtomicBool,
}

impl Stats {
    pub(crate) fn new(progress: Arc<Tracker>) -> Stats {
        Stats {
            fetch: Mutex::default(),
            unpack: Mutex::default(),
            progress,
            stored: AtomicBool::new(false),
        }
    }

    pub(crate) fn fetched(&self, start: Instant, bytes: u64) {
        if let Ok(mut w) = self.fetch.lock() {
            w.add(start, Instant::now(), bytes);
        }
    }

    pub(crate) fn unpacked(&self, start: Instant, bytes: u64) {
        if let Ok(mut w) = self.unpack.lock() {
            w.add(start, Instant::now(), bytes);
        }
    }

    /// The figures so far of a run of `layers` layers that began at `started`.
    pub(crate) fn report(&self, layers: usize, started: Instant) -> Result<PullReport> {
        let lock_failed = |_| Error::Internal("stats lock".into());
        let fetch = self.fetch.lock().map_err(lock_failed)?;
        let unpack = self.unpack.lock().map_err(lock_failed)?;
        Ok(PullReport {
            layers,
            fetched_bytes: fetch.bytes,
            fetch_time: fetch.span(),
            unpacked_bytes: unpack.bytes,
            unpack_time: unpack.span(),
            total_time: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_is_listed_while_it_runs_and_a_failed_attempt_is_taken_back() {
        let pulls = Arc::new(Pulls::default());
        let reg = pulls.begin("docker.io/library/busybox:latest".into());
        reg.tracker.set_total(100);
        let meter = Meter::new(reg.tracker.clone(), "sha256:aa", 50);
        meter.add(60);
        meter.undo();
        meter.add(30);
        reg.tracker.add_done(10);
        let now = pulls.snapshot();
        assert_eq!(now.len(), 1);
        assert_eq!((now[0].done_bytes, now[0].total_bytes), (40, 100));
        let blob = &now[0].blobs[0];
        assert_eq!(
            (blob.digest.as_str(), blob.done_bytes, blob.total_bytes),
            ("sha256:aa", 30, 50)
        );
        std::thread::sleep(Duration::from_millis(20));
        assert!(pulls.snapshot()[0].blobs[0].stalled >= Duration::from_millis(20));
        meter.finish(50);
        let now = pulls.snapshot();
        assert_eq!(now[0].done_bytes, 60);
        assert_eq!(now[0].blobs[0].done_bytes, 50);
        assert_eq!(now[0].blobs[0].stalled, Duration::ZERO);
        drop(reg);
        assert!(pulls.snapshot().is_empty());
    }
}
