//! Pulls in progress and how far each has come: the bytes its blobs add up to (known once its
//! manifest is read) and the bytes already in the content store or received so far. crius
//! serves them on its metrics endpoint, so an operator sees a large pull move.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
}

/// The counters of one pull run (shared by the callers that joined it).
#[derive(Debug)]
pub(crate) struct Tracker {
    image: String,
    started: Instant,
    total: AtomicU64,
    done: AtomicU64,
}

impl Tracker {
    pub(crate) fn set_total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn add_done(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
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
            .map(|t| PullProgress {
                image: t.image.clone(),
                done_bytes: t.done.load(Ordering::Relaxed),
                total_bytes: t.total.load(Ordering::Relaxed),
                elapsed: t.started.elapsed(),
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
    streamed: AtomicU64,
}

impl Meter {
    pub(crate) fn new(pull: Arc<Tracker>) -> Meter {
        Meter {
            pull,
            streamed: AtomicU64::new(0),
        }
    }

    pub(crate) fn add(&self, bytes: u64) {
        self.streamed.fetch_add(bytes, Ordering::Relaxed);
        self.pull.add_done(bytes);
    }

    /// Takes back what this attempt counted.
    pub(crate) fn undo(&self) {
        let n = self.streamed.swap(0, Ordering::Relaxed);
        self.pull.take_back(n);
    }

    /// The blob of `size` bytes is in the store: what this meter has not counted yet (all of
    /// it when another pull downloaded it, or it was there already) counts now.
    pub(crate) fn finish(&self, size: u64) {
        let streamed = self.streamed.swap(size, Ordering::Relaxed);
        self.pull.add_done(size.saturating_sub(streamed));
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
        let meter = Meter::new(reg.tracker.clone());
        meter.add(60);
        meter.undo();
        meter.add(30);
        reg.tracker.add_done(10);
        let now = pulls.snapshot();
        assert_eq!(now.len(), 1);
        assert_eq!((now[0].done_bytes, now[0].total_bytes), (40, 100));
        meter.finish(50);
        assert_eq!(pulls.snapshot()[0].done_bytes, 60);
        drop(reg);
        assert!(pulls.snapshot().is_empty());
    }
}
