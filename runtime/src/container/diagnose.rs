//! Why a create the runtime refused failed, when the request is the cause. libcontainer (and
//! runc, crun) report a command the image lacks, a bind mount of a directory onto a file, a
//! working directory that is a file, a mount onto a device node or a mount point inside a
//! read-only mount from deep inside the container's init, as an error crius can only pass on
//! as Internal. After such a failure, and only then (it costs nothing on the way of a create
//! that works), crius looks at the spec, the rootfs and the runtime's words and, when it
//! finds the cause, answers InvalidArgument naming it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;

use crate::error::Error;
use crate::spec::rootfs::resolve_in_root;
use crate::util::excerpt;

/// `err`, or InvalidArgument with the cause when the spec and the rootfs show one.
pub(super) fn explain(err: Error, spec: &Spec, rootfs: &Path) -> Error {
    if !matches!(err, Error::Internal { .. }) {
        return err;
    }
    let said = crate::error::chain(&err);
    let cause = missing_executable(spec, rootfs)
        .or_else(|| mount_type_mismatch(spec, rootfs))
        .or_else(|| working_dir_not_a_directory(spec, rootfs))
        .or_else(|| mount_over_a_device(spec))
        .or_else(|| mountpoint_in_a_read_only_mount(spec))
        .or_else(|| named_by_the_runtime(spec, &said));
    match cause {
        Some(cause) => Error::InvalidArgument(format!("{cause} (the runtime said: {said})")),
        None => err,
    }
}

/// Devices libcontainer makes in every container's `/dev`.
const DEFAULT_DEVICES: [&str; 8] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/console",
    "/dev/ptmx",
];

fn is_bind(m: &oci_spec::runtime::Mount) -> bool {
    m.typ().as_deref() == Some("bind")
        || m.options()
            .iter()
            .flatten()
            .any(|o| o == "bind" || o == "rbind")
}

/// A mount onto a device node the runtime makes after the mounts (`/dev/null`, a CRI
/// device) or onto `/dev/pts`: the node cannot be made where the mount is, and a terminal
/// needs the container's own pty file system.
fn mount_over_a_device(spec: &Spec) -> Option<String> {
    let devices: Vec<PathBuf> = DEFAULT_DEVICES
        .iter()
        .chain(&["/dev/pts"])
        .map(PathBuf::from)
        .chain(
            spec.linux()
                .as_ref()
                .and_then(|l| l.devices().as_ref())
                .into_iter()
                .flatten()
                .map(|d| d.path().clone()),
        )
        .collect();
    let dest = spec
        .mounts()
        .iter()
        .flatten()
        .filter(|m| is_bind(m))
        .map(|m| m.destination())
        .find(|d| devices.iter().any(|dev| dev == *d))?;
    Some(format!(
        "mount {}: the runtime makes it in every container (a device node, or the pty file \
         system), and a mount cannot replace it",
        dest.display()
    ))
}

/// A read-only bind mount with a later mount inside it whose mount point its host directory
/// lacks: the runtime cannot make the mount point in a read-only mount.
fn mountpoint_in_a_read_only_mount(spec: &Spec) -> Option<String> {
    let mounts = spec.mounts().as_ref()?;
    for (i, m) in mounts.iter().enumerate() {
        let read_only = m
            .options()
            .iter()
            .flatten()
            .any(|o| o == "ro" || o == "rro");
        let Some(source) = m.source().as_ref().filter(|_| is_bind(m) && read_only) else {
            continue;
        };
        for later in &mounts[i + 1..] {
            let Ok(rest) = later.destination().strip_prefix(m.destination()) else {
                continue;
            };
            if rest.as_os_str().is_empty() || std::fs::symlink_metadata(source.join(rest)).is_ok() {
                continue;
            }
            return Some(format!(
                "mount {} is read-only, and {} is mounted inside it, but host_path {} has no {} \
                 to mount onto",
                m.destination().display(),
                later.destination().display(),
                source.display(),
                rest.display()
            ));
        }
    }
    None
}

/// A working directory that is a file or a device in the container: the image's, a bind
/// mount's (through its host source), or a device node.
fn working_dir_not_a_directory(spec: &Spec, rootfs: &Path) -> Option<String> {
    let cwd = spec.process().as_ref()?.cwd();
    let shown = || excerpt(&cwd.to_string_lossy()).into_owned();
    let is_device = DEFAULT_DEVICES.iter().any(|d| cwd == Path::new(d))
        || spec
            .linux()
            .as_ref()
            .and_then(|l| l.devices().as_ref())
            .is_some_and(|ds| ds.iter().any(|d| d.path() == cwd));
    if is_device {
        return Some(format!("config.working_dir {} is a device", shown()));
    }
    let covering = spec
        .mounts()
        .iter()
        .flatten()
        .filter(|m| cwd.starts_with(m.destination()))
        .max_by_key(|m| m.destination().components().count());
    let found = match covering {
        Some(m) => {
            let source = m.source().as_ref().filter(|_| is_bind(m))?;
            let rest = cwd.strip_prefix(m.destination()).ok()?;
            std::fs::metadata(source.join(rest)).ok()?
        }
        None => std::fs::metadata(resolve_in_root(rootfs, cwd).ok()?).ok()?,
    };
    (!found.is_dir()).then(|| format!("config.working_dir {} is not a directory", shown()))
}

/// Causes libcontainer names itself, in words of its own (pinned at 0.7.0; the unit tests
/// hold these words): a command it found no executable file for, a working directory that
/// leads out of the root, a masked or read-only path of the request it could not mount over.
fn named_by_the_runtime(spec: &Spec, said: &str) -> Option<String> {
    let process = spec.process().as_ref()?;
    if said.contains("executable '")
        && [
            "not found in $PATH",
            "does not have correct permissions",
            "failed to check permissions for executable",
        ]
        .iter()
        .any(|w| said.contains(w))
    {
        let command = process.args().as_ref()?.first()?;
        return Some(format!(
            "config.command: {} is not an executable file in the container",
            excerpt(command)
        ));
    }
    if said.contains("failed to verify if current working directory is safe") {
        return Some(format!(
            "config.working_dir {} does not stay inside the container",
            excerpt(&process.cwd().to_string_lossy())
        ));
    }
    let linux = spec.linux().as_ref()?;
    let own = |paths: &Option<Vec<String>>, defaults: &[&str]| {
        paths.iter().flatten().any(|p| {
            !defaults.contains(&p.as_str())
                && !crate::spec::security::cgroup_readonly_paths().any(|c| c == *p)
        })
    };
    if said.contains("failed to mount path as readonly")
        && own(
            linux.readonly_paths(),
            &crate::spec::security::DEFAULT_READONLY_PATHS,
        )
    {
        return Some(
            "security_context.readonly_paths: the runtime could not make one of them read-only"
                .to_owned(),
        );
    }
    if said.contains("failed to mount path as masked")
        && own(
            linux.masked_paths(),
            &crate::spec::security::DEFAULT_MASKED_PATHS,
        )
    {
        return Some(
            "security_context.masked_paths: the runtime could not mask one of them".to_owned(),
        );
    }
    None
}

/// Where the spec mounts something: paths at or below these are not the image's.
fn mount_points(spec: &Spec) -> Vec<PathBuf> {
    spec.mounts()
        .iter()
        .flatten()
        .map(|m| m.destination().clone())
        .collect()
}

/// The command's executable, when the image does not have it (or has it without an
/// executable bit) where the process would look: the path given, or each directory of the
/// process's `PATH`. Nothing is claimed for a path a mount may provide.
fn missing_executable(spec: &Spec, rootfs: &Path) -> Option<String> {
    let process = spec.process().as_ref()?;
    let command = process.args().as_ref()?.first()?;
    let mounts = mount_points(spec);
    let under_a_mount = |p: &Path| mounts.iter().any(|m| p.starts_with(m));
    let candidates: Vec<PathBuf> = if command.contains('/') {
        vec![process.cwd().join(command)]
    } else {
        let path = process
            .env()
            .iter()
            .flatten()
            .find_map(|e| e.strip_prefix("PATH="))?;
        path.split(':')
            .map(Path::new)
            .filter(|d| d.is_absolute())
            .map(|d| d.join(command))
            .collect()
    };
    let mut not_executable = None;
    for candidate in &candidates {
        if under_a_mount(candidate) {
            return None;
        }
        let found = resolve_in_root(rootfs, candidate)
            .ok()
            .and_then(|p| std::fs::metadata(p).ok());
        match found {
            Some(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => return None,
            Some(meta) if meta.is_file() => not_executable = Some(candidate.clone()),
            _ => {}
        }
    }
    let command = excerpt(command);
    Some(match not_executable {
        Some(path) => format!(
            "config.command: {command} is {} in the image, which is not executable",
            path.display()
        ),
        None if candidates.len() == 1 => {
            format!("config.command: {command} is not in the image")
        }
        None => format!(
            "config.command: {command} is in none of the image's PATH directories ({})",
            candidates
                .iter()
                .filter_map(|c| c.parent())
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":")
        ),
    })
}

/// A bind mount whose source is a directory where the image has a file at the target, or
/// the other way round: the kernel mounts neither. A target below another mount is that
/// mount's, not the image's, and is left alone.
fn mount_type_mismatch(spec: &Spec, rootfs: &Path) -> Option<String> {
    let mounts = spec.mounts().as_ref()?;
    for (i, m) in mounts.iter().enumerate() {
        let Some(source) = m.source().as_ref().filter(|_| is_bind(m)) else {
            continue;
        };
        let dest = m.destination();
        if mounts[..i]
            .iter()
            .any(|earlier| dest.starts_with(earlier.destination()))
        {
            continue;
        }
        let Some(target) = resolve_in_root(rootfs, dest)
            .ok()
            .and_then(|p| std::fs::metadata(p).ok())
        else {
            continue;
        };
        let Ok(source_meta) = std::fs::metadata(source) else {
            continue;
        };
        let kind = |dir: bool| {
            if dir {
                "a directory"
            } else {
                "not a directory"
            }
        };
        if source_meta.is_dir() != target.is_dir() {
            return Some(format!(
                "mount {}: host_path {} is {}, but {} in the image is {}",
                dest.display(),
                source.display(),
                kind(source_meta.is_dir()),
                dest.display(),
                kind(target.is_dir()),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{MountBuilder, ProcessBuilder, SpecBuilder};

    fn spec(args: &[&str], env: &[&str], mounts: &[(&str, &str)]) -> Spec {
        let process = ProcessBuilder::default()
            .args(args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .env(env.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .cwd("/")
            .build()
            .unwrap();
        let mounts = mounts
            .iter()
            .map(|(dest, src)| {
                MountBuilder::default()
                    .destination(dest)
                    .typ("bind")
                    .source(src)
                    .options(vec!["rbind".to_string()])
                    .build()
                    .unwrap()
            })
            .collect::<Vec<_>>();
        SpecBuilder::default()
            .process(process)
            .mounts(mounts)
            .build()
            .unwrap()
    }

    /// A rootfs with /bin/busybox (executable), /bin/sh -> /bin/busybox, /etc/passwd (a file,
    /// not executable) and /data (a directory).
    fn rootfs() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("bin")).unwrap();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::create_dir_all(r.join("data")).unwrap();
        std::fs::write(r.join("bin/busybox"), b"").unwrap();
        std::fs::set_permissions(
            r.join("bin/busybox"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("/bin/busybox", r.join("bin/sh")).unwrap();
        std::fs::write(r.join("etc/passwd"), b"root:x:0:0::/:/bin/sh\n").unwrap();
        root
    }

    #[test]
    fn a_command_the_image_lacks_is_named() {
        let root = rootfs();
        let path = ["PATH=/usr/bin:/bin"];
        let found = |args: &[&str], mounts: &[(&str, &str)]| {
            missing_executable(&spec(args, &path, mounts), root.path())
        };
        assert_eq!(
            found(&["sh"], &[]),
            None,
            "through PATH and an absolute symlink"
        );
        assert_eq!(found(&["/bin/sh", "-c", "x"], &[]), None);
        assert_eq!(
            found(&["/no/such/cmd"], &[]).as_deref(),
            Some("config.command: /no/such/cmd is not in the image")
        );
        assert_eq!(
            found(&["nosuch"], &[]).as_deref(),
            Some(
                "config.command: nosuch is in none of the image's PATH directories (/usr/bin:/bin)"
            )
        );
        assert!(found(&["/etc/passwd"], &[]).is_some_and(|m| m.contains("which is not executable")));
        // A script a mount provides is not the image's to lack.
        assert_eq!(found(&["/scripts/run"], &[("/scripts", "/tmp")]), None);
    }

    #[test]
    fn a_directory_bound_onto_a_file_is_named() {
        let root = rootfs();
        let host_dir = tempfile::tempdir().unwrap();
        let host_file = host_dir.path().join("f");
        std::fs::write(&host_file, b"x").unwrap();
        let (dir, file) = (
            host_dir.path().to_str().unwrap(),
            host_file.to_str().unwrap(),
        );
        let mismatch =
            |mounts: &[(&str, &str)]| mount_type_mismatch(&spec(&["sh"], &[], mounts), root.path());
        assert!(mismatch(&[("/etc/passwd", dir)])
            .is_some_and(|m| m.contains("is a directory, but /etc/passwd in the image is not")));
        assert!(mismatch(&[("/data", file)]).is_some_and(|m| m.contains("is not a directory")));
        assert_eq!(mismatch(&[("/etc/passwd", file), ("/data", dir)]), None);
        assert_eq!(
            mismatch(&[("/new/place", dir)]),
            None,
            "a target the image lacks"
        );
        // Below another mount the image's content does not count.
        assert_eq!(mismatch(&[("/etc", dir), ("/etc/passwd", dir)]), None);
    }

    #[test]
    fn a_working_dir_that_is_no_directory_is_named() {
        let root = rootfs();
        let host = tempfile::tempdir().unwrap();
        let file = host.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let dir = host.path().to_str().unwrap();
        let with_cwd = |cwd: &str, mounts: &[(&str, &str)]| {
            let mut s = spec(&["sh"], &[], mounts);
            if let Some(p) = s.process_mut() {
                p.set_cwd(PathBuf::from(cwd));
            }
            working_dir_not_a_directory(&s, root.path())
        };
        assert_eq!(
            with_cwd("/dev/null", &[]).as_deref(),
            Some("config.working_dir /dev/null is a device")
        );
        assert_eq!(
            with_cwd("/etc/passwd", &[]).as_deref(),
            Some("config.working_dir /etc/passwd is not a directory")
        );
        assert_eq!(
            with_cwd("/vol/f", &[("/vol", dir)]).as_deref(),
            Some("config.working_dir /vol/f is not a directory")
        );
        assert_eq!(with_cwd("/data", &[]), None);
        assert_eq!(with_cwd("/vol", &[("/vol", dir)]), None);
        assert_eq!(with_cwd("/not/there", &[]), None, "the runtime makes it");
    }

    /// libcontainer 0.7.0's own words, as its errors carry them to crius.
    #[test]
    fn causes_the_runtime_names_are_the_requests() {
        let s = spec(&["/etc/hosts"], &[], &[]);
        let named = |said: &str| named_by_the_runtime(&s, said);
        for said in [
            "exec process failed with error error in executing process : executable \
             '/etc/hosts' at path '\"/etc/hosts\"' does not have correct permissions",
            "error in executing process : executable 'x' not found in $PATH",
        ] {
            assert_eq!(
                named(said).as_deref(),
                Some("config.command: /etc/hosts is not an executable file in the container")
            );
        }
        assert!(named(
            "error in executing process : failed to verify if current working \
                       directory is safe"
        )
        .is_some_and(|m| m.contains("config.working_dir / does not stay inside")));
        assert_eq!(named("intermediate process error EACCES"), None);
        // A read-only path the runtime could not mount is the request's only when the
        // request gave one of its own.
        let mut s = spec(&["sh"], &[], &[]);
        let linux = |paths: Vec<String>| {
            oci_spec::runtime::LinuxBuilder::default()
                .readonly_paths(paths)
                .build()
                .unwrap()
        };
        let said = "error in executing process : failed to mount path as readonly";
        s.set_linux(Some(linux(vec!["/proc/sys".into()])));
        assert_eq!(named_by_the_runtime(&s, said), None);
        s.set_linux(Some(linux(vec!["/proc/sys".into(), "/proc/1/root".into()])));
        assert!(named_by_the_runtime(&s, said)
            .is_some_and(|m| m.starts_with("security_context.readonly_paths")));
    }

    #[test]
    fn mounts_the_runtime_cannot_make_are_named() {
        let host = tempfile::tempdir().unwrap();
        let dir = host.path().to_str().unwrap();
        let s = spec(&["sh"], &[], &[("/dev/null", dir)]);
        assert!(mount_over_a_device(&s).is_some_and(
            |m| m.starts_with("mount /dev/null: the runtime makes it in every container")
        ));
        assert_eq!(
            mount_over_a_device(&spec(&["sh"], &[], &[("/data", dir)])),
            None
        );
        // read-only /sys from a directory without fs/cgroup, then /sys/fs/cgroup inside it
        let mut s = spec(
            &["sh"],
            &[],
            &[("/sys", dir), ("/sys/fs/cgroup", "/sys/fs/cgroup")],
        );
        let read_only = |s: &mut Spec| {
            let mut mounts = s.mounts().clone().unwrap();
            mounts[0].set_options(Some(vec!["rbind".into(), "ro".into()]));
            s.set_mounts(Some(mounts));
        };
        assert_eq!(
            mountpoint_in_a_read_only_mount(&s),
            None,
            "read-write: the runtime makes it"
        );
        read_only(&mut s);
        assert!(mountpoint_in_a_read_only_mount(&s)
            .is_some_and(|m| m
                .starts_with("mount /sys is read-only, and /sys/fs/cgroup is mounted inside it")));
        std::fs::create_dir_all(host.path().join("fs/cgroup")).unwrap();
        assert_eq!(
            mountpoint_in_a_read_only_mount(&s),
            None,
            "the mount point is there"
        );
    }
}
