//! Registry hosts in containerd's `hosts.toml` layout: `<config_dir>/<host>/hosts.toml` (or
//! `<host>_<port>_` for a host with a port, then `_default/hosts.toml`). Mirrors listed as
//! `[host."URL"]` are tried in file order, then the origin (`server`, by default the registry
//! itself). An `http://` URL is plain HTTP.
//!
//! ```toml
//! server = "https://registry-1.docker.io"
//!
//! [host."http://127.0.0.1:5000"]
//!   capabilities = ["pull", "resolve"]
//!   skip_verify = false
//!   ca = "ca.crt"            # relative to this file's directory
//!   client = ["client.crt", "client.key"]   # mutual TLS
//!   header = { x-team = "a" }
//!   proxy = "http://proxy.corp:3128"   # "" for none; absent: HTTPS_PROXY etc. (crate::proxy)
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::proxy::ProxySetting;

const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_ORIGIN: &str = "registry-1.docker.io";
const HOSTS_FILE: &str = "hosts.toml";
const DEFAULT_DIR: &str = "_default";

/// HTTP or HTTPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    Http,
    Https,
}

/// What a host may be used for: `resolve` turns a tag into a digest, `pull` fetches by digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub pull: bool,
    pub resolve: bool,
    pub push: bool,
}

impl Capabilities {
    pub const ALL: Capabilities = Capabilities {
        pull: true,
        resolve: true,
        push: true,
    };
}

/// One endpoint to try for a registry, with its TLS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryHost {
    pub scheme: Scheme,
    /// `host[:port]`.
    pub authority: String,
    /// The API root path, `/v2` unless the config says otherwise.
    pub path: String,
    pub capabilities: Capabilities,
    pub skip_verify: bool,
    /// Extra CA certificates (PEM files) to trust for this host.
    pub ca: Vec<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS; no key means the certificate file
    /// holds the key too. The first pair is used.
    pub client: Vec<(PathBuf, Option<PathBuf>)>,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
    /// The proxy to reach this host through ([`crate::proxy`]).
    pub proxy: ProxySetting,
    /// True for the registry itself (or the `server` that replaces it), false for a mirror.
    pub is_origin: bool,
}

impl RegistryHost {
    /// `scheme://authority/path`, e.g. `https://registry-1.docker.io/v2`.
    pub fn base_url(&self) -> String {
        format!("{self}")
    }
}

impl fmt::Display for RegistryHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}{}", self.authority, self.path)
    }
}

/// The hosts to try for registry `domain`, mirrors first, the origin last (when allowed).
/// With no config dir, or no file for the host, that is the origin alone.
pub fn resolve_hosts(config_dir: Option<&Path>, domain: &str) -> Result<Vec<RegistryHost>> {
    let file = config_dir.and_then(|dir| find_hosts_dir(dir, domain));
    match file {
        Some(dir) => {
            let path = dir.join(HOSTS_FILE);
            match std::fs::read_to_string(&path) {
                Ok(text) => parse_hosts(&text, &dir, &path, domain),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // A directory with only certificates, as Docker's certs.d has them.
                    let mut origin = default_origin(domain);
                    origin.ca = certs_in(&dir);
                    Ok(vec![origin])
                }
                Err(e) => Err(Error::HostsConfig {
                    path,
                    reason: e.to_string(),
                }),
            }
        }
        None => Ok(vec![default_origin(domain)]),
    }
}

/// The directory names to look in for `domain`, in containerd's order.
fn find_hosts_dir(dir: &Path, domain: &str) -> Option<PathBuf> {
    let mut names = Vec::new();
    if let Some((host, port)) = domain.rsplit_once(':') {
        if !host.ends_with(']') || domain.starts_with('[') {
            names.push(format!("{host}_{port}_"));
        }
    }
    names.push(domain.to_string());
    names.push(DEFAULT_DIR.to_string());
    names.into_iter().map(|n| dir.join(n)).find(|p| p.is_dir())
}

fn certs_in(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "crt"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn is_localhost(domain: &str) -> bool {
    let host = if let Some(rest) = domain.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        domain.rsplit_once(':').map_or(domain, |(h, _)| h)
    };
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn default_origin(domain: &str) -> RegistryHost {
    let (scheme, authority) = if domain == DOCKER_HUB {
        (Scheme::Https, DOCKER_HUB_ORIGIN.to_string())
    } else if is_localhost(domain) {
        (Scheme::Http, domain.to_string())
    } else {
        (Scheme::Https, domain.to_string())
    };
    RegistryHost {
        scheme,
        authority,
        path: "/v2".into(),
        capabilities: Capabilities::ALL,
        skip_verify: false,
        ca: Vec::new(),
        client: Vec::new(),
        headers: Vec::new(),
        proxy: ProxySetting::Environment,
        is_origin: true,
    }
}

fn parse_hosts(text: &str, dir: &Path, path: &Path, domain: &str) -> Result<Vec<RegistryHost>> {
    let bad = |reason: String| Error::HostsConfig {
        path: path.to_path_buf(),
        reason,
    };
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| bad(e.to_string()))?;

    let mut hosts = Vec::new();
    if let Some(value) = table.get("host") {
        let mirrors = value
            .as_table()
            .ok_or_else(|| bad("`host` must be a table of URLs".into()))?;
        for (url, settings) in mirrors {
            let settings = settings
                .as_table()
                .ok_or_else(|| bad(format!("host {url:?} must be a table")))?;
            let mut host = host_from_url(url).map_err(bad)?;
            apply_settings(&mut host, settings, dir)
                .map_err(|r| bad(format!("host {url:?}: {r}")))?;
            hosts.push(host);
        }
    }

    let mut origin = match table.get("server") {
        Some(server) => {
            let url = server
                .as_str()
                .ok_or_else(|| bad("`server` must be a string".into()))?;
            host_from_url(url).map_err(bad)?
        }
        None => default_origin(domain),
    };
    origin.is_origin = true;
    apply_settings(&mut origin, &table, dir).map_err(|r| bad(format!("server: {r}")))?;
    hosts.push(origin);
    Ok(hosts)
}

fn host_from_url(url: &str) -> std::result::Result<RegistryHost, String> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("https://") {
        (Scheme::Https, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (Scheme::Http, r)
    } else if url.contains("://") {
        return Err(format!("unsupported URL scheme in {url:?}"));
    } else {
        (Scheme::Https, url)
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains(['?', '#', '@', ' ']) {
        return Err(format!("invalid host URL {url:?}"));
    }
    Ok(RegistryHost {
        scheme,
        authority: authority.to_string(),
        path: path.trim_end_matches('/').to_string(),
        capabilities: Capabilities::ALL,
        skip_verify: false,
        ca: Vec::new(),
        client: Vec::new(),
        headers: Vec::new(),
        proxy: ProxySetting::Environment,
        is_origin: false,
    })
}

fn apply_settings(
    host: &mut RegistryHost,
    t: &toml::Table,
    dir: &Path,
) -> std::result::Result<(), String> {
    if let Some(caps) = t.get("capabilities") {
        let list = caps
            .as_array()
            .ok_or("`capabilities` must be an array of strings")?;
        let mut c = Capabilities {
            pull: false,
            resolve: false,
            push: false,
        };
        for cap in list {
            match cap.as_str() {
                Some("pull") => c.pull = true,
                Some("resolve") => c.resolve = true,
                Some("push") => c.push = true,
                _ => return Err(format!("unknown capability {cap}")),
            }
        }
        host.capabilities = c;
    }
    if let Some(v) = t.get("proxy") {
        let url = v.as_str().ok_or("`proxy` must be a string")?;
        host.proxy = ProxySetting::parse(url)?;
    }
    if let Some(v) = t.get("skip_verify") {
        host.skip_verify = v.as_bool().ok_or("`skip_verify` must be a boolean")?;
    }
    if let Some(v) = t.get("ca") {
        let list: Vec<&str> = match v {
            toml::Value::String(s) => vec![s.as_str()],
            toml::Value::Array(a) => a
                .iter()
                .map(|x| x.as_str().ok_or("`ca` entries must be strings"))
                .collect::<std::result::Result<_, _>>()?,
            _ => return Err("`ca` must be a string or an array of strings".into()),
        };
        host.ca = list.into_iter().map(|p| dir.join(p)).collect();
    }
    if let Some(v) = t.get("client") {
        let path = |s: &str| dir.join(s);
        let pair = |a: &[toml::Value]| -> std::result::Result<(PathBuf, Option<PathBuf>), String> {
            match a {
                [toml::Value::String(c)] => Ok((path(c), None)),
                [toml::Value::String(c), toml::Value::String(k)] => {
                    Ok((path(c), (!k.is_empty()).then(|| path(k))))
                }
                _ => Err("`client` pairs must be [\"cert\", \"key\"]".into()),
            }
        };
        host.client = match v {
            toml::Value::String(c) => vec![(path(c), None)],
            toml::Value::Array(a) if a.iter().all(|x| x.is_str()) => vec![pair(a)?],
            toml::Value::Array(a) => a
                .iter()
                .map(|x| {
                    x.as_array()
                        .ok_or("`client` must be a path, a pair or a list of pairs".to_string())
                        .and_then(|p| pair(p))
                })
                .collect::<std::result::Result<_, _>>()?,
            _ => return Err("`client` must be a path, a pair or a list of pairs".into()),
        };
    }
    if let Some(v) = t.get("header") {
        let headers = v.as_table().ok_or("`header` must be a table")?;
        for (name, value) in headers {
            match value {
                toml::Value::String(s) => host.headers.push((name.clone(), s.clone())),
                toml::Value::Array(a) => {
                    for x in a {
                        let s = x.as_str().ok_or("header values must be strings")?;
                        host.headers.push((name.clone(), s.to_string()));
                    }
                }
                _ => return Err(format!("header {name:?} must be a string or array")),
            }
        }
    }
    let override_path = match t.get("override_path") {
        Some(v) => v.as_bool().ok_or("`override_path` must be a boolean")?,
        None => false,
    };
    if !override_path && !host.path.ends_with("/v2") {
        host.path = format!("{}/v2", host.path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, host: &str, text: &str) {
        let d = dir.join(host);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(HOSTS_FILE), text).unwrap();
    }

    #[test]
    fn defaults_without_config() {
        let h = resolve_hosts(None, "docker.io").unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].base_url(), "https://registry-1.docker.io/v2");
        assert!(h[0].is_origin);
        let h = resolve_hosts(None, "quay.io").unwrap();
        assert_eq!(h[0].base_url(), "https://quay.io/v2");
        for local in [
            "localhost:5000",
            "127.0.0.1:5000",
            "localhost",
            "[::1]:5000",
        ] {
            let h = resolve_hosts(None, local).unwrap();
            assert_eq!(h[0].scheme, Scheme::Http, "{local}");
        }
        let dir = tempfile::tempdir().unwrap();
        let h = resolve_hosts(Some(dir.path()), "docker.io").unwrap();
        assert_eq!(h[0].base_url(), "https://registry-1.docker.io/v2");
    }

    #[test]
    fn mirrors_in_order_then_origin() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "docker.io",
            r#"
server = "https://registry-1.docker.io"

[host."http://127.0.0.1:5000"]
  capabilities = ["pull", "resolve"]

[host."https://mirror.example.com/prefix"]
  capabilities = ["pull"]
  skip_verify = true
  ca = ["ca1.crt", "/abs/ca2.crt"]
  header = { x-a = "1", x-b = ["2", "3"] }

[host."https://zz.example.com"]
"#,
        );
        let h = resolve_hosts(Some(dir.path()), "docker.io").unwrap();
        let urls: Vec<String> = h.iter().map(|x| x.base_url()).collect();
        assert_eq!(
            urls,
            [
                "http://127.0.0.1:5000/v2",
                "https://mirror.example.com/prefix/v2",
                "https://zz.example.com/v2",
                "https://registry-1.docker.io/v2"
            ]
        );
        assert_eq!(h[0].scheme, Scheme::Http);
        assert!(h[0].capabilities.resolve && h[0].capabilities.pull && !h[0].capabilities.push);
        assert!(!h[1].capabilities.resolve && h[1].capabilities.pull);
        assert!(h[1].skip_verify && !h[0].skip_verify);
        assert_eq!(
            h[1].ca,
            [
                dir.path().join("docker.io/ca1.crt"),
                PathBuf::from("/abs/ca2.crt")
            ]
        );
        assert_eq!(h[1].headers.len(), 3);
        assert_eq!(h[2].capabilities, Capabilities::ALL);
        assert!(h[3].is_origin && !h[0].is_origin);
    }

    #[test]
    fn server_replaces_origin_and_takes_top_level_settings() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "registry.example.com",
            r#"
server = "http://internal:8080"
skip_verify = true
capabilities = ["pull", "resolve"]
"#,
        );
        let h = resolve_hosts(Some(dir.path()), "registry.example.com").unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].base_url(), "http://internal:8080/v2");
        assert!(h[0].skip_verify && h[0].is_origin);
    }

    #[test]
    fn override_path_and_port_dirs_and_default() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "reg_5000_",
            r#"
[host."https://m.example.com/custom/api"]
  override_path = true
"#,
        );
        let h = resolve_hosts(Some(dir.path()), "reg:5000").unwrap();
        assert_eq!(h[0].base_url(), "https://m.example.com/custom/api");
        assert_eq!(h[1].base_url(), "https://reg:5000/v2");

        write(dir.path(), "reg2:5000", "[host.\"http://m2\"]\n");
        let h = resolve_hosts(Some(dir.path()), "reg2:5000").unwrap();
        assert_eq!(h[0].base_url(), "http://m2/v2");

        write(dir.path(), "_default", "[host.\"http://everyone\"]\n");
        let h = resolve_hosts(Some(dir.path()), "other.io").unwrap();
        assert_eq!(h[0].base_url(), "http://everyone/v2");
        assert_eq!(h[1].base_url(), "https://other.io/v2");
    }

    #[test]
    fn client_certificates() {
        let dir = tempfile::tempdir().unwrap();
        for (i, (text, want)) in [
            ("client = \"c.pem\"", vec![("c.pem", None)]),
            (
                "client = [\"c.crt\", \"c.key\"]",
                vec![("c.crt", Some("c.key"))],
            ),
            (
                "client = [[\"a.crt\", \"a.key\"], [\"b.pem\", \"\"]]",
                vec![("a.crt", Some("a.key")), ("b.pem", None)],
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let host = format!("mtls{i}.io");
            write(dir.path(), &host, text);
            let h = resolve_hosts(Some(dir.path()), &host).unwrap();
            let d = dir.path().join(&host);
            let want: Vec<(PathBuf, Option<PathBuf>)> = want
                .into_iter()
                .map(|(c, k)| (d.join(c), k.map(|k| d.join(k))))
                .collect();
            assert_eq!(h[0].client, want, "{text}");
        }
        write(dir.path(), "bad.io", "client = 3");
        assert!(resolve_hosts(Some(dir.path()), "bad.io").is_err());
    }

    #[test]
    fn certs_only_dir() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("secure.io");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("ca.crt"), "x").unwrap();
        let h = resolve_hosts(Some(dir.path()), "secure.io").unwrap();
        assert_eq!(h[0].ca, [d.join("ca.crt")]);
    }

    #[test]
    fn invalid_configs_name_the_file() {
        let cases = [
            "server = 1",
            "this is not toml",
            "[host.\"ftp://x\"]",
            "[host.\"http://x\"]\ncapabilities = [\"fly\"]",
            "[host.\"http://x\"]\nskip_verify = \"yes\"",
            "[host.\"http://x\"]\nca = 3",
            "host = 3",
        ];
        for (i, text) in cases.iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let name = format!("bad{i}.io");
            write(dir.path(), &name, text);
            let err = resolve_hosts(Some(dir.path()), &name).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::FailedPrecondition, "{text}");
            assert!(err.to_string().contains("hosts.toml"), "{err}");
        }
    }
}
