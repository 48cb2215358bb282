//! One plugin's connection: crius's calls to the plugin and the plugin's calls to crius over
//! the multiplexed socket of [`super::wire`].
//!
//! A reader task owns the socket's read half: answers on [`PLUGIN_CONN`] complete the call
//! waiting for them, requests on [`RUNTIME_CONN`] go to the channel [`Link::start`] returns.
//! Writes share the write half behind a lock, one whole frame at a time. When the socket
//! closes or fails, every waiting call fails and the channel ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crius_api::nri::ttrpc;
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use super::wire::{self, Frame, Reassembler, PLUGIN_CONN, RUNTIME_CONN};

/// ttrpc's (gRPC's) status codes crius sends or reads.
pub const CODE_OK: i32 = 0;
pub const CODE_UNIMPLEMENTED: i32 = 12;
pub const CODE_FAILED_PRECONDITION: i32 = 9;

/// Why a call to a plugin failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("connection closed")]
    Closed,
    #[error("plugin answered: {0}")]
    Status(String),
    #[error("undecodable answer: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// A request the plugin sent crius.
#[derive(Debug)]
pub struct Incoming {
    pub stream_id: u32,
    pub request: ttrpc::Request,
}

/// Calls answered and requests to answer on one plugin socket.
pub struct Link {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Mutex<HashMap<u32, oneshot::Sender<ttrpc::Response>>>,
    next_stream: AtomicU32,
    closed: AtomicBool,
    /// Fires when the socket ends.
    gone: tokio::sync::watch::Receiver<bool>,
}

impl Link {
    /// Starts reading `stream`; returns the link and the plugin's requests.
    pub fn start(stream: UnixStream) -> (Arc<Link>, mpsc::Receiver<Incoming>) {
        let (mut read, write) = stream.into_split();
        let (tx, rx) = mpsc::channel(16);
        let (gone_tx, gone) = tokio::sync::watch::channel(false);
        let link = Arc::new(Link {
            writer: tokio::sync::Mutex::new(write),
            pending: Mutex::new(HashMap::new()),
            next_stream: AtomicU32::new(1),
            closed: AtomicBool::new(false),
            gone,
        });
        let reader = Arc::clone(&link);
        tokio::spawn(async move {
            let mut answers = Reassembler::default();
            let mut requests = Reassembler::default();
            let end = loop {
                let (conn, bytes) = match wire::read_chunk(&mut read).await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                };
                let frames = match conn {
                    PLUGIN_CONN => answers.push(&bytes),
                    RUNTIME_CONN => requests.push(&bytes),
                    _ => continue,
                };
                let frames = match frames {
                    Ok(f) => f,
                    Err(e) => break Some(e),
                };
                for f in frames {
                    reader.dispatch(conn, f, &tx).await;
                }
            };
            if let Some(e) = end {
                tracing::debug!("nri: plugin connection: {e}");
            }
            reader.close();
            let _ = gone_tx.send(true);
        });
        (link, rx)
    }

    async fn dispatch(&self, conn: u32, f: Frame, requests: &mpsc::Sender<Incoming>) {
        match (conn, f.kind) {
            (PLUGIN_CONN, wire::TYPE_RESPONSE) => {
                let waiter = self.lock_pending().remove(&f.stream_id);
                match (waiter, ttrpc::Response::decode(f.payload.as_slice())) {
                    (Some(w), Ok(resp)) => {
                        let _ = w.send(resp);
                    }
                    (Some(_), Err(e)) => tracing::warn!("nri: undecodable answer: {e}"),
                    (None, _) => tracing::debug!("nri: answer to no call ({})", f.stream_id),
                }
            }
            (RUNTIME_CONN, wire::TYPE_REQUEST) => {
                match ttrpc::Request::decode(f.payload.as_slice()) {
                    Ok(request) => {
                        let _ = requests
                            .send(Incoming {
                                stream_id: f.stream_id,
                                request,
                            })
                            .await;
                    }
                    Err(e) => {
                        let status = ttrpc::Status {
                            code: CODE_FAILED_PRECONDITION,
                            message: format!("undecodable request: {e}"),
                        };
                        self.answer(f.stream_id, Err(status)).await;
                    }
                }
            }
            (_, kind) => tracing::debug!("nri: ignoring frame of type {kind} on connection {conn}"),
        }
    }

    fn lock_pending(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u32, oneshot::Sender<ttrpc::Response>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the socket has ended.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Waits until the socket ends.
    pub async fn closed(&self) {
        let mut gone = self.gone.clone();
        let _ = gone.wait_for(|g| *g).await;
    }

    /// Fails every waiting call; later calls fail at once.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.lock_pending().clear();
    }

    /// Shuts the socket down (the reader then ends and closes the link).
    pub async fn shutdown(&self) {
        self.close();
        let _ = self.writer.lock().await.shutdown().await;
    }

    /// Calls `method` of the plugin's `Plugin` service and waits at most `timeout`.
    pub async fn call<Req: Message, Resp: Message + Default>(
        &self,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError> {
        if self.is_closed() {
            return Err(CallError::Closed);
        }
        let stream_id = self.next_stream.fetch_add(2, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.lock_pending().insert(stream_id, tx);
        let request = ttrpc::Request {
            service: "nri.pkg.api.v1alpha1.Plugin".into(),
            method: method.into(),
            payload: req.encode_to_vec(),
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
            metadata: Vec::new(),
        };
        let frame = Frame {
            stream_id,
            kind: wire::TYPE_REQUEST,
            flags: 0,
            payload: request.encode_to_vec(),
        };
        let outcome = tokio::time::timeout(timeout, async {
            self.write(PLUGIN_CONN, &frame).await?;
            rx.await.map_err(|_| CallError::Closed)
        })
        .await;
        self.lock_pending().remove(&stream_id);
        let resp = match outcome {
            Ok(r) => r?,
            Err(_) => return Err(CallError::Timeout(timeout)),
        };
        match resp.status {
            Some(s) if s.code != CODE_OK => Err(CallError::Status(s.message)),
            _ => Ok(Resp::decode(resp.payload.as_slice())?),
        }
    }

    /// Answers the plugin's request `stream_id` with a message or a status.
    pub async fn answer(&self, stream_id: u32, result: Result<Vec<u8>, ttrpc::Status>) {
        let response = match result {
            Ok(payload) => ttrpc::Response {
                status: Some(ttrpc::Status {
                    code: CODE_OK,
                    message: String::new(),
                }),
                payload,
            },
            Err(status) => ttrpc::Response {
                status: Some(status),
                payload: Vec::new(),
            },
        };
        let frame = Frame {
            stream_id,
            kind: wire::TYPE_RESPONSE,
            flags: 0,
            payload: response.encode_to_vec(),
        };
        if let Err(e) = self.write(RUNTIME_CONN, &frame).await {
            tracing::debug!("nri: answer a plugin: {e}");
        }
    }

    async fn write(&self, conn: u32, frame: &Frame) -> Result<(), CallError> {
        let bytes = wire::encode(conn, frame);
        let mut w = self.writer.lock().await;
        w.write_all(&bytes).await.map_err(|_| CallError::Closed)
    }
}
