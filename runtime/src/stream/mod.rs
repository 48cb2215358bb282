//! The streaming server for `Exec`, `Attach` and `PortForward`.
//!
//! Those RPCs only validate the request and answer a URL: `http://<address>:<port>/exec/<token>`
//! (or `/attach/`, `/portforward/`; `https://` when TLS is configured, [`tls`]). The token
//! names the prepared request; it can be used once, within [`TOKEN_TTL`]. The client (crictl,
//! critest, or kubelet proxying kubectl's connection) then upgrades an HTTP/1.1 request on that
//! URL to SPDY/3.1 or to WebSocket ([`websocket`]) and speaks the Kubernetes stream protocols
//! over it: [`remotecommand`] for exec and attach, [`portforward`] for port forwarding. The I/O
//! of exec and attach goes through the pod's shim, which hands crius the process's stdio
//! ([`shim_io`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming as Body;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub mod idle;
pub mod peers;
pub mod portforward;
pub mod remotecommand;
pub mod session;
pub mod shim_io;
pub mod spdy;
pub mod tls;
pub mod websocket;

pub use remotecommand::Target;

/// How long a URL answered by Exec, Attach or PortForward stays valid (kubelet's is a minute).
pub const TOKEN_TTL: Duration = Duration::from_secs(60);

/// At most this many prepared requests wait for their client.
const MAX_PENDING: usize = 1000;

/// Errors of the streaming server.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("listen on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("stream server address {0:?} is not an IP address and port")]
    Address(String),
    #[error("the streaming server is not running")]
    NotRunning,
    #[error("shim at {path}")]
    Shim {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the shim refused: {0}")]
    Refused(#[source] crius_api::shim::ShimError),
    #[error("draw a stream token")]
    Token(#[source] std::io::Error),
    #[error("stream server TLS")]
    Tls(#[source] tls::TlsError),
}

/// A request prepared by an RPC, waiting for its client to connect.
pub enum PendingStream {
    /// Exec or attach.
    Command(Target),
    PortForward {
        pod_id: String,
        netns: Option<PathBuf>,
    },
}

impl PendingStream {
    fn kind(&self) -> &'static str {
        match self {
            PendingStream::Command(t) if t.attach() => "attach",
            PendingStream::Command(_) => "exec",
            PendingStream::PortForward { .. } => "portforward",
        }
    }
}

/// The streaming server: its address once listening, and the prepared requests.
pub struct StreamServer {
    base_url: OnceLock<String>,
    /// How long a session may stay without traffic (`[stream] idle_timeout_secs`).
    idle_timeout: OnceLock<Duration>,
    pending: Mutex<HashMap<String, (Instant, PendingStream)>>,
    stop: watch::Sender<bool>,
}

impl Default for StreamServer {
    fn default() -> Self {
        StreamServer {
            base_url: OnceLock::new(),
            idle_timeout: OnceLock::new(),
            pending: Mutex::new(HashMap::new()),
            stop: watch::channel(false).0,
        }
    }
}

impl StreamServer {
    /// Listen on `address:port` (port 0: a free one) and serve until [`StreamServer::stop`].
    /// Returns the address bound.
    ///
    /// A connection must send each request's head within `header_timeout_secs` and counts
    /// against `max_pending_connections`, and against its peer's `max_pending_per_peer` (a
    /// local user, or a remote address: see [`peers`]), until it is upgraded to a session or
    /// closed; past either cap new connections are closed at once. Idle or slow clients thus hold a bounded number of descriptors for a bounded time,
    /// and cannot starve the CRI socket or an undo path of them.
    pub async fn start(
        self: &Arc<Self>,
        config: &crate::config::StreamConfig,
    ) -> Result<SocketAddr, StreamError> {
        let (address, port) = (config.address.as_str(), config.port);
        let header_timeout = Duration::from_secs(config.header_timeout_secs);
        let _ = self
            .idle_timeout
            .set(Duration::from_secs(config.idle_timeout_secs));
        let pending = Arc::new(tokio::sync::Semaphore::new(config.max_pending_connections));
        let per_peer = peers::PeerCounts::new(config.max_pending_per_peer);
        let ip: std::net::IpAddr = address
            .parse()
            .map_err(|_| StreamError::Address(format!("{address}:{port}")))?;
        let addr = SocketAddr::new(ip, port);
        let tls = tls::acceptor(config, ip).map_err(StreamError::Tls)?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StreamError::Listen {
                addr: addr.to_string(),
                source,
            })?;
        let bound = listener
            .local_addr()
            .map_err(|source| StreamError::Listen {
                addr: addr.to_string(),
                source,
            })?;
        let _ = self.base_url.set(format!("{scheme}://{bound}"));
        let server = Arc::clone(self);
        let mut stop = self.stop.subscribe();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = stop.changed() => break,
                };
                let (tcp, remote) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("stream server: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = Arc::clone(&pending).try_acquire_owned() else {
                    tracing::debug!("stream server: too many pending connections; closing one");
                    drop(tcp);
                    continue;
                };
                // One peer (a local user, or a remote address) may not take every place.
                let peer = peers::Peer::of(remote, bound);
                let Some(slot) = per_peer.take(peer) else {
                    tracing::debug!(
                        ?peer,
                        "stream server: too many pending connections of one peer; closing one"
                    );
                    drop(tcp);
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let server = Arc::clone(&server);
                let tls = tls.clone();
                tokio::spawn(async move {
                    // Held until the connection is upgraded (the session then owns the
                    // socket) or closed.
                    let _permit = (permit, slot);
                    let Some(tls) = tls else {
                        return serve_connection(tcp, server, header_timeout).await;
                    };
                    // The handshake counts against the time allowed for the request head.
                    match tokio::time::timeout(header_timeout, tls.accept(tcp)).await {
                        Ok(Ok(stream)) => serve_connection(stream, server, header_timeout).await,
                        Ok(Err(e)) => tracing::debug!("stream server: TLS handshake: {e}"),
                        Err(_) => tracing::debug!("stream server: TLS handshake timed out"),
                    }
                });
            }
            tracing::info!("stream server stopped");
        });
        tracing::info!(url = %format!("{scheme}://{bound}"), "stream server listening");
        Ok(bound)
    }

    /// Stop accepting connections; sessions under way run to their end.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Keep `request` for its client and answer the URL it connects to.
    pub fn register(&self, request: PendingStream) -> Result<String, StreamError> {
        let base = self.base_url.get().ok_or(StreamError::NotRunning)?;
        let kind = request.kind();
        let token = new_token().map_err(StreamError::Token)?;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        pending.retain(|_, (at, _)| now.duration_since(*at) < TOKEN_TTL);
        // Full: the URL unused for longest gives way. Refusing instead would let one client
        // that asks for URLs and never connects lock every other client out for a minute;
        // a real client connects within moments of its RPC, so the oldest is the abandoned one.
        if pending.len() >= MAX_PENDING {
            let oldest = pending
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(token, _)| token.clone());
            if let Some(oldest) = oldest {
                pending.remove(&oldest);
                tracing::debug!(
                    "stream server: {MAX_PENDING} URLs unused; the oldest expires early"
                );
            }
        }
        pending.insert(token.clone(), (now, request));
        Ok(format!("{base}/{kind}/{token}"))
    }

    /// Take the request of `token` if it is of `kind` and still valid.
    fn take(&self, kind: &str, token: &str) -> Option<PendingStream> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let (at, request) = pending.remove(token)?;
        if at.elapsed() >= TOKEN_TTL || request.kind() != kind {
            return None;
        }
        Some(request)
    }

    fn handle(&self, mut req: Request<Body>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_owned();
        let mut parts = path.trim_start_matches('/').splitn(2, '/');
        let (kind, token) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if !matches!(kind, "exec" | "attach" | "portforward") || token.is_empty() {
            return plain(StatusCode::NOT_FOUND, "not found");
        }
        let upgrade = header_values(&req, "upgrade");
        if upgrade.iter().any(|u| u.eq_ignore_ascii_case("websocket")) {
            return self.handle_websocket(req, kind, token);
        }
        if !upgrade.iter().any(|u| u.eq_ignore_ascii_case("SPDY/3.1")) {
            return plain(
                StatusCode::BAD_REQUEST,
                "upgrade the request to SPDY/3.1 or WebSocket",
            );
        }
        let offered = header_values(&req, "x-stream-protocol-version");
        let supported: &[&str] = if kind == "portforward" {
            &[portforward::PROTOCOL]
        } else {
            remotecommand::PROTOCOLS
        };
        // The client's first choice that crius speaks; kubelet does the same.
        let chosen = offered
            .iter()
            .find(|p| supported.contains(&p.as_str()))
            .cloned();
        let Some(chosen) = chosen.or_else(|| {
            // A client that offers nothing gets the oldest protocol, as kubelet does.
            (offered.is_empty() && kind != "portforward").then(|| "channel.k8s.io".to_owned())
        }) else {
            let mut resp = plain(
                StatusCode::FORBIDDEN,
                &format!("none of the offered protocols {offered:?} is supported"),
            );
            for p in supported {
                if let Ok(v) = p.parse() {
                    resp.headers_mut()
                        .append("x-accepted-stream-protocol-versions", v);
                }
            }
            return resp;
        };
        let Some(request) = self.take(kind, token) else {
            return plain(StatusCode::NOT_FOUND, "unknown or expired streaming token");
        };
        tracing::debug!(kind, transport = "spdy", protocol = %chosen, "stream session");
        let protocol = chosen.clone();
        when_upgraded(&mut req, self.idle(), |io| async move {
            let session = session::Session::start(io);
            match request {
                PendingStream::Command(target) => {
                    remotecommand::serve(session, &protocol, target).await
                }
                PendingStream::PortForward { pod_id, netns } => {
                    portforward::serve(session, pod_id, netns).await
                }
            }
        });
        switching_protocols("SPDY/3.1", &[("x-stream-protocol-version", &chosen)])
    }
}

impl StreamServer {
    /// A WebSocket upgrade: the channel protocols for exec and attach, tunnelled SPDY for
    /// port-forward.
    fn handle_websocket(
        &self,
        mut req: Request<Body>,
        kind: &str,
        token: &str,
    ) -> Response<Full<Bytes>> {
        let Some(key) = req
            .headers()
            .get("sec-websocket-key")
            .and_then(|v| v.to_str().ok())
            .map(websocket::accept_key)
        else {
            return plain(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
        };
        let offered = header_values(&req, "sec-websocket-protocol");
        let tunnel = format!("SPDY/3.1+{}", portforward::PROTOCOL);
        let chosen = if kind == "portforward" {
            offered.iter().find(|p| **p == tunnel).cloned()
        } else {
            offered
                .iter()
                .find(|p| remotecommand::WEBSOCKET_PROTOCOLS.contains(&p.as_str()))
                .cloned()
        };
        let Some(chosen) = chosen else {
            return plain(
                StatusCode::FORBIDDEN,
                &format!("none of the offered subprotocols {offered:?} is supported"),
            );
        };
        let Some(request) = self.take(kind, token) else {
            return plain(StatusCode::NOT_FOUND, "unknown or expired streaming token");
        };
        tracing::debug!(kind, transport = "websocket", protocol = %chosen, "stream session");
        let protocol = chosen.clone();
        when_upgraded(&mut req, self.idle(), |io| async move {
            match request {
                PendingStream::Command(target) => {
                    let channels = remotecommand::channels(&target, &protocol);
                    let session = websocket::command_session(io, &channels);
                    remotecommand::serve(session, &protocol, target).await
                }
                PendingStream::PortForward { pod_id, netns } => {
                    let session = session::Session::start(websocket::byte_stream(io));
                    portforward::serve(session, pod_id, netns).await
                }
            }
        });
        switching_protocols(
            "websocket",
            &[
                ("sec-websocket-accept", &key),
                ("sec-websocket-protocol", &chosen),
            ],
        )
    }
}

/// The connection of a session: the upgraded socket, ended after `idle_timeout` without traffic.
type SessionIo = idle::IdleTimeout<TokioIo<hyper::upgrade::Upgraded>>;

impl StreamServer {
    fn idle(&self) -> Duration {
        self.idle_timeout
            .get()
            .copied()
            .unwrap_or(Duration::from_secs(4 * 3600))
    }
}

/// Serves HTTP/1.1 requests on one connection (plain or TLS) until it closes or is upgraded.
async fn serve_connection<I>(io: I, server: Arc<StreamServer>, header_timeout: Duration)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let server = Arc::clone(&server);
        async move { Ok::<_, std::convert::Infallible>(server.handle(req)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!("stream server connection: {e}");
    }
}

/// Run `serve` on the connection of `req` once hyper hands it over after the 101 answer; the
/// connection ends after `idle` without traffic.
fn when_upgraded<F, Fut>(req: &mut Request<Body>, idle: Duration, serve: F)
where
    F: FnOnce(SessionIo) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => serve(idle::IdleTimeout::new(TokioIo::new(io), idle)).await,
            Err(e) => tracing::debug!("stream upgrade failed: {e}"),
        }
    });
}

/// A `101 Switching Protocols` to `upgrade`, with `headers` (those whose value is not a valid
/// header value are left out).
fn switching_protocols(
    upgrade: &'static str,
    headers: &[(&'static str, &str)],
) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("Upgrade"),
    );
    h.insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static(upgrade),
    );
    for (name, value) in headers {
        if let Ok(v) = value.parse() {
            h.insert(*name, v);
        }
    }
    resp
}

/// Every value of header `name`, comma-separated lists split.
fn header_values(req: &Request<Body>, name: &str) -> Vec<String> {
    req.headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(format!("{text}\n"))));
    *resp.status_mut() = status;
    resp
}

/// 128 random bits, URL-safe.
fn new_token() -> std::io::Result<String> {
    crate::util::random_hex(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_single_use_and_typed() {
        let server = StreamServer::default();
        let _ = server.base_url.set("http://127.0.0.1:1".into());
        let url = server
            .register(PendingStream::PortForward {
                pod_id: "p".into(),
                netns: None,
            })
            .unwrap();
        let token = url.rsplit('/').next().unwrap().to_owned();
        assert!(url.starts_with("http://127.0.0.1:1/portforward/"));
        assert_eq!(token.len(), 32);
        assert!(server.take("exec", &token).is_none(), "wrong kind");
        let url = server
            .register(PendingStream::PortForward {
                pod_id: "p".into(),
                netns: None,
            })
            .unwrap();
        let token = url.rsplit('/').next().unwrap().to_owned();
        assert!(server.take("portforward", &token).is_some());
        assert!(server.take("portforward", &token).is_none(), "used once");
    }

    #[test]
    fn a_full_table_drops_the_oldest_unused_url_not_the_new_one() {
        let server = StreamServer::default();
        let _ = server.base_url.set("http://127.0.0.1:1".into());
        let register = || {
            let url = server
                .register(PendingStream::PortForward {
                    pod_id: "p".into(),
                    netns: None,
                })
                .unwrap();
            url.rsplit('/').next().unwrap().to_owned()
        };
        let first = register();
        let second = register();
        for _ in 2..MAX_PENDING {
            register();
        }
        // One client filled the table; the next caller still gets a working URL.
        let newest = register();
        assert!(server.take("portforward", &newest).is_some());
        assert!(
            server.take("portforward", &first).is_none(),
            "oldest gave way"
        );
        assert!(server.take("portforward", &second).is_some());
    }

    #[test]
    fn no_url_before_the_server_listens() {
        let server = StreamServer::default();
        let pending = PendingStream::PortForward {
            pod_id: "p".into(),
            netns: None,
        };
        assert!(matches!(
            server.register(pending),
            Err(StreamError::NotRunning)
        ));
    }
}
