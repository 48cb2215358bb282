//! OOM kills in a container's memory cgroup, noticed while the cgroup still exists.
//!
//! The count is the `oom_kill` line of the cgroup's v1 `memory.oom_control` or v2
//! `memory.events`. Reading it only when the init exits is not enough: with the systemd driver
//! systemd removes a scope's cgroup as soon as its last process is gone, sometimes before the
//! shim gets to read it. So the shim also watches the cgroup from create on ([`OomWatch`]): on
//! v1 an eventfd registered for `memory.oom_control` through `cgroup.event_control`, on v2 an
//! inotify watch of `memory.events` (modified on every event). Each wake-up reads the count at
//! once and remembers a kill.
//!
//! v1 signals the eventfd when an OOM episode begins, before the kernel picks and counts its
//! victim, so a wake-up that finds the count unchanged schedules a few re-reads
//! ([`OomWatch::next_check`]). The eventfd is also signalled when the cgroup is removed; the
//! count is then unreadable and the wake-up means nothing.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// After an OOM episode is signalled without a counted kill, re-read the count this often...
const RECHECK_EVERY: Duration = Duration::from_millis(2);
/// ...for this long.
const RECHECK_FOR: Duration = Duration::from_secs(1);

/// Where to read one cgroup's `oom_kill` count.
#[derive(Debug, Clone)]
pub struct OomCounter {
    file: PathBuf,
}

/// The counts of one read of the cgroup's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    oom_kill: u64,
    /// v2's `oom` line (OOM episodes); v1 has none.
    oom: Option<u64>,
}

impl OomCounter {
    /// The counter of the memory cgroup `pid` belongs to, if the system has one.
    pub fn for_pid(pid: i32) -> Option<Self> {
        let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        Self::from_proc_cgroup(&text, Path::new("/sys/fs/cgroup"))
    }

    /// Pick the file from the text of `/proc/<pid>/cgroup`, with cgroupfs mounted at `root`.
    fn from_proc_cgroup(text: &str, root: &Path) -> Option<Self> {
        let mut unified = None;
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let rel = path.trim_start_matches('/');
            if controllers.split(',').any(|c| c == "memory") {
                return Some(Self {
                    file: root.join("memory").join(rel).join("memory.oom_control"),
                });
            }
            if controllers.is_empty() {
                unified = Some(rel.to_owned());
            }
        }
        // cgroup v2 only: mounted at the root itself, or at `unified` on a hybrid system (where
        // memory is a v1 controller and we returned above).
        let rel = unified?;
        let base = if root.join("cgroup.controllers").exists() {
            root.to_path_buf()
        } else {
            root.join("unified")
        };
        Some(Self {
            file: base.join(rel).join("memory.events"),
        })
    }

    /// The current count; `None` if the cgroup is gone or the kernel has no such counter.
    pub fn read(&self) -> Option<u64> {
        Some(self.counts()?.oom_kill)
    }

    fn counts(&self) -> Option<Counts> {
        parse_counts(&fs::read_to_string(&self.file).ok()?)
    }

    fn is_v1(&self) -> bool {
        self.file
            .file_name()
            .is_some_and(|n| n == "memory.oom_control")
    }
}

fn parse_counts(text: &str) -> Option<Counts> {
    let mut oom_kill = None;
    let mut oom = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        match key {
            "oom_kill" => oom_kill = value.trim().parse().ok(),
            "oom" => oom = value.trim().parse().ok(),
            _ => {}
        }
    }
    Some(Counts {
        oom_kill: oom_kill?,
        oom,
    })
}

/// Errors setting up a watch; the shim then falls back to reading the count at exit.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("create {what}")]
    Create {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("register with {path}")]
    Register {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One container's OOM watch: its counter, the count at create, and the descriptor whose
/// readiness means "look now".
#[derive(Debug)]
pub struct OomWatch {
    counter: OomCounter,
    base: Counts,
    /// The eventfd (v1) or inotify descriptor (v2); `None` when watching is impossible or
    /// over (the cgroup is gone).
    fd: Option<OwnedFd>,
    /// A kill was counted while the cgroup existed.
    killed: bool,
    /// An OOM episode was signalled while the cgroup existed, its kill not counted yet.
    episode: bool,
    /// While `episode`: the next re-read and the last one.
    recheck: Option<(Instant, Instant)>,
}

impl OomWatch {
    /// Watch the memory cgroup of `pid` (a container's init, just created). `None` if it has
    /// no readable OOM counter; a watch without descriptor if the kernel refused one (a
    /// warning is logged), which still reads the count at exit.
    pub fn for_pid(pid: i32) -> Option<Self> {
        Self::new(OomCounter::for_pid(pid)?)
    }

    fn new(counter: OomCounter) -> Option<Self> {
        let base = counter.counts()?;
        let fd = match watch_fd(&counter) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(target: "crius_shim", file = %counter.file.display(), error = %crius_common::error_chain(&e), "cannot watch for OOM kills; the count is read at exit only");
                None
            }
        };
        Some(Self {
            counter,
            base,
            fd,
            killed: false,
            episode: false,
            recheck: None,
        })
    }

    /// The descriptor to poll for readability, while the watch is on.
    pub fn raw_fd(&self) -> Option<RawFd> {
        self.fd.as_ref().map(|fd| fd.as_raw_fd())
    }

    /// The descriptor is readable: consume the wake-up and read the count.
    pub fn on_ready(&mut self) {
        let Some(fd) = &self.fd else {
            return;
        };
        let signals = drain(fd.as_raw_fd());
        // v1: the cgroup's removal signals the eventfd once; a shim that wakes only after it
        // (a busy node) reads more than one signal when an OOM episode came first, whose
        // kill the removal hid.
        if self.counter.is_v1() && signals >= 2 && self.counter.counts().is_none() {
            self.episode = true;
        }
        self.look(true, Instant::now());
    }

    /// When the next re-read is due, if one is.
    pub fn next_check(&self) -> Option<Instant> {
        self.recheck.map(|(next, _)| next)
    }

    /// Re-read the count if a re-read is due at `now`.
    pub fn on_timer(&mut self, now: Instant) {
        if self.recheck.is_some_and(|(next, _)| now >= next) {
            self.look(false, now);
        }
    }

    /// Whether the cgroup saw an OOM kill since create: called once the init has exited. The
    /// count decides while the cgroup exists; once it is gone, what the watch saw does: a kill
    /// counted, or an OOM episode signalled whose kill the cgroup's removal hid.
    pub fn finish(&mut self) -> bool {
        // The descriptor closes unread: a pending wake-up would only repeat the read below.
        self.fd = None;
        self.recheck = None;
        match self.counter.counts() {
            Some(now) => self.killed || now.oom_kill > self.base.oom_kill,
            None => self.killed || self.episode,
        }
    }

    /// Read the count after a wake-up (`woken`) or a scheduled re-read, at `at`.
    fn look(&mut self, woken: bool, at: Instant) {
        let Some(now) = self.counter.counts() else {
            // The cgroup is gone (its removal signals the eventfd or ends the inotify
            // watch): nothing more will come.
            self.fd = None;
            self.recheck = None;
            return;
        };
        if now.oom_kill > self.base.oom_kill {
            self.killed = true;
        }
        // v1's eventfd only fires for OOM episodes (or removal, handled above); v2's file
        // changes for other events too, its `oom` line tells.
        let episode = if self.counter.is_v1() {
            woken
        } else {
            matches!((now.oom, self.base.oom), (Some(n), Some(b)) if n > b)
        };
        if episode {
            self.episode = true;
        }
        self.recheck = if self.killed || !self.episode {
            None
        } else {
            match self.recheck {
                Some((_, last)) if at >= last => None,
                Some((_, last)) => Some((at + RECHECK_EVERY, last)),
                None => Some((at + RECHECK_EVERY, at + RECHECK_FOR)),
            }
        };
    }
}

/// A non-blocking descriptor that becomes readable on the counter's cgroup's OOM events.
fn watch_fd(counter: &OomCounter) -> Result<OwnedFd, WatchError> {
    if counter.is_v1() {
        let dir = counter.file.parent().unwrap_or(Path::new("/"));
        // SAFETY: eventfd(2) with valid flags; the result is checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(WatchError::Create {
                what: "eventfd",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: a descriptor we just created and own.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        let control = fs::File::open(&counter.file).map_err(|source| WatchError::Open {
            path: counter.file.clone(),
            source,
        })?;
        let event_control = dir.join("cgroup.event_control");
        let line = format!("{} {}", efd.as_raw_fd(), control.as_raw_fd());
        fs::write(&event_control, line).map_err(|source| WatchError::Register {
            path: event_control,
            source,
        })?;
        // The kernel holds what it needs of `control`; it may close.
        Ok(efd)
    } else {
        // SAFETY: inotify_init1(2) with valid flags; the result is checked.
        let ifd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if ifd < 0 {
            return Err(WatchError::Create {
                what: "inotify instance",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: a descriptor we just created and own.
        let ifd = unsafe { OwnedFd::from_raw_fd(ifd) };
        add_inotify_watch(&ifd, &counter.file)?;
        Ok(ifd)
    }
}

fn add_inotify_watch(ifd: &OwnedFd, path: &Path) -> Result<(), WatchError> {
    use std::os::unix::ffi::OsStrExt;
    let register = |source| WatchError::Register {
        path: path.to_path_buf(),
        source,
    };
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| register(io::Error::from(io::ErrorKind::InvalidInput)))?;
    // SAFETY: a valid inotify descriptor and NUL-terminated path.
    let wd = unsafe { libc::inotify_add_watch(ifd.as_raw_fd(), c_path.as_ptr(), libc::IN_MODIFY) };
    if wd < 0 {
        return Err(register(io::Error::last_os_error()));
    }
    Ok(())
}

/// Read a non-blocking eventfd or inotify descriptor empty.
/// Reads `fd` until it would block. Returns the sum of the eventfd counters read (an eventfd
/// read is 8 bytes: the signals since the last read); for inotify it means nothing.
fn drain(fd: RawFd) -> u64 {
    let mut buf = [0u8; 512];
    let mut signals = 0u64;
    loop {
        // SAFETY: reading into a buffer we own, of the length we pass.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n == 8 {
            let mut value = [0u8; 8];
            value.copy_from_slice(&buf[..8]);
            signals = signals.saturating_add(u64::from_ne_bytes(value));
        }
        if n > 0 || (n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)) {
            continue;
        }
        return signals;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v1_and_v2_files() {
        assert_eq!(
            parse_counts("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
            Some(Counts {
                oom_kill: 3,
                oom: None
            })
        );
        assert_eq!(
            parse_counts("low 0\nhigh 0\nmax 1\noom 2\noom_kill 1\noom_group_kill 0\n"),
            Some(Counts {
                oom_kill: 1,
                oom: Some(2)
            })
        );
        assert_eq!(parse_counts("oom_kill_disable 0\n"), None);
    }

    #[test]
    fn finds_the_memory_cgroup() {
        let root = Path::new("/nonexistent-cgroupfs");
        let v1 = "4:memory:/crius/c1\n0::/\n";
        let c = OomCounter::from_proc_cgroup(v1, root).unwrap();
        assert_eq!(c.file, root.join("memory/crius/c1/memory.oom_control"));
        assert!(c.is_v1());
        let v2 = "0::/crius/c1\n";
        let c = OomCounter::from_proc_cgroup(v2, root).unwrap();
        assert_eq!(c.file, root.join("unified/crius/c1/memory.events"));
        assert!(!c.is_v1());
        assert!(OomCounter::from_proc_cgroup("", root).is_none());
    }

    fn events(oom: u64, oom_kill: u64, high: u64) -> String {
        format!("low 0\nhigh {high}\nmax 0\noom {oom}\noom_kill {oom_kill}\noom_group_kill 0\n")
    }

    fn readable(fd: RawFd) -> bool {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 1000) == 1 }
    }

    /// A v2 watch over a stand-in `memory.events` (inotify works on any file).
    fn v2_watch(dir: &Path) -> OomWatch {
        let file = dir.join("memory.events");
        fs::write(&file, events(0, 0, 0)).unwrap();
        let w = OomWatch::new(OomCounter { file }).unwrap();
        assert!(w.raw_fd().is_some());
        w
    }

    #[test]
    fn v2_kill_counted_before_the_cgroup_goes_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = v2_watch(dir.path());
        let file = dir.path().join("memory.events");
        // The episode first: the kill is not counted yet, a re-read is scheduled.
        fs::write(&file, events(1, 0, 0)).unwrap();
        assert!(readable(w.raw_fd().unwrap()));
        w.on_ready();
        assert!(w.episode && !w.killed);
        let due = w.next_check().unwrap();
        fs::write(&file, events(1, 1, 0)).unwrap();
        w.on_timer(due);
        assert!(w.killed);
        assert!(w.next_check().is_none());
        // The cgroup goes before the init's exit is handled.
        fs::remove_file(&file).unwrap();
        assert!(w.finish());
    }

    #[test]
    fn v2_episode_whose_cgroup_goes_counts_as_a_kill() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = v2_watch(dir.path());
        let file = dir.path().join("memory.events");
        fs::write(&file, events(1, 0, 0)).unwrap();
        w.on_ready();
        fs::remove_file(&file).unwrap();
        assert!(w.finish());
    }

    /// A v1 watch over a stand-in `memory.oom_control`, with an eventfd the test signals
    /// itself (the kernel's registration needs a real memory cgroup).
    fn v1_watch(dir: &Path) -> (OomWatch, PathBuf) {
        let file = dir.join("memory.oom_control");
        fs::write(&file, "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n").unwrap();
        let counter = OomCounter { file: file.clone() };
        let base = counter.counts().unwrap();
        // SAFETY: eventfd(2) with valid flags, checked below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(efd >= 0);
        let w = OomWatch {
            counter,
            base,
            // SAFETY: the descriptor was just created and is owned here.
            fd: Some(unsafe { OwnedFd::from_raw_fd(efd) }),
            killed: false,
            episode: false,
            recheck: None,
        };
        (w, file)
    }

    fn signal(w: &OomWatch, times: u64) {
        let value = times.to_ne_bytes();
        // SAFETY: an 8-byte write of a counter to our own eventfd.
        let n = unsafe { libc::write(w.raw_fd().unwrap(), value.as_ptr().cast(), 8) };
        assert_eq!(n, 8);
    }

    #[test]
    fn v1_wake_up_after_the_cgroup_went_counts_an_episode_before_the_removal() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, file) = v1_watch(dir.path());
        // The episode and then the removal signalled before the shim woke.
        signal(&w, 1);
        signal(&w, 1);
        fs::remove_file(&file).unwrap();
        w.on_ready();
        assert!(w.finish());
    }

    #[test]
    fn v1_removal_alone_is_no_oom() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, file) = v1_watch(dir.path());
        signal(&w, 1);
        fs::remove_file(&file).unwrap();
        w.on_ready();
        assert!(!w.finish());
    }

    #[test]
    fn v2_other_events_are_no_oom() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = v2_watch(dir.path());
        let file = dir.path().join("memory.events");
        fs::write(&file, events(0, 0, 5)).unwrap();
        assert!(readable(w.raw_fd().unwrap()));
        w.on_ready();
        assert!(!w.episode && w.next_check().is_none());
        fs::remove_file(&file).unwrap();
        assert!(!w.finish());
    }

    #[test]
    fn counts_at_exit_decide_while_the_cgroup_exists() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = v2_watch(dir.path());
        // No wake-up handled (as without a watch): the count read at exit still tells.
        fs::write(dir.path().join("memory.events"), events(1, 1, 0)).unwrap();
        assert!(w.finish());
        assert!(w.raw_fd().is_none());
    }

    #[test]
    fn rechecks_stop_after_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = v2_watch(dir.path());
        fs::write(dir.path().join("memory.events"), events(1, 0, 0)).unwrap();
        w.on_ready();
        let start = w.next_check().unwrap();
        w.on_timer(start + RECHECK_FOR + RECHECK_EVERY);
        assert!(w.next_check().is_none());
        assert!(!w.finish());
    }
}
