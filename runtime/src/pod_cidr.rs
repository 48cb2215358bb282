//! The node's pod CIDR, which kubelet pushes with `UpdateRuntimeConfig` when the node has one
//! (kubeadm's `--pod-network-cidr`, a standalone kubelet's `--pod-cidr`). crius keeps it in
//! `<root>/pod-cidr` across restarts and, when `[cni] conf_template` names a template and the
//! CNI config directory has no network yet, writes one from the template with the CIDR filled
//! in, as containerd does; the network is ready from then on.
//!
//! Placeholders in the template (crius's own, plain text substitution):
//! - `{{.PodCIDR}}`: the first range, e.g. `10.244.1.0/24`;
//! - `{{.PodCIDRRanges}}`: every range as host-local `ranges` (a JSON array of range sets,
//!   `[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:1::/64"}]]`);
//! - `{{.Routes}}`: a default route per address family (`[{"dst":"0.0.0.0/0"}]`, and `::/0`
//!   when there is an IPv6 range).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::daemon::Daemon;
use crate::error::{Error, Result};

/// The file under root that keeps the CIDR.
const FILE: &str = "pod-cidr";
/// The network config written from the template, in `[cni] conf_dir`.
pub const TEMPLATE_OUTPUT: &str = "10-crius-pod-cidr.conflist";

/// The ranges of a `pod_cidr` value: one or two comma-separated CIDRs (dual stack).
pub fn parse(value: &str) -> std::result::Result<Vec<String>, String> {
    let ranges: Vec<String> = value.split(',').map(|r| r.trim().to_string()).collect();
    if ranges.len() > 2 {
        return Err("more than two ranges".into());
    }
    for range in &ranges {
        let (ip, len) = range.split_once('/').ok_or_else(|| {
            format!(
                "{:?} is no CIDR (address/length)",
                crate::util::excerpt(range)
            )
        })?;
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("{:?} is no IP address", crate::util::excerpt(ip)))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        match len.parse::<u8>() {
            Ok(n) if n <= max => {}
            _ => {
                return Err(format!(
                    "{:?} is no prefix length for {ip}",
                    crate::util::excerpt(len)
                ))
            }
        }
    }
    Ok(ranges)
}

/// The template with the placeholders filled in for `ranges`.
pub fn render(template: &str, ranges: &[String]) -> String {
    let sets: Vec<serde_json::Value> = ranges
        .iter()
        .map(|r| serde_json::json!([{ "subnet": r }]))
        .collect();
    let mut routes = vec![serde_json::json!({"dst": "0.0.0.0/0"})];
    if ranges.iter().any(|r| r.contains(':')) {
        routes.push(serde_json::json!({"dst": "::/0"}));
    }
    template
        .replace("{{.PodCIDR}}", ranges.first().map_or("", String::as_str))
        .replace(
            "{{.PodCIDRRanges}}",
            &serde_json::Value::Array(sets).to_string(),
        )
        .replace("{{.Routes}}", &serde_json::Value::Array(routes).to_string())
}

impl Daemon {
    fn pod_cidr_file(&self) -> PathBuf {
        self.config.root.join(FILE)
    }

    /// The CIDR kubelet last pushed, if any.
    pub fn pod_cidr(&self) -> Option<String> {
        std::fs::read_to_string(self.pod_cidr_file())
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    /// Keeps `value` (already parsed into `ranges`) and writes the network config from the
    /// template if that is configured and no network config exists yet.
    pub fn set_pod_cidr(&self, value: &str, ranges: &[String]) -> Result<()> {
        if self.pod_cidr().as_deref() != Some(value) {
            crate::util::write_atomic(&self.pod_cidr_file(), value.as_bytes()).map_err(|e| {
                Error::internal(
                    format!("keep the pod CIDR in {}", self.pod_cidr_file().display()),
                    e,
                )
            })?;
            tracing::info!(pod_cidr = value, "pod CIDR set");
        }
        self.write_network_from_template(ranges)
    }

    /// At start: a CIDR kept from before fills the template if the network is still missing.
    pub fn network_from_kept_cidr(&self) {
        let Some(value) = self.pod_cidr() else {
            return;
        };
        match parse(&value) {
            Ok(ranges) => {
                if let Err(e) = self.write_network_from_template(&ranges) {
                    tracing::warn!(
                        "network config from the template: {}",
                        crate::error::chain(&e)
                    );
                }
            }
            Err(e) => tracing::warn!(file = %self.pod_cidr_file().display(), "kept pod CIDR: {e}"),
        }
    }

    fn write_network_from_template(&self, ranges: &[String]) -> Result<()> {
        let template = &self.config.cni.conf_template;
        if template.as_os_str().is_empty() || self.network.status().is_ok() {
            return Ok(());
        }
        let text = std::fs::read_to_string(template).map_err(|e| {
            Error::FailedPrecondition(format!("[cni] conf_template {}: {e}", template.display()))
        })?;
        let dir = &self.config.cni.conf_dir;
        let out = dir.join(TEMPLATE_OUTPUT);
        write_config(dir, &out, &render(&text, ranges))?;
        tracing::info!(path = %out.display(), "wrote the pod network config from the template");
        Ok(())
    }
}

fn write_config(dir: &Path, out: &Path, text: &str) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::internal(format!("create {}", dir.display()), e))?;
    crate::util::write_atomic(out, text.as_bytes())
        .map_err(|e| Error::internal(format!("write {}", out.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_are_checked() {
        assert_eq!(parse("10.244.1.0/24").unwrap(), ["10.244.1.0/24"]);
        assert_eq!(
            parse("10.244.1.0/24, fd00:1::/64").unwrap(),
            ["10.244.1.0/24", "fd00:1::/64"]
        );
        for bad in [
            "10.244.1.0",
            "10.244.1.0/33",
            "banana/8",
            "fd00::/129",
            "a/1,b/2,c/3",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn placeholders_are_filled() {
        let t = r#"{"subnet":"{{.PodCIDR}}","ranges":{{.PodCIDRRanges}},"routes":{{.Routes}}}"#;
        let v: serde_json::Value = serde_json::from_str(&render(
            t,
            &["10.1.0.0/24".to_string(), "fd00::/64".to_string()],
        ))
        .unwrap();
        assert_eq!(v["subnet"], "10.1.0.0/24");
        assert_eq!(v["ranges"][1][0]["subnet"], "fd00::/64");
        assert_eq!(v["routes"][1]["dst"], "::/0");
    }
}
