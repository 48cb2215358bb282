//! Unpacking one layer tar into its own directory, in the form overlayfs reads as a lower
//! layer: `.wh.<name>` becomes a 0/0 character device, `.wh..wh..opq` the xattr
//! `trusted.overlay.opaque=y` on its directory. Every layer is self-contained (no parent needed),
//! so layers unpack in parallel.
//!
//! Safety: entries with `..` or an absolute path are refused, and every parent directory of an
//! entry (and of a hard link's target) must be a real directory, never a symlink, so nothing is
//! written outside the layer. The work happens in a private temp directory that is renamed
//! into place only when the whole tar was read and its digest matched the diff ID.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest as _, Sha256};

use crate::content::{unique_suffix, TempPath};
use crate::digest::Digest;
use crate::error::{Error, Result};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const WHITEOUT_META_PREFIX: &str = ".wh..wh.";
const READ_BUFFER: usize = 1 << 20;
const COPY_BUFFER: usize = 256 << 10;

/// What unpacking one layer did.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnpackStats {
    /// Bytes of uncompressed tar read.
    pub tar_bytes: u64,
    pub entries: u64,
}

/// Unpacks the layer blob at `blob` into `dest/fs`, atomically: `dest` appears complete or not
/// at all. The uncompressed stream must hash to `diff_id`. If `dest` already exists (another
/// pull won the race) the work is discarded and that is not an error. With `sync`, the
/// filesystem is flushed (syncfs) before the rename, so a snapshot that exists after a power
/// loss is complete.
pub fn unpack_layer(
    blob: &Path,
    digest: &Digest,
    diff_id: &Digest,
    dest: &Path,
    sync: bool,
) -> Result<UnpackStats> {
    let parent = dest.parent().ok_or_else(|| {
        Error::Internal(format!("snapshot path {} has no parent", dest.display()))
    })?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = TempPath::new(parent.join(format!("tmp-{name}-{}", unique_suffix())));
    let root = tmp.path().join("fs");
    std::fs::create_dir_all(&root).map_err(Error::io("create", &root))?;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))
        .map_err(Error::io("chmod", &root))?;

    let file = File::open(blob).map_err(Error::io("open blob", blob))?;
    let mut input = BufReader::with_capacity(READ_BUFFER, file);
    let magic = input.fill_buf().map_err(Error::io("read blob", blob))?;
    let decoder: Box<dyn Read> = if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::bufread::MultiGzDecoder::new(input))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(
            zstd::stream::read::Decoder::with_buffer(input)
                .map_err(Error::io("zstd init for", blob))?,
        )
    } else {
        Box::new(input)
    };
    let reader = HashingReader {
        inner: decoder,
        hasher: Sha256::new(),
        count: 0,
    };
    let mut archive = tar::Archive::new(reader);

    let mut ex = Extractor {
        root: root.clone(),
        digest: digest.clone(),
        known_dirs: HashSet::new(),
        dirs: Vec::new(),
        buf: vec![0; COPY_BUFFER],
        // SAFETY: getuid/getgid have no preconditions.
        ids: unsafe { (libc::geteuid(), libc::getegid()) },
        setgid_dirs: HashSet::new(),
    };
    let mut entries_count = 0;
    let bad = |reason: String| Error::BadLayer {
        digest: digest.clone(),
        reason,
    };
    {
        let entries = archive
            .entries()
            .map_err(|e| bad(format!("read tar: {e}")))?;
        for entry in entries {
            let entry = entry.map_err(|e| bad(format!("read tar: {e}")))?;
            ex.entry(entry)?;
            entries_count += 1;
        }
    }
    // The diff ID covers the whole stream, including the tar's zero padding after the last entry.
    let mut reader = archive.into_inner();
    io::copy(&mut reader, &mut io::sink()).map_err(|e| bad(format!("read tar: {e}")))?;
    let actual = Digest::from_hasher(reader.hasher);
    if &actual != diff_id {
        return Err(bad(format!(
            "uncompressed content has digest {actual}, config says {diff_id}"
        )));
    }
    ex.finish_dirs()?;

    if sync {
        let dir = File::open(tmp.path()).map_err(Error::io("open", tmp.path()))?;
        // SAFETY: syncfs on a file descriptor we own; it only flushes the filesystem.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
            return Err(Error::io("sync", tmp.path())(io::Error::last_os_error()));
        }
    }
    match std::fs::rename(tmp.path(), dest) {
        Ok(()) => tmp.keep(),
        Err(_) if dest.join("fs").is_dir() => {} // someone else finished it first
        Err(e) => return Err(Error::io("commit snapshot", dest)(e)),
    }
    Ok(UnpackStats {
        tar_bytes: reader.count,
        entries: entries_count,
    })
}

struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

struct DirMeta {
    rel: PathBuf,
    mtime: SystemTime,
}

/// An entry's place in the layer and what its header says of it, checked.
struct Meta {
    /// The path in the layer.
    rel: PathBuf,
    /// The path on disk (`root/rel`).
    full: PathBuf,
    uid: u32,
    gid: u32,
    /// Permission bits with set-user-ID, set-group-ID and sticky.
    mode: u32,
    mtime: SystemTime,
}

struct Extractor {
    root: PathBuf,
    digest: Digest,
    /// Directories (relative) known to be real directories we may write into.
    known_dirs: HashSet<PathBuf>,
    dirs: Vec<DirMeta>,
    buf: Vec<u8>,
    /// Our own uid and gid: files we create already have them (unless the directory is
    /// set-group-ID, which hands down its group).
    ids: (u32, u32),
    setgid_dirs: HashSet<PathBuf>,
}

/// The relative path of an entry, or an error for `..` and absolute paths. None for the root.
pub(crate) fn clean_entry_path(p: &Path) -> std::result::Result<Option<PathBuf>, &'static str> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::CurDir => {}
            Component::ParentDir => return Err("path contains '..'"),
            Component::RootDir | Component::Prefix(_) => return Err("absolute path"),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn mtime_of(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

impl Extractor {
    fn refuse(&self, entry: &Path, reason: impl Into<String>) -> Error {
        Error::UnsafeEntry {
            digest: self.digest.clone(),
            entry: entry.display().to_string(),
            reason: reason.into(),
        }
    }

    fn fail(&self, entry: &Path, what: &str, e: io::Error) -> Error {
        Error::Unpack {
            digest: self.digest.clone(),
            reason: format!("{what} {}: {e}", entry.display()),
        }
    }

    /// Writes one tar entry into the layer: a whiteout or an opaque marker in overlay's form,
    /// anything else by its kind. The layer root itself and metadata-only entries make nothing.
    fn entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<()> {
        let Some(meta) = self.place(&entry)? else {
            return Ok(()); // the layer root itself
        };
        let name = meta
            .rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name == OPAQUE_MARKER {
            return self.opaque(&meta);
        }
        if name.starts_with(WHITEOUT_META_PREFIX) {
            return Ok(()); // aufs bookkeeping (.wh..wh.plnk and the like): nothing for overlay
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            return self.whiteout(&meta, hidden);
        }
        let xattrs = pax_xattrs(&mut entry);
        let kind = entry.header().entry_type();
        match kind {
            tar::EntryType::Directory => self.directory(&meta)?,
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                return self.regular_file(&meta, &mut entry, &xattrs);
            }
            tar::EntryType::Symlink => self.symlink(&meta, &entry)?,
            // The metadata belongs to the inode, already set.
            tar::EntryType::Link => return self.hard_link(&meta, &entry),
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                self.device(&meta, entry.header())?
            }
            // PAX global headers and other metadata-only entries carry no file.
            _ => return Ok(()),
        }
        for (k, v) in &xattrs {
            set_xattr(&meta.full, k, v).map_err(|e| self.fail(&meta.rel, "set xattr", e))?;
        }
        // A directory's times are set last ([`Extractor::finish_dirs`]).
        if kind != tar::EntryType::Directory {
            set_times_nofollow(&meta.full, meta.mtime)
                .map_err(|e| self.fail(&meta.rel, "set times", e))?;
        }
        Ok(())
    }

    /// The entry's checked path and header fields, its parent directories made; None for the
    /// layer root.
    fn place<R: Read>(&mut self, entry: &tar::Entry<'_, R>) -> Result<Option<Meta>> {
        let raw = entry
            .path()
            .map_err(|e| Error::BadLayer {
                digest: self.digest.clone(),
                reason: format!("entry name: {e}"),
            })?
            .into_owned();
        let rel = match clean_entry_path(&raw) {
            Ok(Some(rel)) => rel,
            Ok(None) => return Ok(None),
            Err(reason) => return Err(self.refuse(&raw, reason)),
        };
        let header = entry.header();
        // A numeric field that does not parse is a corrupt header: taking it as 0 would make
        // the file root's, or its mode nothing.
        let malformed = |field: &str, e: &dyn std::fmt::Display| {
            self.refuse(&raw, format!("malformed {field} in its tar header: {e}"))
        };
        let id = |value: io::Result<u64>, field: &str| -> Result<u32> {
            let value = value.map_err(|e| malformed(field, &e))?;
            u32::try_from(value).map_err(|_| malformed(field, &format!("{value} is too large")))
        };
        let uid = id(header.uid(), "uid")?;
        let gid = id(header.gid(), "gid")?;
        let mode = header.mode().map_err(|e| malformed("mode", &e))? & 0o7777;
        let mtime = mtime_of(header.mtime().map_err(|e| malformed("mtime", &e))?);
        self.ensure_parents(&rel)?;
        Ok(Some(Meta {
            full: self.root.join(&rel),
            rel,
            uid,
            gid,
            mode,
            mtime,
        }))
    }

    /// `.wh..wh..opq`: its directory hides what lower layers have in it.
    fn opaque(&self, meta: &Meta) -> Result<()> {
        let dir = meta
            .rel
            .parent()
            .map(|p| self.root.join(p))
            .unwrap_or_else(|| self.root.clone());
        set_xattr(&dir, "trusted.overlay.opaque", b"y")
            .map_err(|e| self.fail(&meta.rel, "mark opaque", e))
    }

    /// `.wh.<name>`: `<name>` is deleted, which overlay reads from a 0/0 character device.
    fn whiteout(&mut self, meta: &Meta, hidden: &str) -> Result<()> {
        let rel = &meta.rel;
        let target = meta.full.with_file_name(hidden);
        self.remove_existing(&target, false)
            .map_err(|e| self.fail(rel, "replace", e))?;
        mknod(&target, libc::S_IFCHR, 0).map_err(|e| self.fail(rel, "whiteout", e))?;
        std::os::unix::fs::lchown(&target, Some(meta.uid), Some(meta.gid))
            .map_err(|e| self.fail(rel, "chown", e))
    }

    /// A directory; one already there stays (with the entry's owner and mode).
    fn directory(&mut self, meta: &Meta) -> Result<()> {
        let (rel, full) = (&meta.rel, &meta.full);
        self.remove_existing(full, true)
            .map_err(|e| self.fail(rel, "replace", e))?;
        match std::fs::create_dir(full) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(self.fail(rel, "mkdir", e)),
        }
        std::os::unix::fs::lchown(full, Some(meta.uid), Some(meta.gid))
            .map_err(|e| self.fail(rel, "chown", e))?;
        std::fs::set_permissions(full, std::fs::Permissions::from_mode(meta.mode))
            .map_err(|e| self.fail(rel, "chmod", e))?;
        self.known_dirs.insert(rel.clone());
        if meta.mode & 0o2000 != 0 {
            self.setgid_dirs.insert(rel.clone());
        }
        self.dirs.push(DirMeta {
            rel: rel.clone(),
            mtime: meta.mtime,
        });
        Ok(())
    }

    /// A regular file, its content copied from the entry; owner, mode, xattrs and times set
    /// through its descriptor.
    fn regular_file<R: Read>(
        &mut self,
        meta: &Meta,
        entry: &mut tar::Entry<'_, R>,
        xattrs: &[(String, Vec<u8>)],
    ) -> Result<()> {
        let (rel, full) = (&meta.rel, &meta.full);
        let create = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(full)
        };
        // Most paths are new: try first, clear the way only when something is there.
        let mut f = match create() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                self.remove_existing(full, false)
                    .map_err(|e| self.fail(rel, "replace", e))?;
                create()
            }
            other => other,
        }
        .map_err(|e| self.fail(rel, "create", e))?;
        loop {
            let n = entry
                .read(&mut self.buf)
                .map_err(|e| self.fail(rel, "read", e))?;
            if n == 0 {
                break;
            }
            f.write_all(&self.buf[..n])
                .map_err(|e| self.fail(rel, "write", e))?;
        }
        let in_setgid_dir = rel.parent().is_some_and(|p| self.setgid_dirs.contains(p));
        if (meta.uid, meta.gid) != self.ids || in_setgid_dir {
            std::os::unix::fs::fchown(&f, Some(meta.uid), Some(meta.gid))
                .map_err(|e| self.fail(rel, "chown", e))?;
        }
        f.set_permissions(std::fs::Permissions::from_mode(meta.mode))
            .map_err(|e| self.fail(rel, "chmod", e))?;
        for (k, v) in xattrs {
            set_xattr(full, k, v).map_err(|e| self.fail(rel, "set xattr", e))?;
        }
        f.set_times(
            std::fs::FileTimes::new()
                .set_modified(meta.mtime)
                .set_accessed(meta.mtime),
        )
        .map_err(|e| self.fail(rel, "set times", e))
    }

    /// A symbolic link; its target is not looked at (nothing is written through it).
    fn symlink<R: Read>(&mut self, meta: &Meta, entry: &tar::Entry<'_, R>) -> Result<()> {
        let rel = &meta.rel;
        let target = entry
            .link_name()
            .ok()
            .flatten()
            .ok_or_else(|| self.refuse(rel, "symlink without target"))?
            .into_owned();
        self.remove_existing(&meta.full, false)
            .map_err(|e| self.fail(rel, "replace", e))?;
        std::os::unix::fs::symlink(&target, &meta.full)
            .map_err(|e| self.fail(rel, "symlink", e))?;
        std::os::unix::fs::lchown(&meta.full, Some(meta.uid), Some(meta.gid))
            .map_err(|e| self.fail(rel, "chown", e))
    }

    /// A hard link to a file of this layer, reached through real directories only.
    fn hard_link<R: Read>(&mut self, meta: &Meta, entry: &tar::Entry<'_, R>) -> Result<()> {
        let (rel, full) = (&meta.rel, &meta.full);
        let raw_target = entry
            .link_name()
            .ok()
            .flatten()
            .ok_or_else(|| self.refuse(rel, "hard link without target"))?
            .into_owned();
        let target = match clean_entry_path(&raw_target) {
            Ok(Some(t)) => t,
            Ok(None) => return Err(self.refuse(rel, "hard link to the layer root")),
            Err(reason) => {
                return Err(self.refuse(
                    rel,
                    format!("hard link target {}: {reason}", raw_target.display()),
                ))
            }
        };
        self.check_parents(&target).map_err(|reason| {
            self.refuse(
                rel,
                format!("hard link target {}: {reason}", target.display()),
            )
        })?;
        let target_full = self.root.join(&target);
        match std::fs::symlink_metadata(&target_full) {
            Ok(m) if !m.is_dir() => {}
            Ok(_) => return Err(self.refuse(rel, "hard link to a directory")),
            Err(e) => {
                return Err(self.fail(rel, &format!("hard link target {}", target.display()), e))
            }
        }
        if &target_full == full {
            return Ok(());
        }
        self.remove_existing(full, false)
            .map_err(|e| self.fail(rel, "replace", e))?;
        std::fs::hard_link(&target_full, full).map_err(|e| self.fail(rel, "hard link", e))
    }

    /// A character or block device (its numbers from the header) or a FIFO.
    fn device(&mut self, meta: &Meta, header: &tar::Header) -> Result<()> {
        let (rel, full) = (&meta.rel, &meta.full);
        let kind = header.entry_type();
        self.remove_existing(full, false)
            .map_err(|e| self.fail(rel, "replace", e))?;
        let (fmt, dev) = match kind {
            tar::EntryType::Fifo => (libc::S_IFIFO, 0),
            _ => {
                let major = header
                    .device_major()
                    .map_err(|e| self.fail(rel, "device major of", e))?
                    .unwrap_or(0);
                let minor = header
                    .device_minor()
                    .map_err(|e| self.fail(rel, "device minor of", e))?
                    .unwrap_or(0);
                let fmt = if kind == tar::EntryType::Char {
                    libc::S_IFCHR
                } else {
                    libc::S_IFBLK
                };
                (fmt, libc::makedev(major, minor))
            }
        };
        mknod(full, fmt | meta.mode, dev).map_err(|e| self.fail(rel, "mknod", e))?;
        std::os::unix::fs::lchown(full, Some(meta.uid), Some(meta.gid))
            .map_err(|e| self.fail(rel, "chown", e))?;
        std::fs::set_permissions(full, std::fs::Permissions::from_mode(meta.mode))
            .map_err(|e| self.fail(rel, "chmod", e))
    }

    /// Makes sure every parent of `rel` is a real directory, creating missing ones.
    fn ensure_parents(&mut self, rel: &Path) -> Result<()> {
        let Some(parent) = rel.parent() else {
            return Ok(());
        };
        if parent.as_os_str().is_empty() || self.known_dirs.contains(parent) {
            return Ok(());
        }
        let mut cur = PathBuf::new();
        for c in parent.components() {
            cur.push(c);
            if self.known_dirs.contains(&cur) {
                continue;
            }
            let full = self.root.join(&cur);
            match std::fs::symlink_metadata(&full) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.refuse(rel, format!("parent {} is a symlink", cur.display())));
                }
                Ok(_) => {
                    return Err(
                        self.refuse(rel, format!("parent {} is not a directory", cur.display()))
                    )
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    std::fs::create_dir(&full).map_err(|e| self.fail(rel, "mkdir parent", e))?;
                    std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o755))
                        .map_err(|e| self.fail(rel, "chmod", e))?;
                }
                Err(e) => return Err(self.fail(rel, "inspect parent", e)),
            }
            self.known_dirs.insert(cur.clone());
        }
        Ok(())
    }

    /// Like `ensure_parents` but creates nothing: for hard link targets.
    fn check_parents(&self, rel: &Path) -> std::result::Result<(), String> {
        let Some(parent) = rel.parent() else {
            return Ok(());
        };
        let mut cur = PathBuf::new();
        for c in parent.components() {
            cur.push(c);
            if self.known_dirs.contains(&cur) {
                continue;
            }
            match std::fs::symlink_metadata(self.root.join(&cur)) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(format!("parent {} is not a directory", cur.display())),
                Err(e) => return Err(format!("parent {}: {e}", cur.display())),
            }
        }
        Ok(())
    }

    /// Clears the way for a new entry at `full`. A directory stays when a directory replaces it.
    fn remove_existing(&mut self, full: &Path, keep_dir: bool) -> io::Result<()> {
        match std::fs::symlink_metadata(full) {
            Ok(m) if m.is_dir() => {
                if keep_dir {
                    return Ok(());
                }
                std::fs::remove_dir_all(full)?;
                // Cached directories below it are gone too.
                self.known_dirs.clear();
                Ok(())
            }
            Ok(_) => std::fs::remove_file(full),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Directory mtimes last: creating their children changed them.
    fn finish_dirs(&mut self) -> Result<()> {
        for d in &self.dirs {
            let full = self.root.join(&d.rel);
            if let Err(e) = set_times_nofollow(&full, d.mtime) {
                if e.kind() != io::ErrorKind::NotFound {
                    return Err(self.fail(&d.rel, "set times", e));
                }
            }
        }
        Ok(())
    }
}

/// `SCHILY.xattr.*` records of the entry's PAX header.
fn pax_xattrs<R: Read>(entry: &mut tar::Entry<'_, R>) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    if let Ok(Some(exts)) = entry.pax_extensions() {
        for ext in exts.flatten() {
            if let Ok(key) = ext.key() {
                if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
                    out.push((name.to_string(), ext.value_bytes().to_vec()));
                }
            }
        }
    }
    out
}

fn mknod(path: &Path, mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    let c = cstr(path)?;
    // SAFETY: c is a valid NUL-terminated path; mknod does not retain it.
    if unsafe { libc::mknod(c.as_ptr(), mode, dev) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn set_xattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let p = cstr(path)?;
    let n = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "xattr name contains NUL"))?;
    // SAFETY: valid NUL-terminated strings and a slice with its true length; nothing is retained.
    let rc = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_times_nofollow(path: &Path, mtime: SystemTime) -> io::Result<()> {
    let c = cstr(path)?;
    let secs = mtime
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let ts = libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: 0,
    };
    let times = [ts, ts];
    // SAFETY: valid path and a two-element timespec array as utimensat requires.
    if unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    fn header(path: &str, kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_path(path).unwrap();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_uid(1000);
        h.set_gid(1001);
        h.set_mtime(1_600_000_000);
        h.set_cksum();
        h
    }

    /// Builds a tar from (path, kind, data-or-link) triples, bypassing the tar crate's own
    /// path checks so hostile names can be tested.
    fn tar_of(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, data) in entries {
            match kind {
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    let mut h = header("x", *kind, 0, 0o777);
                    h.set_link_name(data).unwrap();
                    raw_name(&mut h, path);
                    b.append(&h, io::empty()).unwrap();
                }
                _ => {
                    let mode = if *kind == tar::EntryType::Directory {
                        0o750
                    } else {
                        0o640
                    };
                    let mut h = header("x", *kind, data.len() as u64, mode);
                    raw_name(&mut h, path);
                    b.append(&h, data.as_bytes()).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    fn raw_name(h: &mut tar::Header, path: &str) {
        let name = &mut h.as_old_mut().name;
        name.fill(0);
        name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
    }

    fn unpack(data: &[u8], gzip: bool) -> (tempfile::TempDir, Result<UnpackStats>) {
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        let bytes = if gzip {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        } else {
            data.to_vec()
        };
        std::fs::write(&blob, &bytes).unwrap();
        let diff = Digest::of(data);
        let r = unpack_layer(
            &blob,
            &Digest::of(&bytes),
            &diff,
            &dir.path().join("snap"),
            true,
        );
        (dir, r)
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn path_cleaning() {
        assert_eq!(
            clean_entry_path(Path::new("./a/b")).unwrap(),
            Some(PathBuf::from("a/b"))
        );
        assert_eq!(clean_entry_path(Path::new("./")).unwrap(), None);
        assert!(clean_entry_path(Path::new("../x")).is_err());
        assert!(clean_entry_path(Path::new("a/../../x")).is_err());
        assert!(clean_entry_path(Path::new("/etc/passwd")).is_err());
    }

    fn pax_record(key: &str, value: &str) -> String {
        // "<len> <key>=<value>\n" where len counts the whole record, its own digits included.
        let body = format!(" {key}={value}\n");
        let mut len = body.len() + 1;
        while format!("{len}").len() + body.len() != len {
            len += 1;
        }
        format!("{len}{body}")
    }

    #[test]
    fn xattrs_from_pax_headers() {
        if !is_root() {
            return;
        }
        let mut b = tar::Builder::new(Vec::new());
        let records = pax_record("SCHILY.xattr.user.crius", "yes");
        let mut pax = header("x", tar::EntryType::XHeader, records.len() as u64, 0o644);
        raw_name(&mut pax, "PaxHeaders/f");
        b.append(&pax, records.as_bytes()).unwrap();
        let h = header("f", tar::EntryType::Regular, 1, 0o644);
        b.append(&h, &b"x"[..]).unwrap();
        let data = b.into_inner().unwrap();
        let (dir, r) = unpack(&data, false);
        r.unwrap();
        let p = CString::new(dir.path().join("snap/fs/f").as_os_str().as_bytes()).unwrap();
        let n = CString::new("user.crius").unwrap();
        let mut buf = [0u8; 8];
        // SAFETY: valid strings and buffer.
        let len =
            unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(len, 3, "xattr user.crius set");
        assert_eq!(&buf[..3], b"yes");
    }

    #[test]
    fn unpacks_files_links_whiteouts() {
        if !is_root() {
            return; // ownership, device nodes and trusted.* xattrs need root
        }
        use tar::EntryType as T;
        let data = tar_of(&[
            ("etc/", T::Directory, ""),
            ("etc/hello", T::Regular, "hi there"),
            ("etc/link", T::Symlink, "hello"),
            ("etc/hard", T::Link, "etc/hello"),
            ("deep/er/file", T::Regular, "x"),
            ("gone/.wh..wh..opq", T::Regular, ""),
            ("etc/.wh.removed", T::Regular, ""),
            ("fifo", T::Fifo, ""),
        ]);
        let (dir, r) = unpack(&data, true);
        let stats = r.unwrap();
        assert_eq!(stats.entries, 8);
        let fs = dir.path().join("snap/fs");
        assert_eq!(
            std::fs::read_to_string(fs.join("etc/hello")).unwrap(),
            "hi there"
        );
        let m = std::fs::metadata(fs.join("etc/hello")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1000, 1001, 0o640));
        assert_eq!(m.nlink(), 2);
        assert_eq!(m.mtime(), 1_600_000_000);
        let d = std::fs::metadata(fs.join("etc")).unwrap();
        assert_eq!((d.mode() & 0o7777, d.mtime()), (0o750, 1_600_000_000));
        assert_eq!(
            std::fs::read_link(fs.join("etc/link")).unwrap(),
            PathBuf::from("hello")
        );
        assert_eq!(
            std::fs::read_to_string(fs.join("deep/er/file")).unwrap(),
            "x"
        );
        let wh = std::fs::symlink_metadata(fs.join("etc/removed")).unwrap();
        assert!(wh.file_type().is_char_device());
        assert_eq!(wh.rdev(), 0);
        assert!(!fs.join("etc/.wh.removed").exists());
        let mut buf = [0u8; 4];
        let p = CString::new(fs.join("gone").as_os_str().as_bytes()).unwrap();
        let n = CString::new("trusted.overlay.opaque").unwrap();
        // SAFETY: valid strings and buffer.
        let len =
            unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(len, 1);
        assert_eq!(buf[0], b'y');
        assert!(std::fs::symlink_metadata(fs.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo());
        // Nothing but the snapshot is left next to it.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn refuses_escapes() {
        if !crius_common::test_needs_root("refuses_escapes") {
            return;
        }
        use tar::EntryType as T;
        let cases: Vec<Vec<(&str, T, &str)>> = vec![
            vec![("../evil", T::Regular, "x")],
            vec![("a/../../evil", T::Regular, "x")],
            vec![("/abs", T::Regular, "x")],
            vec![("link", T::Symlink, "/tmp"), ("link/evil", T::Regular, "x")],
            vec![("hl", T::Link, "../../etc/passwd")],
            vec![("sl", T::Symlink, "/etc"), ("hl", T::Link, "sl/passwd")],
        ];
        for entries in cases {
            let (dir, r) = unpack(&tar_of(&entries), false);
            let err = r.unwrap_err();
            assert!(
                matches!(err, Error::UnsafeEntry { .. }),
                "{entries:?}: {err}"
            );
            assert!(!dir.path().join("snap").exists());
            assert_eq!(
                std::fs::read_dir(dir.path()).unwrap().count(),
                1,
                "temp dir left behind"
            );
        }
    }

    #[test]
    fn malformed_numeric_header_fields_are_refused() {
        // uid, gid, mode, mtime: a field of garbage where octal digits belong
        for field in [108..116, 116..124, 100..108, 136..148] {
            let mut data = tar_of(&[("f", tar::EntryType::Regular, "x")]);
            data[field.clone()].copy_from_slice(&b"zzzzzzzzzzzz"[..field.len()]);
            let header = tar::Header::from_byte_slice(&data[..512]);
            let mut fixed = header.clone();
            fixed.set_cksum();
            data[..512].copy_from_slice(fixed.as_bytes());
            let (dir, r) = unpack(&data, false);
            let err = r.unwrap_err();
            assert!(
                matches!(err, Error::UnsafeEntry { .. }) && err.to_string().contains("malformed"),
                "{field:?}: {err}"
            );
            assert!(!dir.path().join("snap").exists());
        }
    }

    #[test]
    fn diff_id_mismatch_is_refused() {
        if !crius_common::test_needs_root("diff_id_mismatch_is_refused") {
            return;
        }
        let data = tar_of(&[("f", tar::EntryType::Regular, "x")]);
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        std::fs::write(&blob, &data).unwrap();
        let err = unpack_layer(
            &blob,
            &Digest::of(&data),
            &Digest::of(b"other"),
            &dir.path().join("snap"),
            true,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("uncompressed content has digest"),
            "{err}"
        );
        assert!(!dir.path().join("snap").exists());
    }

    #[test]
    fn zstd_layers() {
        if !crius_common::test_needs_root("zstd_layers") {
            return;
        }
        let data = tar_of(&[("z", tar::EntryType::Regular, "zstd!")]);
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        std::fs::write(&blob, zstd::encode_all(&data[..], 3).unwrap()).unwrap();
        unpack_layer(
            &blob,
            &Digest::of(b"unused"),
            &Digest::of(&data),
            &dir.path().join("snap"),
            true,
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("snap/fs/z")).unwrap(),
            "zstd!"
        );
    }
}
