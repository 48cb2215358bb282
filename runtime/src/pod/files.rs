//! The files a pod shares with its containers: `/etc/hostname`, `/etc/hosts`,
//! `/etc/resolv.conf`.

use std::path::Path;

use crius_api::v1::DnsConfig;

use crate::error::{Error, Result};

/// `/etc/hosts` of a pod on its own network: localhost names only (kubelet manages the pod's
/// own entry through a mount of its own when it wants one).
const POD_HOSTS: &str = "127.0.0.1\tlocalhost\n\
::1\tlocalhost ip6-localhost ip6-loopback\n\
fe00::0\tip6-localnet\n\
ff00::0\tip6-mcastprefix\n\
ff02::1\tip6-allnodes\n\
ff02::2\tip6-allrouters\n";

/// The node's hostname, for host-network pods that name none.
pub fn node_hostname() -> String {
    nix_hostname().unwrap_or_else(|| "localhost".to_string())
}

fn nix_hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec()).ok()
}

/// `resolv.conf` from the pod's DNS config.
pub fn resolv_conf(dns: &DnsConfig) -> String {
    let mut out = String::new();
    if !dns.searches.is_empty() {
        out.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for s in &dns.servers {
        out.push_str(&format!("nameserver {s}\n"));
    }
    if !dns.options.is_empty() {
        out.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    out
}

/// Validates what goes into resolv.conf: one line per entry, no injected lines.
pub fn validate_dns(dns: &DnsConfig) -> Result<()> {
    let fields = [
        ("dns_config.servers", &dns.servers),
        ("dns_config.searches", &dns.searches),
        ("dns_config.options", &dns.options),
    ];
    for (field, values) in fields {
        for v in values {
            if v.is_empty() || v.contains(['\n', '\r', ' ', '\t']) {
                return Err(Error::InvalidArgument(format!(
                    "{field}: invalid entry {v:?}"
                )));
            }
        }
    }
    // A nameserver is an address (IPv6 with an optional `%scope`); resolvers skip any other.
    for (i, server) in dns.servers.iter().enumerate() {
        let address = server.split_once('%').map_or(server.as_str(), |(a, _)| a);
        if address.parse::<std::net::IpAddr>().is_err() {
            return Err(Error::InvalidArgument(format!(
                "dns_config.servers[{i}] {:?} is not an IP address",
                crate::util::excerpt(server)
            )));
        }
    }
    Ok(())
}

/// Writes the three files into `dir`.
pub fn write(
    dir: &Path,
    hostname: &str,
    dns: Option<&DnsConfig>,
    host_network: bool,
) -> Result<()> {
    let io = |what: &str, e: std::io::Error| {
        Error::internal(format!("write pod {what} in {}", dir.display()), e)
    };
    std::fs::write(dir.join("hostname"), format!("{hostname}\n")).map_err(|e| io("hostname", e))?;
    let hosts = if host_network {
        std::fs::read_to_string("/etc/hosts").unwrap_or_else(|_| POD_HOSTS.to_string())
    } else {
        POD_HOSTS.to_string()
    };
    std::fs::write(dir.join("hosts"), hosts).map_err(|e| io("hosts", e))?;
    let resolv = match dns {
        Some(d) if !(d.servers.is_empty() && d.searches.is_empty() && d.options.is_empty()) => {
            resolv_conf(d)
        }
        // No DNS config: the node's own, as kubelet's "Default" DNS policy means.
        _ => std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
    };
    std::fs::write(dir.join("resolv.conf"), resolv).map_err(|e| io("resolv.conf", e))?;
    Ok(())
}

/// Gives the three files to `uid`:`gid` (the host ids of a user-namespaced pod's root).
pub fn chown(dir: &Path, uid: u32, gid: u32) -> Result<()> {
    for name in ["hostname", "hosts", "resolv.conf"] {
        let path = dir.join(name);
        std::os::unix::fs::chown(&path, Some(uid), Some(gid))
            .map_err(|e| Error::internal(format!("chown {}", path.display()), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_has_search_servers_options() {
        let dns = DnsConfig {
            servers: vec!["10.0.0.10".into(), "10.0.0.11".into()],
            searches: vec!["ns.svc.cluster.local".into(), "cluster.local".into()],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf(&dns),
            "search ns.svc.cluster.local cluster.local\nnameserver 10.0.0.10\nnameserver 10.0.0.11\noptions ndots:5\n"
        );
        validate_dns(&dns).unwrap();
    }

    #[test]
    fn injected_lines_are_refused() {
        let dns = DnsConfig {
            servers: vec!["1.1.1.1\nnameserver 6.6.6.6".into()],
            ..Default::default()
        };
        let msg = validate_dns(&dns).unwrap_err().to_string();
        assert!(msg.contains("dns_config.servers"), "{msg}");
    }

    #[test]
    fn files_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let dns = DnsConfig {
            servers: vec!["10.0.0.10".into()],
            ..Default::default()
        };
        write(dir.path(), "web-1", Some(&dns), false).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("hostname")).unwrap(),
            "web-1\n"
        );
        assert!(std::fs::read_to_string(dir.path().join("hosts"))
            .unwrap()
            .contains("localhost"));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("resolv.conf")).unwrap(),
            "nameserver 10.0.0.10\n"
        );
    }
}
