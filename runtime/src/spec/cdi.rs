//! CDI (Container Device Interface) devices: `cdi_devices` of a CRI container resolved in the
//! CDI spec files of this node and applied to the OCI spec.
//!
//! A spec file (`*.json` or `*.yaml` in [`CDI_DIRS`]; a later directory wins for a device
//! both define) has a `kind` (`vendor.com/class`), `devices` (each with a `name` and
//! `containerEdits`) and spec-wide `containerEdits` that apply whenever one of its devices is
//! requested. A device is requested by its qualified name `vendor.com/class=name`. Edits:
//! `env`, `deviceNodes`, `mounts`, `hooks` and `additionalGids`.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Hook, HookBuilder, Hooks, LinuxDevice, LinuxDeviceBuilder, LinuxDeviceCgroup,
    LinuxDeviceCgroupBuilder, LinuxDeviceType, Mount, MountBuilder,
};
use serde::Deserialize;

use super::error::{Result, SpecError};

/// Where CDI spec files live, lowest priority first (the CDI defaults).
pub const CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecFile {
    #[serde(default)]
    cdi_version: String,
    kind: String,
    #[serde(default)]
    devices: Vec<DeviceEntry>,
    #[serde(default)]
    container_edits: Edits,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceEntry {
    name: String,
    #[serde(default)]
    container_edits: Edits,
}

/// One set of `containerEdits`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Edits {
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    mounts: Vec<CdiMount>,
    #[serde(default)]
    hooks: Vec<CdiHook>,
    #[serde(default)]
    additional_gids: Vec<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceNode {
    path: String,
    #[serde(default)]
    host_path: Option<String>,
    #[serde(default, rename = "type")]
    typ: Option<String>,
    #[serde(default)]
    major: Option<i64>,
    #[serde(default)]
    minor: Option<i64>,
    #[serde(default)]
    file_mode: Option<u32>,
    #[serde(default)]
    permissions: Option<String>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CdiMount {
    host_path: String,
    container_path: String,
    #[serde(default, rename = "type")]
    typ: Option<String>,
    #[serde(default)]
    options: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CdiHook {
    hook_name: String,
    path: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    timeout: Option<i64>,
}

/// What the requested CDI devices add to a container.
#[derive(Debug, Default)]
pub(crate) struct Injected {
    pub env: Vec<String>,
    pub devices: Vec<LinuxDevice>,
    pub rules: Vec<LinuxDeviceCgroup>,
    pub mounts: Vec<Mount>,
    pub hooks: Option<Hooks>,
    pub additional_gids: Vec<u32>,
}

fn spec_error(path: &Path, reason: impl Into<String>) -> SpecError {
    SpecError::CdiSpec {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Every device of the spec files in `dirs`, by qualified name, with the edits of the device
/// and of its spec file. Files that are neither JSON nor YAML by name are skipped.
/// Files that cannot be read as a spec are skipped (as the CDI library does) and reported in
/// the second list, so that one broken vendor file does not break every other device.
type Registry = (HashMap<String, (Edits, Edits)>, Vec<String>);

fn registry(dirs: &[&Path]) -> Result<Registry> {
    let mut out = HashMap::new();
    let mut broken = Vec::new();
    for dir in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(SpecError::io("list cdi specs in", *dir, e)),
        };
        // a stable order within one directory: by file name
        let mut files: BTreeMap<PathBuf, ()> = BTreeMap::new();
        for entry in entries {
            let path = entry
                .map_err(|e| SpecError::io("list cdi specs in", *dir, e))?
                .path();
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if matches!(ext, "json" | "yaml" | "yml") {
                files.insert(path, ());
            }
        }
        for path in files.into_keys() {
            let file = match read_spec(&path) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!("skipping cdi spec: {e}");
                    broken.push(e.to_string());
                    continue;
                }
            };
            for d in file.devices {
                out.insert(
                    format!("{}={}", file.kind, d.name),
                    (d.container_edits, file.container_edits.clone()),
                );
            }
        }
    }
    Ok((out, broken))
}

fn read_spec(path: &Path) -> Result<SpecFile> {
    let text = std::fs::read_to_string(path).map_err(|e| spec_error(path, format!("read: {e}")))?;
    // YAML is a superset of JSON: one parser reads both
    let file: SpecFile = serde_yaml::from_str(&text)
        .map_err(|e| spec_error(path, format!("not a cdi spec: {e}")))?;
    if !valid_kind(&file.kind) {
        return Err(spec_error(
            path,
            format!("kind {:?} is not vendor.com/class", file.kind),
        ));
    }
    if file.cdi_version.is_empty() {
        return Err(spec_error(path, "cdiVersion is missing"));
    }
    Ok(file)
}

fn valid_kind(kind: &str) -> bool {
    match kind.split_once('/') {
        Some((vendor, class)) => {
            !vendor.is_empty()
                && !class.is_empty()
                && !class.contains('/')
                && kind
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'))
        }
        None => false,
    }
}

/// Resolves `names` (qualified CDI device names) in the spec files of `dirs` and collects
/// their edits. Each spec file's own edits are applied once however many of its devices are
/// requested. An unknown name is an `InvalidArgument` naming it.
pub(crate) fn inject(names: &[String], dirs: &[&Path]) -> Result<Injected> {
    let mut out = Injected::default();
    if names.is_empty() {
        return Ok(out);
    }
    let (registry, broken) = registry(dirs)?;
    let mut kinds_done: Vec<String> = Vec::new();
    for name in names {
        let Some((kind, _)) = name.split_once('=').filter(|(k, _)| valid_kind(k)) else {
            return Err(SpecError::invalid(format!(
                "cdi device {name} is not a qualified name (vendor.com/class=name)"
            )));
        };
        let (device, spec_wide) = registry.get(name).ok_or_else(|| {
            let mut message = format!(
                "cdi device {name} is not defined by any spec in {}",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if !broken.is_empty() {
                message.push_str(&format!(" (skipped: {})", broken.join("; ")));
            }
            SpecError::invalid(message)
        })?;
        if !kinds_done.iter().any(|k| k == kind) {
            kinds_done.push(kind.to_string());
            apply(spec_wide, &mut out)?;
        }
        apply(device, &mut out)?;
    }
    Ok(out)
}

fn apply(edits: &Edits, out: &mut Injected) -> Result<()> {
    out.env.extend(edits.env.iter().cloned());
    for node in &edits.device_nodes {
        let (dev, rule) = device_node(node)?;
        out.devices.retain(|d| d.path() != dev.path());
        out.devices.push(dev);
        out.rules.push(rule);
    }
    for m in &edits.mounts {
        out.mounts.push(mount(m)?);
    }
    for h in &edits.hooks {
        add_hook(h, out)?;
    }
    for g in &edits.additional_gids {
        if !out.additional_gids.contains(g) {
            out.additional_gids.push(*g);
        }
    }
    Ok(())
}

fn device_node(node: &DeviceNode) -> Result<(LinuxDevice, LinuxDeviceCgroup)> {
    let container_path = super::mounts::clean_container_path(&node.path, "cdi device node path")?;
    let host = PathBuf::from(node.host_path.as_deref().unwrap_or(&node.path));
    let (mut typ, mut major, mut minor) = (
        node.typ.as_deref().map(device_type).transpose()?,
        node.major,
        node.minor,
    );
    let mut mode = node.file_mode;
    let (mut uid, mut gid) = (node.uid, node.gid);
    if major.is_none() || minor.is_none() || typ.is_none() {
        let meta =
            std::fs::metadata(&host).map_err(|e| SpecError::io("stat cdi device", &host, e))?;
        let ft = meta.file_type();
        let found = if ft.is_char_device() {
            LinuxDeviceType::C
        } else if ft.is_block_device() {
            LinuxDeviceType::B
        } else if ft.is_fifo() {
            LinuxDeviceType::P
        } else {
            return Err(SpecError::invalid(format!(
                "cdi device node {} is not a device",
                host.display()
            )));
        };
        typ.get_or_insert(found);
        major.get_or_insert(i64::from(libc::major(meta.rdev())));
        minor.get_or_insert(i64::from(libc::minor(meta.rdev())));
        mode.get_or_insert(meta.mode() & 0o7777);
        uid.get_or_insert(meta.uid());
        gid.get_or_insert(meta.gid());
    }
    let typ = typ.unwrap_or(LinuxDeviceType::C);
    let (major, minor) = (major.unwrap_or(0), minor.unwrap_or(0));
    let mut b = LinuxDeviceBuilder::default()
        .path(container_path)
        .typ(typ)
        .major(major)
        .minor(minor);
    if let Some(m) = mode {
        b = b.file_mode(m);
    }
    if let Some(u) = uid {
        b = b.uid(u);
    }
    if let Some(g) = gid {
        b = b.gid(g);
    }
    let access = node.permissions.clone().unwrap_or_else(|| "rwm".into());
    if access.is_empty() || !access.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
        return Err(SpecError::invalid(format!(
            "cdi device node {} permissions {access} must be made of r, w and m",
            node.path
        )));
    }
    let rule = LinuxDeviceCgroupBuilder::default()
        .allow(true)
        .typ(typ)
        .major(major)
        .minor(minor)
        .access(access)
        .build()?;
    Ok((b.build()?, rule))
}

fn device_type(t: &str) -> Result<LinuxDeviceType> {
    match t {
        "c" | "u" => Ok(LinuxDeviceType::C),
        "b" => Ok(LinuxDeviceType::B),
        "p" => Ok(LinuxDeviceType::P),
        other => Err(SpecError::invalid(format!(
            "cdi device node type {other} is not c, u, b or p"
        ))),
    }
}

fn mount(m: &CdiMount) -> Result<Mount> {
    let dest = super::mounts::clean_container_path(&m.container_path, "cdi mount containerPath")?;
    let typ = m.typ.clone().unwrap_or_else(|| "bind".into());
    let mut options = m.options.clone();
    if typ == "bind" && !options.iter().any(|o| o == "bind" || o == "rbind") {
        options.insert(0, "bind".into());
    }
    Ok(MountBuilder::default()
        .destination(dest)
        .typ(typ)
        .source(&m.host_path)
        .options(options)
        .build()?)
}

fn add_hook(h: &CdiHook, out: &mut Injected) -> Result<()> {
    let mut b = HookBuilder::default().path(&h.path);
    if !h.args.is_empty() {
        b = b.args(h.args.clone());
    }
    if !h.env.is_empty() {
        b = b.env(h.env.clone());
    }
    if let Some(t) = h.timeout {
        b = b.timeout(t);
    }
    let hook: Hook = b.build()?;
    let hooks = out.hooks.get_or_insert_with(Hooks::default);
    let list = match h.hook_name.as_str() {
        "prestart" => hooks.prestart_mut(),
        "createRuntime" => hooks.create_runtime_mut(),
        "createContainer" => hooks.create_container_mut(),
        "startContainer" => hooks.start_container_mut(),
        "poststart" => hooks.poststart_mut(),
        "poststop" => hooks.poststop_mut(),
        other => {
            return Err(SpecError::invalid(format!(
                "cdi hook {} has an unknown hookName {other}",
                h.path
            )))
        }
    };
    list.get_or_insert_with(Vec::new).push(hook);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(tmp: &tempfile::TempDir) -> (PathBuf, PathBuf) {
        let low = tmp.path().join("etc-cdi");
        let high = tmp.path().join("run-cdi");
        std::fs::create_dir_all(&low).unwrap();
        std::fs::create_dir_all(&high).unwrap();
        (low, high)
    }

    #[test]
    fn yaml_and_json_specs_resolve_by_qualified_name() {
        let tmp = tempfile::tempdir().unwrap();
        let (low, high) = dirs(&tmp);
        std::fs::write(
            low.join("vendor.yaml"),
            r#"
cdiVersion: "0.6.0"
kind: example.com/gpu
containerEdits:
  env: ["GPU_DRIVER=1"]
  mounts:
    - hostPath: /usr/lib/driver
      containerPath: /usr/lib/driver
      options: [ro, nosuid]
devices:
  - name: gpu0
    containerEdits:
      env: ["GPU=0"]
      deviceNodes:
        - path: /dev/gpu0
          hostPath: /dev/null
          permissions: rw
      additionalGids: [44]
  - name: gpu1
    containerEdits:
      env: ["GPU=1"]
      deviceNodes:
        - path: /dev/gpu1
          type: c
          major: 195
          minor: 1
      hooks:
        - hookName: createContainer
          path: /usr/bin/gpu-hook
          args: [gpu-hook, setup]
"#,
        )
        .unwrap();
        std::fs::write(
            high.join("other.json"),
            r#"{"cdiVersion": "0.6.0", "kind": "example.com/nic",
                "devices": [{"name": "nic0", "containerEdits": {"env": ["NIC=0"]}}]}"#,
        )
        .unwrap();
        let names = vec![
            "example.com/gpu=gpu0".to_string(),
            "example.com/gpu=gpu1".to_string(),
            "example.com/nic=nic0".to_string(),
        ];
        let got = inject(&names, &[low.as_path(), high.as_path()]).unwrap();
        // the spec-wide edits once, then each device's
        assert_eq!(got.env, ["GPU_DRIVER=1", "GPU=0", "GPU=1", "NIC=0"]);
        assert_eq!(got.mounts.len(), 1);
        assert_eq!(
            got.mounts[0].options().clone().unwrap(),
            ["bind", "ro", "nosuid"]
        );
        assert_eq!(got.devices.len(), 2);
        assert_eq!(got.devices[0].path(), Path::new("/dev/gpu0"));
        assert_eq!((got.devices[0].major(), got.devices[0].minor()), (1, 3));
        assert_eq!((got.devices[1].major(), got.devices[1].minor()), (195, 1));
        assert_eq!(got.rules[0].access().as_deref(), Some("rw"));
        assert_eq!(got.rules[1].access().as_deref(), Some("rwm"));
        assert_eq!(got.additional_gids, [44]);
        let hooks = got.hooks.unwrap();
        assert_eq!(
            hooks.create_container().clone().unwrap()[0].path(),
            Path::new("/usr/bin/gpu-hook")
        );
    }

    #[test]
    fn later_directories_win_and_unknown_devices_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let (low, high) = dirs(&tmp);
        for (dir, value) in [(&low, "low"), (&high, "high")] {
            std::fs::write(
                dir.join("x.json"),
                format!(
                    r#"{{"cdiVersion": "0.6.0", "kind": "example.com/x",
                        "devices": [{{"name": "a", "containerEdits": {{"env": ["W={value}"]}}}}]}}"#
                ),
            )
            .unwrap();
        }
        let got = inject(
            &["example.com/x=a".into()],
            &[low.as_path(), high.as_path()],
        )
        .unwrap();
        assert_eq!(got.env, ["W=high"]);

        let err = inject(&["example.com/x=b".into()], &[low.as_path()]).unwrap_err();
        assert!(err.is_invalid_argument());
        assert!(err.to_string().contains("example.com/x=b"), "{err}");
        let err = inject(&["just-a-name".into()], &[low.as_path()]).unwrap_err();
        assert!(err.to_string().contains("qualified"), "{err}");
    }

    #[test]
    fn a_broken_spec_file_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let (low, _) = dirs(&tmp);
        std::fs::write(low.join("bad.yaml"), "kind: [unclosed").unwrap();
        std::fs::write(
            low.join("good.json"),
            r#"{"cdiVersion": "0.6.0", "kind": "example.com/x", "devices": [{"name": "a"}]}"#,
        )
        .unwrap();
        // the broken file does not hide the good one
        assert!(inject(&["example.com/x=a".into()], &[low.as_path()]).is_ok());
        let err = inject(&["example.com/y=a".into()], &[low.as_path()]).unwrap_err();
        assert!(err.to_string().contains("bad.yaml"), "{err}");
        std::fs::write(low.join("bad.yaml"), "cdiVersion: 0.6.0\nkind: noslash\n").unwrap();
        let err = inject(&["example.com/y=a".into()], &[low.as_path()]).unwrap_err();
        assert!(err.to_string().contains("noslash"), "{err}");
    }
}
