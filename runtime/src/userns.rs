//! User namespaces of pods (`hostUsers: false`) and the idmapped mounts that go with them.
//!
//! # A pod's namespaces
//!
//! A user-namespaced pod gets its user namespace and its network namespace from one short-lived
//! forked child of crius that calls `unshare(CLONE_NEWUSER | CLONE_NEWNET)` (the kernel makes the
//! user namespace first and the network namespace owned by it) and waits; crius writes the pod's
//! `uid_map` and `gid_map`, pins both namespaces with bind mounts (`<state>/userns/<id>` and the
//! usual netns pin), and lets the child exit. The pause container
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
use std::path::{Path, PathBuf};

use oci_spec::runtime::LinuxIdMapping;

/// The id mappings of a user namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMaps {
    pub uids: Vec<LinuxIdMapping>,
    pub gids: Vec<LinuxIdMapping>,
}

fn in_maps(maps: &[LinuxIdMapping], id: u32) -> bool {
    maps.iter()
        .any(|m| id >= m.container_id() && u64::from(id - m.container_id()) < u64::from(m.size()))
}

/// The operation of a [`UsernsError`] when mount_setattr refused to idmap a mount.
const IDMAP_OP: &str = "idmap the mount of";

#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("pin the pod's namespaces")]
    Pin(#[from] crius_cni::Error),
}

impl UsernsError {
    /// The path whose filesystem refused to be idmapped (mount_setattr's `EINVAL` for a
    /// filesystem without idmapped mount support, such as ramfs or an old kernel's tmpfs).
    pub fn idmap_unsupported(&self) -> Option<&Path> {
        match self {
            UsernsError::Io { op, path, source }
                if *op == IDMAP_OP
                    && matches!(source.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) =>
            {
                Some(path)
            }
            _ => None,
        }
    }

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
    /// Whether container uid `id` is mapped.
    pub fn maps_uid(&self, id: u32) -> bool {
        in_maps(&self.uids, id)
    }

    /// Whether container gid `id` is mapped.
    pub fn maps_gid(&self, id: u32) -> bool {
        in_maps(&self.gids, id)
    }

    /// The container ids `maps` covers, as `0-999, 2000-2099`.
    pub fn ranges(maps: &[LinuxIdMapping]) -> String {
        maps.iter()
            .map(|m| {
                let last = u64::from(m.container_id()) + u64::from(m.size()).saturating_sub(1);
                format!("{}-{last}", m.container_id())
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

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

/// A forked child of crius that unshared new namespaces (`flags`) and waits, so that their
/// `/proc/<pid>/ns/*` can be written to and pinned. It never execs: between the fork and its
/// `_exit` it makes only async-signal-safe syscalls, as a fork of a threaded process must. It
/// exits when its end of the release pipe reads EOF: when the holder is dropped, and also when
/// crius dies, however (the kernel closes crius's end), so no holder ever outlives its use.
struct Holder {
    pid: libc::pid_t,
    /// Our end of the release pipe; closing it lets the child exit.
    release: Option<OwnedFd>,
}

/// A pipe, both ends close-on-exec (no exec happens, but other forks of crius may).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the two-element array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors nobody else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The child's side of [`Holder::spawn`]: unshare, report the errno (0 for success) on
/// `ready`, wait for EOF on `release`, exit. Only async-signal-safe calls.
///
/// # Safety
/// To be called only in the child right after `fork`, with the raw descriptors of the pipes.
unsafe fn holder_child(flags: libc::c_int, parent: libc::pid_t, fds: [libc::c_int; 4]) -> ! {
    // SAFETY: plain syscalls on descriptors the fork gave us and on our own stack buffers.
    unsafe {
        let [ready_r, ready_w, release_r, release_w] = fds;
        libc::close(ready_r);
        libc::close(release_w);
        // a crius dying from here on takes the holder with it, and one already gone is noticed
        let mut errno: libc::c_int = 0;
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 || libc::getppid() != parent {
            libc::_exit(1);
        }
        if libc::unshare(flags) == -1 {
            errno = *libc::__errno_location();
        }
        let bytes = errno.to_ne_bytes();
        libc::write(ready_w, bytes.as_ptr().cast(), bytes.len());
        let mut b = 0u8;
        while libc::read(release_r, (&mut b as *mut u8).cast(), 1) == -1
            && *libc::__errno_location() == libc::EINTR
        {}
        libc::_exit(0)
    }
}

impl Holder {
    fn spawn(flags: libc::c_int) -> Result<Holder, UsernsError> {
        let here = Path::new("/proc/self");
        let (ready_r, ready_w) = pipe().map_err(io_err("pipe for a namespace holder", here))?;
        let (release_r, release_w) = pipe().map_err(io_err("pipe for a namespace holder", here))?;
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        let fds = [
            ready_r.as_raw_fd(),
            ready_w.as_raw_fd(),
            release_r.as_raw_fd(),
            release_w.as_raw_fd(),
        ];
        // SAFETY: the child runs only `holder_child` (async-signal-safe syscalls, then _exit).
        let pid = unsafe { libc::fork() };
        if pid == -1 {
            return Err(io_err("fork a namespace holder", here)(
                io::Error::last_os_error(),
            ));
        }
        if pid == 0 {
            // SAFETY: in the child right after fork, with the pipes' raw descriptors.
            unsafe { holder_child(flags, parent, fds) }
        }
        drop((ready_w, release_r));
        let holder = Holder {
            pid,
            release: Some(release_w),
        };
        let mut bytes = [0u8; 4];
        let mut got = 0;
        while got < bytes.len() {
            // SAFETY: read into the part of our buffer not yet filled.
            let n = unsafe {
                libc::read(
                    ready_r.as_raw_fd(),
                    bytes[got..].as_mut_ptr().cast(),
                    bytes.len() - got,
                )
            };
            match n {
                n if n > 0 => got += n as usize,
                0 => break,
                _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                _ => break,
            }
        }
        let errno = i32::from_ne_bytes(bytes);
        if got < bytes.len() || errno != 0 {
            let cause = if got < bytes.len() {
                io::Error::other("the holder exited before it reported")
            } else {
                io::Error::from_raw_os_error(errno)
            };
            return Err(io_err("unshare namespaces in a holder", here)(cause));
        }
        Ok(holder)
    }

    fn ns(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/{name}", self.pid))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.release.take());
        // Another holder forked meanwhile may hold a copy of the release pipe: do not wait for
        // it to go.
        // SAFETY: kill and waitpid on our own child, not yet reaped.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let mut status = 0;
        // SAFETY: as above.
        while unsafe { libc::waitpid(self.pid, &mut status, 0) } == -1
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
    }
}

/// Creates a pod's user namespace with `maps` and a network namespace owned by it; pins the
/// first at `<userns_dir>/<id>` and the second at `<netns_dir>/<id>` (loopback up), and returns
/// the netns pin. On failure nothing is left pinned.
pub fn create_pod_namespaces(
    maps: &IdMaps,
    userns_dir: &Path,
    netns_dir: &Path,
    id: &str,
) -> Result<PathBuf, UsernsError> {
    let proc = Holder::spawn(libc::CLONE_NEWUSER | libc::CLONE_NEWNET)?;
    maps.write_to(proc.pid as u32)?;
    let userns = crius_cni::netns::pin_any(&proc.ns("user"), userns_dir, id)?;
    crius_cni::netns::pin(&proc.ns("net"), netns_dir, id).map_err(|e| {
        let _ = crius_cni::netns::remove(&userns);
        e.into()
    })
}

/// Opens a new user namespace with `maps`, for idmapped mounts whose mapping is not the pod's.
pub fn open_new(maps: &IdMaps) -> Result<OwnedFd, UsernsError> {
    let proc = Holder::spawn(libc::CLONE_NEWUSER)?;
    maps.write_to(proc.pid as u32)?;
    let path = proc.ns("user");
    let file = std::fs::File::open(&path).map_err(io_err("open", &path))?;
    Ok(OwnedFd::from(file))
}

/// Opens a pinned (or `/proc/<pid>/ns/user`) user namespace.
pub fn open(path: &Path) -> Result<OwnedFd, UsernsError> {
    let file = std::fs::File::open(path).map_err(io_err("open user namespace", path))?;
    Ok(OwnedFd::from(file))
}

/// The host ids that stand for a pod's in the start-up checks: not root, owning nothing, in no
/// group (also what the probe's idmapped bind maps root to).
const PROBE_ID: u32 = 1 << 20;

/// Whether user-namespaced pods can work here. Checked in order, the error says what is
/// missing: Linux 5.19 or later (overlayfs over idmapped layers); every directory on the way to
/// `root`, `state` and the `pause` binary searchable by a pod's ids and the binary executable
/// by them (see [`open_own`] and [`reachable`]); an idmapped bind of a directory under `root`
/// (where the image layers are).
pub fn probe(root: &Path, state: &Path, pause: &Path) -> Result<(), String> {
    if !crate::util::kernel_at_least(5, 19) {
        return Err("Linux 5.19 or later is needed for overlayfs over idmapped layers".into());
    }
    open_own(&[root, state], pause);
    reachable(&[root, state], pause, PROBE_ID, PROBE_ID)?;
    probe_idmapped_bind(root)
}

/// The permission bits of `meta` that apply to a process of `uid`/`gid` with no supplementary
/// groups and no capabilities over the inode: how the host sees a user-namespaced pod's
/// processes, whose capabilities do not extend to inodes owned by ids outside their mapping.
fn bits_for(meta: &std::fs::Metadata, uid: u32, gid: u32) -> u32 {
    use std::os::unix::fs::MetadataExt;
    if meta.uid() == uid {
        (meta.mode() >> 6) & 0o7
    } else if meta.gid() == gid {
        (meta.mode() >> 3) & 0o7
    } else {
        meta.mode() & 0o7
    }
}

/// Why `path` stops a process of `uid`/`gid`, which may not `what` it.
fn blocked(path: &Path, meta: &std::fs::Metadata, uid: u32, gid: u32, what: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    format!(
        "{} (mode {:04o}, owner {}:{}) may not be {what} by uid {uid} gid {gid} (not root \
         on the host, as a user-namespaced pod's ids are): crius changes the modes of its own root and state \
         directories only; make every directory above them searchable by others (chmod o+x) \
         or move root and state",
        path.display(),
        meta.mode() & 0o7777,
        meta.uid(),
        meta.gid(),
    )
}

/// Waits until process `pid` runs `program` (it has exec'd it), has gone, or `limit` has
/// passed; returns whether it runs `program`.
///
/// A user-namespaced pod's pause needs this before the pod is handed out. Until its exec the
/// pause is not dumpable (libcontainer's init changed its credentials), and the kernel then
/// refuses its `/proc/<pid>/ns/*` files to every process of the pod's user namespace that
/// lacks `CAP_SYS_PTRACE` over the node: libcontainer opens the pause's pid, ipc and uts
/// namespaces after it joined the pod's user namespace, so a container created in that window
/// fails with EACCES. Starting the pause only lets it go on to its exec; on a busy node or a
/// throttled pod cgroup the exec can come many milliseconds later.
pub fn wait_until_running(pid: i32, program: &Path, limit: std::time::Duration) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(want) = std::fs::metadata(program).map(|m| (m.dev(), m.ino())) else {
        return false;
    };
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let start = std::time::Instant::now();
    let mut nap = std::time::Duration::from_micros(20);
    loop {
        match std::fs::metadata(&exe) {
            Ok(m) if (m.dev(), m.ino()) == want => return true,
            Ok(_) => {}
            // gone, or a zombie: nothing will join it
            Err(_) => return false,
        }
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(std::time::Duration::from_millis(1));
    }
}

/// Whether a process of `uid`/`gid` (see `bits_for`) reaches `dirs` and may search them, and
/// reaches `exe` and may run it: what a user-namespaced pod's root does when its pause starts
/// (the pod's files and bundles are under `state`, its containers' layers under `root`). The
/// error names the first directory from `/` down that stops it. Symbolic links on the way are
/// followed, their targets' directories checked too.
pub fn reachable(dirs: &[&Path], exe: &Path, uid: u32, gid: u32) -> Result<(), String> {
    let stat = |p: &Path| {
        std::fs::metadata(p).map_err(|e| format!("user namespaces: stat {}: {e}", p.display()))
    };
    let mut walks: Vec<PathBuf> = Vec::new();
    for dir in dirs.iter().copied().chain(exe.parent()) {
        walks.push(dir.to_path_buf());
        if let Ok(real) = std::fs::canonicalize(dir) {
            walks.push(real);
        }
    }
    for dir in &walks {
        let from_top: Vec<&Path> = dir.ancestors().collect();
        for d in from_top.into_iter().rev() {
            let meta = stat(d)?;
            if bits_for(&meta, uid, gid) & 0o1 == 0 {
                return Err(blocked(d, &meta, uid, gid, "searched"));
            }
        }
    }
    let meta = stat(exe)?;
    if bits_for(&meta, uid, gid) & 0o1 == 0 {
        return Err(blocked(exe, &meta, uid, gid, "executed"));
    }
    Ok(())
}

/// Adds search permission for group and others (execute, for `exe`) where it is missing on
/// the directories a user-namespaced pod's ids must pass, as far as they belong to crius's
/// user: crius's root and state `dirs`, the directories from them down to `exe` (the pause
/// binary), and their parents up to the first one that belongs to another user (a `mktemp -d`
/// directory holding root and state is 0700 and crius's own). Only search is added, never
/// read: nobody can list these directories who could not before. containerd keeps its root
/// and state 0711 the same way. A directory of another user that blocks is reported by
/// [`reachable`].
pub fn open_own(dirs: &[&Path], exe: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut own: Vec<&Path> = dirs.to_vec();
    if let Some(top) = dirs.iter().find(|d| exe.starts_with(d)) {
        own.extend(exe.ancestors().take_while(|a| a != top));
    }
    let owned_by_me = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.uid() == me);
    for dir in dirs {
        own.extend(dir.ancestors().skip(1).take_while(|a| owned_by_me(a)));
    }
    own.sort();
    own.dedup();
    for path in own {
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        let mode = meta.mode() & 0o7777;
        if meta.uid() != me || mode & 0o011 == 0o011 {
            continue;
        }
        let new = mode | 0o011;
        match std::fs::set_permissions(path, std::fs::Permissions::from_mode(new)) {
            Ok(()) => tracing::info!(
                "{}: mode {mode:04o} -> {new:04o}, so that user-namespaced pods reach it",
                path.display()
            ),
            Err(e) => tracing::warn!("{}: chmod {new:04o}: {e}", path.display()),
        }
    }
}

/// An idmapped bind of a fresh directory under `<root>/tmp` onto another.
fn probe_idmapped_bind(root: &Path) -> Result<(), String> {
    // what a crius killed during its own probe left
    if let Ok(entries) = std::fs::read_dir(root.join("tmp")) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("userns-probe-") {
                let old = e.path();
                if crate::mounts::unmount(&old.join("dst")).is_ok() {
                    let _ = std::fs::remove_dir(old.join("src"));
                    let _ = std::fs::remove_dir(old.join("dst"));
                    let _ = std::fs::remove_dir(&old);
                }
            }
        }
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
        let ns = open_new(&maps)?;
        idmapped_bind(&src, &dst, std::os::fd::AsFd::as_fd(&ns), false)
    })();
    let _ = crate::mounts::unmount(&dst);
    let _ = std::fs::remove_dir(&src);
    let _ = std::fs::remove_dir(&dst);
    let _ = std::fs::remove_dir(&dir);
    attempt.map_err(|e| crius_common::error_chain(&e))
}

fn probe_mapping() -> Result<LinuxIdMapping, String> {
    oci_spec::runtime::LinuxIdMappingBuilder::default()
        .container_id(0u32)
        .host_id(PROBE_ID)
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
        return Err(io_err(IDMAP_OP, source)(io::Error::last_os_error()));
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

    #[test]
    fn mapped_ids_and_their_ranges() {
        let m = |container: u32, size: u32| {
            LinuxIdMappingBuilder::default()
                .container_id(container)
                .host_id(100_000 + container)
                .size(size)
                .build()
                .unwrap()
        };
        let maps = IdMaps {
            uids: vec![m(0, 1000), m(2000, 100)],
            gids: vec![m(0, 1)],
        };
        assert!(maps.maps_uid(0) && maps.maps_uid(999) && maps.maps_uid(2099));
        assert!(!maps.maps_uid(1000) && !maps.maps_uid(2100));
        assert!(maps.maps_gid(0) && !maps.maps_gid(1));
        assert_eq!(IdMaps::ranges(&maps.uids), "0-999, 2000-2099");
        let wide = IdMaps {
            uids: vec![m(0, u32::MAX)],
            gids: vec![],
        };
        assert!(wide.maps_uid(u32::MAX - 1) && !wide.maps_uid(u32::MAX));
    }

    #[test]
    fn waits_for_the_exec_of_the_program_and_not_longer() {
        use std::process::Command;
        use std::time::{Duration, Instant};
        let sleep = Path::new("/bin/sleep");
        // sh first, sleep after its exec
        let mut late = Command::new("sh")
            .args(["-c", "sleep 0.3; exec sleep 5"])
            .spawn()
            .unwrap();
        let begun = Instant::now();
        assert!(wait_until_running(
            late.id() as i32,
            sleep,
            Duration::from_secs(10)
        ));
        assert!(
            begun.elapsed() >= Duration::from_millis(250),
            "{:?}",
            begun.elapsed()
        );
        late.kill().unwrap();
        late.wait().unwrap();
        // gone before it ran the program: no wait for the limit
        let mut gone = Command::new("sh").args(["-c", "exit 0"]).spawn().unwrap();
        gone.wait().unwrap();
        let begun = Instant::now();
        assert!(!wait_until_running(
            gone.id() as i32,
            sleep,
            Duration::from_secs(10)
        ));
        assert!(begun.elapsed() < Duration::from_secs(1));
        // never runs it: false at the limit
        let mut never = Command::new("sh")
            .args(["-c", "read x"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let begun = Instant::now();
        assert!(!wait_until_running(
            never.id() as i32,
            sleep,
            Duration::from_millis(200)
        ));
        assert!(begun.elapsed() >= Duration::from_millis(200));
        never.kill().unwrap();
        never.wait().unwrap();
    }

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

    #[test]
    fn reachable_names_the_first_blocking_directory_and_open_own_opens_only_its_users() {
        if !crius_common::test_needs_root(
            "reachable_names_the_first_blocking_directory_and_open_own_opens_only_its_users",
        ) {
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let set = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let parent = dir.path().join("parent");
        let (root, state) = (parent.join("root"), parent.join("state"));
        let pause = state.join("bin").join("pause");
        std::fs::create_dir_all(root.join("x")).unwrap();
        std::fs::create_dir_all(pause.parent().unwrap()).unwrap();
        std::fs::write(&pause, "").unwrap();
        set(dir.path(), 0o755);
        set(&parent, 0o700);
        for p in [
            &root,
            &state,
            &pause.parent().unwrap().to_path_buf(),
            &pause,
        ] {
            set(p, 0o700);
        }
        let id = PROBE_ID;

        open_own(&[&root, &state], &pause);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        for p in [
            &root,
            &state,
            &pause.parent().unwrap().to_path_buf(),
            &pause,
        ] {
            assert_eq!(mode(p), 0o711, "{}", p.display());
        }
        // a parent of crius's user is opened for search, up to the first of another user
        assert_eq!(mode(&parent), 0o711, "a parent of crius's user");
        let outer = dir.path();
        std::os::unix::fs::chown(outer, Some(4242), None).unwrap();
        set(outer, 0o755);
        set(&parent, 0o700);
        std::os::unix::fs::chown(&parent, Some(4242), None).unwrap();
        open_own(&[&root, &state], &pause);
        assert_eq!(
            mode(&parent),
            0o700,
            "a parent of another user is left alone"
        );

        let err = reachable(&[&root, &state], &pause, id, id).unwrap_err();
        assert!(
            err.starts_with(&format!("{} (mode 0700", parent.display())),
            "{err}"
        );
        // its owner passes the owner's bits, others those of others
        assert!(reachable(&[&root, &state], &pause, 4242, 4242).is_ok());
        set(&parent, 0o701);
        assert!(reachable(&[&root, &state], &pause, id, id).is_ok());
        set(&pause, 0o700);
        let err = reachable(&[&root, &state], &pause, id, id).unwrap_err();
        assert!(err.contains("may not be executed"), "{err}");
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
        let ns = open_new(&maps(200000)).unwrap();
        idmapped_bind(&src, &dst, ns.as_fd(), false).unwrap();
        let uid = std::fs::metadata(dst.join("f")).map(|m| m.uid());
        crate::mounts::unmount(&dst).unwrap();
        assert_eq!(uid.unwrap(), 200000);
        assert_eq!(std::fs::metadata(src.join("f")).unwrap().uid(), 0);
    }
}
