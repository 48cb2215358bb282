//! Reaching registries through an HTTP proxy. Which proxy, per registry host:
//!
//! - `proxy = "http://proxy:3128"` in the host's `hosts.toml` entry: that one;
//! - `proxy = ""`: none, whatever the environment says;
//! - no `proxy` key: the environment's `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY` (or their
//!   lower-case forms), read once when crius starts (a systemd unit's `Environment=`).
//!
//! An `https://` registry is reached through a `CONNECT` tunnel, TLS running end to end inside
//! it, with the proxy URL's user and password sent as `Proxy-Authorization`. A plain `http://`
//! registry is sent to the proxy as an ordinary forward-proxy request (absolute URI), since
//! common proxies refuse `CONNECT` to ports other than 443; credentials are not sent on that
//! path. The proxy itself is spoken to in plain HTTP.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use http::{HeaderValue, Uri};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A host's proxy setting from `hosts.toml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum ProxySetting {
    /// No `proxy` key: the environment decides.
    #[default]
    Environment,
    /// `proxy = ""`.
    Direct,
    /// `proxy = "http://host:port"`, as written.
    Via(String),
}

impl ProxySetting {
    /// Parses a `proxy` value: empty, or an `http://[user:password@]host[:port]` URL.
    pub fn parse(value: &str) -> Result<Self, String> {
        if value.is_empty() {
            return Ok(ProxySetting::Direct);
        }
        let uri: Uri = value
            .parse()
            .map_err(|e| format!("proxy {value:?} is not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "proxy {value:?}: only http:// proxies are supported"
            ));
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(format!("proxy {value:?} names no host"));
        }
        Ok(ProxySetting::Via(value.to_string()))
    }
}

/// The proxies of the environment, read once.
fn environment() -> Arc<Matcher> {
    static MATCHER: OnceLock<Arc<Matcher>> = OnceLock::new();
    MATCHER
        .get_or_init(|| Arc::new(Matcher::from_env()))
        .clone()
}

/// A connector that goes to the registry directly or through its proxy.
#[derive(Clone)]
pub(crate) struct ProxyConnector {
    http: HttpConnector,
    route: Route,
}

#[derive(Clone)]
enum Route {
    Direct,
    Environment(Arc<Matcher>),
    Via(Arc<Matcher>),
}

impl ProxyConnector {
    pub(crate) fn new(http: HttpConnector, setting: &ProxySetting) -> Self {
        let route = match setting {
            ProxySetting::Environment => Route::Environment(environment()),
            ProxySetting::Direct => Route::Direct,
            // One proxy for every destination of this host: a matcher with nothing excluded.
            ProxySetting::Via(url) => {
                Route::Via(Arc::new(Matcher::builder().all(url.clone()).build()))
            }
        };
        Self { http, route }
    }

    /// The proxy for `dst` and its `Proxy-Authorization`, if one is used.
    fn proxy_for(&self, dst: &Uri) -> Option<(Uri, Option<HeaderValue>)> {
        let matcher = match &self.route {
            Route::Direct => return None,
            Route::Environment(m) | Route::Via(m) => m,
        };
        let intercept = matcher.intercept(dst)?;
        Some((intercept.uri().clone(), intercept.basic_auth().cloned()))
    }
}

/// A connection failure through a proxy, naming it (without its credentials).
#[derive(Debug, thiserror::Error)]
#[error("through proxy {proxy}")]
struct ProxyError {
    proxy: String,
    #[source]
    source: BoxError,
}

impl Service<Uri> for ProxyConnector {
    type Response = Conn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let via = self.proxy_for(&dst);
        let mut http = self.http.clone();
        Box::pin(async move {
            let Some((proxy, auth)) = via else {
                return Ok(Conn::Direct(http.call(dst).await?));
            };
            let name = match (proxy.host(), proxy.port_u16()) {
                (Some(h), Some(p)) => format!("{h}:{p}"),
                (Some(h), None) => h.to_string(),
                _ => proxy.to_string(),
            };
            let wrap = |source: BoxError| -> BoxError {
                Box::new(ProxyError {
                    proxy: name.clone(),
                    source,
                })
            };
            if dst.scheme_str() == Some("https") {
                let mut tunnel = Tunnel::new(proxy, http);
                if let Some(auth) = auth {
                    tunnel = tunnel.with_auth(auth);
                }
                let io = tunnel.call(dst).await.map_err(|e| wrap(Box::new(e)))?;
                Ok(Conn::Direct(io))
            } else {
                let io = http.call(proxy).await.map_err(|e| wrap(Box::new(e)))?;
                Ok(Conn::Forward(io))
            }
        })
    }
}

/// A connection to the registry (or a tunnel to it), or to a forward proxy, which makes the
/// client send absolute URIs.
pub(crate) enum Conn {
    Direct(TokioIo<TcpStream>),
    Forward(TokioIo<TcpStream>),
}

impl Conn {
    fn io(self: Pin<&mut Self>) -> Pin<&mut TokioIo<TcpStream>> {
        match self.get_mut() {
            Conn::Direct(io) | Conn::Forward(io) => Pin::new(io),
        }
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        match self {
            Conn::Direct(io) => io.connected(),
            Conn::Forward(io) => io.connected().proxy(true),
        }
    }
}

impl Read for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.io().poll_read(cx, buf)
    }
}

impl Write for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.io().poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io().poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Direct(io) | Conn::Forward(io) => io.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.io().poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings() {
        assert_eq!(ProxySetting::parse("").unwrap(), ProxySetting::Direct);
        assert_eq!(
            ProxySetting::parse("http://u:p@127.0.0.1:3128").unwrap(),
            ProxySetting::Via("http://u:p@127.0.0.1:3128".into())
        );
        for bad in [
            "https://proxy:3128",
            "socks5://p:1080",
            "proxy:3128",
            "http://",
        ] {
            assert!(ProxySetting::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_named_proxy_takes_every_destination() {
        let c = ProxyConnector::new(
            HttpConnector::new(),
            &ProxySetting::Via("http://u:p@127.0.0.1:3128".into()),
        );
        for dst in ["https://127.0.0.1:5000/v2/", "http://registry.local/v2/"] {
            let (proxy, auth) = c.proxy_for(&dst.parse().unwrap()).unwrap();
            assert_eq!(proxy.port_u16(), Some(3128), "{dst}");
            assert!(auth.is_some());
        }
        let direct = ProxyConnector::new(HttpConnector::new(), &ProxySetting::Direct);
        assert!(direct.proxy_for(&"https://x/".parse().unwrap()).is_none());
    }
}
