//! The API the pod sandbox code calls: attach a pod to the node's network and detach it again.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::cache::{Attachment, Cache, KIND};
use crate::capabilities::{Bandwidth, DnsConfig, PortMapping};
use crate::config::{runtime_config, ConfDir, NetworkConfigList, PluginConfig};
use crate::error::{Error, Result};
use crate::exec::{AttachmentParams, Command, Exec};
use crate::netns;
use crate::result::AddResult;

/// Name of the built-in loopback network (attached with ifname `lo` before the pod network).
pub const LOOPBACK_NETWORK: &str = "crius-loopback";

/// Where things are and how long a plugin may take.
#[derive(Debug, Clone)]
pub struct NetworkOptions {
    /// The CNI conf dir (kubelet's `/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// Where plugin binaries are looked up, in order; also `CNI_PATH`.
    pub bin_dirs: Vec<PathBuf>,
    /// Where attachments are recorded between ADD and DEL. Must survive a daemon restart
    /// (and, since IPAM stores like host-local's survive reboots, preferably a reboot too).
    pub cache_dir: PathBuf,
    /// Each plugin call is killed after this long.
    pub plugin_timeout: Duration,
    /// The pod's interface name (`CNI_IFNAME`).
    pub ifname: String,
    /// Also attach the pod to a built-in network with the `loopback` plugin (ifname `lo`), as
    /// containerd does. Off by default: [`crate::netns::create`] already brings `lo` up, which
    /// saves a plugin run (~15-20 ms here). Turn it on for a netns made by something else.
    pub loopback: bool,
}

impl Default for NetworkOptions {
    fn default() -> Self {
        NetworkOptions {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
            cache_dir: PathBuf::from("/var/lib/crius/cni"),
            plugin_timeout: Duration::from_secs(60),
            ifname: "eth0".to_string(),
            loopback: false,
        }
    }
}

/// A pod, as far as its network is concerned.
#[derive(Debug, Clone, Default)]
pub struct PodNetwork {
    /// The sandbox id (`CNI_CONTAINERID`, `K8S_POD_INFRA_CONTAINER_ID`).
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// The pinned netns (see [`crate::netns::create`]).
    pub netns_path: PathBuf,
    /// From `PodSandboxConfig.port_mappings`; entries with host port 0 are not forwarded.
    pub port_mappings: Vec<PortMapping>,
    /// Traffic shaping; see [`Bandwidth::from_annotations`].
    pub bandwidth: Option<Bandwidth>,
    /// From `PodSandboxConfig.dns_config`.
    pub dns: Option<DnsConfig>,
    /// The pod's annotations (`io.kubernetes.cri.pod-annotations` capability).
    pub annotations: BTreeMap<String, String>,
    /// The pod's cgroup parent (`cgroupPath` capability), if known.
    pub cgroup_path: Option<String>,
}

impl PodNetwork {
    /// `CNI_ARGS` as kubelet-era runtimes pass them.
    fn cni_args(&self) -> Vec<(String, String)> {
        vec![
            ("IgnoreUnknown".into(), "1".into()),
            ("K8S_POD_NAMESPACE".into(), self.namespace.clone()),
            ("K8S_POD_NAME".into(), self.name.clone()),
            ("K8S_POD_INFRA_CONTAINER_ID".into(), self.id.clone()),
            ("K8S_POD_UID".into(), self.uid.clone()),
        ]
    }

    /// Capability args; a plugin only sees those it declared.
    fn capability_args(&self) -> BTreeMap<String, Value> {
        let mut args = BTreeMap::new();
        let ports: Vec<&PortMapping> = self
            .port_mappings
            .iter()
            .filter(|p| p.host_port != 0)
            .collect();
        if !ports.is_empty() {
            args.insert("portMappings".into(), serde_json::json!(ports));
        }
        if let Some(b) = &self.bandwidth {
            args.insert("bandwidth".into(), serde_json::json!(b));
        }
        if let Some(d) = &self.dns {
            args.insert("dns".into(), serde_json::json!(d));
        }
        args.insert(
            "io.kubernetes.cri.pod-annotations".into(),
            serde_json::json!(self.annotations),
        );
        if let Some(c) = &self.cgroup_path {
            args.insert("cgroupPath".into(), Value::String(c.clone()));
        }
        args
    }
}

/// What [`Network::status`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkStatus {
    pub network: String,
    pub cni_version: String,
    pub source: Option<PathBuf>,
}

/// The node's pod network: config discovery, plugin execution and the attachment cache.
///
/// Cheap to share (`Arc<Network>`); every method takes `&self`. Calls for different pods may run
/// concurrently; the caller serializes calls for one pod, and must not run [`Network::gc`]
/// concurrently with setup/teardown (CNI spec, "Lifecycle & Ordering").
pub struct Network {
    opts: NetworkOptions,
    conf: ConfDir,
    exec: Exec,
    cache: Cache,
}

fn check_container_id(id: &str) -> Result<()> {
    let ok = id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "container id {id:?} must be alphanumeric, '_', '.' or '-', starting alphanumeric"
        )))
    }
}

fn loopback_list() -> NetworkConfigList {
    let mut raw = Map::new();
    raw.insert("type".into(), Value::String("loopback".into()));
    NetworkConfigList {
        name: LOOPBACK_NETWORK.into(),
        // The oldest version with today's result shape: any loopback plugin speaks it.
        cni_version: "0.3.1".into(),
        disable_check: false,
        disable_gc: true,
        plugins: vec![PluginConfig {
            plugin_type: "loopback".into(),
            capabilities: Vec::new(),
            raw,
        }],
        source: None,
    }
}

/// The request configuration for one plugin (spec section 3, "Deriving request configuration").
fn request_config(
    list: &NetworkConfigList,
    plugin: &PluginConfig,
    prev_result: Option<&Value>,
    capability_args: Option<&BTreeMap<String, Value>>,
    extra: Option<(&str, Value)>,
) -> Vec<u8> {
    let mut conf = plugin.raw.clone();
    conf.retain(|k, _| !k.starts_with("cni.dev/") && k != "capabilities");
    conf.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
    conf.insert("name".into(), Value::String(list.name.clone()));
    conf.remove("runtimeConfig");
    conf.remove("prevResult");
    if let Some(args) = capability_args {
        let rc = runtime_config(plugin, args);
        if !rc.is_empty() {
            conf.insert("runtimeConfig".into(), Value::Object(rc));
        }
    }
    if let Some(prev) = prev_result {
        conf.insert("prevResult".into(), prev.clone());
    }
    if let Some((k, v)) = extra {
        conf.insert(k.into(), v);
    }
    // Serializing a map of JSON values cannot fail.
    serde_json::to_vec(&Value::Object(conf)).unwrap_or_default()
}

impl Network {
    /// Sets up the network side; reads nothing yet (config is loaded on each use).
    pub fn new(opts: NetworkOptions) -> Self {
        Network {
            conf: ConfDir::new(opts.conf_dir.clone()),
            exec: Exec {
                bin_dirs: opts.bin_dirs.clone(),
                timeout: opts.plugin_timeout,
            },
            cache: Cache::new(opts.cache_dir.clone()),
            opts,
        }
    }

    pub fn options(&self) -> &NetworkOptions {
        &self.opts
    }

    /// The network configuration in effect now (re-read if the conf dir changed).
    pub fn config(&self) -> Result<Arc<NetworkConfigList>> {
        self.conf.load()
    }

    /// Attaches the pod: the loopback network (if enabled), then the configured network, with
    /// CNI ADD. Returns the pod network's result.
    ///
    /// Every attachment is recorded in the cache dir before its first plugin runs. If ADD fails,
    /// what was attached is detached again before the error is returned; should that DEL fail
    /// too, the records stay and a later [`Network::teardown`] retries. So: after any `setup`,
    /// successful or not, `teardown` is what releases everything, and it is always safe to call.
    /// Dropping the future (say on the client's deadline) kills the plugin that is running and
    /// leaves the record for `teardown` likewise.
    pub async fn setup(&self, pod: &PodNetwork) -> Result<AddResult> {
        check_container_id(&pod.id)?;
        let list = self.conf.load()?;
        let res = self.setup_lists(pod, &list).await;
        if let Err(e) = &res {
            tracing::warn!(pod = %pod.id, "CNI ADD failed, undoing: {e}");
            if let Err(del) = self.teardown(&pod.id).await {
                tracing::error!(pod = %pod.id, "undoing a failed CNI ADD failed, teardown must be retried: {del}");
            }
        }
        res
    }

    async fn setup_lists(&self, pod: &PodNetwork, list: &NetworkConfigList) -> Result<AddResult> {
        if self.opts.loopback {
            self.attach(pod, &loopback_list(), "lo", 0).await?;
        }
        self.attach(pod, list, &self.opts.ifname, 1).await
    }

    async fn attach(
        &self,
        pod: &PodNetwork,
        list: &NetworkConfigList,
        ifname: &str,
        seq: u32,
    ) -> Result<AddResult> {
        let mut record = Attachment {
            kind: KIND.into(),
            container_id: pod.id.clone(),
            network: list.name.clone(),
            ifname: ifname.into(),
            seq,
            netns: pod.netns_path.to_string_lossy().into_owned(),
            cni_args: pod.cni_args(),
            capability_args: pod.capability_args(),
            config: list.to_json(),
            result: None,
        };
        self.cache.write(&record)?;
        let params = AttachmentParams {
            container_id: record.container_id.clone(),
            netns: record.netns.clone(),
            ifname: record.ifname.clone(),
            args: record.cni_args.clone(),
        };
        let mut prev: Option<Value> = None;
        let mut last = "";
        for plugin in &list.plugins {
            let stdin = request_config(
                list,
                plugin,
                prev.as_ref(),
                Some(&record.capability_args),
                None,
            );
            let out = self
                .exec
                .run(&plugin.plugin_type, Command::Add, &params, &stdin)
                .await?;
            let value: Value = serde_json::from_slice(&out).map_err(|e| Error::InvalidResult {
                plugin: plugin.plugin_type.clone(),
                command: "ADD",
                reason: e.to_string(),
            })?;
            prev = Some(value);
            last = &plugin.plugin_type;
        }
        let final_result = prev.unwrap_or(Value::Object(Map::new()));
        let parsed =
            AddResult::from_value(&final_result).map_err(|reason| Error::InvalidResult {
                plugin: last.to_string(),
                command: "ADD",
                reason,
            })?;
        record.result = Some(final_result);
        self.cache.write(&record)?;
        Ok(parsed)
    }

    /// Detaches the pod with CNI DEL, newest attachment first, each with the configuration, args
    /// and ADD result recorded at setup (so it works after a conf change, a daemon restart, a
    /// half-failed ADD, or with the netns already gone). A record is removed only after its DEL
    /// succeeded. Idempotent: with nothing recorded it does nothing and succeeds.
    pub async fn teardown(&self, id: &str) -> Result<()> {
        check_container_id(id)?;
        let mut records = self.cache.list(id)?;
        records.reverse();
        for record in records {
            self.detach(&record).await?;
            self.release_blank_reservations(&record);
            self.cache.remove(&record)?;
        }
        Ok(())
    }

    /// After a reboot, before any ADD of this boot: host-local's empty reservations in the
    /// stores of every recorded attachment's network (host-local leaves them unsynced). Returns the
    /// files removed.
    pub fn release_blank_reservations_after_reboot(&self) -> Vec<PathBuf> {
        let mut lists = Vec::new();
        for id in self.cache.container_ids().unwrap_or_default() {
            for record in self.cache.list(&id).unwrap_or_default() {
                if let Ok(list) = self.record_list(&record) {
                    lists.push(list);
                }
            }
        }
        crate::host_local::release_all_blank(&lists)
    }

    /// After a successful DEL: host-local reservations of the attachment's addresses that a
    /// power loss left empty, which host-local's DEL cannot match (see [`crate::host_local`]).
    fn release_blank_reservations(&self, record: &Attachment) {
        let (Ok(list), Some(Ok(result))) = (
            self.record_list(record),
            record.result.as_ref().map(AddResult::from_value),
        ) else {
            return;
        };
        for file in crate::host_local::release_blank(&list, &result) {
            tracing::info!(
                container = %record.container_id,
                file = %file.display(),
                "removed host-local's empty reservation of the pod's address (a power loss cut its write)"
            );
        }
    }

    fn record_list(&self, record: &Attachment) -> Result<NetworkConfigList> {
        let path = self.cache.dir().join(&record.container_id);
        let bytes = serde_json::to_vec(&record.config).unwrap_or_default();
        let mut list = NetworkConfigList::from_conflist(&bytes, &path)?;
        list.source = None;
        Ok(list)
    }

    fn record_params(record: &Attachment) -> AttachmentParams {
        // A netns that is gone is passed as "": plugins then skip what happens inside it and
        // still release host-side state (IPAM, iptables).
        let netns = if netns::is_netns(Path::new(&record.netns)) {
            record.netns.clone()
        } else {
            String::new()
        };
        AttachmentParams {
            container_id: record.container_id.clone(),
            netns,
            ifname: record.ifname.clone(),
            args: record.cni_args.clone(),
        }
    }

    async fn detach(&self, record: &Attachment) -> Result<()> {
        let list = self.record_list(record)?;
        let params = Self::record_params(record);
        // prevResult on DEL came with 0.4.0.
        let prev = record
            .result
            .as_ref()
            .filter(|_| list.version().has_check());
        // Every plugin gets its DEL even when one before it fails: a chain whose ADD failed at
        // a missing or broken plugin would otherwise never reach the IPAM plugin's DEL, and
        // the pod's address would be held for good. The first error is returned (so the
        // attachment stays recorded and is retried); the plugins that succeeded succeed again
        // on the retry, as DEL must be idempotent.
        let mut first_err = None;
        for plugin in list.plugins.iter().rev() {
            let stdin = request_config(&list, plugin, prev, Some(&record.capability_args), None);
            if let Err(e) = self
                .exec
                .run(&plugin.plugin_type, Command::Del, &params, &stdin)
                .await
            {
                // A plugin that is not installed cannot be asked to undo anything, now or on a
                // retry: keeping the attachment for it would only keep retrying forever.
                if matches!(e, Error::PluginNotFound { .. }) {
                    tracing::warn!(plugin = %plugin.plugin_type, "DEL skipped: {e}");
                    continue;
                }
                tracing::warn!(plugin = %plugin.plugin_type, "DEL failed, continuing with the rest of the chain: {e}");
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The recorded result of the pod network's ADD, if setup completed (useful after a daemon
    /// restart to report the pod's IPs).
    pub fn cached_result(&self, id: &str) -> Result<Option<AddResult>> {
        check_container_id(id)?;
        let records = self.cache.list(id)?;
        let Some(main) = records.iter().rev().find(|r| r.network != LOOPBACK_NETWORK) else {
            return Ok(None);
        };
        match &main.result {
            None => Ok(None),
            Some(v) => AddResult::from_value(v)
                .map(Some)
                .map_err(|reason| Error::InvalidConfig {
                    path: self.cache.dir().join(id),
                    reason,
                }),
        }
    }

    /// Runs CNI CHECK for each completed attachment of the pod whose config version has CHECK
    /// (≥ 0.4.0) and does not set `disableCheck`.
    pub async fn check(&self, id: &str) -> Result<()> {
        check_container_id(id)?;
        for record in self.cache.list(id)? {
            let list = self.record_list(&record)?;
            let Some(result) = record.result.as_ref() else {
                return Err(Error::InvalidArgument(format!(
                    "pod {id}: network {} was never completely added",
                    list.name
                )));
            };
            if !list.version().has_check() || list.disable_check {
                continue;
            }
            let params = Self::record_params(&record);
            for plugin in &list.plugins {
                let stdin = request_config(
                    &list,
                    plugin,
                    Some(result),
                    Some(&record.capability_args),
                    None,
                );
                self.exec
                    .run(&plugin.plugin_type, Command::Check, &params, &stdin)
                    .await?;
            }
        }
        Ok(())
    }

    /// Whether the network is ready, cheaply: a valid config is present in the conf dir (else
    /// [`Error::NoNetworkConfig`], "no network config found in DIR"). Costs a `readdir` and a
    /// `stat` per config file (the config is re-read only when something changed), so it suits
    /// CRI `Status`, which kubelet calls every few seconds. Runs no plugin.
    pub fn status(&self) -> Result<NetworkStatus> {
        let list = self.conf.load()?;
        Ok(NetworkStatus {
            network: list.name.clone(),
            cni_version: list.cni_version.clone(),
            source: list.source.clone(),
        })
    }

    /// [`Network::status`], and for a ≥ 1.1.0 config also CNI STATUS on every plugin (they
    /// answer codes 50/51 when they cannot serve ADD). Runs one process per plugin.
    pub async fn plugin_status(&self) -> Result<NetworkStatus> {
        let list = self.conf.load()?;
        if list.version().has_status_and_gc() {
            for plugin in &list.plugins {
                let stdin = request_config(&list, plugin, None, None, None);
                self.exec
                    .run(
                        &plugin.plugin_type,
                        Command::Status,
                        &AttachmentParams::default(),
                        &stdin,
                    )
                    .await?;
            }
        }
        Ok(NetworkStatus {
            network: list.name.clone(),
            cni_version: list.cni_version.clone(),
            source: list.source.clone(),
        })
    }

    /// Garbage collection: detaches (DEL) every recorded pod not in `valid_ids`, then, for a
    /// ≥ 1.1.0 config without `disableGC`, sends GC with the still valid attachments to every
    /// plugin. Errors of independent steps are all collected into [`Error::Multiple`].
    pub async fn gc(&self, valid_ids: &HashSet<String>) -> Result<()> {
        let mut errors = Vec::new();
        for id in self.cache.container_ids()? {
            if valid_ids.contains(&id) || check_container_id(&id).is_err() {
                continue;
            }
            tracing::info!(pod = %id, "CNI GC: tearing down a stale attachment");
            if let Err(e) = self.teardown(&id).await {
                errors.push(e);
            }
        }
        match self.conf.load() {
            Ok(list) if list.version().has_status_and_gc() && !list.disable_gc => {
                let mut valid = Vec::new();
                for id in self.cache.container_ids()? {
                    for r in self.cache.list(&id).unwrap_or_default() {
                        if r.network == list.name {
                            valid.push(serde_json::json!({"containerID": r.container_id, "ifname": r.ifname}));
                        }
                    }
                }
                for plugin in &list.plugins {
                    let stdin = request_config(
                        &list,
                        plugin,
                        None,
                        None,
                        Some(("cni.dev/valid-attachments", Value::Array(valid.clone()))),
                    );
                    if let Err(e) = self
                        .exec
                        .run(
                            &plugin.plugin_type,
                            Command::Gc,
                            &AttachmentParams::default(),
                            &stdin,
                        )
                        .await
                    {
                        errors.push(e);
                    }
                }
            }
            Ok(_) => {}
            Err(e) if e.is_no_config() => {}
            Err(e) => errors.push(e),
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Multiple(errors)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids() {
        assert!(check_container_id("abc-1_2.3").is_ok());
        for bad in ["", "-a", "a/b", "a b", "../x"] {
            assert!(check_container_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn request_config_injects_and_strips() {
        let list = NetworkConfigList::from_conflist(
            br#"{"cniVersion":"1.0.0","name":"net","plugins":[
                {"type":"portmap","capabilities":{"portMappings":true},"snat":true,
                 "cni.dev/x":1,"runtimeConfig":{"stale":1},"name":"wrong","cniVersion":"0.1.0"}]}"#,
            Path::new("x"),
        )
        .unwrap();
        let pod = PodNetwork {
            id: "p".into(),
            port_mappings: vec![
                PortMapping {
                    host_port: 8080,
                    container_port: 80,
                    protocol: "tcp".into(),
                    host_ip: String::new(),
                },
                PortMapping {
                    host_port: 0,
                    container_port: 81,
                    protocol: "tcp".into(),
                    host_ip: String::new(),
                },
            ],
            dns: Some(DnsConfig::default()),
            ..Default::default()
        };
        let prev = serde_json::json!({"cniVersion": "1.0.0", "ips": []});
        let bytes = request_config(
            &list,
            &list.plugins[0],
            Some(&prev),
            Some(&pod.capability_args()),
            None,
        );
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["name"], "net");
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["snat"], true);
        assert_eq!(v["prevResult"], prev);
        assert!(v.get("capabilities").is_none());
        assert!(v.get("cni.dev/x").is_none());
        // Only the declared capability, and only mappings with a host port.
        assert_eq!(
            v["runtimeConfig"],
            serde_json::json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
        );
    }

    #[test]
    fn cni_args_for_kubernetes() {
        let pod = PodNetwork {
            id: "sb1".into(),
            name: "web".into(),
            namespace: "default".into(),
            uid: "u-1".into(),
            ..Default::default()
        };
        assert_eq!(
            crate::exec::format_args(&pod.cni_args()),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=sb1;K8S_POD_UID=u-1"
        );
    }
}
