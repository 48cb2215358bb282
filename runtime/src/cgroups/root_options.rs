//! The cgroup2 mount's options kept across CRIU's runs.
//!
//! The options of the cgroup2 mount (`nsdelegate`, `favordynmods`, `memory_recursiveprot`,
//! `memory_localevents`, ...) are flags of the one cgroup2 root, and every new mount of
//! cgroup2 made in the host's cgroup namespace sets them to that mount's options. CRIU mounts
//! cgroup2 for a moment during a dump or restore (its cgroup yard) with none, so each
//! checkpoint turned those flags off for the whole node, favordynmods among them (every
//! container create then waits for an RCU grace period again). crius puts them back when its
//! last CRIU run in flight has ended, as they were before the first began.

use std::path::PathBuf;
use std::sync::Mutex;

/// CRIU runs in flight, and the options before the first of them.
static IN_FLIGHT: Mutex<(usize, Option<Options>)> = Mutex::new((0, None));

/// The cgroup2 mount and its super options (without `rw`/`ro`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Options {
    mount_point: PathBuf,
    flags: Vec<String>,
}

/// Held while a CRIU run may mount cgroup2; the last one dropped puts the options back.
#[must_use = "the options are put back when the guard is dropped"]
pub struct Preserved(());

/// Remembers the cgroup2 options (if this is the first CRIU run in flight) until the
/// returned guard is dropped.
pub fn preserve() -> Preserved {
    let mut state = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner());
    if state.0 == 0 {
        state.1 = current();
    }
    state.0 += 1;
    Preserved(())
}

impl Drop for Preserved {
    fn drop(&mut self) {
        let mut state = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner());
        state.0 = state.0.saturating_sub(1);
        if state.0 > 0 {
            return;
        }
        let Some(before) = state.1.take() else {
            return;
        };
        match current() {
            Some(now) if now.mount_point == before.mount_point && now.flags != before.flags => {
                match remount(&before) {
                    Ok(()) => tracing::info!(
                        mount = %before.mount_point.display(),
                        was = %now.flags.join(","),
                        now = %before.flags.join(","),
                        "cgroup2 options put back after CRIU"
                    ),
                    Err(e) => tracing::warn!(
                        mount = %before.mount_point.display(),
                        "put cgroup2 options {} back after CRIU: {e}",
                        before.flags.join(",")
                    ),
                }
            }
            _ => {}
        }
    }
}

fn current() -> Option<Options> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse(&info)
}

/// The first cgroup2 mount of a `/proc/self/mountinfo` text.
fn parse(info: &str) -> Option<Options> {
    let m = crius_common::mountinfo::mounts(info).find(|m| m.fs_type == "cgroup2")?;
    Some(Options {
        flags: m
            .super_options
            .split(',')
            .filter(|f| !matches!(*f, "rw" | "ro" | ""))
            .map(str::to_owned)
            .collect(),
        mount_point: m.mount_point,
    })
}

/// A cgroup2 remount sets exactly the flags it is given.
fn remount(to: &Options) -> std::io::Result<()> {
    crate::mounts::remount_with_data(&to.mount_point, &to.flags.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_and_its_super_options_are_read() {
        let info = "\
30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate,favordynmods
42 31 0:39 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
";
        assert_eq!(
            parse(info),
            Some(Options {
                mount_point: "/sys/fs/cgroup/unified".into(),
                flags: vec!["nsdelegate".into(), "favordynmods".into()],
            })
        );
        let plain = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(parse(plain).map(|o| o.flags), Some(vec![]));
        assert_eq!(
            parse("30 24 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"),
            None
        );
    }
}
