//! The host's cgroup hierarchy, v1 or v2, found from the mount table, and what crius does
//! with a cgroup through it: apply limits (all or nothing), read them back, read usage.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crius_api::v1::LinuxContainerResources;

use super::mounts::{cgroup_mounts, CgroupMount};
use super::systemd::own_unit;
use super::validation::validate;
use super::{systemd, v1, v2, CgroupError, CgroupStats, Result, Transaction};

/// Which cgroup version a [`Hierarchy`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One hierarchy per controller (also a hybrid host, whose v2 tree has no controllers).
    V1,
    /// The unified hierarchy.
    V2,
}

/// The cgroup filesystems of a host, able to apply limits to a cgroup, read them back and read
/// its usage. Cgroups are named by their cgroupfs path (see [`fs_path`](super::fs_path)).
#[derive(Debug, Clone)]
pub enum Hierarchy {
    V1(v1::V1),
    V2(v2::V2),
}

impl Hierarchy {
    /// This host's cgroups, detected once from the mount table.
    pub fn host() -> Result<&'static Hierarchy> {
        static HOST: OnceLock<std::result::Result<Hierarchy, String>> = OnceLock::new();
        HOST.get_or_init(|| {
            let info = std::fs::read_to_string("/proc/self/mountinfo")
                .map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
            Hierarchy::from_mountinfo(&info).map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| CgroupError::Detect(e.clone()))
    }

    /// The hierarchy described by the text of `/proc/self/mountinfo`: v2 when
    /// `/sys/fs/cgroup` is cgroup2, else the v1 controllers, else a cgroup2 mounted elsewhere.
    pub fn from_mountinfo(mountinfo: &str) -> Result<Hierarchy> {
        let mounts = cgroup_mounts(mountinfo);
        let unified = |m: &&CgroupMount| m.fstype == "cgroup2";
        if let Some(m) = mounts
            .iter()
            .filter(unified)
            .find(|m| m.mount_point == Path::new("/sys/fs/cgroup"))
        {
            return Ok(Hierarchy::V2(v2::V2::new(&m.mount_point)));
        }
        // A controller can be mounted more than once: CRIU mounts the hierarchies again in a
        // directory of its own while it restores (`.criu.cgyard.*`). The host's mount (below
        // /sys/fs/cgroup) wins, else the first one listed.
        let mut controllers: HashMap<String, PathBuf> = HashMap::new();
        for m in mounts.iter().filter(|m| m.fstype == "cgroup") {
            let host = m.mount_point.parent() == Some(Path::new("/sys/fs/cgroup"));
            for c in &m.controllers {
                let known = controllers
                    .get(c)
                    .is_some_and(|p| p.parent() == Some(Path::new("/sys/fs/cgroup")));
                if !controllers.contains_key(c) || (host && !known) {
                    controllers.insert(c.clone(), m.mount_point.clone());
                }
            }
        }
        if !controllers.is_empty() {
            return Ok(Hierarchy::V1(v1::V1::new(controllers)));
        }
        match mounts.iter().find(unified) {
            Some(m) => Ok(Hierarchy::V2(v2::V2::new(&m.mount_point))),
            None => Err(CgroupError::Detect(
                "no cgroup or cgroup2 filesystem in /proc/self/mountinfo".to_string(),
            )),
        }
    }

    pub fn mode(&self) -> Mode {
        match self {
            Hierarchy::V1(_) => Mode::V1,
            Hierarchy::V2(_) => Mode::V2,
        }
    }

    /// Whether this host has `controller` (`hugetlb`, `cpuset`, …): mounted on v1, listed in
    /// the root's `cgroup.controllers` on v2. libcontainer refuses to create a container whose
    /// spec sets limits of a missing controller (e.g. hugepage limits without hugetlb).
    pub fn has_controller(&self, controller: &str) -> bool {
        match self {
            Hierarchy::V1(h) => h.mount(controller).is_some(),
            Hierarchy::V2(h) => h.has_controller(controller),
        }
    }

    /// The text of `cgroup`'s file `name`, which on v1 lives in `controller`'s hierarchy;
    /// None when that is not mounted or the file cannot be read.
    pub fn file(&self, controller: &str, cgroup: &str, name: &str) -> Option<String> {
        let dir = match self {
            Hierarchy::V1(h) => h.dir(controller, cgroup)?,
            Hierarchy::V2(h) => h.dir(cgroup),
        };
        std::fs::read_to_string(dir.join(name)).ok()
    }

    /// Whether the cgroup exists (in the memory hierarchy on v1).
    pub fn exists(&self, cgroup: &str) -> bool {
        match self {
            Hierarchy::V1(h) => h.exists(cgroup),
            Hierarchy::V2(h) => h.exists(cgroup),
        }
    }

    /// Writes every set field of `r` into the existing cgroup, all or nothing: the values are
    /// checked first, each file's old value is read before it is written, and when the kernel
    /// refuses a value the files already written get their old values back. Zero and empty
    /// fields are left as they are (CRI's "not set"); `oom_score_adj` is a process setting and
    /// is ignored here.
    ///
    /// With the systemd driver the unit crius made for the cgroup (a container's scope, a pod
    /// slice crius owns) gets the same values as properties afterwards, so that systemd keeps
    /// them; the files hold them already, so a refusal there is only logged.
    pub fn apply(&self, cgroup: &str, r: &LinuxContainerResources) -> Result<()> {
        self.apply_files(cgroup, r)?;
        if let Some((sd, unit)) = own_unit(cgroup) {
            let synced = systemd::resource_properties(r, self.mode())
                .and_then(|props| sd.set_properties(unit, &props));
            if let Err(e) = synced {
                tracing::warn!(
                    "set the properties of {unit}: {}",
                    crius_common::error_chain(&e)
                );
            }
        }
        Ok(())
    }

    /// [`Hierarchy::apply`] to the cgroup files only.
    pub fn apply_files(&self, cgroup: &str, r: &LinuxContainerResources) -> Result<()> {
        validate(r, self.mode())?;
        if !self.exists(cgroup) {
            return Err(CgroupError::NotFound(cgroup.to_string()));
        }
        let mut tx = Transaction::default();
        let result = match self {
            Hierarchy::V1(h) => h.apply(&mut tx, cgroup, r),
            Hierarchy::V2(h) => h.apply(&mut tx, cgroup, r),
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) => {
                tx.rollback();
                Err(e)
            }
        }
    }

    /// The limits in force in the cgroup, in CRI terms (unlimited reads as 0, "not set";
    /// an unlimited CPU quota as -1). `unified` stays empty.
    pub fn read(&self, cgroup: &str) -> Result<LinuxContainerResources> {
        if !self.exists(cgroup) {
            return Err(CgroupError::NotFound(cgroup.to_string()));
        }
        match self {
            Hierarchy::V1(h) => h.read(cgroup),
            Hierarchy::V2(h) => h.read(cgroup),
        }
    }

    /// Usage of the cgroup and everything below it.
    pub fn stats(&self, cgroup: &str) -> Result<CgroupStats> {
        if !self.exists(cgroup) {
            return Err(CgroupError::NotFound(cgroup.to_string()));
        }
        match self {
            Hierarchy::V1(h) => h.stats(cgroup),
            Hierarchy::V2(h) => h.stats(cgroup),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_hosts_mount_of_a_controller_wins_over_criu_s() {
        let yard = "\
99 23 0:50 / /run/x/.criu.cgyard.a/freezer rw,relatime - cgroup cgroup rw,freezer
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
98 23 0:51 / /run/x/.criu.cgyard.a/memory rw,relatime - cgroup cgroup rw,memory
";
        let after = format!("{HYBRID}{yard}");
        for info in [after.as_str(), yard] {
            let Hierarchy::V1(v1) = Hierarchy::from_mountinfo(info).unwrap() else {
                unreachable!()
            };
            assert_eq!(
                v1.mount("freezer"),
                Some(Path::new("/sys/fs/cgroup/freezer"))
            );
        }
        let Hierarchy::V1(v1) = Hierarchy::from_mountinfo(&after).unwrap() else {
            unreachable!()
        };
        assert_eq!(v1.mount("memory"), Some(Path::new("/sys/fs/cgroup/memory")));
    }

    #[test]
    fn hybrid_host_is_v1_with_each_controller() {
        let h = Hierarchy::from_mountinfo(HYBRID).unwrap();
        assert_eq!(h.mode(), Mode::V1);
        let Hierarchy::V1(v1) = h else { unreachable!() };
        assert_eq!(
            v1.mount("cpuacct"),
            Some(Path::new("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(v1.mount("cpu"), v1.mount("cpuacct"));
        assert_eq!(v1.mount("memory"), Some(Path::new("/sys/fs/cgroup/memory")));
        assert_eq!(v1.mount("hugetlb"), None);
        assert_eq!(
            v1.dir("memory", "/crius/p/c"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/crius/p/c"))
        );
        assert_eq!(cgroup_mounts(HYBRID).len(), 5);
    }

    #[test]
    fn unified_host_is_v2() {
        let info = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let h = Hierarchy::from_mountinfo(info).unwrap();
        assert_eq!(h.mode(), Mode::V2);
        let Hierarchy::V2(v2) = h else { unreachable!() };
        assert_eq!(v2.dir("/crius/p"), PathBuf::from("/sys/fs/cgroup/crius/p"));
        assert!(Hierarchy::from_mountinfo("1 0 0:1 / / rw - ext4 /dev/sda rw\n").is_err());
    }
}
