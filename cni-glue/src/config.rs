//! Network configuration lists (spec section 1) and their discovery in a conf dir.
//!
//! Discovery follows what kubelet and containerd do: the files ending in `.conflist`, `.conf`
//! or `.json` are sorted by name, and the first one that parses into a usable list wins; a
//! `.conf`/`.json` file holds a single plugin configuration and is wrapped into a list of one.
//! Files that do not parse are skipped with a logged reason. [`ConfDir`] rescans only when the
//! directory listing or one of those files changed (name, inode, size or mtime), which costs a
//! `readdir` plus one `stat` per candidate file on each use.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The spec versions this crate can speak, oldest first. Older ones have another result shape.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// A `major.minor.patch` version, for comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// Parses `1.0.0` (or `1.0`); `None` if it is not a version.
    pub fn parse(s: &str) -> Option<Version> {
        let mut it = s.split('.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        let patch = match it.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        if it.next().is_some() {
            return None;
        }
        Some(Version(major, minor, patch))
    }

    /// CHECK and `prevResult` on DEL came with 0.4.0.
    pub fn has_check(self) -> bool {
        self >= Version(0, 4, 0)
    }

    /// STATUS and GC came with 1.1.0.
    pub fn has_status_and_gc(self) -> bool {
        self >= Version(1, 1, 0)
    }
}

/// One plugin of a list: its `type` and declared capabilities, plus the whole object as written,
/// which is passed through to the plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    /// The binary name (`type`).
    pub plugin_type: String,
    /// Capability names this plugin declared with `true`.
    pub capabilities: Vec<String>,
    /// The plugin configuration object exactly as in the file.
    pub raw: Map<String, Value>,
}

/// A network configuration list, ready to be executed.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfigList {
    pub name: String,
    /// The version selected for this list (the highest of `cniVersion`/`cniVersions` we speak).
    pub cni_version: String,
    pub disable_check: bool,
    pub disable_gc: bool,
    pub plugins: Vec<PluginConfig>,
    /// The file it came from, if any.
    pub source: Option<PathBuf>,
}

fn invalid(path: &Path, reason: impl Into<String>) -> Error {
    Error::InvalidConfig {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn select_version(obj: &Map<String, Value>, path: &Path) -> Result<String> {
    let mut offered = Vec::new();
    match obj.get("cniVersion") {
        Some(Value::String(v)) => offered.push(v.clone()),
        Some(_) => return Err(invalid(path, "cniVersion is not a string")),
        None => return Err(invalid(path, "missing cniVersion")),
    }
    if let Some(list) = obj.get("cniVersions") {
        let list = list
            .as_array()
            .ok_or_else(|| invalid(path, "cniVersions is not a list"))?;
        for v in list {
            let v = v
                .as_str()
                .ok_or_else(|| invalid(path, "cniVersions has a non-string entry"))?;
            offered.push(v.to_string());
        }
    }
    offered
        .iter()
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        .max_by_key(|v| Version::parse(v))
        .cloned()
        .ok_or_else(|| {
            invalid(
                path,
                format!(
                    "cniVersion {offered:?}: none of them is supported ({SUPPORTED_VERSIONS:?})"
                ),
            )
        })
}

fn parse_plugin(value: &Value, path: &Path) -> Result<PluginConfig> {
    let raw = value
        .as_object()
        .ok_or_else(|| invalid(path, "a plugin is not an object"))?
        .clone();
    let plugin_type = match raw.get("type") {
        Some(Value::String(t)) if !t.is_empty() => t.clone(),
        _ => return Err(invalid(path, "a plugin has no type")),
    };
    if plugin_type.contains('/') || plugin_type == "." || plugin_type == ".." {
        return Err(invalid(
            path,
            format!("plugin type {plugin_type:?} is not a file name"),
        ));
    }
    let capabilities = match raw.get("capabilities") {
        None => Vec::new(),
        Some(Value::Object(caps)) => caps
            .iter()
            .filter(|(_, v)| v.as_bool() == Some(true))
            .map(|(k, _)| k.clone())
            .collect(),
        Some(_) => return Err(invalid(path, "capabilities is not an object")),
    };
    Ok(PluginConfig {
        plugin_type,
        capabilities,
        raw,
    })
}

fn bool_field(obj: &Map<String, Value>, key: &str, path: &Path) -> Result<bool> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(path, format!("{key} is not a boolean"))),
    }
}

fn name_field(obj: &Map<String, Value>, path: &Path) -> Result<String> {
    match obj.get("name") {
        Some(Value::String(n)) if !n.is_empty() => {
            let ok = n.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
            if ok {
                Ok(n.clone())
            } else {
                Err(invalid(
                    path,
                    format!("network name {n:?} has invalid characters"),
                ))
            }
        }
        _ => Err(invalid(path, "missing network name")),
    }
}

impl NetworkConfigList {
    /// Parses a `.conflist` document. `path` is only used in errors and [`Self::source`].
    pub fn from_conflist(bytes: &[u8], path: &Path) -> Result<Self> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| invalid(path, e.to_string()))?;
        let obj = value
            .as_object()
            .ok_or_else(|| invalid(path, "not a JSON object"))?;
        let plugins = match obj.get("plugins") {
            Some(Value::Array(p)) if !p.is_empty() => p
                .iter()
                .map(|p| parse_plugin(p, path))
                .collect::<Result<Vec<_>>>()?,
            Some(Value::Array(_)) => return Err(invalid(path, "plugins is empty")),
            Some(_) => return Err(invalid(path, "plugins is not a list")),
            None => return Err(invalid(path, "no plugins")),
        };
        Ok(NetworkConfigList {
            name: name_field(obj, path)?,
            cni_version: select_version(obj, path)?,
            disable_check: bool_field(obj, "disableCheck", path)?,
            disable_gc: bool_field(obj, "disableGC", path)?,
            plugins,
            source: Some(path.to_path_buf()),
        })
    }

    /// Parses a single-plugin `.conf`/`.json` document and wraps it into a list of one.
    pub fn from_conf(bytes: &[u8], path: &Path) -> Result<Self> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| invalid(path, e.to_string()))?;
        let obj = value
            .as_object()
            .ok_or_else(|| invalid(path, "not a JSON object"))?;
        if obj.contains_key("plugins") && !obj.contains_key("type") {
            return Err(invalid(
                path,
                "a list of plugins in a .conf file (name it .conflist)",
            ));
        }
        Ok(NetworkConfigList {
            name: name_field(obj, path)?,
            cni_version: select_version(obj, path)?,
            disable_check: false,
            disable_gc: false,
            plugins: vec![parse_plugin(&value, path)?],
            source: Some(path.to_path_buf()),
        })
    }

    /// Reads one file, as a list or a single conf according to its extension.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| invalid(path, e.to_string()))?;
        if path.extension().is_some_and(|e| e == "conflist") {
            Self::from_conflist(&bytes, path)
        } else {
            Self::from_conf(&bytes, path)
        }
    }

    /// The selected version, parsed.
    pub fn version(&self) -> Version {
        // Only versions from SUPPORTED_VERSIONS are ever selected, and they all parse.
        Version::parse(&self.cni_version).unwrap_or(Version(0, 3, 0))
    }

    /// The list as a JSON document (with the selected version), for the attachment cache.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "cniVersion": self.cni_version,
            "name": self.name,
            "disableCheck": self.disable_check,
            "disableGC": self.disable_gc,
            "plugins": self.plugins.iter().map(|p| Value::Object(p.raw.clone())).collect::<Vec<_>>(),
        })
    }
}

/// Identity of a directory entry, to notice changes without reading the file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    name: String,
    ino: u64,
    len: u64,
    mtime: Option<SystemTime>,
}

struct Loaded {
    stamps: Vec<Stamp>,
    list: Option<Arc<NetworkConfigList>>,
}

/// A CNI conf dir, watched cheaply: [`ConfDir::load`] rescans only when something changed.
pub struct ConfDir {
    dir: PathBuf,
    loaded: Mutex<Option<Loaded>>,
}

fn is_candidate(name: &str) -> bool {
    [".conflist", ".conf", ".json"]
        .iter()
        .any(|ext| name.len() > ext.len() && name.ends_with(ext))
}

impl ConfDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ConfDir {
            dir: dir.into(),
            loaded: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Candidate files sorted by name, with their stamps. A missing dir has none.
    fn scan(&self) -> Vec<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut stamps: Vec<Stamp> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                if !is_candidate(&name) {
                    return None;
                }
                // Follow symlinks, as a reader of the file would.
                let md = std::fs::metadata(e.path()).ok()?;
                if !md.is_file() {
                    return None;
                }
                Some(Stamp {
                    name,
                    ino: md.ino(),
                    len: md.len(),
                    mtime: md.modified().ok(),
                })
            })
            .collect();
        stamps.sort_by(|a, b| a.name.cmp(&b.name));
        stamps
    }

    /// The network configuration in effect: the first valid file, re-read if anything changed.
    pub fn load(&self) -> Result<Arc<NetworkConfigList>> {
        let stamps = self.scan();
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(l) = loaded.as_ref().filter(|l| l.stamps == stamps) {
            return l.list.clone().ok_or_else(|| Error::NoNetworkConfig {
                dir: self.dir.clone(),
            });
        }
        let mut found = None;
        for s in &stamps {
            let path = self.dir.join(&s.name);
            match NetworkConfigList::from_file(&path) {
                Ok(list) => {
                    tracing::info!(path = %path.display(), network = %list.name, version = %list.cni_version, "using CNI network config");
                    found = Some(Arc::new(list));
                    break;
                }
                Err(e) => tracing::warn!("skipping CNI config: {e}"),
            }
        }
        if found.is_none() {
            tracing::warn!(dir = %self.dir.display(), "no CNI network config found");
        }
        *loaded = Some(Loaded {
            stamps,
            list: found.clone(),
        });
        found.ok_or_else(|| Error::NoNetworkConfig {
            dir: self.dir.clone(),
        })
    }
}

/// Capability names [`crate::Network`] fills in, for reference.
pub const KNOWN_CAPABILITIES: &[&str] = &[
    "portMappings",
    "bandwidth",
    "dns",
    "io.kubernetes.cri.pod-annotations",
];

/// Builds `runtimeConfig` for one plugin: the capability args it declared, of those given.
pub(crate) fn runtime_config(
    plugin: &PluginConfig,
    args: &BTreeMap<String, Value>,
) -> Map<String, Value> {
    plugin
        .capabilities
        .iter()
        .filter_map(|cap| args.get(cap).map(|v| (cap.clone(), v.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    const LIST: &str = r#"{"cniVersion":"1.0.0","name":"crius-a","plugins":[
        {"type":"bridge","bridge":"crius0","ipam":{"type":"host-local"}},
        {"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false}}]}"#;

    #[test]
    fn versions() {
        assert!(Version::parse("1.1.0").unwrap().has_status_and_gc());
        assert!(!Version::parse("1.0.0").unwrap().has_status_and_gc());
        assert!(Version::parse("0.4.0").unwrap().has_check());
        assert!(!Version::parse("0.3.1").unwrap().has_check());
        assert_eq!(Version::parse("1.0"), Some(Version(1, 0, 0)));
        assert_eq!(Version::parse("x"), None);
        assert_eq!(Version::parse("1.2.3.4"), None);
    }

    #[test]
    fn parses_list() {
        let l = NetworkConfigList::from_conflist(LIST.as_bytes(), Path::new("x")).unwrap();
        assert_eq!(l.name, "crius-a");
        assert_eq!(l.cni_version, "1.0.0");
        assert_eq!(l.plugins.len(), 2);
        assert_eq!(l.plugins[1].plugin_type, "portmap");
        assert_eq!(l.plugins[1].capabilities, vec!["portMappings"]);
        assert_eq!(l.plugins[0].raw["bridge"], "crius0");
        // Round trip through the cache format.
        let again =
            NetworkConfigList::from_conflist(l.to_json().to_string().as_bytes(), Path::new("x"))
                .unwrap();
        assert_eq!(again, l);
    }

    #[test]
    fn picks_highest_supported_version() {
        let l = NetworkConfigList::from_conflist(
            br#"{"cniVersion":"0.4.0","cniVersions":["0.3.1","1.0.0","9.9.9"],"name":"n","plugins":[{"type":"bridge"}]}"#,
            Path::new("x"),
        )
        .unwrap();
        assert_eq!(l.cni_version, "1.0.0");
        let err = NetworkConfigList::from_conflist(
            br#"{"cniVersion":"0.2.0","name":"n","plugins":[{"type":"bridge"}]}"#,
            Path::new("x"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("not supported") || err.to_string().contains("none"));
    }

    #[test]
    fn rejects_invalid() {
        for (doc, want) in [
            ("{", "EOF"),
            ("[]", "not a JSON object"),
            (r#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#, "empty"),
            (r#"{"cniVersion":"1.0.0","name":"n"}"#, "no plugins"),
            (r#"{"cniVersion":"1.0.0","plugins":[{"type":"b"}]}"#, "name"),
            (
                r#"{"cniVersion":"1.0.0","name":"-x","plugins":[{"type":"b"}]}"#,
                "invalid characters",
            ),
            (r#"{"name":"n","plugins":[{"type":"b"}]}"#, "cniVersion"),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"bridge":"x"}]}"#,
                "no type",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"../x"}]}"#,
                "file name",
            ),
        ] {
            let err = NetworkConfigList::from_conflist(doc.as_bytes(), Path::new("f"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{doc}: {err}");
        }
    }

    #[test]
    fn conf_is_wrapped() {
        let l = NetworkConfigList::from_conf(
            br#"{"cniVersion":"0.4.0","name":"single","type":"bridge","capabilities":{"dns":true}}"#,
            Path::new("x.conf"),
        )
        .unwrap();
        assert_eq!(l.name, "single");
        assert_eq!(l.plugins.len(), 1);
        assert_eq!(l.plugins[0].plugin_type, "bridge");
        assert_eq!(l.plugins[0].capabilities, vec!["dns"]);
    }

    #[test]
    fn discovery_takes_lexically_first_valid_file() {
        let dir = tempfile::tempdir().unwrap();
        let conf = ConfDir::new(dir.path());
        let err = conf.load().unwrap_err();
        assert!(err.is_no_config());
        assert_eq!(
            err.to_string(),
            format!("no network config found in {}", dir.path().display())
        );

        // Not candidates: wrong extension, a directory.
        write(dir.path(), "00-notes.txt", "hello");
        std::fs::create_dir(dir.path().join("01-dir.conflist")).unwrap();
        assert!(conf.load().unwrap_err().is_no_config());

        write(
            dir.path(),
            "20-b.conflist",
            &LIST.replace("crius-a", "crius-b"),
        );
        assert_eq!(conf.load().unwrap().name, "crius-b");

        // A lexically earlier .conf wins, wrapped into a list.
        write(
            dir.path(),
            "10-a.conf",
            r#"{"cniVersion":"0.4.0","name":"crius-conf","type":"bridge"}"#,
        );
        let l = conf.load().unwrap();
        assert_eq!(l.name, "crius-conf");
        assert_eq!(
            l.source.as_deref(),
            Some(dir.path().join("10-a.conf").as_path())
        );

        // An earlier invalid file is skipped.
        write(dir.path(), "05-broken.conflist", "{ nope");
        assert_eq!(conf.load().unwrap().name, "crius-conf");

        // .json counts too, and sorts by full name.
        write(
            dir.path(),
            "07-j.json",
            r#"{"cniVersion":"1.0.0","name":"crius-json","type":"ptp"}"#,
        );
        assert_eq!(conf.load().unwrap().name, "crius-json");

        // Removing files falls back to the next one.
        std::fs::remove_file(dir.path().join("07-j.json")).unwrap();
        std::fs::remove_file(dir.path().join("10-a.conf")).unwrap();
        assert_eq!(conf.load().unwrap().name, "crius-b");
    }

    #[test]
    fn discovery_notices_in_place_edits() {
        let dir = tempfile::tempdir().unwrap();
        let conf = ConfDir::new(dir.path());
        write(dir.path(), "10-x.conflist", "{ broken");
        assert!(conf.load().unwrap_err().is_no_config());
        let a = conf.load();
        assert!(a.is_err());
        // Rewriting the same file with a different size is seen without any dir change.
        write(dir.path(), "10-x.conflist", LIST);
        assert_eq!(conf.load().unwrap().name, "crius-a");
        // Unchanged: the same Arc comes back (no re-read).
        let x = conf.load().unwrap();
        let y = conf.load().unwrap();
        assert!(Arc::ptr_eq(&x, &y));
    }

    #[test]
    fn missing_dir_is_no_config() {
        let conf = ConfDir::new("/nonexistent/crius-cni-test");
        assert!(conf.load().unwrap_err().is_no_config());
    }

    #[test]
    fn runtime_config_only_declared_capabilities() {
        let l = NetworkConfigList::from_conflist(LIST.as_bytes(), Path::new("x")).unwrap();
        let mut args = BTreeMap::new();
        args.insert(
            "portMappings".to_string(),
            serde_json::json!([{"hostPort": 1}]),
        );
        args.insert(
            "bandwidth".to_string(),
            serde_json::json!({"ingressRate": 1}),
        );
        assert!(runtime_config(&l.plugins[0], &args).is_empty());
        let rc = runtime_config(&l.plugins[1], &args);
        assert_eq!(rc.len(), 1);
        assert!(rc.contains_key("portMappings"));
    }
}
