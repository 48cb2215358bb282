//! NRI's wire format: ttrpc frames inside a connection multiplexer, on one unix socket.
//!
//! A plugin's socket carries two byte streams ("virtual connections"), each chunk sent as
//! `conn id (u32 BE) | length (u32 BE) | bytes`. On connection [`PLUGIN_CONN`] the plugin is
//! the ttrpc server and crius the client; on [`RUNTIME_CONN`] the other way round. Inside a
//! virtual connection every message is a ttrpc frame: `length (u32 BE) | stream id (u32 BE) |
//! type (u8) | flags (u8)` and a protobuf payload, a `ttrpc.Request` or `ttrpc.Response`. A
//! chunk boundary need not fall on a frame boundary, so each connection's bytes are
//! reassembled ([`Reassembler`]). Clients number their calls 1, 3, 5, …; an answer carries the
//! call's number.

use tokio::io::{AsyncRead, AsyncReadExt};

/// The virtual connection on which the plugin serves the `Plugin` service.
pub const PLUGIN_CONN: u32 = 1;
/// The virtual connection on which crius serves the `Runtime` service.
pub const RUNTIME_CONN: u32 = 2;

const MUX_HEADER: usize = 8;
const TTRPC_HEADER: usize = 10;
/// ttrpc's limit on one message's payload.
pub const MAX_MESSAGE: usize = 4 << 20;
/// The multiplexer's limit on one chunk: one whole ttrpc frame.
const MAX_CHUNK: usize = MAX_MESSAGE + TTRPC_HEADER;

/// ttrpc frame types.
pub const TYPE_REQUEST: u8 = 1;
pub const TYPE_RESPONSE: u8 = 2;

/// What can go wrong reading a peer's bytes.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("read from plugin socket")]
    Io(#[from] std::io::Error),
    #[error("multiplexer chunk of {0} bytes exceeds the limit")]
    ChunkTooLarge(usize),
    #[error("ttrpc message of {0} bytes exceeds the 4 MiB limit")]
    MessageTooLarge(usize),
}

/// One ttrpc message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub stream_id: u32,
    pub kind: u8,
    pub flags: u8,
    pub payload: Vec<u8>,
}

/// Reads the next multiplexer chunk: its connection id and bytes, `None` at a clean end.
pub async fn read_chunk<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<(u32, Vec<u8>)>, WireError> {
    let mut header = [0u8; MUX_HEADER];
    match r.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
    if len > MAX_CHUNK {
        return Err(WireError::ChunkTooLarge(len));
    }
    let mut bytes = vec![0u8; len];
    r.read_exact(&mut bytes).await?;
    Ok(Some((conn, bytes)))
}

/// `frame` on virtual connection `conn`, as the bytes to write to the socket.
pub fn encode(conn: u32, frame: &Frame) -> Vec<u8> {
    let mut body = Vec::with_capacity(TTRPC_HEADER + frame.payload.len());
    body.extend_from_slice(&(frame.payload.len() as u32).to_be_bytes());
    body.extend_from_slice(&frame.stream_id.to_be_bytes());
    body.push(frame.kind);
    body.push(frame.flags);
    body.extend_from_slice(&frame.payload);
    let mut out = Vec::with_capacity(body.len() + MUX_HEADER);
    for chunk in body.chunks(MAX_CHUNK) {
        out.extend_from_slice(&conn.to_be_bytes());
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

/// Collects one virtual connection's bytes and cuts them into ttrpc frames.
#[derive(Debug, Default)]
pub struct Reassembler {
    buf: Vec<u8>,
}

impl Reassembler {
    /// Adds `bytes` and returns every frame now complete.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Frame>, WireError> {
        self.buf.extend_from_slice(bytes);
        let mut frames = Vec::new();
        let mut at = 0;
        while self.buf.len() - at >= TTRPC_HEADER {
            let h = &self.buf[at..at + TTRPC_HEADER];
            let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
            if len > MAX_MESSAGE {
                return Err(WireError::MessageTooLarge(len));
            }
            if self.buf.len() - at < TTRPC_HEADER + len {
                break;
            }
            let stream_id = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
            let (kind, flags) = (h[8], h[9]);
            let start = at + TTRPC_HEADER;
            frames.push(Frame {
                stream_id,
                kind,
                flags,
                payload: self.buf[start..start + len].to_vec(),
            });
            at = start + len;
        }
        self.buf.drain(..at);
        Ok(frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: u32, payload: &[u8]) -> Frame {
        Frame {
            stream_id: id,
            kind: TYPE_REQUEST,
            flags: 0,
            payload: payload.to_vec(),
        }
    }

    #[tokio::test]
    async fn a_frame_round_trips_through_the_multiplexer() {
        let bytes = encode(RUNTIME_CONN, &frame(3, b"hello"));
        let mut r = bytes.as_slice();
        let (conn, chunk) = read_chunk(&mut r).await.unwrap().unwrap();
        assert_eq!(conn, RUNTIME_CONN);
        let frames = Reassembler::default().push(&chunk).unwrap();
        assert_eq!(frames, vec![frame(3, b"hello")]);
        assert!(read_chunk(&mut r).await.unwrap().is_none());
    }

    #[test]
    fn frames_split_across_chunks_are_reassembled() {
        let mut bytes = encode(PLUGIN_CONN, &frame(1, b"abcdef"));
        bytes.drain(..MUX_HEADER);
        bytes.extend(encode(PLUGIN_CONN, &frame(5, b"")).split_off(MUX_HEADER));
        let mut r = Reassembler::default();
        assert!(r.push(&bytes[..7]).unwrap().is_empty());
        let frames = r.push(&bytes[7..]).unwrap();
        assert_eq!(frames, vec![frame(1, b"abcdef"), frame(5, b"")]);
    }

    #[test]
    fn an_oversized_message_is_refused() {
        let mut header = vec![0u8; TTRPC_HEADER];
        header[..4].copy_from_slice(&((MAX_MESSAGE + 1) as u32).to_be_bytes());
        assert!(matches!(
            Reassembler::default().push(&header),
            Err(WireError::MessageTooLarge(_))
        ));
    }
}
