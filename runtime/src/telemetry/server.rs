//! The metrics endpoint: `GET /metrics` on `[metrics] address`, in the OpenMetrics text
//! format Prometheus scrapes. Started with crius when an address is configured, and moved,
//! stopped or started again when SIGHUP changes the address or the namespace.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::config::MetricsConfig;

/// Scrapes served at the same time, at most; more connections wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 16;

/// A scraper must send its request within this long.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The endpoint as configured now: off, or serving on an address.
#[derive(Default)]
pub struct Endpoint {
    running: Mutex<Option<Running>>,
}

struct Running {
    config: MetricsConfig,
    bound: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("bound", &self.bound())
            .finish()
    }
}

impl Endpoint {
    /// The address served on, if any.
    pub fn bound(&self) -> Option<SocketAddr> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.as_ref().map(|r| r.bound)
    }

    /// Serves as `config` says from now on: nothing when its address is empty; the endpoint
    /// already running is kept when nothing changed, else replaced. When a new address cannot
    /// be bound (taken) the endpoint in force stays as it was; on the same address (only the
    /// namespace changed) the old listener is closed first, so a failure there leaves none.
    /// `collector` gives the figures read at each scrape (the daemon's is
    /// [`super::collect::Collector`]).
    pub async fn apply(
        &self,
        config: &MetricsConfig,
        collector: impl Collector,
    ) -> anyhow::Result<Option<SocketAddr>> {
        if let Some(r) = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            if &r.config == config {
                return Ok(Some(r.bound));
            }
        }
        if config.address.is_empty() {
            self.stop();
            return Ok(None);
        }
        let addr: SocketAddr = config
            .address
            .parse()
            .with_context(|| format!("metrics address {:?}", config.address))?;
        let registry = Arc::new(super::registry(&config.namespace, collector));
        // The old listener goes first when the new one wants its address.
        let same_address = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|r| r.bound == addr || r.config.address == config.address);
        if same_address {
            self.stop();
        }
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("metrics endpoint: listen on {addr}"))?;
        let bound = listener.local_addr().context("metrics endpoint address")?;
        let task = tokio::spawn(serve(listener, registry));
        let old = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(Running {
                config: config.clone(),
                bound,
                task,
            });
        if let Some(old) = old {
            old.task.abort();
        }
        tracing::info!(url = %format!("http://{bound}/metrics"), "metrics endpoint listening");
        Ok(Some(bound))
    }

    /// Stops serving (scrapes under way end with it).
    pub fn stop(&self) {
        let old = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(old) = old {
            old.task.abort();
            tracing::info!(address = %old.bound, "metrics endpoint stopped");
        }
    }
}

async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!("metrics endpoint: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let registry = registry.clone();
        // In the set, so that stopping the endpoint ends its connections too.
        connections.spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let registry = registry.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&req, &registry)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service);
            if let Err(e) = conn.await {
                tracing::debug!("metrics endpoint connection: {e}");
            }
        });
        while connections.try_join_next().is_some() {}
    }
}

fn answer(req: &Request<hyper::body::Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        if let Ok(v) = content_type.parse() {
            resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        resp
    };
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics\n".into(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET /metrics\n".into(),
        );
    }
    let mut text = String::with_capacity(32 << 10);
    match prometheus_client::encoding::text::encode(&mut text, registry) {
        Ok(()) => reply(StatusCode::OK, CONTENT_TYPE, text),
        Err(e) => {
            tracing::warn!("metrics endpoint: encode: {e}");
            reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                "the metrics could not be encoded\n".into(),
            )
        }
    }
}
