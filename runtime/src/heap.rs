//! The daemon's heap: one glibc malloc arena, and the free pages inside it given back to the
//! kernel from time to time.
//!
//! glibc returns memory to the kernel only from the top of an arena; what a burst of calls
//! frees in the middle (request buffers, specs, CNI results) stays resident until the same
//! sizes are asked for again. `malloc_trim` walks the free chunks and `MADV_DONTNEED`s their
//! whole pages: measured with 60 pods, 350 KiB of a 3.9 MiB heap.

use std::time::Duration;

/// How often the free pages are handed back.
pub const TRIM_EVERY: Duration = Duration::from_secs(30);

/// One malloc arena instead of eight per core. Every thread that meets contention on an
/// arena gets one of its own, and each keeps the memory freed into it, so the daemon's
/// short-lived blocking threads (shim starts, file work) left a resident heap behind in each.
/// Its allocations are small and rare enough not to contend: measured with 60 pods against two
/// arenas, 200 KiB less heap and no call slower. Call before any other thread exists.
pub fn single_arena() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets a parameter of the allocator; the caller runs it before
        // any thread other than main exists.
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
        if ok != 1 {
            eprintln!("crius: mallopt(M_ARENA_MAX) refused");
        }
    }
}

/// Gives the whole free pages of the heap back to the kernel. Returns whether any were.
pub fn trim() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim takes the arena locks itself; it only releases free memory.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

/// Trims the heap every [`TRIM_EVERY`], on a blocking thread (the walk holds the arena lock,
/// which the async workers' allocations would otherwise wait on inside a poll).
pub fn trim_periodically() {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(TRIM_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let _ = tokio::task::spawn_blocking(trim).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_is_trimmed() {
        // Many small blocks, then every other run of four freed: holes of whole pages in the
        // middle of the heap, which glibc keeps until trimmed.
        let mut blocks: Vec<Vec<u8>> = (0..4096).map(|i| vec![i as u8; 4000]).collect();
        let kept: Vec<Vec<u8>> = blocks
            .drain(..)
            .enumerate()
            .filter_map(|(i, b)| (i % 8 < 4).then_some(b))
            .collect();
        let released = trim();
        assert_eq!(kept.len(), 2048);
        if cfg!(target_env = "gnu") {
            assert!(released, "malloc_trim released nothing");
        }
    }
}
