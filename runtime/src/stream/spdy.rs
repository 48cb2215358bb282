//! SPDY/3.1 framing, as the Kubernetes streaming clients speak it after an HTTP upgrade
//! (`Upgrade: SPDY/3.1`).
//!
//! Every frame has an 8-byte header. A control frame starts with the control bit, the version
//! (3) and its type; a data frame with the stream id. The second word holds 8 bits of flags and
//! a 24-bit payload length. Header blocks (in SYN_STREAM, SYN_REPLY and HEADERS) are a count and
//! length-prefixed name/value pairs, compressed with zlib: one stream per direction for the
//! whole session, primed with the dictionary of the SPDY/3 specification, each block ending in
//! a sync flush.
//!
//! Flow control (WINDOW_UPDATE) is read and ignored: the Go clients (moby/spdystream) neither
//! send window updates nor wait for them, and the peers' buffers are what bounds the data.

use std::collections::BTreeMap;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The SPDY version this speaks.
pub const VERSION: u16 = 3;

/// Largest payload this accepts or sends in one frame (the format allows 16 MiB; the clients
/// send far smaller frames).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Largest data payload this sends in one frame.
pub const MAX_DATA_CHUNK: usize = 32 * 1024;

/// Flag of a data frame, SYN_STREAM, SYN_REPLY or HEADERS: the sender's last frame on the stream.
pub const FLAG_FIN: u8 = 0x01;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status: the stream is being cancelled.
pub const RST_CANCEL: u32 = 5;
/// RST_STREAM status: a frame for a stream that is not open.
pub const RST_INVALID_STREAM: u32 = 2;

/// Headers: lower-case names, each with its values.
pub type Headers = BTreeMap<String, Vec<String>>;

/// The first value of header `name` (lower case), if any.
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.first())
        .map(String::as_str)
}

/// Errors of the framing layer; every one ends the session.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    #[error("unsupported SPDY version {0}")]
    Version(u16),
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    #[error("header block: {0}")]
    HeaderBlock(String),
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
    SynStream {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    SynReply {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Settings,
    Ping {
        id: u32,
    },
    GoAway {
        last_stream: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    WindowUpdate {
        stream: u32,
        delta: u32,
    },
    /// A control frame of a type this does not know; SPDY says to ignore it.
    Unknown,
}

/// The header-block dictionary of the SPDY/3 specification: these words, each with a 4-byte
/// big-endian length before it, then [`DICTIONARY_TAIL`] as it is.
const DICTIONARY_WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

const DICTIONARY_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

/// The SPDY/3 header dictionary (1423 bytes).
pub fn dictionary() -> Vec<u8> {
    let mut out = Vec::with_capacity(1423);
    for word in DICTIONARY_WORDS {
        out.extend_from_slice(&(word.len() as u32).to_be_bytes());
        out.extend_from_slice(word.as_bytes());
    }
    out.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    out
}

/// Encodes frames of one direction of a session (it owns that direction's compressor).
pub struct Encoder {
    deflate: Compress,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    pub fn new() -> Encoder {
        let mut deflate = Compress::new(Compression::default(), true);
        // A fresh zlib stream always takes a dictionary; nothing to handle.
        let _ = deflate.set_dictionary(&dictionary());
        Encoder { deflate }
    }

    /// Append `frame` to `out`. Data frames longer than a frame allows are the caller's to split.
    pub fn encode(&mut self, frame: &Frame, out: &mut Vec<u8>) -> Result<(), SpdyError> {
        match frame {
            Frame::Data { stream, fin, data } => {
                if data.len() >= MAX_PAYLOAD {
                    return Err(SpdyError::TooLarge(data.len()));
                }
                out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
                push_flags_len(out, fin_flag(*fin), data.len());
                out.extend_from_slice(data);
            }
            Frame::SynStream {
                stream,
                fin,
                headers,
            } => {
                let block = self.header_block(headers)?;
                let mut payload = Vec::with_capacity(10 + block.len());
                payload.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
                payload.extend_from_slice(&0u32.to_be_bytes());
                payload.extend_from_slice(&[0, 0]);
                payload.extend_from_slice(&block);
                control(out, TYPE_SYN_STREAM, fin_flag(*fin), &payload)?;
            }
            Frame::SynReply {
                stream,
                fin,
                headers,
            }
            | Frame::Headers {
                stream,
                fin,
                headers,
            } => {
                let kind = if matches!(frame, Frame::SynReply { .. }) {
                    TYPE_SYN_REPLY
                } else {
                    TYPE_HEADERS
                };
                let block = self.header_block(headers)?;
                let mut payload = Vec::with_capacity(4 + block.len());
                payload.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
                payload.extend_from_slice(&block);
                control(out, kind, fin_flag(*fin), &payload)?;
            }
            Frame::RstStream { stream, status } => {
                let mut payload = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
                payload.extend_from_slice(&status.to_be_bytes());
                control(out, TYPE_RST_STREAM, 0, &payload)?;
            }
            Frame::Settings => control(out, TYPE_SETTINGS, 0, &0u32.to_be_bytes())?,
            Frame::Ping { id } => control(out, TYPE_PING, 0, &id.to_be_bytes())?,
            Frame::GoAway {
                last_stream,
                status,
            } => {
                let mut payload = (last_stream & 0x7fff_ffff).to_be_bytes().to_vec();
                payload.extend_from_slice(&status.to_be_bytes());
                control(out, TYPE_GOAWAY, 0, &payload)?;
            }
            Frame::WindowUpdate { stream, delta } => {
                let mut payload = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
                payload.extend_from_slice(&(delta & 0x7fff_ffff).to_be_bytes());
                control(out, TYPE_WINDOW_UPDATE, 0, &payload)?;
            }
            Frame::Unknown => {}
        }
        Ok(())
    }

    fn header_block(&mut self, headers: &Headers) -> Result<Vec<u8>, SpdyError> {
        let mut plain = Vec::new();
        plain.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (name, values) in headers {
            let value = values.join("\0");
            plain.extend_from_slice(&(name.len() as u32).to_be_bytes());
            plain.extend_from_slice(name.to_ascii_lowercase().as_bytes());
            plain.extend_from_slice(&(value.len() as u32).to_be_bytes());
            plain.extend_from_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(plain.len() + 64);
        let mut input = &plain[..];
        loop {
            out.reserve(256);
            let before_in = self.deflate.total_in();
            let before_out = self.deflate.total_out();
            self.deflate
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::HeaderBlock(e.to_string()))?;
            let used = (self.deflate.total_in() - before_in) as usize;
            input = &input[used..];
            let produced = self.deflate.total_out() - before_out;
            // Done once all input is in and the flush fitted (spare room left over).
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            if used == 0 && produced == 0 && out.len() < out.capacity() {
                return Err(SpdyError::HeaderBlock("compressor made no progress".into()));
            }
        }
        Ok(out)
    }
}

fn fin_flag(fin: bool) -> u8 {
    if fin {
        FLAG_FIN
    } else {
        0
    }
}

fn push_flags_len(out: &mut Vec<u8>, flags: u8, len: usize) {
    let word = (u32::from(flags) << 24) | (len as u32 & 0x00ff_ffff);
    out.extend_from_slice(&word.to_be_bytes());
}

fn control(out: &mut Vec<u8>, kind: u16, flags: u8, payload: &[u8]) -> Result<(), SpdyError> {
    if payload.len() >= MAX_PAYLOAD {
        return Err(SpdyError::TooLarge(payload.len()));
    }
    out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    push_flags_len(out, flags, payload.len());
    out.extend_from_slice(payload);
    Ok(())
}

/// Decodes frames of one direction of a session (it owns that direction's decompressor).
pub struct Decoder {
    inflate: Decompress,
    dictionary: Vec<u8>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder {
            inflate: Decompress::new(true),
            dictionary: dictionary(),
        }
    }

    /// Decode the first frame of `buf` if it is complete: the frame and the bytes it used.
    pub fn decode(&mut self, buf: &[u8]) -> Result<Option<(Frame, usize)>, SpdyError> {
        let Some(head) = buf.get(..8) else {
            return Ok(None);
        };
        let word0 = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let word1 = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        let flags = (word1 >> 24) as u8;
        let len = (word1 & 0x00ff_ffff) as usize;
        if len >= MAX_PAYLOAD {
            return Err(SpdyError::TooLarge(len));
        }
        let Some(payload) = buf.get(8..8 + len) else {
            return Ok(None);
        };
        let fin = flags & FLAG_FIN != 0;
        let frame = if word0 & 0x8000_0000 == 0 {
            Frame::Data {
                stream: word0,
                fin,
                data: payload.to_vec(),
            }
        } else {
            let version = ((word0 >> 16) & 0x7fff) as u16;
            if version != VERSION {
                return Err(SpdyError::Version(version));
            }
            self.control((word0 & 0xffff) as u16, fin, payload)?
        };
        Ok(Some((frame, 8 + len)))
    }

    fn control(&mut self, kind: u16, fin: bool, p: &[u8]) -> Result<Frame, SpdyError> {
        let word = |i: usize, what: &'static str| -> Result<u32, SpdyError> {
            p.get(i..i + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or(SpdyError::Malformed(what))
        };
        Ok(match kind {
            TYPE_SYN_STREAM => {
                let stream = word(0, "SYN_STREAM")? & 0x7fff_ffff;
                let block = p.get(10..).ok_or(SpdyError::Malformed("SYN_STREAM"))?;
                Frame::SynStream {
                    stream,
                    fin,
                    headers: self.header_block(block)?,
                }
            }
            TYPE_SYN_REPLY | TYPE_HEADERS => {
                let what = if kind == TYPE_SYN_REPLY {
                    "SYN_REPLY"
                } else {
                    "HEADERS"
                };
                let stream = word(0, what)? & 0x7fff_ffff;
                let headers = self.header_block(p.get(4..).ok_or(SpdyError::Malformed(what))?)?;
                if kind == TYPE_SYN_REPLY {
                    Frame::SynReply {
                        stream,
                        fin,
                        headers,
                    }
                } else {
                    Frame::Headers {
                        stream,
                        fin,
                        headers,
                    }
                }
            }
            TYPE_RST_STREAM => Frame::RstStream {
                stream: word(0, "RST_STREAM")? & 0x7fff_ffff,
                status: word(4, "RST_STREAM")?,
            },
            TYPE_SETTINGS => Frame::Settings,
            TYPE_PING => Frame::Ping {
                id: word(0, "PING")?,
            },
            TYPE_GOAWAY => Frame::GoAway {
                last_stream: word(0, "GOAWAY")? & 0x7fff_ffff,
                status: word(4, "GOAWAY").unwrap_or(0),
            },
            TYPE_WINDOW_UPDATE => Frame::WindowUpdate {
                stream: word(0, "WINDOW_UPDATE")? & 0x7fff_ffff,
                delta: word(4, "WINDOW_UPDATE")? & 0x7fff_ffff,
            },
            _ => Frame::Unknown,
        })
    }

    fn header_block(&mut self, compressed: &[u8]) -> Result<Headers, SpdyError> {
        let bad = |m: &str| SpdyError::HeaderBlock(m.to_owned());
        let mut plain: Vec<u8> = Vec::with_capacity(compressed.len() * 4 + 64);
        let mut input = compressed;
        loop {
            if plain.len() == plain.capacity() {
                if plain.len() > 1 << 20 {
                    return Err(bad("more than 1 MiB of headers"));
                }
                plain.reserve(plain.len().max(256));
            }
            let before_in = self.inflate.total_in();
            let before_out = self.inflate.total_out();
            let status = match self
                .inflate
                .decompress_vec(input, &mut plain, FlushDecompress::Sync)
            {
                Ok(status) => status,
                Err(e) if e.needs_dictionary().is_some() => {
                    let used = (self.inflate.total_in() - before_in) as usize;
                    input = &input[used..];
                    self.inflate
                        .set_dictionary(&self.dictionary)
                        .map_err(|e| SpdyError::HeaderBlock(e.to_string()))?;
                    continue;
                }
                Err(e) => return Err(SpdyError::HeaderBlock(e.to_string())),
            };
            let used = (self.inflate.total_in() - before_in) as usize;
            input = &input[used..];
            let produced = self.inflate.total_out() - before_out;
            if status == Status::StreamEnd {
                break;
            }
            if input.is_empty() && plain.len() < plain.capacity() {
                break;
            }
            if used == 0 && produced == 0 && plain.len() < plain.capacity() {
                return Err(bad("truncated"));
            }
        }
        parse_headers(&plain)
    }
}

fn parse_headers(b: &[u8]) -> Result<Headers, SpdyError> {
    let bad = || SpdyError::HeaderBlock("malformed name/value block".to_owned());
    let mut pos = 0usize;
    let take_u32 = |pos: &mut usize| -> Result<usize, SpdyError> {
        let s = b.get(*pos..*pos + 4).ok_or_else(bad)?;
        *pos += 4;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize)
    };
    let count = take_u32(&mut pos)?;
    let mut headers = Headers::new();
    for _ in 0..count {
        let n = take_u32(&mut pos)?;
        let name = b.get(pos..pos + n).ok_or_else(bad)?;
        pos += n;
        let n = take_u32(&mut pos)?;
        let value = b.get(pos..pos + n).ok_or_else(bad)?;
        pos += n;
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        let entry = headers.entry(name).or_default();
        for v in value.split(|c| *c == 0) {
            entry.push(String::from_utf8_lossy(v).into_owned());
        }
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        let mut h = Headers::new();
        for (k, v) in pairs {
            h.entry((*k).to_owned()).or_default().push((*v).to_owned());
        }
        h
    }

    #[test]
    fn dictionary_is_the_specified_size() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b"enq=0."));
    }

    #[test]
    fn frames_round_trip_through_one_compression_context() {
        let mut enc = Encoder::new();
        let mut dec = Decoder::new();
        let frames = vec![
            Frame::SynStream {
                stream: 1,
                fin: false,
                headers: headers(&[("streamtype", "error"), ("port", "80")]),
            },
            Frame::SynStream {
                stream: 3,
                fin: true,
                headers: headers(&[("streamtype", "stdout"), ("a", "x"), ("a", "y")]),
            },
            Frame::SynReply {
                stream: 3,
                fin: false,
                headers: Headers::new(),
            },
            Frame::Data {
                stream: 3,
                fin: true,
                data: b"hello".to_vec(),
            },
            Frame::RstStream {
                stream: 5,
                status: RST_CANCEL,
            },
            Frame::Ping { id: 7 },
            Frame::GoAway {
                last_stream: 3,
                status: 0,
            },
            Frame::WindowUpdate {
                stream: 1,
                delta: 1000,
            },
        ];
        let mut wire = Vec::new();
        for f in &frames {
            enc.encode(f, &mut wire).unwrap();
        }
        let mut pos = 0;
        for f in &frames {
            // Byte by byte first: an incomplete frame is not an error.
            assert_eq!(dec.decode(&wire[pos..pos + 7]).unwrap(), None);
            let (back, used) = dec.decode(&wire[pos..]).unwrap().unwrap();
            assert_eq!(&back, f);
            pos += used;
        }
        assert_eq!(pos, wire.len());
    }

    #[test]
    fn wire_layout_of_data_and_control_frames() {
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        enc.encode(
            &Frame::Data {
                stream: 5,
                fin: true,
                data: vec![9, 9],
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [0, 0, 0, 5, 1, 0, 0, 2, 9, 9]);
        out.clear();
        enc.encode(&Frame::Ping { id: 1 }, &mut out).unwrap();
        assert_eq!(out, [0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]);
    }

    #[test]
    fn a_header_block_starts_a_zlib_stream_with_the_dictionary_id() {
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        enc.encode(
            &Frame::SynReply {
                stream: 1,
                fin: false,
                headers: Headers::new(),
            },
            &mut out,
        )
        .unwrap();
        // zlib header after the 8-byte frame header and the stream id: FDICT set.
        let zlib = &out[12..];
        assert_eq!(zlib[1] & 0x20, 0x20);
        assert_eq!(u16::from_be_bytes([zlib[0], zlib[1]]) % 31, 0);
    }

    #[test]
    fn other_versions_and_huge_frames_are_refused() {
        let mut dec = Decoder::new();
        assert!(matches!(
            dec.decode(&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]),
            Err(SpdyError::Version(2))
        ));
        assert!(matches!(
            dec.decode(&[0, 0, 0, 1, 0, 0xff, 0xff, 0xff]),
            Err(SpdyError::TooLarge(_))
        ));
    }
}
