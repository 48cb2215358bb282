//! Any `:authority` a gRPC client sends on the CRI socket is accepted.
//!
//! Many gRPC clients (grpc-java, Python grpcio since 1.57, grpc-go releases before they
//! special-cased unix sockets, the kubelets built with them) put the socket's path in the
//! HTTP/2 `:authority` pseudo-header. A path is not a valid URI authority, and the HTTP/2
//! library under tonic resets every such stream with PROTOCOL_ERROR before our code sees it.
//! containerd and CRI-O accept any authority on a unix socket; crius must too.
//!
//! [`AuthorityFix`] sits between the accepted socket and the HTTP/2 server and rewrites only
//! what the client sends. It walks the frames: everything but header blocks passes through
//! untouched; each header block (HEADERS and its CONTINUATIONs) is HPACK-decoded with the
//! client's compression state, an authority that does not parse is replaced by `localhost`,
//! and the block is encoded again for the server without its dynamic table (the first block
//! sets the server's table to size 0, so the two sides can never disagree about it). Server
//! to client traffic is never touched.
//!
//! Anything the walker does not understand (no HTTP/2 preface, a malformed frame, a block that
//! fails to decode, one larger than [`MAX_HEADER_BLOCK`]) switches the connection to plain
//! pass-through, from the first byte not yet handed on, so the server sees exactly what the
//! client sent and answers it with the protocol error it deserves.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
/// Every HTTP/2 peer accepts frames of this size (the SETTINGS_MAX_FRAME_SIZE floor), so
/// rewritten blocks are cut into frames no larger.
const MAX_FRAME: usize = 16_384;
/// The largest header block (all fragments together) the walker rewrites. gRPC's own limit on
/// metadata is 8 KiB by default; a larger block passes through unchanged.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;
/// The header table size a client may use before it has seen our settings (RFC 7541 §4.2):
/// the server never advertises another.
const DEFAULT_TABLE_SIZE: usize = 4_096;
/// What an unparseable authority becomes.
const REPLACEMENT: &[u8] = b"localhost";

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// A dynamic table size update to 0 (RFC 7541 §6.3): `001` then the 5-bit integer 0.
const TABLE_SIZE_ZERO: u8 = 0x20;

/// One accepted connection with the client's header blocks rewritten on the way in.
pub struct AuthorityFix<S> {
    inner: S,
    walker: Walker,
    /// Read from the socket, not yet examined.
    raw: BytesMut,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> AuthorityFix<S> {
        AuthorityFix {
            inner,
            walker: Walker::new(),
            raw: BytesMut::new(),
            eof: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.walker.ready.is_empty() {
                let n = this.walker.ready.len().min(buf.remaining());
                buf.put_slice(&this.walker.ready[..n]);
                this.walker.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // Whatever was left half-examined goes through as it came; the server judges
                // a truncated frame.
                this.walker.pass_rest(&mut this.raw);
                if this.walker.ready.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            this.raw.reserve(MAX_FRAME);
            let mut read = ReadBuf::uninit(this.raw.spare_capacity_mut());
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    if n == 0 {
                        this.eof = true;
                    } else {
                        // SAFETY: the inner reader initialised these `n` bytes of spare capacity.
                        unsafe { this.raw.set_len(this.raw.len() + n) };
                        this.walker.walk(&mut this.raw);
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

enum Mode {
    /// This many bytes of the client preface have been seen.
    Preface(usize),
    Frames,
    /// Everything passes as it comes.
    Raw,
}

/// A header block being gathered: its HEADERS frame and any CONTINUATIONs so far.
struct Block {
    stream_id: u32,
    end_stream: bool,
    /// The PRIORITY fields of the HEADERS frame, kept as they came.
    priority: Option<[u8; 5]>,
    fragments: Vec<u8>,
    /// The frames exactly as received, in case the block has to pass unchanged.
    original: Vec<u8>,
}

/// The frame walker, apart from any I/O so that it can be fed bytes in any pieces.
struct Walker {
    mode: Mode,
    /// Examined and ready for the server.
    ready: BytesMut,
    /// Payload bytes of a frame that passes unchanged, still to come.
    skip: usize,
    block: Option<Block>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
    /// The server's table has not been set to size 0 yet.
    first_block: bool,
}

impl Walker {
    fn new() -> Walker {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(DEFAULT_TABLE_SIZE);
        let mut encoder = Encoder::new();
        encoder.set_max_table_size(0);
        Walker {
            mode: Mode::Preface(0),
            ready: BytesMut::new(),
            skip: 0,
            block: None,
            decoder,
            encoder,
            first_block: true,
        }
    }

    /// Examines as much of `raw` as can be examined now; what remains is an incomplete frame.
    fn walk(&mut self, raw: &mut BytesMut) {
        loop {
            match self.mode {
                Mode::Raw => {
                    self.pass(raw, raw.len());
                    return;
                }
                Mode::Preface(seen) => {
                    let n = raw.len().min(PREFACE.len() - seen);
                    if raw[..n] != PREFACE[seen..seen + n] {
                        self.mode = Mode::Raw;
                        continue;
                    }
                    self.pass(raw, n);
                    if seen + n < PREFACE.len() {
                        self.mode = Mode::Preface(seen + n);
                        return;
                    }
                    self.mode = Mode::Frames;
                }
                Mode::Frames => {
                    if self.skip > 0 {
                        let n = self.skip.min(raw.len());
                        self.pass(raw, n);
                        self.skip -= n;
                        if self.skip > 0 {
                            return;
                        }
                    }
                    if raw.len() < FRAME_HEADER_LEN {
                        return;
                    }
                    let len =
                        usize::from(raw[0]) << 16 | usize::from(raw[1]) << 8 | usize::from(raw[2]);
                    let kind = raw[3];
                    let in_block = self.block.is_some();
                    if kind != TYPE_HEADERS && !in_block {
                        self.pass(raw, FRAME_HEADER_LEN);
                        self.skip = len;
                        continue;
                    }
                    let gathered = self.block.as_ref().map_or(0, |b| b.fragments.len());
                    if gathered + len > MAX_HEADER_BLOCK {
                        self.give_up();
                        continue;
                    }
                    if raw.len() < FRAME_HEADER_LEN + len {
                        return;
                    }
                    let frame = raw.split_to(FRAME_HEADER_LEN + len);
                    if !self.gather(&frame) {
                        // The frame itself has not been handed on: it follows the block.
                        self.give_up();
                        self.ready.extend_from_slice(&frame);
                    }
                }
            }
        }
    }

    /// Takes one whole HEADERS or CONTINUATION frame into the block; false if it does not
    /// belong in one (the caller then passes everything unchanged).
    fn gather(&mut self, frame: &[u8]) -> bool {
        let kind = frame[3];
        let flags = frame[4];
        let stream_id = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER_LEN..];
        match self.block.as_mut() {
            None => {
                let Some((priority, fragment)) = split_headers_payload(flags, payload) else {
                    return false;
                };
                if stream_id == 0 {
                    return false;
                }
                self.block = Some(Block {
                    stream_id,
                    end_stream: flags & FLAG_END_STREAM != 0,
                    priority,
                    fragments: fragment.to_vec(),
                    original: frame.to_vec(),
                });
            }
            Some(block) => {
                if kind != TYPE_CONTINUATION || stream_id != block.stream_id {
                    return false;
                }
                block.fragments.extend_from_slice(payload);
                block.original.extend_from_slice(frame);
            }
        }
        if flags & FLAG_END_HEADERS != 0 {
            self.finish();
        }
        true
    }

    /// Decodes the gathered block, fixes its authority and queues it encoded afresh.
    fn finish(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut size = 0usize;
        let decoded = self
            .decoder
            .decode_with_cb(&block.fragments, |name, value| {
                size += name.len() + value.len() + 32;
                if size <= MAX_HEADER_BLOCK {
                    headers.push((name.into_owned(), value.into_owned()));
                }
            });
        if decoded.is_err() || size > MAX_HEADER_BLOCK {
            self.ready.extend_from_slice(&block.original);
            self.mode = Mode::Raw;
            return;
        }
        for (name, value) in &mut headers {
            if name.as_slice() == b":authority"
                && http::uri::Authority::try_from(&value[..]).is_err()
            {
                tracing::debug!(
                    authority = %String::from_utf8_lossy(&value[..value.len().min(64)]),
                    "client sent an authority that is no URI authority; serving it as localhost"
                );
                *value = REPLACEMENT.to_vec();
            }
        }
        let mut encoded = Vec::with_capacity(block.fragments.len() + 64);
        if self.first_block {
            encoded.push(TABLE_SIZE_ZERO);
            self.first_block = false;
        }
        encoded.extend(
            self.encoder
                .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))),
        );
        self.emit(&block, &encoded);
    }

    /// Queues `encoded` as a HEADERS frame and as many CONTINUATIONs as it needs.
    fn emit(&mut self, block: &Block, encoded: &[u8]) {
        let prefix = block.priority.as_ref().map_or(&[][..], |p| &p[..]);
        let first_room = MAX_FRAME - prefix.len();
        let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
        let mut flags = if block.end_stream { FLAG_END_STREAM } else { 0 };
        if block.priority.is_some() {
            flags |= FLAG_PRIORITY;
        }
        if rest.is_empty() {
            flags |= FLAG_END_HEADERS;
        }
        self.frame_header(
            prefix.len() + first.len(),
            TYPE_HEADERS,
            flags,
            block.stream_id,
        );
        self.ready.extend_from_slice(prefix);
        self.ready.extend_from_slice(first);
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
            let flags = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
            self.frame_header(chunk.len(), TYPE_CONTINUATION, flags, block.stream_id);
            self.ready.extend_from_slice(chunk);
            rest = tail;
        }
    }

    fn frame_header(&mut self, len: usize, kind: u8, flags: u8, stream_id: u32) {
        // `len` is at most MAX_FRAME, well inside the 24-bit length field.
        let len = len as u32;
        self.ready
            .put_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
        self.ready.put_u32(stream_id);
    }

    /// Stops rewriting: a block being gathered goes on as it came, and so does all that follows.
    fn give_up(&mut self) {
        if let Some(block) = self.block.take() {
            self.ready.extend_from_slice(&block.original);
        }
        self.mode = Mode::Raw;
    }

    fn pass_rest(&mut self, raw: &mut BytesMut) {
        self.give_up();
        self.pass(raw, raw.len());
    }

    fn pass(&mut self, raw: &mut BytesMut, n: usize) {
        self.ready.extend_from_slice(&raw[..n]);
        raw.advance(n);
    }
}

/// The PRIORITY fields and the header block fragment of a HEADERS payload (RFC 9113 §6.2),
/// without padding; None if the padding or priority fields do not fit.
fn split_headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut rest = payload;
    let mut pad = 0usize;
    if flags & FLAG_PADDED != 0 {
        let (&n, tail) = rest.split_first()?;
        pad = usize::from(n);
        rest = tail;
    }
    let mut priority = None;
    if flags & FLAG_PRIORITY != 0 {
        let fields: [u8; 5] = rest.get(..5)?.try_into().ok()?;
        priority = Some(fields);
        rest = &rest[5..];
    }
    let end = rest.len().checked_sub(pad)?;
    Some((priority, &rest[..end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream_id.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn request(encoder: &mut Encoder<'static>, authority: &[u8], path: &[u8]) -> Vec<u8> {
        encoder.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", path),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ])
    }

    /// Feeds `input` to a walker in pieces of `step` bytes, as reads may deliver it.
    fn walk_in_pieces(input: &[u8], step: usize) -> Vec<u8> {
        let mut walker = Walker::new();
        let mut raw = BytesMut::new();
        for piece in input.chunks(step) {
            raw.extend_from_slice(piece);
            walker.walk(&mut raw);
        }
        walker.pass_rest(&mut raw);
        walker.ready.to_vec()
    }

    /// Splits the server-side bytes into frames and decodes every header block with one
    /// decoder, as the server does.
    type Headers = Vec<(Vec<u8>, Vec<u8>)>;
    /// Type, flags, stream id and payload.
    type Frame = (u8, u8, u32, Vec<u8>);

    fn server_view(bytes: &[u8]) -> (Vec<Headers>, Vec<Frame>) {
        assert_eq!(&bytes[..PREFACE.len()], PREFACE);
        let mut rest = &bytes[PREFACE.len()..];
        let mut frames = Vec::new();
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            assert!(len <= MAX_FRAME, "frame of {len} bytes");
            let id = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            frames.push((rest[3], rest[4], id, rest[9..9 + len].to_vec()));
            rest = &rest[9 + len..];
        }
        let mut decoder = Decoder::new();
        let mut blocks = Vec::new();
        let mut block = Vec::new();
        for (kind, flags, _, payload) in &frames {
            match *kind {
                TYPE_HEADERS => {
                    let (_, fragment) = split_headers_payload(*flags, payload).unwrap();
                    block = fragment.to_vec();
                }
                TYPE_CONTINUATION => block.extend_from_slice(payload),
                _ => continue,
            }
            if flags & FLAG_END_HEADERS != 0 {
                blocks.push(decoder.decode(&block).unwrap());
            }
        }
        (blocks, frames)
    }

    fn authority(headers: &[(Vec<u8>, Vec<u8>)]) -> &[u8] {
        &headers.iter().find(|(n, _)| n == b":authority").unwrap().1
    }

    #[test]
    fn socket_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let mut client = Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        let first = request(
            &mut client,
            b"/run/crius/crius.sock",
            b"/runtime.v1.RuntimeService/Version",
        );
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &first));
        input.extend(frame(0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\x04\x0a\x02v1"));
        // The second request leans on the client's dynamic table from the first.
        let second = request(
            &mut client,
            b"/run/crius/crius.sock",
            b"/runtime.v1.RuntimeService/Status",
        );
        assert!(
            second.len() < first.len(),
            "the client encoder reuses its table"
        );
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &second,
        ));
        let third = request(&mut client, b"localhost:1234", b"/x");
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 5, &third));

        for step in [1, 7, 4096] {
            let (blocks, frames) = server_view(&walk_in_pieces(&input, step));
            assert_eq!(blocks.len(), 3);
            assert_eq!(authority(&blocks[0]), b"localhost");
            assert_eq!(authority(&blocks[1]), b"localhost");
            assert_eq!(
                authority(&blocks[2]),
                b"localhost:1234",
                "a valid authority is kept"
            );
            let paths: Vec<_> = blocks
                .iter()
                .map(|b| b.iter().find(|(n, _)| n == b":path").unwrap().1.clone())
                .collect();
            assert_eq!(paths[1], b"/runtime.v1.RuntimeService/Status");
            assert_eq!(blocks[0].len(), 6);
            // Frames other than headers arrive unchanged and in order.
            let kinds: Vec<_> = frames.iter().map(|f| (f.0, f.2)).collect();
            assert_eq!(kinds, [(4, 0), (1, 1), (0, 1), (1, 3), (1, 5)]);
            assert_eq!(frames[2].3, b"\0\0\0\0\x04\x0a\x02v1");
            assert_eq!(frames[3].1 & FLAG_END_STREAM, FLAG_END_STREAM);
        }
    }

    #[test]
    fn padding_priority_and_continuations_are_understood() {
        let mut client = Encoder::new();
        let block = client.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":path", b"/p"),
            (b":authority", b"/a path"),
            (b"big", &[b'x'; 40_000][..]),
        ]);
        let mut payload = vec![3u8]; // pad length
        payload.extend_from_slice(&[0x80, 0, 0, 0, 16]); // exclusive dependency on 0, weight 16
        payload.extend_from_slice(&block[..100]);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
            7,
            &payload,
        ));
        input.extend(frame(TYPE_CONTINUATION, 0, 7, &block[100..20_000]));
        input.extend(frame(
            TYPE_CONTINUATION,
            FLAG_END_HEADERS,
            7,
            &block[20_000..],
        ));

        let (blocks, frames) = server_view(&walk_in_pieces(&input, 1000));
        assert_eq!(authority(&blocks[0]), b"localhost");
        assert_eq!(blocks[0][3].1.len(), 40_000);
        let (kind, flags, id, payload) = &frames[0];
        assert_eq!((*kind, *id), (TYPE_HEADERS, 7));
        assert_eq!(
            flags & (FLAG_PRIORITY | FLAG_END_STREAM | FLAG_PADDED | FLAG_END_HEADERS),
            FLAG_PRIORITY | FLAG_END_STREAM
        );
        assert_eq!(&payload[..5], &[0x80, 0, 0, 0, 16]);
        assert!(frames[1..]
            .iter()
            .all(|f| f.0 == TYPE_CONTINUATION && f.2 == 7));
        assert_eq!(frames.last().unwrap().1, FLAG_END_HEADERS);
    }

    #[test]
    fn what_is_not_understood_passes_unchanged() {
        // Not HTTP/2 at all.
        let http1 = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(walk_in_pieces(http1, 3), http1);

        // A block that does not decode (index 70 with an empty dynamic table), and everything
        // after it, reach the server as sent, so that it answers with its own error.
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0x80 | 70]));
        input.extend(frame(0x0, 0, 1, b"data"));
        assert_eq!(walk_in_pieces(&input, 5), input);

        // Padding longer than the frame.
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_PADDED,
            1,
            &[9, 0x82],
        ));
        assert_eq!(walk_in_pieces(&input, 64), input);

        // A CONTINUATION for another stream interrupts a block.
        let mut client = Encoder::new();
        let block = request(&mut client, b"/s", b"/p");
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, 0, 1, &block[..4]));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &block[4..]));
        assert_eq!(walk_in_pieces(&input, 64), input);

        // A connection cut in the middle of a frame.
        let mut input = PREFACE.to_vec();
        input.extend(&frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block)[..10]);
        assert_eq!(walk_in_pieces(&input, 3), input);
    }

    #[test]
    fn random_bytes_never_panic() {
        // A small deterministic generator: the point is many shapes of garbage after a valid
        // preface and frame header, not cryptographic randomness.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..2_000 {
            let len = (next() % 64) as usize;
            let payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let flags = next() as u8;
            let mut input = PREFACE.to_vec();
            input.extend(frame(TYPE_HEADERS, flags, 1, &payload));
            input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &payload));
            let out = walk_in_pieces(&input, 1 + (next() % 17) as usize);
            assert!(out.starts_with(PREFACE));
        }
    }

    #[tokio::test]
    async fn reads_through_the_wrapper_see_the_rewritten_stream() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(64);
        let mut encoder = Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &request(&mut encoder, b"/run/crius/crius.sock", b"/v"),
        ));
        let writer = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
            client.shutdown().await.unwrap();
        });
        let mut out = Vec::new();
        AuthorityFix::new(server)
            .read_to_end(&mut out)
            .await
            .unwrap();
        writer.await.unwrap();
        let (blocks, _) = server_view(&out);
        assert_eq!(authority(&blocks[0]), b"localhost");
    }
}
