//! User namespaces of pods (`hostUsers: false`) and the idmapped mounts that go with them.
//!
//! # A pod's namespaces
//!
//! A user-namespaced pod gets its user namespace and its network namespace from one short-lived
//! process: crius starts the pause binary with `unshare(CLONE_NEWUSER | CLONE_NEWNET)` between
//! fork and exec (the kernel makes the user namespace first and the network namespace owned by
//! it), writes the pod's `uid_map` and `gid_map`, pins both namespaces with bind mounts
//! (`<state>/userns/<id>` and the usual netns pin), and kills the process. The pause container
//! then joins the pinned user namespace first and the pinned netns after it; containers join
//! the pause's. A network namespace owned by the pod's user namespace is what lets the pod's
//! root mount sysfs and set `net.*` sysctls, and host root (CNI plugins) may still enter it.
//!
//! # Idmapped mounts
//!
//! Files on the node are owned by host ids; seen from the pod they would all be the overflow
//! id. [`idmapped_bind`] makes a bind mount that shows them through a user namespace's mapping
//! (`open_tree` + `mount_setattr(MOUNT_ATTR_IDMAP)` + `move_mount`): a file of host uid 0
//! appears as the host uid the pod's root is, so root inside the pod owns it. The container
//! rootfs is an overlay over idmapped binds of the image layers with an upper directory owned
//! by the pod's root (overlayfs accepts idmapped layers since Linux 5.19); CRI volume mounts
//! with `uid_mappings`/`gid_mappings` (kubelet sends the pod's) are idmapped binds, staged in
//! the container's bundle and bound into the container from there.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use oci_spec::runtime::LinuxIdMapping;

/// The id mappings of a user namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMaps {
    pub uids: Vec<LinuxIdMapping>,
    pub gids: Vec<LinuxIdMapping>,
}

#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("pin the pod's network namespace")]
    Netns(#[from] crius_cni::Error),
}

impl UsernsError {
    /// Whether the kernel refused the id mapping (`EINVAL`/`EPERM` writing a map file).
    pub fn refused_mapping(&self) -> bool {
        matches!(self, UsernsError::Io { op: "write", path, source }
            if (path.ends_with("uid_map") || path.ends_with("gid_map"))
                && matches!(source.raw_os_error(), Some(libc::EINVAL | libc::EPERM)))
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> UsernsError + 'a {
    move |source| UsernsError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// `/proc/<pid>/{uid,gid}_map` text: one `container host length` line a mapping.
fn map_text(maps: &[LinuxIdMapping]) -> String {
    maps.iter()
        .map(|m| format!("{} {} {}\n", m.container_id(), m.host_id(), m.size()))
        .collect()
}

impl IdMaps {
    /// The host uid and gid that the namespace's root (id 0) is, if root is mapped.
    pub fn host_root(&self) -> Option<(u32, u32)> {
        let find = |maps: &[LinuxIdMapping]| {
            maps.iter()
                .find(|m| m.container_id() == 0 && m.size() > 0)
                .map(|m| m.host_id())
        };
        Some((find(&self.uids)?, find(&self.gids)?))
    }

    /// Writes the mappings of the (new, unmapped) user namespace of `pid`.
    fn write_to(&self, pid: u32) -> Result<(), UsernsError> {
        for (file, maps) in [("uid_map", &self.uids), ("gid_map", &self.gids)] {
            let path = PathBuf::from(format!("/proc/{pid}/{file}"));
            std::fs::write(&path, map_text(maps)).map_err(io_err("write", &path))?;
        }
        Ok(())
    }
}

/// A program that waits to be killed (crius uses the pause binary), with its arguments.
#[derive(Debug, Clone, Copy)]
pub struct HolderProgram<'a> {
    pub path: &'a Path,
    pub args: &'a [&'a str],
}

/// A process of a [`HolderProgram`] in new namespaces (`flags`), killed and reaped on drop.
struct Holder {
    child: std::process::Child,
}

impl Holder {
    fn spawn(program: HolderProgram<'_>, flags: libc::c_int) -> Result<Holder, UsernsError> {
        let parent = std::process::id();
        let mut cmd = Command::new(program.path);
        cmd.args(program.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: the closure runs in the forked child before exec and makes only syscalls
        // (prctl, getppid, unshare), which are async-signal-safe; the child has a single thread, as a
        // new user namespace requires.
        unsafe {
            cmd.pre_exec(move || {
                // a crius killed meanwhile takes the holder with it
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(io::Error::last_os_error());
                }
                // crius died before the prctl: nobody would kill this holder
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::from(io::ErrorKind::Interrupted));
                }
                if libc::unshare(flags) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(io_err("start a namespace holder from", program.path))?;
        Ok(Holder { child })
    }

    fn ns(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/{name}", self.child.id()))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates a pod's user namespace with `maps` and a network namespace owned by it; pins the
/// first at `userns_pin` and the second at `<netns_dir>/<id>` (loopback up), and returns the
/// netns pin. On failure nothing is left pinned.
pub fn create_pod_namespaces(
    holder: HolderProgram<'_>,
    maps: &IdMaps,
    userns_pin: &Path,
    netns_dir: &Path,
    id: &str,
) -> Result<PathBuf, UsernsError> {
    let proc = Holder::spawn(holder, libc::CLONE_NEWUSER | libc::CLONE_NEWNET)?;
    maps.write_to(proc.child.id())?;
    pin_ns(&proc.ns("user"), userns_pin)?;
    match crius_cni::netns::pin(&proc.ns("net"), netns_dir, id) {
        Ok(netns) => Ok(netns),
        Err(e) => {
            let _ = unpin(userns_pin);
            Err(e.into())
        }
    }
}

/// Opens a new user namespace with `maps`, for idmapped mounts whose mapping is not the pod's.
pub fn open_new(holder: HolderProgram<'_>, maps: &IdMaps) -> Result<OwnedFd, UsernsError> {
    let proc = Holder::spawn(holder, libc::CLONE_NEWUSER)?;
    maps.write_to(proc.child.id())?;
    let path = proc.ns("user");
    let file = std::fs::File::open(&path).map_err(io_err("open", &path))?;
    Ok(OwnedFd::from(file))
}

/// Opens a pinned (or `/proc/<pid>/ns/user`) user namespace.
pub fn open(path: &Path) -> Result<OwnedFd, UsernsError> {
    let file = std::fs::File::open(path).map_err(io_err("open user namespace", path))?;
    Ok(OwnedFd::from(file))
}

fn pin_ns(source: &Path, pin: &Path) -> Result<(), UsernsError> {
    if let Some(dir) = pin.parent() {
        std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(pin)
        .map_err(io_err("create pin file", pin))?;
    let bound = crate::mounts::mount(&source.to_string_lossy(), pin, "", libc::MS_BIND, "");
    if let Err(e) = bound {
        let _ = std::fs::remove_file(pin);
        return Err(io_err("pin user namespace at", pin)(e));
    }
    Ok(())
}

/// Unpins a namespace pinned at `pin` (idempotent).
pub fn unpin(pin: &Path) -> Result<(), UsernsError> {
    crius_cni::netns::remove(pin)?;
    Ok(())
}

/// Whether user-namespaced pods can work here: Linux 5.19 or later (overlayfs over idmapped
/// layers) and an idmapped bind of a directory under `root` (where the image layers are)
/// succeeds. The error says what is missing.
pub fn probe(holder: HolderProgram<'_>, root: &Path) -> Result<(), String> {
    if !crate::util::kernel_at_least(5, 19) {
        return Err("Linux 5.19 or later is needed for overlayfs over idmapped layers".into());
    }
    let dir = root
        .join("tmp")
        .join(format!("userns-probe-{}", std::process::id()));
    let (src, dst) = (dir.join("src"), dir.join("dst"));
    let mapping = probe_mapping()?;
    let attempt = (|| -> Result<(), UsernsError> {
        for d in [&src, &dst] {
            std::fs::create_dir_all(d).map_err(io_err("create", d))?;
        }
        let maps = IdMaps {
            uids: vec![mapping],
            gids: vec![mapping],
        };
        let ns = open_new(holder, &maps)?;
        idmapped_bind(&src, &dst, std::os::fd::AsFd::as_fd(&ns), false)
    })();
    let _ = crate::mounts::unmount(&dst);
    let _ = std::fs::remove_dir(&src);
    let _ = std::fs::remove_dir(&dst);
    let _ = std::fs::remove_dir(&dir);
    attempt.map_err(|e| crate::error::chain(&e))
}

fn probe_mapping() -> Result<LinuxIdMapping, String> {
    oci_spec::runtime::LinuxIdMappingBuilder::default()
        .container_id(0u32)
        .host_id(1u32 << 20)
        .size(1u32)
        .build()
        .map_err(|e| e.to_string())
}

// From linux/mount.h and linux/fcntl.h.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Binds `source` (recursively with `recursive`) on `target` (which must exist and be of the
/// same kind, directory or file) as a mount idmapped through `userns`.
pub fn idmapped_bind(
    source: &Path,
    target: &Path,
    userns: BorrowedFd<'_>,
    recursive: bool,
) -> Result<(), UsernsError> {
    let src = crate::mounts::cstr(source).map_err(io_err("bind", source))?;
    let dst = crate::mounts::cstr(target).map_err(io_err("bind on", target))?;
    let rec = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: open_tree with a valid NUL-terminated path; the result is checked and owned.
    let raw = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | rec,
        )
    };
    if raw < 0 {
        return Err(io_err("clone the mount of", source)(
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: a fresh descriptor nobody else owns (open_tree returns an int fd).
    let tree = unsafe { OwnedFd::from_raw_fd(raw as libc::c_int) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: mount_setattr on our detached tree with a valid struct and its size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | rec,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(io_err("idmap the mount of", source)(
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: move_mount of our detached tree onto a valid NUL-terminated target path.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(io_err("mount idmapped bind on", target)(
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::LinuxIdMappingBuilder;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    fn maps(host: u32) -> IdMaps {
        let m = LinuxIdMappingBuilder::default()
            .container_id(0u32)
            .host_id(host)
            .size(65536u32)
            .build()
            .unwrap();
        IdMaps {
            uids: vec![m],
            gids: vec![m],
        }
    }

    #[test]
    fn map_text_and_host_root() {
        let m = maps(100000);
        assert_eq!(map_text(&m.uids), "0 100000 65536\n");
        assert_eq!(m.host_root(), Some((100000, 100000)));
        let none = IdMaps {
            uids: vec![],
            gids: m.gids.clone(),
        };
        assert_eq!(none.host_root(), None);
    }

    /// A static program that waits to be killed: `sleep` from busybox-static.
    fn holder() -> HolderProgram<'static> {
        HolderProgram {
            path: Path::new("/bin/busybox"),
            args: &["sleep", "1000"],
        }
    }

    #[test]
    fn idmapped_bind_shows_host_root_files_as_the_mapped_root() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let dst = dir.path().join("dst");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(&dst).unwrap();
        std::fs::write(src.join("f"), "x").unwrap();
        let ns = open_new(holder(), &maps(200000)).unwrap();
        idmapped_bind(&src, &dst, ns.as_fd(), false).unwrap();
        let uid = std::fs::metadata(dst.join("f")).map(|m| m.uid());
        crate::mounts::unmount(&dst).unwrap();
        assert_eq!(uid.unwrap(), 200000);
        assert_eq!(std::fs::metadata(src.join("f")).unwrap().uid(), 0);
    }
}
