//! Test helpers: a real `docker-registry` on 127.0.0.1, a tiny pusher, image builders based
//! on /bin/busybox, and a fake registry for behaviours a real one will not show (stalls,
//! bearer tokens). Shared by the integration tests and the pull benchmark.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// `sha256:<hex>` of `data`, the OCI digest form.
pub use crius_tests::sha256_digest as sha256;

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    crius_tests::free_port().expect("bind a loopback port")
}

/// A `docker-registry` serving from a temp dir; killed and reaped on drop.
pub struct Registry {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Child,
    pub credentials: Option<(String, String)>,
}

impl Registry {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// With credentials: htpasswd (basic) authentication.
    pub fn start_with(credentials: Option<(&str, &str)>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("crius-image-registry")
            .tempdir()
            .unwrap();
        let port = free_port();
        let mut auth = String::new();
        if let Some((user, pass)) = credentials {
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, pass])
                .output()
                .expect("htpasswd (apache2-utils) is installed");
            assert!(out.status.success(), "htpasswd failed");
            std::fs::write(dir.path().join("htpasswd"), &out.stdout).unwrap();
            auth = format!(
                "auth:\n  htpasswd:\n    realm: crius-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            );
        }
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: crius-test-secret\n{auth}",
            dir.path().join("data").display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let child = spawn_registry(dir.path(), &config_path);
        let reg = Registry {
            dir,
            port,
            child,
            credentials: credentials.map(|(u, p)| (u.to_string(), p.to_string())),
        };
        reg.wait_ready();
        reg
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "registry did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Restarts the registry (same port, same content) serving HTTPS with a certificate for
    /// 127.0.0.1 signed by a fresh test CA; returns the CA certificate's path.
    pub fn restart_with_tls(&mut self) -> PathBuf {
        self.restart_with_tls_opts(false)
    }

    /// Like [`Registry::restart_with_tls`]; with `require_client`, the registry also demands a
    /// client certificate signed by the CA (`client.crt`/`client.key` beside `ca.crt`).
    pub fn restart_with_tls_opts(&mut self, require_client: bool) -> PathBuf {
        let d = self.dir.path().to_path_buf();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&d)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=crius-test-ca",
                ],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=127.0.0.1",
                ],
            ]
            .concat(),
        );
        std::fs::write(
            d.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ]);
        if require_client {
            openssl(
                &[
                    &["req"][..],
                    &ec,
                    &[
                        "-keyout",
                        "client.key",
                        "-out",
                        "client.csr",
                        "-subj",
                        "/CN=crius-client",
                    ],
                ]
                .concat(),
            );
            std::fs::write(
                d.join("client-ext.cnf"),
                "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
            )
            .unwrap();
            openssl(&[
                "x509",
                "-req",
                "-in",
                "client.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "client.crt",
                "-days",
                "2",
                "-extfile",
                "client-ext.cnf",
            ]);
        }
        let client_cas = if require_client {
            format!("    clientcas:\n      - {}\n", d.join("ca.crt").display())
        } else {
            String::new()
        };
        let config_path = d.join("config.yml");
        let config = std::fs::read_to_string(&config_path).unwrap().replace(
            "  secret: crius-test-secret\n",
            &format!(
                "  secret: crius-test-secret\n  tls:\n    certificate: {}\n    key: {}\n{client_cas}",
                d.join("server.crt").display(),
                d.join("server.key").display()
            ),
        );
        std::fs::write(&config_path, config).unwrap();
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn_registry(&d, &config_path);
        self.wait_ready();
        d.join("ca.crt")
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// The registry's own file for a blob, to corrupt it behind its back.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

fn spawn_registry(dir: &Path, config: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("registry.log"))
        .unwrap();
    Command::new("/usr/bin/docker-registry")
        .arg("serve")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start /usr/bin/docker-registry")
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One tar entry of a test layer.
pub enum Entry {
    Dir(&'static str, u32),
    File(String, Vec<u8>, u32),
    Owned(String, Vec<u8>, u32, u64, u64),
    Symlink(&'static str, &'static str),
    Hardlink(&'static str, &'static str),
    /// A regular file whose name is written raw, unchecked (e.g. `../evil`).
    RawName(&'static str, Vec<u8>),
}

pub fn file(path: &str, data: impl Into<Vec<u8>>) -> Entry {
    Entry::File(path.to_string(), data.into(), 0o644)
}

pub fn tar(entries: &[Entry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            Entry::Dir(p, mode) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*mode);
                h.set_size(0);
                b.append_data(&mut h, p, std::io::empty()).unwrap();
            }
            Entry::File(p, data, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, &data[..]).unwrap();
            }
            Entry::Owned(p, data, mode, uid, gid) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_uid(*uid);
                h.set_gid(*gid);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, &data[..]).unwrap();
            }
            Entry::Symlink(p, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, p, target).unwrap();
            }
            Entry::Hardlink(p, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                h.set_size(0);
                b.append_link(&mut h, p, target).unwrap();
            }
            Entry::RawName(p, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(data.len() as u64);
                let name = &mut h.as_old_mut().name;
                name.fill(0);
                name[..p.len()].copy_from_slice(p.as_bytes());
                h.set_cksum();
                b.append(&h, &data[..]).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A layer with /bin/busybox and a few applet links: enough to be a real busybox image.
pub fn busybox_layer() -> Vec<u8> {
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static is installed");
    tar(&[
        Entry::Dir("bin", 0o755),
        Entry::File("bin/busybox".into(), busybox, 0o755),
        Entry::Symlink("bin/sh", "busybox"),
        Entry::Symlink("bin/ls", "busybox"),
        Entry::Hardlink("bin/true", "bin/busybox"),
        Entry::Dir("etc", 0o755),
        file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        Entry::Dir("tmp", 0o1777),
    ])
}

/// What a layer is sent as.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

pub struct Pushed {
    pub manifest_digest: String,
    pub manifest: Vec<u8>,
    pub config_digest: String,
    pub layer_digests: Vec<String>,
}

pub struct ImageSpec {
    pub layers: Vec<Vec<u8>>,
    pub user: Option<String>,
    pub architecture: String,
    pub compression: Compression,
    /// Docker schema2 media types instead of OCI.
    pub docker: bool,
}

impl ImageSpec {
    pub fn new(layers: Vec<Vec<u8>>) -> Self {
        Self {
            layers,
            user: None,
            architecture: "amd64".into(),
            compression: Compression::Gzip,
            docker: false,
        }
    }
}

/// Pushes blobs and manifests with the registry API (basic auth when the registry has it).
pub struct Pusher {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    auth: Option<String>,
}

impl Pusher {
    pub fn new(reg: &Registry) -> Self {
        use base64::Engine as _;
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{}", reg.host()),
            auth: reg.credentials.as_ref().map(|(u, p)| {
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
                )
            }),
        }
    }

    async fn send(
        &self,
        method: &str,
        url: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, http::HeaderMap, Vec<u8>) {
        let mut req = http::Request::builder().method(method).uri(url);
        if let Some(a) = &self.auth {
            req = req.header("authorization", a);
        }
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let resp = self
            .client
            .request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        (status, headers, body)
    }

    pub async fn blob(&self, repo: &str, data: &[u8]) -> String {
        let digest = sha256(data);
        let (status, headers, body) = self
            .send(
                "POST",
                &format!("{}/v2/{repo}/blobs/uploads/", self.base),
                None,
                vec![],
            )
            .await;
        assert_eq!(
            status,
            202,
            "start upload: {}",
            String::from_utf8_lossy(&body)
        );
        let location = headers["location"].to_str().unwrap().to_string();
        let location = if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else {
            location
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let (status, _, body) = self
            .send(
                "PUT",
                &format!("{location}{sep}digest={digest}"),
                Some("application/octet-stream"),
                data.to_vec(),
            )
            .await;
        assert_eq!(status, 201, "upload: {}", String::from_utf8_lossy(&body));
        digest
    }

    pub async fn manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        data: &[u8],
    ) -> String {
        let (status, _, body) = self
            .send(
                "PUT",
                &format!("{}/v2/{repo}/manifests/{reference}", self.base),
                Some(media_type),
                data.to_vec(),
            )
            .await;
        assert_eq!(
            status,
            201,
            "put manifest: {}",
            String::from_utf8_lossy(&body)
        );
        sha256(data)
    }

    /// Pushes an image (config + layers + manifest) and tags it.
    pub async fn image(&self, repo: &str, tag: &str, spec: &ImageSpec) -> Pushed {
        let diff_ids: Vec<String> = spec.layers.iter().map(|l| sha256(l)).collect();
        let mut config = serde_json::json!({
            "architecture": spec.architecture,
            "os": "linux",
            "config": { "Cmd": ["/bin/sh"], "Env": ["PATH=/bin"] },
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
        });
        if let Some(u) = &spec.user {
            config["config"]["User"] = serde_json::json!(u);
        }
        let config = serde_json::to_vec(&config).unwrap();
        let config_digest = self.blob(repo, &config).await;
        let (layer_type, manifest_type, config_type) = match (spec.docker, spec.compression) {
            (true, _) => (
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "application/vnd.docker.distribution.manifest.v2+json",
                "application/vnd.docker.container.image.v1+json",
            ),
            (false, Compression::None) => (
                "application/vnd.oci.image.layer.v1.tar",
                "application/vnd.oci.image.manifest.v1+json",
                "application/vnd.oci.image.config.v1+json",
            ),
            (false, Compression::Gzip) => (
                "application/vnd.oci.image.layer.v1.tar+gzip",
                "application/vnd.oci.image.manifest.v1+json",
                "application/vnd.oci.image.config.v1+json",
            ),
            (false, Compression::Zstd) => (
                "application/vnd.oci.image.layer.v1.tar+zstd",
                "application/vnd.oci.image.manifest.v1+json",
                "application/vnd.oci.image.config.v1+json",
            ),
        };
        let mut layers = Vec::new();
        let mut layer_digests = Vec::new();
        for layer in &spec.layers {
            let blob = match (spec.docker, spec.compression) {
                (true, _) | (false, Compression::Gzip) => gzip(layer),
                (false, Compression::None) => layer.clone(),
                (false, Compression::Zstd) => zstd::encode_all(&layer[..], 3).unwrap(),
            };
            let d = self.blob(repo, &blob).await;
            layers.push(
                serde_json::json!({"mediaType": layer_type, "digest": d, "size": blob.len()}),
            );
            layer_digests.push(d);
        }
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": manifest_type,
            "config": {"mediaType": config_type, "digest": config_digest, "size": config.len()},
            "layers": layers,
        }))
        .unwrap();
        let manifest_digest = self.manifest(repo, tag, manifest_type, &manifest).await;
        Pushed {
            manifest_digest,
            manifest,
            config_digest,
            layer_digests,
        }
    }

    /// Pushes an OCI index over already pushed manifests, `(architecture, image)` each.
    pub async fn index(&self, repo: &str, tag: &str, entries: &[(&str, &Pushed)]) -> String {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .map(|(arch, p)| {
                serde_json::json!({
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": p.manifest_digest,
                    "size": p.manifest.len(),
                    "platform": {"architecture": arch, "os": "linux"},
                })
            })
            .collect();
        let index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
        }))
        .unwrap();
        self.manifest(repo, tag, "application/vnd.oci.image.index.v1+json", &index)
            .await
    }
}

/// A read-only overlay of lowerdirs on a temp mountpoint; unmounted on drop.
pub struct OverlayMount {
    pub dir: tempfile::TempDir,
}

impl OverlayMount {
    pub fn new(lowerdirs: &[PathBuf]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("crius-image-overlay")
            .tempdir()
            .unwrap();
        let lower: Vec<String> = lowerdirs.iter().map(|p| p.display().to_string()).collect();
        let lower = if lower.len() == 1 {
            // overlay needs two layers without an upper dir: add an empty one.
            let empty = dir.path().join("empty");
            std::fs::create_dir(&empty).unwrap();
            vec![lower[0].clone(), empty.display().to_string()]
        } else {
            lower
        };
        let target = dir.path().join("merged");
        std::fs::create_dir(&target).unwrap();
        let status = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o"])
            .arg(format!("ro,lowerdir={}", lower.join(":")))
            .arg(&target)
            .status()
            .unwrap();
        assert!(status.success(), "mount overlay");
        Self { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("merged")
    }
}

impl Drop for OverlayMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.path()).status();
    }
}

/// What the fake registry answers for one request.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Send only this many body bytes, then stall (keep the connection open, silent).
    pub stall_after: Option<usize>,
    /// Wait this long before answering (a slow registry that still delivers).
    pub delay: Option<Duration>,
}

impl Reply {
    pub fn ok(body: Vec<u8>, content_type: &str) -> Self {
        Reply {
            status: 200,
            headers: vec![("Content-Type".into(), content_type.into())],
            body,
            stall_after: None,
            delay: None,
        }
    }
    pub fn status(status: u16) -> Self {
        Reply {
            status,
            headers: vec![],
            body: vec![],
            stall_after: None,
            delay: None,
        }
    }
}

/// A minimal HTTP/1.1 server on 127.0.0.1 answering each request with `handler(method, path,
/// headers, body)`. Stops when dropped.
pub struct FakeRegistry {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl FakeRegistry {
    pub async fn start<F>(handler: F) -> Self
    where
        F: Fn(&str, &str, &[(String, String)], &[u8]) -> Reply + Send + Sync + 'static,
    {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let handler = std::sync::Arc::new(handler);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let handler = handler.clone();
                tokio::spawn(async move {
                    let (r, mut w) = stream.into_split();
                    let mut r = BufReader::new(r);
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let mut parts = line.split_whitespace();
                        let method = parts.next().unwrap_or("").to_string();
                        let path = parts.next().unwrap_or("").to_string();
                        let mut headers = Vec::new();
                        let mut content_length = 0usize;
                        loop {
                            let mut h = String::new();
                            if r.read_line(&mut h).await.unwrap_or(0) == 0 {
                                return;
                            }
                            let h = h.trim_end();
                            if h.is_empty() {
                                break;
                            }
                            if let Some((k, v)) = h.split_once(':') {
                                if k.eq_ignore_ascii_case("content-length") {
                                    content_length = v.trim().parse().unwrap_or(0);
                                }
                                headers.push((k.trim().to_lowercase(), v.trim().to_string()));
                            }
                        }
                        let mut body = vec![0; content_length];
                        if content_length > 0 {
                            use tokio::io::AsyncReadExt;
                            if r.read_exact(&mut body).await.is_err() {
                                return;
                            }
                        }
                        let reply = handler(&method, &path, &headers, &body);
                        if let Some(delay) = reply.delay {
                            tokio::time::sleep(delay).await;
                        }
                        let mut head = format!(
                            "HTTP/1.1 {} X\r\nContent-Length: {}\r\n",
                            reply.status,
                            reply.body.len()
                        );
                        for (k, v) in &reply.headers {
                            head.push_str(&format!("{k}: {v}\r\n"));
                        }
                        head.push_str("\r\n");
                        if w.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        let n = reply.stall_after.unwrap_or(reply.body.len());
                        if w.write_all(&reply.body[..n]).await.is_err() {
                            return;
                        }
                        let _ = w.flush().await;
                        if reply.stall_after.is_some() {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            return;
                        }
                    }
                });
            }
        });
        Self { port, task }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes `<dir>/<host>/hosts.toml`.
pub fn hosts_toml(dir: &Path, host: &str, text: &str) {
    let d = dir.join(host);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("hosts.toml"), text).unwrap();
}
