//! `/proc/<pid>/mountinfo` (proc(5)): one line per mount,
//! `<id> <parent> <major:minor> <root> <mount point> <options> [optional...] - <fs type>
//! <source> <super options>`, with space, tab, newline and backslash in paths escaped as
//! `\ooo`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// The fields of one mountinfo line that crius reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount<'a> {
    /// Where it is mounted, unescaped.
    pub mount_point: PathBuf,
    /// `cgroup2`, `overlay`, `tmpfs`, ...
    pub fs_type: &'a str,
    /// The mount source (`tmpfs`, `/dev/vda1`, the name a tmpfs was mounted with, ...).
    pub source: &'a str,
    /// The per-superblock options (for a v1 cgroup mount, its controllers among them).
    pub super_options: &'a str,
}

/// Parse one line; `None` for a line that is not of the format.
pub fn parse_line(line: &str) -> Option<Mount<'_>> {
    let (head, tail) = line.split_once(" - ")?;
    let mount_point = head.split(' ').nth(4)?;
    let mut tail = tail.split(' ');
    let fs_type = tail.next()?;
    let source = tail.next().unwrap_or("");
    let super_options = tail.next().unwrap_or("");
    Some(Mount {
        mount_point: PathBuf::from(OsString::from_vec(unescape(mount_point))),
        fs_type,
        source,
        super_options,
    })
}

/// Every mount in the text of a mountinfo file.
pub fn mounts(text: &str) -> impl Iterator<Item = Mount<'_>> {
    text.lines().filter_map(parse_line)
}

/// The v1 controllers libcontainer 0.7 puts a container in (`libcgroups::v1::CONTROLLERS`);
/// named hierarchies such as `name=systemd` are not among them.
pub const LIBCONTAINER_V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "memory",
    "pids",
    "perf_event",
    "blkio",
    "net_prio",
    "net_cls",
    "freezer",
];

/// For each of [`LIBCONTAINER_V1_CONTROLLERS`] that is mounted, in that order, the first v1
/// cgroup mount in the text of a mountinfo file whose super options name it (as libcontainer
/// takes the first match). Co-mounted controllers share a mount point.
pub fn libcontainer_v1_mounts(text: &str) -> Vec<(&'static str, PathBuf)> {
    LIBCONTAINER_V1_CONTROLLERS
        .iter()
        .filter_map(|controller| {
            let mount = mounts(text).find(|m| {
                m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == *controller)
            })?;
            Some((*controller, mount.mount_point))
        })
        .collect()
}

/// The mount points of [`libcontainer_v1_mounts`]' answer, each once (co-mounted controllers
/// share one), in the order of their first controller: where a container's cgroup is made.
pub fn distinct_mounts(mounts: &[(&'static str, PathBuf)]) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for (_, mount) in mounts {
        if !roots.contains(mount) {
            roots.push(mount.clone());
        }
    }
    roots
}

/// Undo mountinfo's octal escapes (`\040` is a space); anything else stays as it is.
pub fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|d| d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        match octal {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mount_point_type_source_and_super_options() {
        let text = "36 35 98:0 /mnt1 /mnt\\040with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    25 1 0:22 / /sys/fs/cgroup/cpu,cpuacct rw shared:9 - cgroup cgroup rw,cpu,cpuacct\n\
                    garbage\n";
        let all: Vec<_> = mounts(text).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].mount_point, PathBuf::from("/mnt with space"));
        assert_eq!(all[0].fs_type, "ext3");
        assert_eq!(all[0].source, "/dev/root");
        assert_eq!(all[0].super_options, "rw,errors=continue");
        assert_eq!(all[1].fs_type, "cgroup");
        assert_eq!(all[1].super_options, "rw,cpu,cpuacct");
    }

    #[test]
    fn comounted_controllers_give_one_root() {
        let text =
            "25 1 0:22 / /sys/fs/cgroup/cpu,cpuacct rw shared:9 - cgroup cgroup rw,cpu,cpuacct\n\
                    26 1 0:23 / /sys/fs/cgroup/memory rw shared:10 - cgroup cgroup rw,memory\n\
                    27 1 0:24 / /sys/fs/cgroup/unified rw shared:11 - cgroup2 cgroup2 rw\n";
        let all = libcontainer_v1_mounts(text);
        assert_eq!(all.len(), 3, "{all:?}");
        assert_eq!(
            distinct_mounts(&all),
            [
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                PathBuf::from("/sys/fs/cgroup/memory")
            ]
        );
    }

    #[test]
    fn unescapes_octal_only() {
        assert_eq!(unescape("a\\040b\\134c"), b"a b\\c");
        assert_eq!(unescape("a\\9zz\\04"), b"a\\9zz\\04");
        assert_eq!(unescape("\\777"), b"\\777", "over 255 is not an escape");
    }
}
