//! Registry credentials from a file (`[registry] auth_file`), in the docker `config.json`
//! format: `{"auths": {"<registry>": {"auth": "<base64 user:pass>"}}}` (or `username` and
//! `password`, or `identitytoken`). Keys may be a host (`registry.example:5000`) or a URL
//! (`https://index.docker.io/v1/`); Docker Hub's names all mean `docker.io`. A credential is
//! used only for the registry host it names: a mirror gets only its own.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::auth::{authority, Auth};
use crate::error::{Error, Result};

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    auths: HashMap<String, Entry>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Entry {
    auth: String,
    username: String,
    password: String,
    identitytoken: String,
    registrytoken: String,
}

/// The credentials of `path` by registry authority (`docker.io` for Docker Hub).
pub fn load(path: &Path) -> Result<HashMap<String, Auth>> {
    let bad = |reason: String| Error::AuthFile {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    parse(&text).map_err(bad)
}

pub(crate) fn parse(text: &str) -> std::result::Result<HashMap<String, Auth>, String> {
    let file: File = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(file
        .auths
        .into_iter()
        .map(|(key, e)| {
            let auth = Auth {
                username: e.username,
                password: e.password,
                auth: e.auth,
                server_address: String::new(),
                identity_token: e.identitytoken,
                registry_token: e.registrytoken,
            };
            (authority(&key), auth)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_authorities_and_entries_credentials() {
        let auths = parse(
            r#"{"auths": {
                "https://index.docker.io/v1/": {"auth": "dTpw"},
                "127.0.0.1:5000": {"username": "u", "password": "p"},
                "quay.io": {"identitytoken": "t"}
            }, "credsStore": "ignored"}"#,
        )
        .unwrap();
        assert_eq!(auths["docker.io"].auth, "dTpw");
        assert_eq!(auths["127.0.0.1:5000"].username, "u");
        assert_eq!(auths["quay.io"].identity_token, "t");
        assert!(parse("not json").is_err());
    }
}
