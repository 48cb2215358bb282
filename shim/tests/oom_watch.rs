//! The OOM watch on a real v1 memory cgroup whose process is OOM-killed and which is removed
//! right after, before the count is read at exit (as systemd does with a scope). Needs root
//! and a v1 memory hierarchy at /sys/fs/cgroup/memory (skipped otherwise).
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::Write;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crius_shim::oom::OomWatch;

/// A memory cgroup with a hog in it; both go on drop.
struct Hog {
    cgroup: PathBuf,
    child: Child,
}

impl Hog {
    fn start(name: &str) -> Option<Self> {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("cgroup.event_control").exists() {
            eprintln!("no v1 memory hierarchy: skipped");
            return None;
        }
        let cgroup = root.join(format!("crius-test-{name}-{}", std::process::id()));
        fs::create_dir(&cgroup).unwrap();
        let child = Command::new("sh")
            .args([
                "-c",
                "read go; x=0123456789abcdef; while true; do x=$x$x; done",
            ])
            .stdin(Stdio::piped())
            .spawn();
        let child = child.unwrap_or_else(|e| {
            // No Hog yet whose Drop would remove the cgroup.
            let _ = fs::remove_dir(&cgroup);
            panic!("spawn sh: {e}");
        });
        let hog = Self { cgroup, child };
        fs::write(hog.cgroup.join("memory.limit_in_bytes"), "16777216").unwrap();
        fs::write(hog.cgroup.join("cgroup.procs"), hog.child.id().to_string()).unwrap();
        Some(hog)
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn go(&mut self) {
        self.child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"go\n")
            .unwrap();
    }

    fn remove_cgroup(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Err(e) = fs::remove_dir(&self.cgroup) {
            assert!(
                Instant::now() < deadline,
                "rmdir {}: {e}",
                self.cgroup.display()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.cgroup.exists() {
            self.remove_cgroup();
        }
    }
}

fn poll_in(fd: Option<RawFd>, timeout: Duration) -> bool {
    let Some(fd) = fd else {
        std::thread::sleep(timeout);
        return false;
    };
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, 100) as i32;
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, ms) == 1 }
}

/// Run the watch as the shim's loop does until the hog dies, remove its cgroup, then ask.
fn oom_killed_after_removal(watching: bool) -> Option<bool> {
    let mut hog = Hog::start(if watching { "oomw" } else { "oomn" })?;
    let mut watch = OomWatch::for_pid(hog.pid()).unwrap();
    assert!(watch.raw_fd().is_some(), "no eventfd registered");
    hog.go();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = hog.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the hog was never killed");
        if !watching {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let wait = watch.next_check().map_or(Duration::from_millis(20), |t| {
            t.saturating_duration_since(Instant::now())
        });
        if poll_in(watch.raw_fd(), wait) {
            watch.on_ready();
        }
        watch.on_timer(Instant::now());
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    hog.remove_cgroup();
    Some(watch.finish())
}

#[test]
fn oom_kill_is_seen_although_the_cgroup_is_removed_at_once() {
    for _ in 0..5 {
        let Some(killed) = oom_killed_after_removal(true) else {
            return;
        };
        assert!(killed);
    }
}

#[test]
fn without_watching_the_removal_hides_the_kill() {
    // What the shim saw before it watched: the count is gone with the cgroup.
    if let Some(killed) = oom_killed_after_removal(false) {
        assert!(!killed);
    }
}
