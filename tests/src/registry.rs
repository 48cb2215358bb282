//! A real OCI registry (Debian's `docker-registry`, distribution 2.8) on a free loopback port.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::http::{request, Response};
use crate::process::{log_tail, spawn_logged, terminate};
use crate::{free_port, sha256_digest, Error, Result, TestDir};

const DOCKER_REGISTRY: &str = "/usr/bin/docker-registry";
const HTPASSWD: &str = "/usr/bin/htpasswd";
const START_TIMEOUT: Duration = Duration::from_secs(20);
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Attempts with a fresh port when another process took the one we picked.
const PORT_ATTEMPTS: usize = 5;

/// User name of [`Registry::start_with_auth`].
pub const USERNAME: &str = "crius";
/// Password of [`Registry::start_with_auth`].
pub const PASSWORD: &str = "crius-test-password";
/// The `Basic` realm the auth registry announces in `WWW-Authenticate`.
pub const REALM: &str = "crius-test";

/// Every manifest media type the fixtures push, for `Accept` headers.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// User name and password for a registry with auth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

/// A running `docker-registry` with filesystem storage in its own temp dir, listening on
/// `127.0.0.1:<port>` over plain HTTP only. Stopped (SIGTERM, then SIGKILL) and removed on drop.
///
/// Distribution's `htpasswd` auth works over plain HTTP (it only needs a realm), so the auth
/// variant is plain HTTP too: without credentials `/v2/` answers 401 with
/// `WWW-Authenticate: Basic realm="crius-test"`.
#[derive(Debug)]
pub struct Registry {
    child: Option<Child>,
    port: u16,
    credentials: Option<Credentials>,
    log: PathBuf,
    // Dropped last: the process must be gone before its storage is removed.
    dir: TestDir,
}

impl Registry {
    /// Starts a registry that needs no credentials.
    pub fn start() -> Result<Registry> {
        Registry::launch(None)
    }

    /// Starts a registry with htpasswd (bcrypt) auth for [`USERNAME`] / [`PASSWORD`].
    pub fn start_with_auth() -> Result<Registry> {
        Registry::launch(Some(Credentials {
            username: USERNAME.to_owned(),
            password: PASSWORD.to_owned(),
        }))
    }

    fn launch(credentials: Option<Credentials>) -> Result<Registry> {
        if !Path::new(DOCKER_REGISTRY).is_file() {
            return Err(Error::MissingProgram {
                program: DOCKER_REGISTRY,
                package: "docker-registry",
            });
        }
        let dir = TestDir::new("registry")?;
        let htpasswd = match &credentials {
            Some(credentials) => Some(write_htpasswd(&dir, credentials)?),
            None => None,
        };
        let log = dir.join("registry.log");
        let mut registry = Registry {
            child: None,
            port: 0,
            credentials,
            log,
            dir,
        };

        let mut last_reason = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let config = registry.dir.join("config.yml");
            let yaml = config_yaml(&registry.dir.join("storage"), port, htpasswd.as_deref());
            std::fs::write(&config, yaml)
                .map_err(|source| Error::io("write registry config", &config, source))?;

            let mut command = Command::new(DOCKER_REGISTRY);
            command.arg("serve").arg(&config);
            // Distribution overrides its config file from REGISTRY_* variables.
            for (key, _) in std::env::vars_os() {
                if key.to_string_lossy().starts_with("REGISTRY_") {
                    command.env_remove(key);
                }
            }
            registry.child = Some(spawn_logged(command, "docker-registry", &registry.log)?);
            registry.port = port;

            match registry.wait_ready() {
                Ok(()) => return Ok(registry),
                Err(reason) => {
                    if let Some(mut child) = registry.child.take() {
                        terminate(&mut child, "docker-registry", STOP_GRACE)?;
                    }
                    if !log_tail(&registry.log).contains("address already in use") {
                        return Err(Error::Start {
                            name: "docker-registry",
                            reason,
                            log: log_tail(&registry.log),
                        });
                    }
                    last_reason = reason;
                }
            }
        }
        Err(Error::Start {
            name: "docker-registry",
            reason: format!("no free port after {PORT_ATTEMPTS} attempts: {last_reason}"),
            log: log_tail(&registry.log),
        })
    }

    /// Polls `GET /v2/` until it answers 200 (or 401 with auth).
    fn wait_ready(&mut self) -> std::result::Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let url = format!("{}/v2/", self.url());
        let expected = if self.credentials.is_some() { 401 } else { 200 };
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("exited with {status}"));
                }
            }
            match request("GET", &url, &[], &[]) {
                Ok(response) if response.status == expected => return Ok(()),
                Ok(response) => {
                    return Err(format!(
                        "GET {url} answered {} instead of {expected}",
                        response.status
                    ))
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(err) => return Err(format!("no answer within {START_TIMEOUT:?}: {err}")),
            }
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.host_port())
    }

    /// The loopback port it serves on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`, the registry host as it appears in image references.
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The credentials it requires, `None` for [`Registry::start`].
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// A client that sends the registry's credentials (if any) with every request.
    pub fn client(&self) -> RegistryClient {
        RegistryClient::new(&self.url(), self.credentials.as_ref())
    }

    /// A client that never sends credentials.
    pub fn anonymous_client(&self) -> RegistryClient {
        RegistryClient::new(&self.url(), None)
    }

    /// The registry's log so far (its tail, if long).
    pub fn log(&self) -> String {
        log_tail(&self.log)
    }

    /// Where the registry keeps its blobs and manifests.
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.join("storage")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Err(err) = terminate(&mut child, "docker-registry", STOP_GRACE) {
                eprintln!("crius-tests: stop docker-registry: {err}");
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "--- docker-registry log ({}) ---\n{}",
                self.log.display(),
                self.log()
            );
        }
    }
}

fn config_yaml(storage: &Path, port: u16, htpasswd: Option<&Path>) -> String {
    // Access logs and the "no HTTP secret" warning would only add noise to failure output.
    let mut yaml = format!(
        "version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:{port}
  secret: crius-tests-upload-state-secret
",
        storage = storage.display()
    );
    if let Some(htpasswd) = htpasswd {
        yaml.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: {REALM}\n    path: {}\n",
            htpasswd.display()
        ));
    }
    yaml
}

/// Writes a bcrypt htpasswd file with `htpasswd -Bbn` (Debian's apache2-utils).
fn write_htpasswd(dir: &TestDir, credentials: &Credentials) -> Result<PathBuf> {
    if !Path::new(HTPASSWD).is_file() {
        return Err(Error::MissingProgram {
            program: HTPASSWD,
            package: "apache2-utils",
        });
    }
    let output = Command::new(HTPASSWD)
        .args(["-Bbn", &credentials.username, &credentials.password])
        .output()
        .map_err(|source| Error::io("run htpasswd", HTPASSWD, source))?;
    if !output.status.success() {
        return Err(Error::io(
            "htpasswd -Bbn",
            HTPASSWD,
            std::io::Error::other(String::from_utf8_lossy(&output.stderr).into_owned()),
        ));
    }
    let path = dir.join("htpasswd");
    std::fs::write(&path, &output.stdout)
        .map_err(|source| Error::io("write htpasswd file", &path, source))?;
    Ok(path)
}

/// A manifest as the registry served it.
#[derive(Debug, Clone)]
pub struct FetchedManifest {
    /// The `Content-Type` the registry answered with.
    pub media_type: String,
    /// `sha256:` of the bytes, checked against `Docker-Content-Digest` and a by-digest request.
    pub digest: String,
    pub body: Vec<u8>,
}

/// A blocking client for the parts of the distribution API the fixtures need.
///
/// Built on a few lines of plain HTTP/1.1 rather than a registry client library: crius pulls
/// with its own client stack (`crius_image::registry`), and pushing/reading back with an
/// independent one keeps a shared bug from passing unnoticed (see the `http` module).
#[derive(Debug, Clone)]
pub struct RegistryClient {
    base: String,
    authorization: Option<String>,
}

impl RegistryClient {
    /// A client for `base_url` (`http://host:port`), sending Basic auth when given credentials.
    pub fn new(base_url: &str, credentials: Option<&Credentials>) -> RegistryClient {
        let authorization = credentials.map(|c| {
            let token = base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", c.username, c.password));
            format!("Basic {token}")
        });
        RegistryClient {
            base: base_url.trim_end_matches('/').to_owned(),
            authorization,
        }
    }

    /// Sends a request to `path` (e.g. `/v2/`) and returns the response whatever its status.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response> {
        let url = if path.starts_with("http://") {
            path.to_owned()
        } else {
            format!("{}{path}", self.base)
        };
        let mut all: Vec<(&str, &str)> = headers.to_vec();
        if let Some(authorization) = &self.authorization {
            all.push(("Authorization", authorization));
        }
        request(method, &url, &all, body)
    }

    /// `GET path`, any status.
    pub fn get(&self, path: &str) -> Result<Response> {
        self.send("GET", path, &[], &[])
    }

    /// Uploads a blob unless the repository already has it; returns its digest.
    ///
    /// Monolithic upload: `POST /v2/<repo>/blobs/uploads/`, then one `PUT <location>&digest=`.
    pub fn push_blob(&self, repository: &str, data: &[u8]) -> Result<String> {
        let digest = sha256_digest(data);
        let blob_path = format!("/v2/{repository}/blobs/{digest}");
        if self.send("HEAD", &blob_path, &[], &[])?.status == 200 {
            return Ok(digest);
        }

        let start_path = format!("/v2/{repository}/blobs/uploads/");
        let started = expect_status(
            self.send("POST", &start_path, &[], &[])?,
            "POST",
            &self.url(&start_path),
            &[202],
        )?;
        let location = started.header("location").ok_or_else(|| Error::Protocol {
            url: self.url(&start_path),
            detail: "upload started without a Location header".to_owned(),
        })?;
        let location = if location.starts_with("http://") {
            location.to_owned()
        } else {
            format!("{}{location}", self.base)
        };
        let separator = if location.contains('?') { '&' } else { '?' };
        let put_url = format!("{location}{separator}digest={digest}");
        let response = self.send(
            "PUT",
            &put_url,
            &[("Content-Type", "application/octet-stream")],
            data,
        )?;
        expect_status(response, "PUT", &put_url, &[201])?;
        Ok(digest)
    }

    /// `PUT /v2/<repo>/manifests/<reference>` (a tag or the manifest's digest); returns the digest.
    pub fn push_manifest(
        &self,
        repository: &str,
        reference: &str,
        media_type: &str,
        body: &[u8],
    ) -> Result<String> {
        let digest = sha256_digest(body);
        let path = format!("/v2/{repository}/manifests/{reference}");
        let response = self.send("PUT", &path, &[("Content-Type", media_type)], body)?;
        let response = expect_status(response, "PUT", &self.url(&path), &[201])?;
        match response.header("docker-content-digest") {
            Some(served) if served != digest => Err(Error::Protocol {
                url: self.url(&path),
                detail: format!("registry computed digest {served}, we computed {digest}"),
            }),
            _ => Ok(digest),
        }
    }

    /// Fetches a manifest or index by tag or digest; checks the digest of what was served.
    pub fn manifest(&self, repository: &str, reference: &str) -> Result<FetchedManifest> {
        let path = format!("/v2/{repository}/manifests/{reference}");
        let response = self.send("GET", &path, &[("Accept", MANIFEST_ACCEPT)], &[])?;
        let response = expect_status(response, "GET", &self.url(&path), &[200])?;
        let digest = sha256_digest(&response.body);
        let served = response.header("docker-content-digest");
        let wrong = served.is_some_and(|served| served != digest)
            || (reference.starts_with("sha256:") && reference != digest);
        if wrong {
            return Err(Error::Protocol {
                url: self.url(&path),
                detail: format!("served manifest has digest {digest} (header says {served:?})"),
            });
        }
        Ok(FetchedManifest {
            media_type: response
                .header("content-type")
                .unwrap_or_default()
                .to_owned(),
            digest,
            body: response.body,
        })
    }

    /// Fetches a blob and checks it against its digest.
    pub fn blob(&self, repository: &str, digest: &str) -> Result<Vec<u8>> {
        let path = format!("/v2/{repository}/blobs/{digest}");
        let response = self.send("GET", &path, &[], &[])?;
        let response = expect_status(response, "GET", &self.url(&path), &[200])?;
        let actual = sha256_digest(&response.body);
        if actual != digest {
            return Err(Error::Protocol {
                url: self.url(&path),
                detail: format!("served blob has digest {actual}"),
            });
        }
        Ok(response.body)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

fn expect_status(response: Response, method: &str, url: &str, ok: &[u16]) -> Result<Response> {
    if ok.contains(&response.status) {
        Ok(response)
    } else {
        Err(Error::HttpStatus {
            method: method.to_owned(),
            url: url.to_owned(),
            status: response.status,
            body: response.body_text(),
        })
    }
}
