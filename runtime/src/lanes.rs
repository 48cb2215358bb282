//! Two lanes of work, so that the calls kubelet makes every second (status, list, stats, probes)
//! never wait for the lifecycle calls in flight.
//!
//! A lifecycle call (RunPodSandbox, CreateContainer, Stop*, Remove*, PullImage, ...) and the
//! work it leaves behind (exit watchers, releases, the trash, image GC) run on the **writes**
//! runtime: its workers make blocking syscalls (mounts, cgroup and file writes, the database's
//! fsync) and start the processes a pod needs (shims, CNI plugins, helpers). The gRPC server and
//! the calls that only read run on the **reads** runtime, whose threads run at a higher priority
//! ([`READS_NICE`]) and with `SCHED_RESET_ON_FORK`, so nothing they start inherits it.
//!
//! Why both: on a node whose CPUs are busy with pod starts (10 at a time on two cores keep 10 to
//! 25 threads runnable), a status call waited for a CPU behind the writers' own threads and
//! processes, not for a lock or a worker: 2.3 ms p50 against 0.25 ms idle, and the same with 32
//! workers. A priority only helps if the writers do not run on the same threads, hence the lane
//! of their own. The priority weighs only against threads in crius's own cgroup (the CNI
//! plugins and helpers crius starts, crius's own writers), and a read costs a fraction of a
//! millisecond of CPU.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// The nice value of the reads runtime's threads (the default is 0): a weight of 3,121 against
/// 1,024, enough for a waking reader to be picked ahead of the writers.
pub const READS_NICE: i32 = -5;

static WRITES: OnceLock<Handle> = OnceLock::new();

/// Makes `handle` the writes lane. The first call wins; until one is made (unit tests, tools
/// that embed the daemon) everything runs on the current runtime.
pub fn set_writes(handle: Handle) {
    let _ = WRITES.set(handle);
}

/// Runs `work` on the writes lane.
pub fn spawn_write<F>(work: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match WRITES.get() {
        Some(writes) => writes.spawn(work),
        None => tokio::spawn(work),
    }
}

/// Makes the writes lane the current runtime until the guard is dropped, for code that starts
/// its tasks with `tokio::spawn` (a server's accept loop). `None` without a writes lane.
pub fn enter_writes() -> Option<tokio::runtime::EnterGuard<'static>> {
    WRITES.get().map(Handle::enter)
}

/// For the reads runtime's `on_thread_start`: this thread at [`READS_NICE`], with
/// `SCHED_RESET_ON_FORK` so that a thread or process it starts gets the default again. Without
/// the right to raise a priority (no `CAP_SYS_NICE`) the thread stays as it was, which costs
/// only the reads' head start.
pub fn raise_this_thread() {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: both calls act on the calling thread (pid 0 and its own tid) and read only the
    // sched_param on this stack; no memory is kept.
    let (policy, nice) = unsafe {
        (
            libc::sched_setscheduler(0, libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK, &param),
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, READS_NICE),
        )
    };
    if policy != 0 || nice != 0 {
        static SAID: std::sync::Once = std::sync::Once::new();
        let err = std::io::Error::last_os_error();
        SAID.call_once(|| {
            tracing::debug!("the reads' threads keep the default priority: {err}");
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of(tid: libc::pid_t) -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
            .expect("read the thread's stat");
        let after = &stat[stat.rfind(')').expect("a comm") + 2..];
        // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
        // cutime cstime priority nice: nice is the 17th field after the comm
        after
            .split(' ')
            .nth(16)
            .and_then(|n| n.parse().ok())
            .expect("the nice field")
    }

    #[test]
    fn a_raised_thread_starts_threads_at_the_default_priority() {
        let (raised, child) = std::thread::spawn(|| {
            raise_this_thread();
            // SAFETY: gettid cannot fail.
            let me = unsafe { libc::gettid() };
            // SAFETY: gettid cannot fail.
            let child = std::thread::spawn(|| nice_of(unsafe { libc::gettid() }))
                .join()
                .expect("the child thread ran");
            (nice_of(me), child)
        })
        .join()
        .expect("the thread ran");
        // Without CAP_SYS_NICE the raise is refused and the thread stays at 0.
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!(raised, READS_NICE);
        }
        assert_eq!(
            child, 0,
            "SCHED_RESET_ON_FORK gives a new thread the default"
        );
    }
}
