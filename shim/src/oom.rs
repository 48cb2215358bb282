//! The OOM-kill counter of a container's memory cgroup (v1 `memory.oom_control`, v2
//! `memory.events`, both have an `oom_kill` line). The shim reads it when a container is created
//! and when its init exits; a larger count means the kernel OOM-killed a process in it.

use std::fs;
use std::path::{Path, PathBuf};

/// Where to read one cgroup's `oom_kill` count.
#[derive(Debug, Clone)]
pub struct OomCounter {
    file: PathBuf,
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
        parse_oom_kill(&fs::read_to_string(&self.file).ok()?)
    }
}

fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v1_and_v2_files() {
        assert_eq!(
            parse_oom_kill("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
            Some(3)
        );
        assert_eq!(
            parse_oom_kill("low 0\nhigh 0\nmax 1\noom 1\noom_kill 1\noom_group_kill 0\n"),
            Some(1)
        );
        assert_eq!(parse_oom_kill("oom_kill_disable 0\n"), None);
    }

    #[test]
    fn finds_the_memory_cgroup() {
        let root = Path::new("/nonexistent-cgroupfs");
        let v1 = "4:memory:/crius/c1\n0::/\n";
        assert_eq!(
            OomCounter::from_proc_cgroup(v1, root).unwrap().file,
            root.join("memory/crius/c1/memory.oom_control")
        );
        let v2 = "0::/crius/c1\n";
        assert_eq!(
            OomCounter::from_proc_cgroup(v2, root).unwrap().file,
            root.join("unified/crius/c1/memory.events")
        );
        assert!(OomCounter::from_proc_cgroup("", root).is_none());
    }
}
