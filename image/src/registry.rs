//! A small registry client on hyper: per-host TLS settings from `hosts.toml`, the Basic and
//! Bearer challenge flows (with username/password, `auth`, identity or registry tokens), and
//! redirects. One `Session` serves one pull: it tries the hosts in order and caches tokens.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, LOCATION, USER_AGENT, WWW_AUTHENTICATE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::auth::authority;
pub use crate::auth::Auth;
use crate::error::{Error, Result};
use crate::hosts::RegistryHost;
use crate::proxy::{ProxyConnector, ProxySetting};

const MAX_REDIRECTS: usize = 5;
const USER_AGENT_VALUE: &str = concat!("crius/", env!("CARGO_PKG_VERSION"));

type HttpClient = Client<HttpsConnector<ProxyConnector>, Full<Bytes>>;

#[derive(Clone, PartialEq, Eq, Hash)]
struct TlsKey {
    skip_verify: bool,
    ca: Vec<PathBuf>,
    client: Option<(PathBuf, Option<PathBuf>)>,
    proxy: ProxySetting,
}

/// HTTP clients shared by all pulls, one per distinct TLS setting, each with its own
/// connection pool.
#[derive(Default)]
pub(crate) struct Clients {
    map: Mutex<HashMap<TlsKey, HttpClient>>,
    native_roots: OnceLock<Vec<CertificateDer<'static>>>,
}

impl Clients {
    fn client_for(&self, host: &RegistryHost) -> Result<HttpClient> {
        let key = TlsKey {
            skip_verify: host.skip_verify,
            ca: host.ca.clone(),
            client: host.client.first().cloned(),
            proxy: host.proxy.clone(),
        };
        let mut map = self
            .map
            .lock()
            .map_err(|_| Error::Internal("registry client cache lock poisoned".into()))?;
        if let Some(c) = map.get(&key) {
            return Ok(c.clone());
        }
        let client = self.build(&key, &host.authority)?;
        map.insert(key, client.clone());
        Ok(client)
    }

    fn build(&self, key: &TlsKey, registry: &str) -> Result<HttpClient> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Internal(format!("tls setup: {e}")))?;
        let builder = if key.skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
        } else {
            let mut roots = rustls::RootCertStore::empty();
            let native = self.native_roots.get_or_init(|| {
                let found = rustls_native_certs::load_native_certs();
                for e in &found.errors {
                    tracing::warn!("loading system CA certificates: {e}");
                }
                found.certs
            });
            roots.add_parsable_certificates(native.iter().cloned());
            for path in &key.ca {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
                    .map_err(|e| Error::HostsConfig {
                        path: path.clone(),
                        reason: format!("CA certificate for {registry}: {e}"),
                    })?;
                for cert in certs {
                    roots.add(cert).map_err(|e| Error::HostsConfig {
                        path: path.clone(),
                        reason: format!("CA certificate for {registry}: {e}"),
                    })?;
                }
            }
            builder.with_root_certificates(roots)
        };
        let config = match &key.client {
            None => builder.with_no_client_auth(),
            Some((cert, key_file)) => {
                let bad = |path: &PathBuf, e: String| Error::HostsConfig {
                    path: path.clone(),
                    reason: format!("client certificate for {registry}: {e}"),
                };
                let certs = CertificateDer::pem_file_iter(cert)
                    .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
                    .map_err(|e| bad(cert, e.to_string()))?;
                let key_path = key_file.as_ref().unwrap_or(cert);
                let private = PrivateKeyDer::from_pem_file(key_path)
                    .map_err(|e| bad(key_path, e.to_string()))?;
                builder
                    .with_client_auth_cert(certs, private)
                    .map_err(|e| bad(cert, e.to_string()))?
            }
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(Duration::from_secs(30)));
        http.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .wrap_connector(ProxyConnector::new(http, &key.proxy));
        Ok(Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(https))
    }
}

/// Whether a request failed because its connection closed before any answer (a stale pooled
/// connection), rather than for a reason a second try would meet again.
fn closed_early(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            return h.is_incomplete_message() || h.is_canceled();
        }
        source = err.source();
    }
    false
}

/// Accepts any server certificate: `skip_verify = true` in hosts.toml.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The registry side of one pull: the hosts to try, the repository and the credentials.
pub(crate) struct Session {
    clients: Arc<Clients>,
    pub(crate) hosts: Vec<RegistryHost>,
    domain: String,
    repo: String,
    /// The request's credentials, for the origin registry only.
    auth: Auth,
    /// Credentials from the auth file by registry authority; each only for its own host.
    file_auths: HashMap<String, Auth>,
    /// Authorization header per host authority, once a challenge was answered.
    authorization: Mutex<HashMap<String, String>>,
    /// How long to wait for response headers or for the next chunk of a body.
    pub(crate) timeout: Duration,
}

impl Session {
    pub(crate) fn new(
        clients: Arc<Clients>,
        hosts: Vec<RegistryHost>,
        domain: &str,
        repo: &str,
        auth: &Auth,
        file_auths: HashMap<String, Auth>,
        timeout: Duration,
    ) -> Self {
        Self {
            clients,
            hosts,
            domain: domain.to_string(),
            repo: repo.to_string(),
            auth: auth.for_registry(domain),
            file_auths,
            authorization: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    /// GET `<host>/<repo>/<object>` (object = `manifests/<ref>` or `blobs/<digest>`), answering
    /// an auth challenge once and following redirects. Errors name the host and `what`.
    pub(crate) async fn get(
        &self,
        host: &RegistryHost,
        object: &str,
        accept: &str,
        what: &str,
    ) -> Result<Response<Incoming>> {
        let client = self.clients.client_for(host)?;
        let mut url = format!("{}/{}/{}", host.base_url(), self.repo, object);
        if !host.is_origin {
            url.push_str(&format!("?ns={}", query_escape(&self.domain)));
        }
        let registry = host.authority.clone();
        let mut same_host = true;
        let mut answered_challenge = false;
        let mut redirects = 0;
        loop {
            let mut req = Request::builder()
                .method(Method::GET)
                .uri(&url)
                .header(USER_AGENT, USER_AGENT_VALUE);
            if !accept.is_empty() {
                req = req.header(ACCEPT, accept);
            }
            if same_host {
                for (k, v) in &host.headers {
                    req = req.header(k.as_str(), v.as_str());
                }
                if let Some(value) = self.authorization_for(&registry) {
                    req = req.header(AUTHORIZATION, value);
                }
            }
            let req = req
                .body(Full::new(Bytes::new()))
                .map_err(|e| Error::Protocol {
                    registry: registry.clone(),
                    what: what.to_string(),
                    reason: format!("bad request URL {url:?}: {e}"),
                })?;
            let resp = self.send(&client, req, &registry).await?;
            let status = resp.status();
            if status.is_success() {
                return Ok(resp);
            }
            if status.is_redirection() {
                redirects += 1;
                let location = resp
                    .headers()
                    .get(LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .filter(|_| redirects <= MAX_REDIRECTS)
                    .ok_or_else(|| Error::Protocol {
                        registry: registry.clone(),
                        what: what.to_string(),
                        reason: format!("redirect ({status}) without usable location"),
                    })?;
                let next = resolve_location(&url, location);
                same_host = same_host && authority_of(&next) == authority_of(&url);
                url = next;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED && same_host && !answered_challenge {
                answered_challenge = true;
                let challenges: Vec<String> = resp
                    .headers()
                    .get_all(WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok().map(str::to_string))
                    .collect();
                let value = self
                    .answer_challenge(&client, &registry, &challenges)
                    .await?;
                self.set_authorization(&registry, value);
                continue;
            }
            return Err(self.status_error(&registry, what, resp).await);
        }
    }

    async fn send(
        &self,
        client: &HttpClient,
        req: Request<Full<Bytes>>,
        registry: &str,
    ) -> Result<Response<Incoming>> {
        // A pooled connection the server (or a proxy) closed just as the request went out
        // fails it with nothing read: a GET or HEAD is sent once more on a fresh connection.
        let again = matches!(*req.method(), Method::GET | Method::HEAD).then(|| {
            let mut r = Request::new(req.body().clone());
            *r.method_mut() = req.method().clone();
            *r.uri_mut() = req.uri().clone();
            *r.headers_mut() = req.headers().clone();
            r
        });
        let first = tokio::time::timeout(self.timeout, client.request(req)).await;
        let outcome = match (first, again) {
            (Ok(Err(e)), Some(again)) if closed_early(&e) => {
                tokio::time::timeout(self.timeout, client.request(again)).await
            }
            (first, _) => first,
        };
        match outcome {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(Error::Unavailable {
                registry: registry.to_string(),
                reason: crius_common::error_chain(&e),
            }),
            Err(_) => Err(Error::Unavailable {
                registry: registry.to_string(),
                reason: format!("no response within {} s", self.timeout.as_secs()),
            }),
        }
    }

    async fn status_error(&self, registry: &str, what: &str, resp: Response<Incoming>) -> Error {
        let status = resp.status();
        let registry = registry.to_string();
        let what = what.to_string();
        match status {
            StatusCode::UNAUTHORIZED if self.auth_for(&registry).is_empty() => {
                Error::AuthenticationRequired { registry }
            }
            StatusCode::UNAUTHORIZED => Error::CredentialsRejected { registry },
            StatusCode::FORBIDDEN => Error::PermissionDenied { registry, what },
            StatusCode::NOT_FOUND => Error::NotFoundInRegistry { registry, what },
            _ => {
                let body = read_limited(resp, 1024, self.timeout)
                    .await
                    .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                    .unwrap_or_default();
                Error::RegistryStatus {
                    registry,
                    what,
                    status: status.as_u16(),
                    body,
                }
            }
        }
    }

    /// The credentials for host `registry`: the request's for the origin when it carries some,
    /// else the auth file's entry for that host (for the origin also the one for its domain).
    fn auth_for(&self, registry: &str) -> &Auth {
        static NONE: std::sync::OnceLock<Auth> = std::sync::OnceLock::new();
        let origin = self
            .hosts
            .iter()
            .any(|h| h.is_origin && h.authority == registry);
        if origin && !self.auth.is_empty() {
            return &self.auth;
        }
        let own = self.file_auths.get(&authority(registry));
        own.or_else(|| origin.then(|| self.file_auths.get(&self.domain)).flatten())
            .unwrap_or_else(|| NONE.get_or_init(Auth::default))
    }

    fn authorization_for(&self, registry: &str) -> Option<String> {
        let cached = self
            .authorization
            .lock()
            .ok()
            .and_then(|m| m.get(registry).cloned());
        let auth = self.auth_for(registry);
        cached.or_else(|| {
            (!auth.registry_token.is_empty()).then(|| format!("Bearer {}", auth.registry_token))
        })
    }

    fn set_authorization(&self, registry: &str, value: String) {
        if let Ok(mut m) = self.authorization.lock() {
            m.insert(registry.to_string(), value);
        }
    }

    /// The Authorization header value that answers the challenges of a 401.
    async fn answer_challenge(
        &self,
        client: &HttpClient,
        registry: &str,
        challenges: &[String],
    ) -> Result<String> {
        let parsed: Vec<Challenge> = challenges
            .iter()
            .filter_map(|c| parse_challenge(c))
            .collect();
        let required = || Error::AuthenticationRequired {
            registry: registry.to_string(),
        };
        if let Some(bearer) = parsed
            .iter()
            .find(|c| c.scheme.eq_ignore_ascii_case("bearer"))
        {
            let realm = bearer.param("realm").ok_or_else(|| Error::Protocol {
                registry: registry.to_string(),
                what: "auth challenge".into(),
                reason: "bearer challenge without realm".into(),
            })?;
            let default_scope = format!("repository:{}:pull", self.repo);
            let scope = bearer.param("scope").unwrap_or(&default_scope);
            let service = bearer.param("service").unwrap_or("");
            let token = self
                .fetch_token(client, registry, realm, service, scope)
                .await?;
            return Ok(format!("Bearer {token}"));
        }
        if parsed
            .iter()
            .any(|c| c.scheme.eq_ignore_ascii_case("basic"))
        {
            let (user, pass) = self.auth_for(registry).basic().ok_or_else(required)?;
            let encoded =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
            return Ok(format!("Basic {encoded}"));
        }
        Err(required())
    }

    async fn fetch_token(
        &self,
        client: &HttpClient,
        registry: &str,
        realm: &str,
        service: &str,
        scope: &str,
    ) -> Result<String> {
        let realm_host = authority_of(realm).unwrap_or(realm).to_string();
        // The credentials of the registry that sent the challenge, for its token server.
        let auth = self.auth_for(registry);
        let req = if !auth.identity_token.is_empty() {
            let form = format!(
                "grant_type=refresh_token&refresh_token={}&service={}&scope={}&client_id=crius",
                query_escape(&auth.identity_token),
                query_escape(service),
                query_escape(scope)
            );
            Request::builder()
                .method(Method::POST)
                .uri(realm)
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header(USER_AGENT, USER_AGENT_VALUE)
                .body(Full::new(Bytes::from(form)))
        } else {
            let sep = if realm.contains('?') { '&' } else { '?' };
            let mut url = format!("{realm}{sep}scope={}", query_escape(scope));
            if !service.is_empty() {
                url.push_str(&format!("&service={}", query_escape(service)));
            }
            let mut req = Request::builder()
                .method(Method::GET)
                .uri(url)
                .header(USER_AGENT, USER_AGENT_VALUE);
            if let Some((user, pass)) = auth.basic() {
                let encoded =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
                req = req.header(AUTHORIZATION, format!("Basic {encoded}"));
            }
            req.body(Full::new(Bytes::new()))
        }
        .map_err(|e| Error::Protocol {
            registry: registry.to_string(),
            what: "auth token".into(),
            reason: format!("bad token realm {realm:?}: {e}"),
        })?;

        let resp = self.send(client, req, &realm_host).await?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(if auth.is_empty() {
                Error::AuthenticationRequired {
                    registry: registry.to_string(),
                }
            } else {
                Error::CredentialsRejected {
                    registry: registry.to_string(),
                }
            });
        }
        if !status.is_success() {
            return Err(self.status_error(&realm_host, "auth token", resp).await);
        }
        let body = read_limited(resp, 1 << 20, self.timeout).await?;
        #[derive(serde::Deserialize)]
        struct TokenResponse {
            #[serde(default)]
            token: String,
            #[serde(default)]
            access_token: String,
        }
        let parsed: TokenResponse = serde_json::from_slice(&body).map_err(|e| Error::Protocol {
            registry: realm_host.clone(),
            what: "auth token".into(),
            reason: format!("invalid token response: {e}"),
        })?;
        let token = if parsed.token.is_empty() {
            parsed.access_token
        } else {
            parsed.token
        };
        if token.is_empty() {
            return Err(Error::Protocol {
                registry: realm_host,
                what: "auth token".into(),
                reason: "token response has no token".into(),
            });
        }
        Ok(token)
    }
}

/// The error when no host of the pull may serve `what`.
pub(crate) fn no_hosts(what: &str) -> Error {
    Error::Internal(format!(
        "{what}: no registry host may serve it (check the capabilities in hosts.toml)"
    ))
}

/// Reads a whole (small) body, refusing more than `limit` bytes.
pub(crate) async fn read_limited(
    resp: Response<Incoming>,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes> {
    let mut body = resp.into_body();
    let mut out = Vec::new();
    loop {
        let frame = match tokio::time::timeout(timeout, body.frame()).await {
            Err(_) => {
                return Err(Error::ResponseStalled {
                    secs: timeout.as_secs(),
                })
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(Error::Internal(format!("reading response: {e}"))),
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(Error::Internal(format!(
                    "response larger than {limit} bytes"
                )));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(out))
}

fn authority_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    Some(rest.split(['/', '?']).next().unwrap_or(rest))
}

fn resolve_location(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    if location.starts_with('/') {
        format!("{}{}", &base[..host_end], location)
    } else {
        let dir_end = base
            .rfind('/')
            .filter(|&i| i >= host_end)
            .unwrap_or(host_end);
        format!("{}/{}", &base[..dir_end], location)
    }
}

fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

struct Challenge {
    scheme: String,
    params: Vec<(String, String)>,
}

impl Challenge {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Parses `Scheme k="v", k2=v2` (RFC 7235, one challenge per header value).
fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, mut rest) = match header.split_once(' ') {
        Some((s, r)) => (s, r.trim_start()),
        None => (header, ""),
    };
    if scheme.is_empty() {
        return None;
    }
    let mut params = Vec::new();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().trim_start_matches(',').trim().to_string();
        let after = after.trim_start();
        let (value, remaining) = if let Some(q) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = q.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &q[end?..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        params.push((key, value));
        rest = remaining.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge {
        scheme: scheme.to_string(),
        params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenge_parsing() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "Bearer");
        assert_eq!(c.param("realm"), Some("https://auth.docker.io/token"));
        assert_eq!(c.param("service"), Some("registry.docker.io"));
        assert_eq!(c.param("scope"), Some("repository:library/busybox:pull"));
        let c = parse_challenge(r#"Basic realm="basic-realm""#).unwrap();
        assert_eq!(c.scheme, "Basic");
        assert_eq!(c.param("REALM"), Some("basic-realm"));
        let c = parse_challenge(r#"Bearer realm=x, error="invalid \"token\"""#).unwrap();
        assert_eq!(c.param("realm"), Some("x"));
        assert_eq!(c.param("error"), Some("invalid \"token\""));
        assert!(parse_challenge(r#"Bearer realm="unterminated"#).is_none());
    }

    #[test]
    fn locations_and_escaping() {
        let base = "http://a:5000/v2/x/blobs/sha256:1";
        assert_eq!(resolve_location(base, "/other"), "http://a:5000/other");
        assert_eq!(resolve_location(base, "https://s3/x?y"), "https://s3/x?y");
        assert_eq!(
            resolve_location(base, "rel"),
            "http://a:5000/v2/x/blobs/rel"
        );
        assert_eq!(authority_of(base), Some("a:5000"));
        assert_eq!(
            query_escape("repository:a/b:pull"),
            "repository%3Aa%2Fb%3Apull"
        );
    }
}
