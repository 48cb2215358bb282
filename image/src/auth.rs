//! Registry credentials: what CRI's `AuthConfig` carries for one pull, and the authority a
//! credential is for. The registry client sends them (`registry.rs`); the auth file
//! (`auth_file.rs`) is one more source of them.

use base64::Engine as _;

use crate::digest::Digest;

/// Credentials for one pull, as CRI's `AuthConfig` carries them. All fields optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    pub username: String,
    pub password: String,
    /// base64 of `username:password`.
    pub auth: String,
    /// When set, the credentials are only sent to this registry host.
    pub server_address: String,
    /// An OAuth2 refresh token, exchanged at the token realm.
    pub identity_token: String,
    /// A bearer token sent to the registry as is.
    pub registry_token: String,
}

impl Auth {
    pub fn is_empty(&self) -> bool {
        self.basic().is_none() && self.identity_token.is_empty() && self.registry_token.is_empty()
    }

    /// A digest of the credentials, to tell two sets apart without keeping them in a key.
    pub(crate) fn fingerprint(&self) -> String {
        let text = format!(
            "{}\0{}\0{}\0{}\0{}\0{}",
            self.username,
            self.password,
            self.auth,
            self.server_address,
            self.identity_token,
            self.registry_token
        );
        Digest::of(text.as_bytes()).hex()[..16].to_string()
    }

    /// Username and password, from the fields or from `auth`.
    pub(crate) fn basic(&self) -> Option<(String, String)> {
        if !self.username.is_empty() {
            return Some((self.username.clone(), self.password.clone()));
        }
        if self.auth.is_empty() {
            return None;
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(self.auth.trim())
            .ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (u, p) = text.split_once(':')?;
        Some((u.to_string(), p.to_string()))
    }

    /// These credentials, or none if they are meant for another registry.
    pub(crate) fn for_registry(&self, domain: &str) -> Auth {
        let server = self
            .server_address
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_end_matches('/');
        let server = server.split('/').next().unwrap_or(server);
        let matches = server.is_empty()
            || server == domain
            || (domain == "docker.io"
                && matches!(server, "index.docker.io" | "registry-1.docker.io"));
        if matches {
            self.clone()
        } else {
            Auth::default()
        }
    }
}

/// The registry authority a credential key names: a host, or the host of a URL
/// (`https://index.docker.io/v1/`); Docker Hub's names all mean `docker.io`.
pub(crate) fn authority(key: &str) -> String {
    let host = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = host.split('/').next().unwrap_or(host);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => "docker.io".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_sources() {
        let a = Auth {
            auth: base64::engine::general_purpose::STANDARD.encode("u:p:x"),
            ..Default::default()
        };
        assert_eq!(a.basic(), Some(("u".into(), "p:x".into())));
        let a = Auth {
            username: "me".into(),
            password: "pw".into(),
            auth: "ignored".into(),
            ..Default::default()
        };
        assert_eq!(a.basic(), Some(("me".into(), "pw".into())));
        assert!(Auth::default().is_empty());
        assert!(Auth {
            auth: "!!notbase64".into(),
            ..Default::default()
        }
        .is_empty());
        let scoped = Auth {
            username: "u".into(),
            server_address: "https://index.docker.io/v1/".into(),
            ..Default::default()
        };
        assert!(!scoped.for_registry("docker.io").is_empty());
        assert!(scoped.for_registry("quay.io").is_empty());
    }

    #[test]
    fn authorities() {
        assert_eq!(authority("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(authority("registry-1.docker.io"), "docker.io");
        assert_eq!(authority("http://127.0.0.1:5000/x"), "127.0.0.1:5000");
    }
}
