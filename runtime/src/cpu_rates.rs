//! CPU use as a rate. A cgroup reports the CPU time it has used so far; CRI's
//! `usage_nano_cores` is the average use since the previous sample of the same cgroup, so the
//! daemon keeps the last sample of each cgroup it was asked about.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// A sample older than this is dropped (its container or pod is most likely gone).
const SAMPLE_TTL_NS: i64 = 10 * 60 * 1_000_000_000;
/// Two samples closer than this give too noisy a rate: the last rate is reused.
const MIN_WINDOW_NS: i64 = 1_000_000_000;

/// The previous CPU sample of a cgroup and the rate computed from it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: i64,
    usage: u64,
    rate: Option<u64>,
}

/// The last CPU sample of each cgroup, keyed by a name the caller chooses.
#[derive(Debug, Default)]
pub struct CpuRates {
    samples: Mutex<HashMap<String, Sample>>,
}

impl CpuRates {
    /// Average CPU use, in nanocores, since the previous sample of `key` (`usage` ns of CPU
    /// time at `at` ns); `None` for the first sample or after the counter went back.
    pub fn nano_cores(&self, key: &str, at: i64, usage: u64) -> Option<u64> {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        match samples.get_mut(key) {
            Some(prev) if at - prev.at < MIN_WINDOW_NS && at >= prev.at => prev.rate,
            Some(prev) => {
                let window = u128::try_from(at - prev.at).ok().filter(|w| *w > 0);
                let rate = match (usage.checked_sub(prev.usage), window) {
                    (Some(used), Some(w)) => {
                        u64::try_from(u128::from(used) * 1_000_000_000 / w).ok()
                    }
                    // A counter that went back (a new cgroup of the same name): start again.
                    _ => None,
                };
                *prev = Sample { at, usage, rate };
                rate
            }
            None => {
                let first = Sample {
                    at,
                    usage,
                    rate: None,
                };
                samples.insert(key.to_string(), first);
                None
            }
        }
    }

    /// Forgets samples not refreshed for ten minutes.
    pub fn prune(&self, now: i64) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.retain(|_, s| now - s.at < SAMPLE_TTL_NS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nano_cores_from_two_samples_a_second_apart() {
        let rates = CpuRates::default();
        let key = "container:c1";
        let s = 1_000_000_000;
        assert_eq!(rates.nano_cores(key, 10 * s, 0), None);
        // Too close: no rate yet.
        assert_eq!(rates.nano_cores(key, 10 * s + 1000, 1000), None);
        // Half a core over two seconds.
        assert_eq!(
            rates.nano_cores(key, 12 * s, 1_000_000_000),
            Some(500_000_000)
        );
        assert_eq!(
            rates.nano_cores(key, 12 * s + 10, 1_000_000_010),
            Some(500_000_000)
        );
        // Counter reset: no rate.
        assert_eq!(rates.nano_cores(key, 14 * s, 5), None);
        rates.prune(14 * s + SAMPLE_TTL_NS);
        assert_eq!(rates.nano_cores(key, 30 * s + SAMPLE_TTL_NS, 10), None);
    }
}
