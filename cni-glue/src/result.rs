//! Typed CNI ADD results (spec section 5, "ADD Success"), in the 0.3.x/0.4.0 and 1.x shapes.
//!
//! The two shapes differ only in small ways: 0.3.x/0.4.0 `ips` entries carry a `version`
//! ("4"/"6") that 1.0.0 dropped, and 1.1.0 added interface `socketPath`/`pciID` and route
//! `mtu`/`advmss`/`priority`/`table`/`scope`. Everything optional is optional here too, so one
//! parser reads all of them.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An address with a prefix length, as in `10.88.0.5/24` (the address keeps its host bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not in CIDR notation"))?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} has an invalid address"))?;
        let prefix_len: u8 = prefix
            .parse()
            .map_err(|_| format!("{s:?} has an invalid prefix length"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(format!("{s:?} has a prefix length over {max}"));
        }
        Ok(IpNet { addr, prefix_len })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl Serialize for IpNet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// An interface created by the attachment (`interfaces[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Interface {
    pub name: String,
    pub mac: Option<String>,
    pub mtu: Option<u32>,
    /// The netns path for interfaces inside the pod; `None` for host-side interfaces.
    pub sandbox: Option<String>,
    pub socket_path: Option<String>,
    pub pci_id: Option<String>,
}

/// An address assigned by the attachment (`ips[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpConfig {
    pub address: IpNet,
    pub gateway: Option<IpAddr>,
    /// Index into [`AddResult::interfaces`].
    pub interface: Option<usize>,
}

/// A route created by the attachment (`routes[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Route {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
    pub scope: Option<u32>,
}

/// DNS settings the network knows of (`dns`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Dns {
    pub nameservers: Vec<String>,
    pub domain: Option<String>,
    pub search: Vec<String>,
    pub options: Vec<String>,
}

/// The result of a successful ADD of a whole network configuration list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AddResult {
    /// The version the plugin answered in.
    pub cni_version: String,
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawResult {
    #[serde(default)]
    cni_version: String,
    #[serde(default)]
    interfaces: Vec<RawInterface>,
    #[serde(default)]
    ips: Vec<RawIp>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    dns: Option<RawDns>,
    // 0.1.0/0.2.0 results had `ip4`/`ip6` instead of `ips`; only detected, to say so.
    #[serde(default)]
    ip4: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawInterface {
    name: String,
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    sandbox: Option<String>,
    #[serde(default)]
    socket_path: Option<String>,
    #[serde(default, rename = "pciID")]
    pci_id: Option<String>,
}

#[derive(Deserialize)]
struct RawIp {
    // 0.3.x/0.4.0 only: "4" or "6"; checked against the address when present.
    #[serde(default)]
    version: Option<String>,
    address: String,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    interface: Option<usize>,
}

#[derive(Deserialize)]
struct RawRoute {
    dst: String,
    #[serde(default)]
    gw: Option<String>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    advmss: Option<u32>,
    #[serde(default)]
    priority: Option<u32>,
    #[serde(default)]
    table: Option<u32>,
    #[serde(default)]
    scope: Option<u32>,
}

#[derive(Deserialize)]
struct RawDns {
    #[serde(default)]
    nameservers: Vec<String>,
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    search: Vec<String>,
    #[serde(default)]
    options: Vec<String>,
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

fn parse_gateway(s: Option<String>) -> Result<Option<IpAddr>, String> {
    match non_empty(s) {
        None => Ok(None),
        Some(g) => g
            .parse()
            .map(Some)
            .map_err(|_| format!("invalid gateway {g:?}")),
    }
}

impl AddResult {
    /// Parses a plugin's stdout (a JSON result of version 0.3.0 to 1.1.0).
    pub fn parse(json: &[u8]) -> Result<Self, String> {
        let raw: RawResult = serde_json::from_slice(json).map_err(|e| e.to_string())?;
        Self::from_raw(raw)
    }

    /// Converts an already-decoded JSON result.
    pub fn from_value(value: &serde_json::Value) -> Result<Self, String> {
        let raw = RawResult::deserialize(value).map_err(|e| e.to_string())?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawResult) -> Result<Self, String> {
        if raw.ip4.is_some() && raw.ips.is_empty() {
            return Err(format!(
                "result version {:?} (ip4/ip6 fields) is older than 0.3.0 and not supported",
                raw.cni_version
            ));
        }
        let interfaces = raw
            .interfaces
            .into_iter()
            .map(|i| Interface {
                name: i.name,
                mac: non_empty(i.mac),
                mtu: i.mtu.filter(|m| *m != 0),
                sandbox: non_empty(i.sandbox),
                socket_path: non_empty(i.socket_path),
                pci_id: non_empty(i.pci_id),
            })
            .collect::<Vec<_>>();
        let mut ips = Vec::with_capacity(raw.ips.len());
        for ip in raw.ips {
            let address: IpNet = ip.address.parse()?;
            if let Some(v) = ip.version.as_deref() {
                let want = if address.addr.is_ipv4() { "4" } else { "6" };
                if v != want {
                    return Err(format!("ip {address} has version {v:?}"));
                }
            }
            if let Some(idx) = ip.interface {
                if idx >= interfaces.len() {
                    return Err(format!(
                        "ip {address} names interface index {idx} out of range"
                    ));
                }
            }
            ips.push(IpConfig {
                address,
                gateway: parse_gateway(ip.gateway)?,
                interface: ip.interface,
            });
        }
        let mut routes = Vec::with_capacity(raw.routes.len());
        for r in raw.routes {
            routes.push(Route {
                dst: r.dst.parse()?,
                gw: parse_gateway(r.gw)?,
                mtu: r.mtu,
                advmss: r.advmss,
                priority: r.priority,
                table: r.table,
                scope: r.scope,
            });
        }
        let dns = raw
            .dns
            .map(|d| Dns {
                nameservers: d.nameservers,
                domain: non_empty(d.domain),
                search: d.search,
                options: d.options,
            })
            .unwrap_or_default();
        Ok(AddResult {
            cni_version: raw.cni_version,
            interfaces,
            ips,
            routes,
            dns,
        })
    }

    /// The pod's addresses: IPs on interfaces inside the sandbox (or with no interface given),
    /// IPv4 first, then IPv6, each in result order. What `PodSandboxStatus` reports as `ip` and
    /// `additional_ips`.
    pub fn pod_ips(&self) -> Vec<IpAddr> {
        let in_pod = |ip: &&IpConfig| match ip.interface {
            None => true,
            Some(i) => self
                .interfaces
                .get(i)
                .is_some_and(|iface| iface.sandbox.is_some()),
        };
        let v4 = self
            .ips
            .iter()
            .filter(in_pod)
            .filter(|ip| ip.address.addr.is_ipv4());
        let v6 = self
            .ips
            .iter()
            .filter(in_pod)
            .filter(|ip| ip.address.addr.is_ipv6());
        v4.chain(v6).map(|ip| ip.address.addr).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // What Debian's bridge 1.1.1 prints for cniVersion 0.4.0.
    const V040: &str = r#"{
        "cniVersion": "0.4.0",
        "interfaces": [
            {"name": "crius0", "mac": "aa:bb:cc:dd:ee:01"},
            {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:02"},
            {"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": "/run/crius/netns/p1"}
        ],
        "ips": [
            {"version": "6", "address": "fd00:88::5/64", "gateway": "fd00:88::1", "interface": 2},
            {"version": "4", "address": "10.88.0.5/24", "gateway": "10.88.0.1", "interface": 2}
        ],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.1.0.0/16", "gw": "10.88.0.254"}],
        "dns": {"nameservers": ["10.88.0.1"], "search": ["svc.local"]}
    }"#;

    const V100: &str = r#"{
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "crius0", "mac": "aa:bb:cc:dd:ee:01"},
            {"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": "/run/crius/netns/p1", "mtu": 1500}
        ],
        "ips": [
            {"address": "10.88.0.6/24", "gateway": "10.88.0.1", "interface": 1},
            {"address": "192.0.2.7/32", "interface": 0}
        ],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.88.0.1", "priority": 10, "table": 100, "scope": 0}],
        "dns": {}
    }"#;

    #[test]
    fn parses_040_result() {
        let r = AddResult::parse(V040.as_bytes()).unwrap();
        assert_eq!(r.cni_version, "0.4.0");
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.interfaces[0].sandbox, None);
        assert_eq!(
            r.interfaces[2].sandbox.as_deref(),
            Some("/run/crius/netns/p1")
        );
        assert_eq!(r.ips[1].address.to_string(), "10.88.0.5/24");
        assert_eq!(r.ips[1].address.prefix_len, 24);
        assert_eq!(r.ips[1].gateway, Some("10.88.0.1".parse().unwrap()));
        assert_eq!(r.routes[0].dst.to_string(), "0.0.0.0/0");
        assert_eq!(r.routes[0].gw, None);
        assert_eq!(r.routes[1].gw, Some("10.88.0.254".parse().unwrap()));
        assert_eq!(r.dns.nameservers, vec!["10.88.0.1"]);
        assert_eq!(r.dns.search, vec!["svc.local"]);
        // IPv4 first even though the plugin listed IPv6 first.
        assert_eq!(
            r.pod_ips(),
            vec![
                "10.88.0.5".parse::<IpAddr>().unwrap(),
                "fd00:88::5".parse().unwrap()
            ]
        );
    }

    #[test]
    fn parses_100_result() {
        let r = AddResult::parse(V100.as_bytes()).unwrap();
        assert_eq!(r.cni_version, "1.0.0");
        assert_eq!(r.interfaces[1].mtu, Some(1500));
        assert_eq!(r.routes[0].priority, Some(10));
        assert_eq!(r.routes[0].table, Some(100));
        assert_eq!(r.dns, Dns::default());
        // The address on the host-side interface is not a pod IP.
        assert_eq!(r.pod_ips(), vec!["10.88.0.6".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn ipam_result_without_interfaces() {
        let r = AddResult::parse(br#"{"cniVersion":"1.0.0","ips":[{"address":"10.88.0.9/24"}]}"#)
            .unwrap();
        assert!(r.interfaces.is_empty());
        assert_eq!(r.pod_ips(), vec!["10.88.0.9".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn rejects_bad_results() {
        for (json, want) in [
            (r#"{"ips":[{"address":"10.0.0.1"}]}"#, "CIDR"),
            (r#"{"ips":[{"address":"10.0.0.1/33"}]}"#, "prefix length"),
            (
                r#"{"ips":[{"address":"10.0.0.1/8","version":"6"}]}"#,
                "version",
            ),
            (
                r#"{"ips":[{"address":"10.0.0.1/8","interface":3}]}"#,
                "out of range",
            ),
            (
                r#"{"ips":[{"address":"10.0.0.1/8","gateway":"x"}]}"#,
                "gateway",
            ),
            (
                r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.1/8"}}"#,
                "older than 0.3.0",
            ),
            ("not json", "expected"),
        ] {
            let err = AddResult::parse(json.as_bytes()).unwrap_err();
            assert!(err.contains(want), "{json}: {err}");
        }
    }

    #[test]
    fn empty_strings_mean_absent() {
        let r = AddResult::parse(
            br#"{"interfaces":[{"name":"eth0","mac":"","sandbox":""}],"ips":[{"address":"10.0.0.2/8","gateway":""}]}"#,
        )
        .unwrap();
        assert_eq!(r.interfaces[0].sandbox, None);
        assert_eq!(r.ips[0].gateway, None);
    }
}
