//! WebSocket (RFC 6455) for the clients that stream over it instead of SPDY: `crictl
//! --transport websocket` and critest's websocket flags.
//!
//! Two uses:
//! - Exec and attach with the channel protocols (`v5.channel.k8s.io` down to
//!   `channel.k8s.io`): every binary message starts with a channel byte (0 stdin, 1 stdout,
//!   2 stderr, 3 error, 4 resize) and carries that channel's data; in v5 the client half-closes
//!   a channel with the two bytes `255, channel`. The channels of the request exist from the
//!   start; [`command_session`] presents them as the streams of a [`Session`], so the
//!   remote-command code is the same as over SPDY. The session ends with a close frame.
//! - Port-forward tunnelled through WebSocket (`SPDY/3.1+portforward.k8s.io`): the binary
//!   messages carry the bytes of an ordinary SPDY session; [`byte_stream`] turns them back into
//!   a byte stream for [`Session::start`].
//!
//! Pings are answered with pongs (the clients send them as a heartbeat and give up without
//! answers); fragmented messages are joined; client frames must be masked, ours are not.

use std::collections::HashMap;

use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::session::{Incoming, Out, Session};
use super::spdy::{Frame, Headers};

/// The GUID RFC 6455 appends to the client's key.
const ACCEPT_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Largest message this accepts from a client.
const MAX_MESSAGE: usize = 16 << 20;

/// The client half-closes a channel with this byte and the channel's number (v5).
const STREAM_CLOSE: u8 = 255;

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// The value of `Sec-WebSocket-Accept` for the client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    let mut input = key.trim().as_bytes().to_vec();
    input.extend_from_slice(ACCEPT_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(sha1(&input))
}

/// SHA-1, needed only for the handshake's accept key.
fn sha1(data: &[u8]) -> [u8; 20] {
    use sha1::Digest as _;
    sha1::Sha1::digest(data).into()
}

/// One message or control frame from the client.
#[derive(Debug, PartialEq, Eq)]
enum Message {
    Binary(Vec<u8>),
    Text(Vec<u8>),
    Ping(Vec<u8>),
    Pong,
    Close,
}

/// Reassembles client frames into messages.
#[derive(Default)]
struct Reader {
    buf: Vec<u8>,
    /// Opcode and data of a fragmented message under way.
    partial: Option<(u8, Vec<u8>)>,
}

impl Reader {
    /// The next complete message in the buffer, if any; an error ends the connection.
    fn next(&mut self) -> Result<Option<Message>, &'static str> {
        loop {
            let Some((fin, opcode, payload, used)) = parse_frame(&self.buf)? else {
                return Ok(None);
            };
            self.buf.drain(..used);
            match opcode {
                OP_PING => return Ok(Some(Message::Ping(payload))),
                OP_PONG => return Ok(Some(Message::Pong)),
                OP_CLOSE => return Ok(Some(Message::Close)),
                OP_CONTINUATION => {
                    let Some((op, mut data)) = self.partial.take() else {
                        return Err("continuation without a message");
                    };
                    data.extend_from_slice(&payload);
                    if data.len() > MAX_MESSAGE {
                        return Err("message too large");
                    }
                    if fin {
                        return Ok(Some(message(op, data)));
                    }
                    self.partial = Some((op, data));
                }
                OP_TEXT | OP_BINARY => {
                    if self.partial.is_some() {
                        return Err("new message inside a fragmented one");
                    }
                    if fin {
                        return Ok(Some(message(opcode, payload)));
                    }
                    self.partial = Some((opcode, payload));
                }
                _ => return Err("unknown opcode"),
            }
        }
    }
}

fn message(opcode: u8, data: Vec<u8>) -> Message {
    if opcode == OP_TEXT {
        Message::Text(data)
    } else {
        Message::Binary(data)
    }
}

/// Parse one client frame: (fin, opcode, unmasked payload, bytes used).
#[allow(clippy::type_complexity)]
fn parse_frame(buf: &[u8]) -> Result<Option<(bool, u8, Vec<u8>, usize)>, &'static str> {
    let (Some(&b0), Some(&b1)) = (buf.first(), buf.get(1)) else {
        return Ok(None);
    };
    let fin = b0 & 0x80 != 0;
    let opcode = b0 & 0x0f;
    if b1 & 0x80 == 0 {
        return Err("client frames must be masked");
    }
    let (len, mut pos) = match b1 & 0x7f {
        126 => match buf.get(2..4) {
            Some(b) => (u64::from(u16::from_be_bytes([b[0], b[1]])), 4),
            None => return Ok(None),
        },
        127 => match buf.get(2..10) {
            Some(b) => {
                let mut n = [0u8; 8];
                n.copy_from_slice(b);
                (u64::from_be_bytes(n), 10)
            }
            None => return Ok(None),
        },
        n => (u64::from(n), 2),
    };
    if len > MAX_MESSAGE as u64 {
        return Err("frame too large");
    }
    let len = len as usize;
    let Some(mask) = buf.get(pos..pos + 4) else {
        return Ok(None);
    };
    let mask = [mask[0], mask[1], mask[2], mask[3]];
    pos += 4;
    let Some(payload) = buf.get(pos..pos + len) else {
        return Ok(None);
    };
    let payload = payload
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ mask[i % 4])
        .collect();
    Ok(Some((fin, opcode, payload, pos + len)))
}

/// Append one unmasked server frame.
fn push_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    out.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= 0xffff => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

/// What the writer task sends.
enum Outgoing {
    Binary(Vec<u8>),
    Pong(Vec<u8>),
    Close,
}

async fn write_loop<W: AsyncWrite>(w: W, mut rx: mpsc::Receiver<Outgoing>) {
    tokio::pin!(w);
    let mut buf = Vec::new();
    // Every sender gone without a close also ends the session with one.
    let mut item = rx.recv().await.unwrap_or(Outgoing::Close);
    loop {
        buf.clear();
        let close = matches!(item, Outgoing::Close);
        match item {
            Outgoing::Binary(data) => push_frame(&mut buf, OP_BINARY, &data),
            Outgoing::Pong(data) => push_frame(&mut buf, OP_PONG, &data),
            // Normal closure.
            Outgoing::Close => push_frame(&mut buf, OP_CLOSE, &1000u16.to_be_bytes()),
        }
        if w.write_all(&buf).await.is_err() || w.flush().await.is_err() || close {
            break;
        }
        item = rx.recv().await.unwrap_or(Outgoing::Close);
    }
    let _ = w.shutdown().await;
}

/// A remote-command session over WebSocket with the channels `channels` (stream type, channel
/// number): they appear on the returned [`Session`] as streams whose ids are the channel
/// numbers.
pub fn command_session<IO>(io: IO, channels: &[(&'static str, u8)]) -> Session
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read_half, write_half) = tokio::io::split(io);
    let (ws_tx, ws_rx) = mpsc::channel::<Outgoing>(64);
    tokio::spawn(write_loop(write_half, ws_rx));
    // The handler's frames become channel messages.
    let (frames_tx, mut frames_rx) = mpsc::channel::<Frame>(64);
    let to_ws = ws_tx.clone();
    tokio::spawn(async move {
        while let Some(frame) = frames_rx.recv().await {
            if let Frame::Data { stream, data, .. } = frame {
                if data.is_empty() {
                    continue;
                }
                let mut msg = Vec::with_capacity(data.len() + 1);
                msg.push(stream as u8);
                msg.extend_from_slice(&data);
                if to_ws.send(Outgoing::Binary(msg)).await.is_err() {
                    return;
                }
            }
        }
        let _ = to_ws.send(Outgoing::Close).await;
    });
    let (incoming_tx, incoming_rx) = mpsc::channel(8);
    let mut senders = HashMap::new();
    let mut resets = Vec::new();
    for (kind, channel) in channels {
        let (data_tx, data_rx) = mpsc::channel(64);
        let (reset_tx, reset_rx) = watch::channel(false);
        senders.insert(*channel, data_tx);
        resets.push(reset_tx);
        let mut headers = Headers::new();
        headers.insert("streamtype".into(), vec![(*kind).to_owned()]);
        let _ = incoming_tx.try_send(Incoming {
            id: u32::from(*channel),
            headers,
            data: data_rx,
            reset: reset_rx,
        });
    }
    let reader = async move {
        // Held until the connection ends: a dropped sender reads as a reset.
        let _resets = resets;
        let _incoming = incoming_tx;
        let mut senders = senders;
        let mut messages = Messages::new(read_half, ws_tx);
        while let Some(msg) = messages.next_binary().await {
            let Some((&channel, data)) = msg.split_first() else {
                continue;
            };
            if channel == STREAM_CLOSE {
                if let Some(&closed) = data.first() {
                    senders.remove(&closed);
                }
                continue;
            }
            if let Some(tx) = senders.get(&channel) {
                if !data.is_empty() && tx.send(data.to_vec()).await.is_err() {
                    senders.remove(&channel);
                }
            }
        }
    };
    Session::from_parts(incoming_rx, Out::new(frames_tx), reader)
}

/// The client's side of a connection: its binary messages, with pings answered on the way.
struct Messages<R> {
    r: R,
    reader: Reader,
    ws_tx: mpsc::Sender<Outgoing>,
    done: bool,
}

impl<R: AsyncRead + Unpin> Messages<R> {
    fn new(r: R, ws_tx: mpsc::Sender<Outgoing>) -> Self {
        Messages {
            r,
            reader: Reader::default(),
            ws_tx,
            done: false,
        }
    }

    /// The next binary message; `None` once the client closed or the connection failed.
    async fn next_binary(&mut self) -> Option<Vec<u8>> {
        while !self.done {
            match self.reader.next() {
                Ok(Some(Message::Binary(data))) => return Some(data),
                Ok(Some(Message::Ping(data))) => {
                    let _ = self.ws_tx.send(Outgoing::Pong(data)).await;
                    continue;
                }
                Ok(Some(Message::Text(_))) | Ok(Some(Message::Pong)) => continue,
                Ok(Some(Message::Close)) => {
                    let _ = self.ws_tx.send(Outgoing::Close).await;
                    self.done = true;
                    continue;
                }
                Err(e) => {
                    tracing::debug!("websocket: {e}");
                    self.done = true;
                    continue;
                }
                Ok(None) => {}
            }
            // Read straight into the frame buffer, which keeps its room between reads.
            self.reader.buf.reserve(32 * 1024);
            if let Ok(0) | Err(_) = self.r.read_buf(&mut self.reader.buf).await {
                self.done = true;
            }
        }
        None
    }
}

/// The byte stream carried in the binary messages of a WebSocket connection (the tunnelled
/// SPDY of port-forward), as one end of an in-memory pipe.
pub fn byte_stream<IO>(io: IO) -> tokio::io::DuplexStream
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (read_half, write_half) = tokio::io::split(io);
    let (ws_tx, ws_rx) = mpsc::channel::<Outgoing>(64);
    tokio::spawn(write_loop(write_half, ws_rx));
    let (mut pipe_r, mut pipe_w) = tokio::io::split(ours);
    let to_ws = ws_tx.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match pipe_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_ws
                        .send(Outgoing::Binary(buf[..n].to_vec()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        let _ = to_ws.send(Outgoing::Close).await;
    });
    tokio::spawn(async move {
        let mut messages = Messages::new(read_half, ws_tx);
        while let Some(data) = messages.next_binary().await {
            if pipe_w.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = pipe_w.shutdown().await;
    });
    theirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_and_accept_key_match_the_rfc() {
        let hex: String = sha1(b"abc").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "a9993e364706816aba3e25717850c26c9cd0d89d");
        let long = vec![b'a'; 1000];
        let hex: String = sha1(&long).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "291e9a6c66994949b57ba5e650361e98fc36b1ba");
        // The example of RFC 6455, section 1.3.
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    fn client_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => out.push(0x80 | n as u8),
            n => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    #[test]
    fn reader_joins_fragments_and_reports_control_frames() {
        let mut r = Reader::default();
        r.buf.extend(client_frame(false, OP_BINARY, b"\x01hel"));
        r.buf.extend(client_frame(true, OP_PING, b"hb"));
        r.buf.extend(client_frame(true, OP_CONTINUATION, b"lo"));
        let big = vec![7u8; 300];
        r.buf.extend(client_frame(true, OP_BINARY, &big));
        r.buf
            .extend(client_frame(true, OP_CLOSE, &1000u16.to_be_bytes()));
        assert_eq!(r.next().unwrap(), Some(Message::Ping(b"hb".to_vec())));
        assert_eq!(
            r.next().unwrap(),
            Some(Message::Binary(b"\x01hello".to_vec()))
        );
        assert_eq!(r.next().unwrap(), Some(Message::Binary(big)));
        assert_eq!(r.next().unwrap(), Some(Message::Close));
        assert_eq!(r.next().unwrap(), None);
    }

    #[test]
    fn unmasked_client_frames_and_partial_frames() {
        let mut r = Reader::default();
        let frame = client_frame(true, OP_BINARY, b"abc");
        r.buf.extend_from_slice(&frame[..frame.len() - 1]);
        assert_eq!(r.next().unwrap(), None);
        r.buf.push(*frame.last().unwrap());
        assert_eq!(r.next().unwrap(), Some(Message::Binary(b"abc".to_vec())));
        r.buf.extend_from_slice(&[0x82, 0x01, b'x']);
        assert!(r.next().is_err());
    }

    #[test]
    fn server_frames_use_the_short_and_extended_lengths() {
        let mut out = Vec::new();
        push_frame(&mut out, OP_BINARY, b"hi");
        assert_eq!(out, [0x82, 2, b'h', b'i']);
        out.clear();
        push_frame(&mut out, OP_BINARY, &[0u8; 200]);
        assert_eq!(&out[..4], &[0x82, 126, 0, 200]);
        out.clear();
        push_frame(&mut out, OP_BINARY, &vec![0u8; 70_000]);
        assert_eq!(&out[..2], &[0x82, 127]);
        assert_eq!(out.len(), 10 + 70_000);
    }
}
