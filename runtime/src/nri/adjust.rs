//! Plugins' `ContainerAdjustment`s: merged with a check that no two plugins set the same
//! field, then applied to the container's OCI spec (as JSON, whose field names are the OCI
//! runtime spec's) before the container is created.
//!
//! A key starting with `-` (an annotation, an env variable, a mount's destination, a device's
//! path, a namespace's type) removes that entry, as NRI defines. Adjustments crius cannot
//! honour (CDI devices, RDT and block I/O classes, I/O priority, scheduling, memory policy,
//! network devices, seccomp policy, a new cgroups path) fail the create rather than being
//! dropped silently.

use std::collections::HashMap;

use crius_api::nri::api;
use serde_json::{json, Map, Value};

/// The adjustments of every plugin, in plugin order.
#[derive(Debug, Default)]
pub struct Merged {
    owners: HashMap<String, String>,
    adjustments: Vec<api::ContainerAdjustment>,
}

impl Merged {
    /// Whether no plugin adjusted anything.
    pub fn is_empty(&self) -> bool {
        self.adjustments.is_empty()
    }

    /// Adds `plugin`'s adjustment; an error names a field another plugin already set, or one
    /// crius cannot honour.
    pub fn add(&mut self, plugin: &str, a: api::ContainerAdjustment) -> Result<(), String> {
        if let Some(what) = unsupported(&a) {
            return Err(format!(
                "NRI plugin {plugin} adjusts {what}, which crius does not support"
            ));
        }
        for field in claims(&a) {
            match self.owners.get(&field) {
                Some(other) if other != plugin => {
                    return Err(format!(
                        "NRI plugins {other} and {plugin} both adjust {field} of the container"
                    ));
                }
                _ => {
                    self.owners.insert(field, plugin.to_string());
                }
            }
        }
        self.adjustments.push(a);
        Ok(())
    }

    /// Applies every adjustment to `spec`.
    pub fn apply(&self, spec: &mut Value) {
        for a in &self.adjustments {
            apply(a, spec);
        }
    }
}

fn unsupported(a: &api::ContainerAdjustment) -> Option<&'static str> {
    if !a.cdi_devices.is_empty() {
        return Some("CDI devices");
    }
    let linux = a.linux.as_ref()?;
    let r = linux.resources.as_ref();
    if r.is_some_and(|r| r.blockio_class.is_some()) {
        return Some("the block I/O class");
    }
    if r.is_some_and(|r| r.rdt_class.is_some()) || linux.rdt.is_some() {
        return Some("the RDT class");
    }
    if linux.io_priority.is_some() {
        return Some("the I/O priority");
    }
    if linux.scheduler.is_some() {
        return Some("the scheduling policy");
    }
    if linux.memory_policy.is_some() {
        return Some("the memory policy");
    }
    if !linux.net_devices.is_empty() {
        return Some("network devices");
    }
    if linux.seccomp_policy.is_some() {
        return Some("the seccomp policy");
    }
    if !linux.cgroups_path.is_empty() {
        return Some("the cgroups path");
    }
    None
}

fn bare(key: &str) -> &str {
    key.strip_prefix('-').unwrap_or(key)
}

/// The fields `a` sets, one name each, for the conflict check.
fn claims(a: &api::ContainerAdjustment) -> Vec<String> {
    let mut out = Vec::new();
    out.extend(
        a.annotations
            .keys()
            .map(|k| format!("annotation {}", bare(k))),
    );
    out.extend(
        a.mounts
            .iter()
            .map(|m| format!("mount {}", bare(&m.destination))),
    );
    out.extend(a.env.iter().map(|e| format!("env {}", bare(&e.key))));
    if !a.args.is_empty() {
        out.push("args".into());
    }
    out.extend(a.rlimits.iter().map(|r| format!("rlimit {}", r.r#type)));
    let Some(linux) = &a.linux else {
        return out;
    };
    out.extend(
        linux
            .devices
            .iter()
            .map(|d| format!("device {}", bare(&d.path))),
    );
    out.extend(linux.sysctl.keys().map(|k| format!("sysctl {}", bare(k))));
    out.extend(
        linux
            .namespaces
            .iter()
            .map(|n| format!("namespace {}", bare(&n.r#type))),
    );
    if linux.oom_score_adj.is_some() {
        out.push("oom_score_adj".into());
    }
    if let Some(r) = &linux.resources {
        if let Some(m) = &r.memory {
            for (set, name) in [
                (m.limit.is_some(), "memory limit"),
                (m.reservation.is_some(), "memory reservation"),
                (m.swap.is_some(), "memory swap limit"),
                (m.kernel.is_some(), "kernel memory limit"),
                (m.kernel_tcp.is_some(), "kernel TCP memory limit"),
                (m.swappiness.is_some(), "memory swappiness"),
                (m.disable_oom_killer.is_some(), "OOM killer"),
            ] {
                if set {
                    out.push(name.into());
                }
            }
        }
        if let Some(c) = &r.cpu {
            for (set, name) in [
                (c.shares.is_some(), "CPU shares"),
                (c.quota.is_some(), "CPU quota"),
                (c.period.is_some(), "CPU period"),
                (c.realtime_runtime.is_some(), "CPU realtime runtime"),
                (c.realtime_period.is_some(), "CPU realtime period"),
                (!c.cpus.is_empty(), "cpuset CPUs"),
                (!c.mems.is_empty(), "cpuset memory nodes"),
            ] {
                if set {
                    out.push(name.into());
                }
            }
        }
        out.extend(
            r.hugepage_limits
                .iter()
                .map(|h| format!("hugepage limit {}", h.page_size)),
        );
        out.extend(r.unified.keys().map(|k| format!("cgroup file {k}")));
        if r.pids.is_some() {
            out.push("pids limit".into());
        }
    }
    out
}

/// The object at `key` of `v`, made if missing (or not an object).
fn obj<'a>(v: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !v.is_object() {
        *v = json!({});
    }
    let Value::Object(map) = v else {
        unreachable!("made an object above")
    };
    let entry = map.entry(key.to_string()).or_insert_with(|| json!({}));
    if !entry.is_object() {
        *entry = json!({});
    }
    let Value::Object(inner) = entry else {
        unreachable!("made an object above")
    };
    inner
}

/// The array at `key` of `map`, made if missing.
fn arr<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Vec<Value> {
    let entry = map.entry(key.to_string()).or_insert_with(|| json!([]));
    if !entry.is_array() {
        *entry = json!([]);
    }
    let Value::Array(a) = entry else {
        unreachable!("made an array above")
    };
    a
}

fn apply(a: &api::ContainerAdjustment, spec: &mut Value) {
    if !spec.is_object() {
        *spec = json!({});
    }
    let annotations = obj(spec, "annotations");
    for (k, v) in &a.annotations {
        match k.strip_prefix('-') {
            Some(k) => {
                annotations.remove(k);
            }
            None => {
                annotations.insert(k.clone(), json!(v));
            }
        }
    }
    if let Value::Object(root) = spec {
        let mounts = arr(root, "mounts");
        for m in &a.mounts {
            let dest = bare(&m.destination);
            mounts.retain(|x| x["destination"].as_str() != Some(dest));
            if !m.destination.starts_with('-') {
                mounts.push(json!({
                    "destination": m.destination,
                    "type": m.r#type,
                    "source": m.source,
                    "options": m.options,
                }));
            }
        }
    }
    let process = obj(spec, "process");
    if !a.env.is_empty() {
        let env = arr(process, "env");
        for kv in &a.env {
            let key = bare(&kv.key);
            let prefix = format!("{key}=");
            env.retain(|e| !e.as_str().is_some_and(|e| e.starts_with(&prefix)));
            if !kv.key.starts_with('-') {
                env.push(json!(format!("{key}={}", kv.value)));
            }
        }
    }
    if !a.args.is_empty() {
        process.insert("args".into(), json!(a.args));
    }
    if !a.rlimits.is_empty() {
        let rlimits = arr(process, "rlimits");
        for r in &a.rlimits {
            rlimits.retain(|x| x["type"].as_str() != Some(r.r#type.as_str()));
            rlimits.push(json!({"type": r.r#type, "hard": r.hard, "soft": r.soft}));
        }
    }
    if let Some(linux) = &a.linux {
        if let Some(v) = &linux.oom_score_adj {
            process.insert("oomScoreAdj".into(), json!(v.value));
        }
    }
    if let Some(h) = &a.hooks {
        let hooks = obj(spec, "hooks");
        for (key, list) in [
            ("prestart", &h.prestart),
            ("createRuntime", &h.create_runtime),
            ("createContainer", &h.create_container),
            ("startContainer", &h.start_container),
            ("poststart", &h.poststart),
            ("poststop", &h.poststop),
        ] {
            for hook in list {
                let mut v = json!({"path": hook.path});
                if !hook.args.is_empty() {
                    v["args"] = json!(hook.args);
                }
                if !hook.env.is_empty() {
                    v["env"] = json!(hook.env);
                }
                if let Some(t) = &hook.timeout {
                    v["timeout"] = json!(t.value);
                }
                arr(hooks, key).push(v);
            }
        }
    }
    let Some(adj) = &a.linux else {
        return;
    };
    let linux = obj(spec, "linux");
    for d in &adj.devices {
        let path = bare(&d.path);
        arr(linux, "devices").retain(|x| x["path"].as_str() != Some(path));
        if d.path.starts_with('-') {
            continue;
        }
        let mut dev = json!({"path": d.path, "type": d.r#type, "major": d.major, "minor": d.minor});
        if let Some(m) = &d.file_mode {
            dev["fileMode"] = json!(m.value);
        }
        if let Some(u) = &d.uid {
            dev["uid"] = json!(u.value);
        }
        if let Some(g) = &d.gid {
            dev["gid"] = json!(g.value);
        }
        arr(linux, "devices").push(dev);
        let rule = json!({"allow": true, "type": d.r#type, "major": d.major, "minor": d.minor, "access": "rwm"});
        let resources = linux
            .entry("resources".to_string())
            .or_insert_with(|| json!({}));
        if let Value::Object(r) = resources {
            arr(r, "devices").push(rule);
        }
    }
    if !adj.sysctl.is_empty() {
        let sysctl = linux
            .entry("sysctl".to_string())
            .or_insert_with(|| json!({}));
        if let Value::Object(s) = sysctl {
            for (k, v) in &adj.sysctl {
                match k.strip_prefix('-') {
                    Some(k) => {
                        s.remove(k);
                    }
                    None => {
                        s.insert(k.clone(), json!(v));
                    }
                }
            }
        }
    }
    for n in &adj.namespaces {
        let kind = bare(&n.r#type);
        let list = arr(linux, "namespaces");
        list.retain(|x| x["type"].as_str() != Some(kind));
        if !n.r#type.starts_with('-') {
            let mut ns = json!({"type": n.r#type});
            if !n.path.is_empty() {
                ns["path"] = json!(n.path);
            }
            list.push(ns);
        }
    }
    if let Some(r) = &adj.resources {
        let resources = linux
            .entry("resources".to_string())
            .or_insert_with(|| json!({}));
        if let Value::Object(res) = resources {
            apply_resources(r, res);
        }
    }
}

/// NRI resources over OCI `linux.resources`.
pub fn apply_resources(r: &api::LinuxResources, res: &mut Map<String, Value>) {
    let mut set = |section: &str, key: &str, value: Option<Value>| {
        if let Some(v) = value {
            let s = res.entry(section.to_string()).or_insert_with(|| json!({}));
            if !s.is_object() {
                *s = json!({});
            }
            s[key] = v;
        }
    };
    if let Some(m) = &r.memory {
        set("memory", "limit", m.limit.as_ref().map(|v| json!(v.value)));
        set(
            "memory",
            "reservation",
            m.reservation.as_ref().map(|v| json!(v.value)),
        );
        set("memory", "swap", m.swap.as_ref().map(|v| json!(v.value)));
        set(
            "memory",
            "kernel",
            m.kernel.as_ref().map(|v| json!(v.value)),
        );
        set(
            "memory",
            "kernelTCP",
            m.kernel_tcp.as_ref().map(|v| json!(v.value)),
        );
        set(
            "memory",
            "swappiness",
            m.swappiness.as_ref().map(|v| json!(v.value)),
        );
        set(
            "memory",
            "disableOOMKiller",
            m.disable_oom_killer.as_ref().map(|v| json!(v.value)),
        );
    }
    if let Some(c) = &r.cpu {
        set("cpu", "shares", c.shares.as_ref().map(|v| json!(v.value)));
        set("cpu", "quota", c.quota.as_ref().map(|v| json!(v.value)));
        set("cpu", "period", c.period.as_ref().map(|v| json!(v.value)));
        set(
            "cpu",
            "realtimeRuntime",
            c.realtime_runtime.as_ref().map(|v| json!(v.value)),
        );
        set(
            "cpu",
            "realtimePeriod",
            c.realtime_period.as_ref().map(|v| json!(v.value)),
        );
        set("cpu", "cpus", (!c.cpus.is_empty()).then(|| json!(c.cpus)));
        set("cpu", "mems", (!c.mems.is_empty()).then(|| json!(c.mems)));
    }
    if let Some(p) = &r.pids {
        set("pids", "limit", Some(json!(p.limit)));
    }
    if !r.hugepage_limits.is_empty() {
        let list = arr(res, "hugepageLimits");
        for h in &r.hugepage_limits {
            list.retain(|x| x["pageSize"].as_str() != Some(h.page_size.as_str()));
            list.push(json!({"pageSize": h.page_size, "limit": h.limit}));
        }
    }
    if !r.unified.is_empty() {
        let u = res
            .entry("unified".to_string())
            .or_insert_with(|| json!({}));
        if let Value::Object(u) = u {
            for (k, v) in &r.unified {
                u.insert(k.clone(), json!(v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(key: &str, value: &str) -> api::KeyValue {
        api::KeyValue {
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn env_mounts_and_cpu_limits_reach_the_spec() {
        let mut spec = json!({
            "process": {"env": ["PATH=/bin", "OLD=1"], "args": ["sh"]},
            "mounts": [{"destination": "/data", "type": "bind", "source": "/a"}],
            "linux": {"resources": {"cpu": {"shares": 2}}}
        });
        let mut m = Merged::default();
        m.add(
            "10-a",
            api::ContainerAdjustment {
                env: vec![env("NRI", "yes"), env("-OLD", "")],
                mounts: vec![api::Mount {
                    destination: "/data".into(),
                    r#type: "bind".into(),
                    source: "/b".into(),
                    options: vec!["rbind".into(), "ro".into()],
                }],
                linux: Some(api::LinuxContainerAdjustment {
                    resources: Some(api::LinuxResources {
                        cpu: Some(api::LinuxCpu {
                            quota: Some(api::OptionalInt64 { value: 20000 }),
                            period: Some(api::OptionalUInt64 { value: 100000 }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .unwrap();
        m.apply(&mut spec);
        assert_eq!(spec["process"]["env"], json!(["PATH=/bin", "NRI=yes"]));
        assert_eq!(spec["mounts"][0]["source"], "/b");
        assert_eq!(spec["mounts"].as_array().unwrap().len(), 1);
        assert_eq!(spec["linux"]["resources"]["cpu"]["quota"], 20000);
        assert_eq!(spec["linux"]["resources"]["cpu"]["shares"], 2);
    }

    #[test]
    fn two_plugins_setting_one_field_is_an_error_naming_both() {
        let a = || api::ContainerAdjustment {
            env: vec![env("X", "1")],
            ..Default::default()
        };
        let mut m = Merged::default();
        m.add("10-a", a()).unwrap();
        let err = m.add("20-b", a()).unwrap_err();
        assert!(
            err.contains("10-a") && err.contains("20-b") && err.contains("env X"),
            "{err}"
        );
    }

    #[test]
    fn what_crius_cannot_do_is_refused() {
        let mut m = Merged::default();
        let err = m
            .add(
                "10-a",
                api::ContainerAdjustment {
                    cdi_devices: vec![api::CdiDevice {
                        name: "vendor.com/gpu=0".into(),
                    }],
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(err.contains("CDI"), "{err}");
    }
}
