//! One SPDY/3.1 session over an upgraded connection: a reader task that decodes the client's
//! frames and hands out the streams it opens, and a writer task that encodes what the
//! handlers send. The client opens every stream (SYN_STREAM); the session answers each with a
//! SYN_REPLY at once, as the Go clients wait for it before they use the stream.

use std::collections::HashMap;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::spdy::{Decoder, Encoder, Frame, Headers, MAX_DATA_CHUNK};

/// How many chunks of a stream's incoming data may wait for its handler before the session
/// stops reading from the connection.
const STREAM_QUEUE: usize = 64;

/// A stream the client opened.
pub struct Incoming {
    pub id: u32,
    pub headers: Headers,
    /// Its data; the channel closes at the client's FIN, at a reset, or when the session ends.
    pub data: mpsc::Receiver<Vec<u8>>,
    /// Becomes `true` when the client resets the stream (the sender is dropped when the
    /// session ends, which means the same).
    pub reset: watch::Receiver<bool>,
}

impl Incoming {
    /// The value of the stream's `streamtype` header.
    pub fn stream_type(&self) -> &str {
        super::spdy::header(&self.headers, "streamtype").unwrap_or("")
    }
}

/// Sends frames on the session; cheap to clone. The session's write side is shut down once
/// every `Out` (and the [`Session`]) is dropped.
#[derive(Clone)]
pub struct Out {
    tx: mpsc::Sender<Frame>,
}

impl Out {
    /// An `Out` feeding frames to `tx` (a session of another transport).
    pub fn new(tx: mpsc::Sender<Frame>) -> Out {
        Out { tx }
    }

    /// Send `data` on stream `id`, split into frames; false once the session is gone.
    pub async fn data(&self, id: u32, data: &[u8]) -> bool {
        for chunk in data.chunks(MAX_DATA_CHUNK) {
            let frame = Frame::Data {
                stream: id,
                fin: false,
                data: chunk.to_vec(),
            };
            if self.tx.send(frame).await.is_err() {
                return false;
            }
        }
        true
    }

    /// End our side of stream `id`.
    pub async fn fin(&self, id: u32) {
        let frame = Frame::Data {
            stream: id,
            fin: true,
            data: Vec::new(),
        };
        let _ = self.tx.send(frame).await;
    }

    /// Send `data` and end our side of stream `id`.
    pub async fn data_fin(&self, id: u32, data: &[u8]) {
        if !data.is_empty() {
            self.data(id, data).await;
        }
        self.fin(id).await;
    }
}

/// The handler's view of a session: the streams as the client opens them, and a sender.
pub struct Session {
    pub incoming: mpsc::Receiver<Incoming>,
    pub out: Out,
    reader: tokio::task::JoinHandle<()>,
    /// Becomes `true` when the client's side of the connection has ended.
    gone: watch::Receiver<bool>,
}

impl Session {
    /// Start the session's reader and writer tasks on `io`.
    pub fn start<IO>(io: IO) -> Session
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(io);
        let (frames_tx, frames_rx) = mpsc::channel::<Frame>(STREAM_QUEUE);
        let (incoming_tx, incoming_rx) = mpsc::channel(16);
        tokio::spawn(write_loop(write_half, frames_rx));
        // The reader holds a weak sender: the write side closes when the handlers are done.
        let weak = frames_tx.downgrade();
        let (reader, gone) = watch_end(read_loop(read_half, incoming_tx, weak));
        let out = Out { tx: frames_tx };
        Session {
            incoming: incoming_rx,
            out,
            reader,
            gone,
        }
    }

    /// A session of another transport (WebSocket) that presents itself like a SPDY one:
    /// `reader` ends when the client's side of the connection does.
    pub fn from_parts(
        incoming: mpsc::Receiver<Incoming>,
        out: Out,
        reader: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Session {
        let (reader, gone) = watch_end(reader);
        Session {
            incoming,
            out,
            reader,
            gone,
        }
    }

    /// A signal that becomes `true` once the client's side of the connection has ended.
    pub fn gone(&self) -> watch::Receiver<bool> {
        self.gone.clone()
    }

    /// Wait (at most `limit`) for the client to close the connection, after our side is done:
    /// closing first could reset the connection under data the client has not read yet.
    pub async fn finish(self, limit: std::time::Duration) {
        let Session {
            incoming,
            out,
            mut reader,
            ..
        } = self;
        drop(out);
        drop(incoming);
        if tokio::time::timeout(limit, &mut reader).await.is_err() {
            reader.abort();
        }
    }
}

/// Run `reader` as a task, with a signal set when it ends.
fn watch_end(
    reader: impl std::future::Future<Output = ()> + Send + 'static,
) -> (tokio::task::JoinHandle<()>, watch::Receiver<bool>) {
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        reader.await;
        let _ = tx.send(true);
    });
    (task, rx)
}

async fn write_loop<W: AsyncWrite>(w: W, mut frames: mpsc::Receiver<Frame>) {
    tokio::pin!(w);
    let mut encoder = Encoder::new();
    let mut buf = Vec::with_capacity(MAX_DATA_CHUNK + 64);
    while let Some(frame) = frames.recv().await {
        buf.clear();
        if let Err(e) = encoder.encode(&frame, &mut buf) {
            tracing::warn!("spdy: encode a frame: {e}");
            break;
        }
        // Send whatever else is queued in the same write.
        while buf.len() < MAX_DATA_CHUNK {
            match frames.try_recv() {
                Ok(frame) => {
                    if let Err(e) = encoder.encode(&frame, &mut buf) {
                        tracing::warn!("spdy: encode a frame: {e}");
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        if w.write_all(&buf).await.is_err() || w.flush().await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}

/// Send a frame of the reader's own (a reply, a pong) while the session's write side is open.
async fn send(out: &mpsc::WeakSender<Frame>, frame: Frame) -> bool {
    match out.upgrade() {
        Some(tx) => tx.send(frame).await.is_ok(),
        None => false,
    }
}

async fn read_loop<R: AsyncRead>(
    r: R,
    incoming: mpsc::Sender<Incoming>,
    out: mpsc::WeakSender<Frame>,
) {
    tokio::pin!(r);
    let mut decoder = Decoder::new();
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut streams: HashMap<u32, mpsc::Sender<Vec<u8>>> = HashMap::new();
    let mut resets: HashMap<u32, watch::Sender<bool>> = HashMap::new();
    let mut accepting = true;
    loop {
        loop {
            let (frame, used) = match decoder.decode(&buf) {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!("spdy: {e}");
                    return;
                }
            };
            buf.drain(..used);
            match frame {
                Frame::SynStream {
                    stream,
                    fin,
                    headers,
                } => {
                    if !accepting || streams.contains_key(&stream) {
                        let reset = Frame::RstStream {
                            stream,
                            status: super::spdy::RST_INVALID_STREAM,
                        };
                        send(&out, reset).await;
                        continue;
                    }
                    let (data_tx, data_rx) = mpsc::channel(STREAM_QUEUE);
                    let (reset_tx, reset_rx) = watch::channel(false);
                    if !fin {
                        streams.insert(stream, data_tx);
                    }
                    resets.insert(stream, reset_tx);
                    let reply = Frame::SynReply {
                        stream,
                        fin: false,
                        headers: Headers::new(),
                    };
                    if !send(&out, reply).await {
                        return;
                    }
                    let new = Incoming {
                        id: stream,
                        headers,
                        data: data_rx,
                        reset: reset_rx,
                    };
                    // A handler that stopped listening leaves the stream unserved.
                    let _ = incoming.send(new).await;
                }
                Frame::Data { stream, fin, data } => {
                    if let Some(tx) = streams.get(&stream) {
                        if !data.is_empty() && tx.send(data).await.is_err() {
                            streams.remove(&stream);
                        }
                    }
                    if fin {
                        streams.remove(&stream);
                    }
                }
                Frame::RstStream { stream, .. } => {
                    streams.remove(&stream);
                    if let Some(reset) = resets.get(&stream) {
                        let _ = reset.send(true);
                    }
                }
                Frame::Ping { id } => {
                    send(&out, Frame::Ping { id }).await;
                }
                Frame::GoAway { .. } => accepting = false,
                Frame::Headers { stream, fin, .. } => {
                    if fin {
                        streams.remove(&stream);
                    }
                }
                Frame::SynReply { .. }
                | Frame::Settings
                | Frame::WindowUpdate { .. }
                | Frame::Unknown => {}
            }
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        match r.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
