//! Devices: CRI devices resolved through stat, all host devices for privileged containers, and
//! the device cgroup rules.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crius_api::v1::Device;
use oci_spec::runtime::{
    LinuxDevice, LinuxDeviceBuilder, LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType,
};

use super::error::{Result, SpecError};

/// Directories of /dev a privileged container does not get from the host (its own are mounted).
const SKIPPED_DEV_DIRS: [&str; 7] = ["pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev"];

/// The device node at `path` (symlinks followed), or `None` when it is not a char/block device.
fn device_at(path: &Path, container_path: &Path) -> Result<Option<LinuxDevice>> {
    let meta = std::fs::metadata(path).map_err(|e| SpecError::io("stat device", path, e))?;
    let ft = meta.file_type();
    let typ = if ft.is_char_device() {
        LinuxDeviceType::C
    } else if ft.is_block_device() {
        LinuxDeviceType::B
    } else {
        return Ok(None);
    };
    let rdev = meta.rdev();
    Ok(Some(
        LinuxDeviceBuilder::default()
            .path(container_path)
            .typ(typ)
            .major(i64::from(libc::major(rdev)))
            .minor(i64::from(libc::minor(rdev)))
            .file_mode(meta.mode() & 0o7777)
            .uid(meta.uid())
            .gid(meta.gid())
            .build()?,
    ))
}

/// Devices under a host path: the device itself, or every device in a directory (recursively,
/// keeping the relative layout under `container_path`).
fn devices_under(
    host: &Path,
    container: &Path,
    top: bool,
    out: &mut Vec<LinuxDevice>,
) -> Result<()> {
    let meta = std::fs::metadata(host).map_err(|e| SpecError::io("stat device", host, e))?;
    if !meta.is_dir() {
        return match device_at(host, container)? {
            Some(dev) => {
                out.push(dev);
                Ok(())
            }
            None if top => Err(SpecError::invalid(format!(
                "device host_path {} is not a device",
                host.display()
            ))),
            None => Ok(()),
        };
    }
    let entries = std::fs::read_dir(host).map_err(|e| SpecError::io("list devices in", host, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| SpecError::io("list devices in", host, e))?;
        let name = entry.file_name();
        let ft = entry
            .file_type()
            .map_err(|e| SpecError::io("stat device", entry.path(), e))?;
        if ft.is_dir() {
            if SKIPPED_DEV_DIRS.iter().any(|s| name == *s) {
                continue;
            }
            devices_under(&entry.path(), &container.join(&name), false, out)?;
        } else if ft.is_char_device() || ft.is_block_device() {
            if name == "console" {
                continue;
            }
            match device_at(&entry.path(), &container.join(&name)) {
                Ok(Some(dev)) => out.push(dev),
                Ok(None) => {}
                // a node that vanished while listing is not an error
                Err(SpecError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Validates CRI device permissions: any of `r`, `w`, `m`; empty means `rwm`.
fn permissions(device: &Device) -> Result<String> {
    if device.permissions.is_empty() {
        return Ok("rwm".into());
    }
    if device
        .permissions
        .chars()
        .all(|c| matches!(c, 'r' | 'w' | 'm'))
    {
        Ok(device.permissions.clone())
    } else {
        Err(SpecError::invalid(format!(
            "device {} permissions {} must be made of r, w and m",
            device.host_path, device.permissions
        )))
    }
}

/// The CRI devices as OCI devices plus the cgroup rules allowing them. A directory host path
/// brings every device below it. A missing host path is an `InvalidArgument`.
pub(crate) fn cri_devices(
    devices: &[Device],
) -> Result<(Vec<LinuxDevice>, Vec<LinuxDeviceCgroup>)> {
    let mut nodes = Vec::new();
    let mut rules = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let host = Path::new(&d.host_path);
        let shown = || crate::util::excerpt(&d.host_path);
        if !host.is_absolute() {
            return Err(SpecError::invalid(format!(
                "devices[{i}].host_path {} is not absolute",
                shown()
            )));
        }
        let container = if d.container_path.is_empty() {
            PathBuf::from(&d.host_path)
        } else {
            super::mounts::clean_container_path(&d.container_path, "device container_path")?
        };
        // The container's /dev is the runtime's own tmpfs; libcontainer makes nodes only there.
        if !container.starts_with("/dev") || container == Path::new("/dev") {
            return Err(SpecError::invalid(format!(
                "devices[{i}].container_path {} is not in /dev",
                crate::util::excerpt(&container.to_string_lossy())
            )));
        }
        let Ok(meta) = std::fs::metadata(host) else {
            return Err(SpecError::invalid(format!(
                "devices[{i}].host_path {} does not exist",
                shown()
            )));
        };
        // A directory brings the devices below it: a directory of the host's /dev (as
        // `/dev/dri`), never a walk of the whole file system.
        if meta.is_dir() && !std::fs::canonicalize(host).is_ok_and(|p| p.starts_with("/dev")) {
            return Err(SpecError::invalid(format!(
                "devices[{i}].host_path {} is a directory outside /dev: give a device, or a \
                 directory of /dev",
                shown()
            )));
        }
        let access = permissions(d)?;
        let start = nodes.len();
        devices_under(host, &container, true, &mut nodes)?;
        for dev in &nodes[start..] {
            rules.push(rule(
                true,
                Some(dev.typ()),
                Some(dev.major()),
                Some(dev.minor()),
                &access,
            )?);
        }
    }
    Ok((nodes, rules))
}

/// Every device node of the host's /dev, for privileged containers.
pub(crate) fn host_devices() -> Result<Vec<LinuxDevice>> {
    let mut out = Vec::new();
    devices_under(Path::new("/dev"), Path::new("/dev"), false, &mut out)?;
    Ok(out)
}

fn rule(
    allow: bool,
    typ: Option<LinuxDeviceType>,
    major: Option<i64>,
    minor: Option<i64>,
    access: &str,
) -> Result<LinuxDeviceCgroup> {
    let mut b = LinuxDeviceCgroupBuilder::default()
        .allow(allow)
        .access(access);
    if let Some(t) = typ {
        b = b.typ(t);
    }
    if let Some(m) = major {
        b = b.major(m);
    }
    if let Some(m) = minor {
        b = b.minor(m);
    }
    Ok(b.build()?)
}

/// The device cgroup rules every container starts with: deny everything, then allow mknod of
/// any node and use of the standard ones (null, zero, full, random, urandom, tty, console,
/// ptmx, the pty slaves and tun).
///
/// For crius's own path (`builtin`) only the deny: libcontainer 0.7 appends exactly those
/// allows to the spec's rules itself (libcgroups' default devices, on v1 and v2 alike), as
/// runc does under containerd, whose specs carry the deny alone. Listed here too, each was
/// applied twice: on v1 one more write to `devices.allow` per rule in the create's
/// intermediate process, twelve per container. An OCI runtime handler gets them listed.
pub(crate) fn default_rules(builtin: bool) -> Result<Vec<LinuxDeviceCgroup>> {
    use LinuxDeviceType::{B, C};
    let mut rules = vec![rule(false, None, None, None, "rwm")?];
    if builtin {
        return Ok(rules);
    }
    rules.push(rule(true, Some(C), None, None, "m")?);
    rules.push(rule(true, Some(B), None, None, "m")?);
    for (major, minor) in [
        (1, 3),
        (1, 5),
        (1, 7),
        (1, 8),
        (1, 9),
        (5, 0),
        (5, 1),
        (5, 2),
        (10, 200),
    ] {
        rules.push(rule(true, Some(C), Some(major), Some(minor), "rwm")?);
    }
    rules.push(rule(true, Some(C), Some(136), None, "rwm")?);
    Ok(rules)
}

/// Allow every device (privileged containers).
pub(crate) fn allow_all_rules() -> Result<Vec<LinuxDeviceCgroup>> {
    Ok(vec![rule(true, None, None, None, "rwm")?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_null_resolves_to_1_3() {
        let (nodes, rules) = cri_devices(&[Device {
            host_path: "/dev/null".into(),
            container_path: "/dev/mynull".into(),
            permissions: "rw".into(),
        }])
        .unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].path(), Path::new("/dev/mynull"));
        assert_eq!(nodes[0].typ(), LinuxDeviceType::C);
        assert_eq!((nodes[0].major(), nodes[0].minor()), (1, 3));
        assert_eq!(rules[0].access().as_deref(), Some("rw"));
        assert!(rules[0].allow());
        assert_eq!((rules[0].major(), rules[0].minor()), (Some(1), Some(3)));
    }

    #[test]
    fn bad_devices_are_invalid() {
        let missing = Device {
            host_path: "/dev/crius-no-such-device".into(),
            container_path: "/dev/x".into(),
            permissions: "rwm".into(),
        };
        let err = cri_devices(&[missing]).unwrap_err();
        assert!(err.is_invalid_argument());
        assert!(err.to_string().contains("/dev/crius-no-such-device"));
        let not_a_device = Device {
            host_path: "/etc/hostname".into(),
            container_path: "/dev/x".into(),
            permissions: "rwm".into(),
        };
        if Path::new("/etc/hostname").exists() {
            assert!(cri_devices(&[not_a_device])
                .unwrap_err()
                .is_invalid_argument());
        }
        let bad_perm = Device {
            host_path: "/dev/null".into(),
            container_path: "/dev/x".into(),
            permissions: "rwx".into(),
        };
        assert!(cri_devices(&[bad_perm]).unwrap_err().is_invalid_argument());
    }

    #[test]
    fn host_devices_include_null_and_skip_pts() {
        let devs = host_devices().unwrap();
        assert!(devs.iter().any(|d| d.path() == Path::new("/dev/null")));
        assert!(!devs.iter().any(|d| d.path().starts_with("/dev/pts")));
    }

    #[test]
    fn default_rules_deny_first() {
        let rules = default_rules(false).unwrap();
        assert!(!rules[0].allow());
        assert_eq!(rules[0].access().as_deref(), Some("rwm"));
        assert!(rules[1..].iter().all(|r| r.allow()));
        assert!(rules
            .iter()
            .any(|r| r.major() == Some(1) && r.minor() == Some(9)));
        // libcontainer adds the allows itself
        let builtin = default_rules(true).unwrap();
        assert_eq!(builtin, rules[..1]);
    }
}
