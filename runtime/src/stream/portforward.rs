//! Port-forward sessions: the `portforward.k8s.io` protocol over SPDY.
//!
//! For every connection it forwards, the client opens two streams with the same `port` and
//! `requestid` headers: `error` (which it closes at once; crius writes a failure there) and
//! `data`. crius connects to `127.0.0.1:<port>` inside the pod's network namespace and relays
//! both ways; when both directions are done it closes the data and error streams (the client
//! waits for the error stream's end before it lets the connection go).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::session::{Incoming, Out, Session};

/// The port-forward protocol crius speaks.
pub const PROTOCOL: &str = "portforward.k8s.io";

/// How long a connect inside the pod may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request's second stream may take to follow its first.
const PAIR_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve a port-forward session until the client closes it. `netns` is the pod's pinned
/// network namespace, `None` for a pod on the host network.
pub async fn serve(mut session: Session, pod_id: String, netns: Option<PathBuf>) {
    let mut halves: HashMap<String, (Option<Incoming>, Option<Incoming>, tokio::time::Instant)> =
        HashMap::new();
    while let Some(stream) = session.incoming.recv().await {
        let request = super::spdy::header(&stream.headers, "requestid")
            .unwrap_or("")
            .to_owned();
        let now = tokio::time::Instant::now();
        halves.retain(|_, (_, _, at)| now.duration_since(*at) < PAIR_TIMEOUT);
        let entry = halves.entry(request.clone()).or_insert((None, None, now));
        match stream.stream_type() {
            "error" => entry.0 = Some(stream),
            "data" => entry.1 = Some(stream),
            other => {
                tracing::debug!(stream_type = other, "port-forward: ignoring a stream");
                continue;
            }
        }
        if let (Some(_), Some(_)) = (&entry.0, &entry.1) {
            if let Some((Some(error), Some(data), _)) = halves.remove(&request) {
                let out = session.out.clone();
                let pod = pod_id.clone();
                let netns = netns.clone();
                tokio::spawn(async move { forward(out, error, data, pod, netns).await });
            }
        }
    }
    session.finish(Duration::from_secs(1)).await;
}

/// Forward one connection.
async fn forward(out: Out, error: Incoming, data: Incoming, pod: String, netns: Option<PathBuf>) {
    let port = super::spdy::header(&data.headers, "port")
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0);
    let Some(port) = port else {
        let message = "port-forward: the data stream names no valid port";
        out.fin(data.id).await;
        out.data_fin(error.id, message.as_bytes()).await;
        return;
    };
    let tcp = match connect(port, netns.as_deref()).await {
        Ok(tcp) => tcp,
        Err(e) => {
            let message = format!(
                "failed to connect to localhost:{port} inside the network of pod {pod}: {e}"
            );
            tracing::debug!("{message}");
            out.fin(data.id).await;
            out.data_fin(error.id, message.as_bytes()).await;
            return;
        }
    };
    let (mut tcp_r, mut tcp_w) = tcp.into_split();
    let Incoming {
        id: data_id,
        data: mut from_client,
        mut reset,
        ..
    } = data;
    let to_pod = async move {
        while let Some(chunk) = from_client.recv().await {
            if tcp_w.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = tcp_w.shutdown().await;
    };
    let out2 = out.clone();
    let to_client = async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match tcp_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !out2.data(data_id, &buf[..n]).await {
                        break;
                    }
                }
            }
        }
        // The client waits for this end before it lets the connection go.
        out2.fin(data_id).await;
    };
    let reset_seen = async move {
        loop {
            if *reset.borrow() {
                return;
            }
            if reset.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(to_pod, to_client) } => {}
        _ = reset_seen => out.fin(data_id).await,
    }
    out.fin(error.id).await;
}

/// Connect to `127.0.0.1:port` in the network namespace `netns` (the host's when `None`).
async fn connect(port: u16, netns: Option<&Path>) -> io::Result<TcpStream> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Some(netns) = netns else {
        return tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?;
    };
    let netns = netns.to_path_buf();
    // A socket keeps the network namespace it was created in: run_in connects from a thread
    // of its own that joins the pod's namespace, so no runtime thread ever changes namespace.
    let stream = tokio::task::spawn_blocking(move || {
        crius_cni::netns::run_in(&netns, || {
            std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        })
    })
    .await
    .map_err(|_| io::Error::other("connect thread ended without an answer"))?
    .map_err(|e| io::Error::other(crius_common::error_chain(&e)))??;
    stream.set_nonblocking(true)?;
    TcpStream::from_std(stream)
}
