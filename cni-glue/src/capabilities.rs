//! Capability arguments (CNI CONVENTIONS.md) that a runtime passes in `runtimeConfig`, in the
//! JSON shapes the plugins expect.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{Error, Result};

/// Pod annotation kubelet uses for ingress shaping (a Kubernetes quantity, bits per second).
pub const INGRESS_BANDWIDTH_ANNOTATION: &str = "kubernetes.io/ingress-bandwidth";
/// Pod annotation kubelet uses for egress shaping (a Kubernetes quantity, bits per second).
pub const EGRESS_BANDWIDTH_ANNOTATION: &str = "kubernetes.io/egress-bandwidth";

/// One `portMappings` entry: a host port forwarded to a port of the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    /// `tcp`, `udp` or `sctp` (lowercase, as the portmap plugin wants).
    pub protocol: String,
    /// The host address to listen on; empty means every address.
    #[serde(rename = "hostIP", skip_serializing_if = "String::is_empty")]
    pub host_ip: String,
}

/// `bandwidth`: rates in bits per second, bursts in bits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bandwidth {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_rate: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_burst: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_rate: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_burst: Option<u64>,
}

/// Burst given with an annotation-derived rate: the annotations carry none, and the bandwidth
/// plugin refuses a rate without a burst. Same value as containerd uses.
const DEFAULT_BURST: u64 = u32::MAX as u64;

impl Bandwidth {
    /// Reads `kubernetes.io/ingress-bandwidth` and `kubernetes.io/egress-bandwidth`; `None`
    /// when neither is set. A malformed value is an error (kubelet rejects such pods too).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Option<Bandwidth>> {
        let get = |key: &str| -> Result<Option<u64>> {
            match annotations.get(key) {
                None => Ok(None),
                Some(v) => parse_quantity(v).map(Some).ok_or_else(|| {
                    Error::InvalidArgument(format!("annotation {key}={v:?} is not a quantity"))
                }),
            }
        };
        let ingress = get(INGRESS_BANDWIDTH_ANNOTATION)?;
        let egress = get(EGRESS_BANDWIDTH_ANNOTATION)?;
        if ingress.is_none() && egress.is_none() {
            return Ok(None);
        }
        Ok(Some(Bandwidth {
            ingress_rate: ingress,
            ingress_burst: ingress.map(|_| DEFAULT_BURST),
            egress_rate: egress,
            egress_burst: egress.map(|_| DEFAULT_BURST),
        }))
    }
}

/// `dns`: what the pod's resolver should use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DnsConfig {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// Parses a Kubernetes quantity (`100k`, `10M`, `1Gi`, `1.5G`, `2e6`) into a whole number,
/// rounding up as `Quantity.Value()` does. `None` if it is not one or is negative.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() {
        return None;
    }
    let mantissa: f64 = num.parse().ok()?;
    let factor: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => 10f64.powi(exp[1..].parse::<i32>().ok()?),
        _ => return None,
    };
    let v = (mantissa * factor).ceil();
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return None;
    }
    Some(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("100"), Some(100));
        assert_eq!(parse_quantity("10M"), Some(10_000_000));
        assert_eq!(parse_quantity("1Gi"), Some(1 << 30));
        assert_eq!(parse_quantity("1.5k"), Some(1500));
        assert_eq!(parse_quantity("2e3"), Some(2000));
        assert_eq!(parse_quantity("1500m"), Some(2));
        for bad in ["", "M", "10X", "-5", "1..2"] {
            assert_eq!(parse_quantity(bad), None, "{bad}");
        }
    }

    #[test]
    fn bandwidth_from_annotations() {
        let mut a = BTreeMap::new();
        assert_eq!(Bandwidth::from_annotations(&a).unwrap(), None);
        a.insert(INGRESS_BANDWIDTH_ANNOTATION.to_string(), "10M".to_string());
        let b = Bandwidth::from_annotations(&a).unwrap().unwrap();
        assert_eq!(b.ingress_rate, Some(10_000_000));
        assert_eq!(b.ingress_burst, Some(u64::from(u32::MAX)));
        assert_eq!(b.egress_rate, None);
        assert_eq!(
            serde_json::to_value(&b).unwrap(),
            serde_json::json!({"ingressRate": 10_000_000u64, "ingressBurst": 4294967295u64})
        );
        a.insert(EGRESS_BANDWIDTH_ANNOTATION.to_string(), "fast".to_string());
        assert!(Bandwidth::from_annotations(&a).is_err());
    }

    #[test]
    fn port_mapping_json() {
        let p = PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: "tcp".into(),
            host_ip: String::new(),
        };
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            serde_json::json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp"})
        );
        let p = PortMapping {
            host_ip: "127.0.0.1".into(),
            ..p
        };
        assert_eq!(serde_json::to_value(&p).unwrap()["hostIP"], "127.0.0.1");
    }
}
