//! Image references, parsed and normalized the way kubelet, crictl and containerd users expect:
//! `busybox` is `docker.io/library/busybox:latest`, `host:port/repo:tag` keeps its host, and a
//! digest (`repo@sha256:…`, `repo:tag@sha256:…`) pins the manifest.

use std::fmt;

use crate::digest::Digest;
use crate::error::{Error, Result};

/// The registry that names without a host refer to.
pub const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
const DEFAULT_TAG: &str = "latest";
const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;

/// A normalized image reference: always a domain and a repository path, and at least one of a
/// tag or a digest (a bare name gets `latest`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    domain: String,
    path: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

impl Reference {
    /// Parses and normalizes `input`; a malformed reference is an `InvalidReference` error
    /// naming it and saying what is wrong.
    pub fn parse(input: &str) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidReference {
            reference: input.to_string(),
            reason: reason.to_string(),
        };
        if input.is_empty() {
            return Err(invalid("empty reference"));
        }
        if input.trim() != input || input.chars().any(char::is_whitespace) {
            return Err(invalid("contains whitespace"));
        }

        let (rest, digest) = match input.split_once('@') {
            Some((name, d)) => {
                let digest = Digest::parse(d).map_err(|e| invalid(&e))?;
                (name, Some(digest))
            }
            None => (input, None),
        };

        // A tag follows the last ':' that comes after the last '/': a ':' before it is a port.
        let last_slash = rest.rfind('/');
        let (name, tag) = match rest.rfind(':') {
            Some(colon) if last_slash.is_none_or(|s| colon > s) => {
                (&rest[..colon], Some(&rest[colon + 1..]))
            }
            _ => (rest, None),
        };
        if let Some(tag) = tag {
            validate_tag(tag).map_err(|e| invalid(&e))?;
        }
        if name.is_empty() {
            return Err(invalid("missing repository name"));
        }

        let (domain, path) = split_domain(name);
        validate_domain(&domain).map_err(|e| invalid(&e))?;
        validate_path(&path).map_err(|e| invalid(&e))?;
        if domain.len() + 1 + path.len() > MAX_NAME_LEN {
            return Err(invalid("repository name longer than 255 characters"));
        }

        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, None) => Some(DEFAULT_TAG.to_string()),
            (None, Some(_)) => None,
        };
        Ok(Self {
            domain,
            path,
            tag,
            digest,
        })
    }

    /// The registry host as written in the reference (`docker.io`, `registry:5000`).
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The repository path inside the registry (`library/busybox`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The tag, if any (a reference by digest alone has none).
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest, if the reference pins one.
    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// `domain/path`, the repository name without tag or digest.
    pub fn repository(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// `domain/path:tag` when the reference has a tag and no digest: what CRI calls a repo tag.
    pub fn repo_tag(&self) -> Option<String> {
        match (&self.tag, &self.digest) {
            (Some(tag), None) => Some(format!("{}:{}", self.repository(), tag)),
            _ => None,
        }
    }

    /// `domain/path@digest`, what CRI calls a repo digest.
    pub fn repo_digest(&self, manifest: &Digest) -> String {
        format!("{}@{}", self.repository(), manifest)
    }

    /// What to ask the registry for: the digest when pinned, else the tag.
    pub fn object(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => DEFAULT_TAG.to_string(),
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.domain, self.path)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Reference {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

/// Splits `name` into domain and path with Docker's rule: the first component is a domain
/// only if it contains '.' or ':' or is `localhost`; docker.io names with one component get
/// `library/`.
fn split_domain(name: &str) -> (String, String) {
    let (mut domain, mut path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => (DEFAULT_DOMAIN.to_string(), name.to_string()),
    };
    if domain == LEGACY_DEFAULT_DOMAIN {
        domain = DEFAULT_DOMAIN.to_string();
    }
    if domain == DEFAULT_DOMAIN && !path.contains('/') {
        path = format!("{OFFICIAL_REPO_PREFIX}{path}");
    }
    (domain, path)
}

fn validate_tag(tag: &str) -> std::result::Result<(), String> {
    if tag.is_empty() {
        return Err("empty tag".into());
    }
    if tag.len() > MAX_TAG_LEN {
        return Err("tag longer than 128 characters".into());
    }
    let mut chars = tag.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        return Err(format!("invalid tag {tag:?}"));
    }
    Ok(())
}

fn validate_domain(domain: &str) -> std::result::Result<(), String> {
    let bad = || format!("invalid registry host {domain:?}");
    let (host, port) = if let Some(rest) = domain.strip_prefix('[') {
        // An IPv6 literal: [::1]:5000
        let (addr, after) = rest.split_once(']').ok_or_else(bad)?;
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad());
        }
        match after {
            "" => return Ok(()),
            p => (None, Some(p.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else {
        match domain.rsplit_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(domain), None),
        }
    };
    if let Some(port) = port {
        if port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()) || port.len() > 5 {
            return Err(bad());
        }
        if port.parse::<u16>().is_err() {
            return Err(format!(
                "invalid registry host {domain:?}: port {port} is over 65535"
            ));
        }
    }
    if let Some(host) = host {
        if host.is_empty() {
            return Err(bad());
        }
        for label in host.split('.') {
            let ok = !label.is_empty()
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-');
            if !ok {
                return Err(bad());
            }
        }
    }
    Ok(())
}

/// Path components: lowercase alphanumerics separated by '.', '_', '__' or runs of '-'.
fn validate_path(path: &str) -> std::result::Result<(), String> {
    for component in path.split('/') {
        if component.is_empty() {
            return Err(format!("empty path component in {path:?}"));
        }
        if component.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(format!("repository name {path:?} must be lowercase"));
        }
        if !component_ok(component) {
            return Err(format!("invalid repository path component {component:?}"));
        }
    }
    Ok(())
}

fn component_ok(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !bytes.first().copied().is_some_and(alnum) || !bytes.last().copied().is_some_and(alnum) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator: ".", "_", "__" or one or more "-".
        let start = i;
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < bytes.len() && bytes[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < bytes.len() && bytes[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
        if i == start || i >= bytes.len() || !alnum(bytes[i]) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "6b3f6e3c8c3d0c5bd1cbc26a7d0e4b8f8d8e9e9a3b5c0b1e2d3f4a5b6c7d8e9f";

    fn norm(s: &str) -> String {
        Reference::parse(s).unwrap().to_string()
    }

    #[test]
    fn normalizes_like_docker() {
        let cases = [
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("library/busybox", "docker.io/library/busybox:latest"),
            ("docker.io/busybox", "docker.io/library/busybox:latest"),
            (
                "index.docker.io/busybox",
                "docker.io/library/busybox:latest",
            ),
            ("index.docker.io/foo/bar:1", "docker.io/foo/bar:1"),
            ("foo/bar", "docker.io/foo/bar:latest"),
            ("foo/bar/baz", "docker.io/foo/bar/baz:latest"),
            ("quay.io/coreos/etcd", "quay.io/coreos/etcd:latest"),
            ("localhost/foo", "localhost/foo:latest"),
            ("localhost:5000/foo", "localhost:5000/foo:latest"),
            ("127.0.0.1:5000/a/b:v1.2", "127.0.0.1:5000/a/b:v1.2"),
            ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"),
            ("[::1]:5000/foo:t", "[::1]:5000/foo:t"),
            (
                "my-reg.example.com:443/a_b/c__d/e--f/g.h:Tag_1-x.y",
                "my-reg.example.com:443/a_b/c__d/e--f/g.h:Tag_1-x.y",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(norm(input), want, "input {input}");
        }
    }

    #[test]
    fn digests() {
        let d = format!("sha256:{HEX}");
        let r = Reference::parse(&format!("busybox@{d}")).unwrap();
        assert_eq!(r.to_string(), format!("docker.io/library/busybox@{d}"));
        assert_eq!(r.tag(), None);
        assert_eq!(r.object(), d);
        assert_eq!(r.repo_tag(), None);

        let r = Reference::parse(&format!("host:5000/x/y:v1@{d}")).unwrap();
        assert_eq!(r.domain(), "host:5000");
        assert_eq!(r.path(), "x/y");
        assert_eq!(r.tag(), Some("v1"));
        assert_eq!(r.digest().unwrap().to_string(), d);
        assert_eq!(r.object(), d, "a digest wins over a tag");
        assert_eq!(r.repo_tag(), None);
        assert_eq!(r.to_string(), format!("host:5000/x/y:v1@{d}"));
    }

    #[test]
    fn accessors() {
        let r = Reference::parse("busybox").unwrap();
        assert_eq!(r.domain(), "docker.io");
        assert_eq!(r.path(), "library/busybox");
        assert_eq!(r.repository(), "docker.io/library/busybox");
        assert_eq!(
            r.repo_tag().as_deref(),
            Some("docker.io/library/busybox:latest")
        );
        assert_eq!(r.object(), "latest");
        let r: Reference = "localhost:5000/foo:bar".parse().unwrap();
        assert_eq!(r.domain(), "localhost:5000");
        assert_eq!(r.tag(), Some("bar"));
    }

    #[test]
    fn rejects_invalid() {
        let long_tag = format!("a:{}", "t".repeat(129));
        let long_name = format!("{}/x", "a".repeat(300));
        let cases: Vec<String> = vec![
            "".into(),
            " busybox".into(),
            "busy box".into(),
            "Busybox".into(),
            "docker.io/Library/busybox".into(),
            "busybox:".into(),
            "busybox:-tag".into(),
            "busybox:ta/g".into(),
            ":tag".into(),
            "/busybox".into(),
            "busybox/".into(),
            "a//b".into(),
            "foo_/bar".into(),
            "-foo".into(),
            "foo..bar".into(),
            "foo___bar".into(),
            "host:port/foo".into(),
            "host:123456/foo".into(),
            "host:99999/foo".into(),
            "[::1]:70000/foo".into(),
            "-host.com/foo".into(),
            "[::1/foo".into(),
            "busybox@sha256:abc".into(),
            "busybox@md5:0123".into(),
            format!("busybox@sha256:{}", HEX.to_uppercase()),
            format!("busybox@{HEX}"),
            "busybox@".into(),
            long_tag,
            long_name,
            "busybox:latest:latest".into(),
        ];
        for input in cases {
            let err = Reference::parse(&input).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{input}");
            assert!(err.to_string().contains(&input), "{err} names {input}");
        }
    }
}
