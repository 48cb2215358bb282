//! The admin socket, `<state>/admin.sock`: what an operator's `crius images …` commands ask of
//! the running crius, and which kubelet must not reach (so not the CRI socket).
//!
//! Why the running crius and not the root directory offline: the image store's records, leases
//! and garbage collection live in the daemon's memory. A second process writing blobs and
//! records under a running crius would be invisible to it until a restart, and its collection
//! could remove blobs the import had just written. Stopping crius to import would be safe but
//! is not what an operator preloading a node wants. Through the daemon, an import holds the
//! store's collection gate like a pull, and an imported image is usable at once.
//!
//! The socket is mode 0600 and owned by the user crius runs as (root); each connection's peer
//! must also be root or that user (`SO_PEERCRED`). One request per connection:
//!
//! ```text
//! client: <Request as one JSON line>
//! import: client sends the archive as chunks, then the server answers <Response line>
//! export: server sends the archive as chunks, then <Response line>
//! pulls:  server answers <Response line>
//! chunk:  u32 big-endian length, then that many bytes; length 0 ends the stream
//! ```
//!
//! Chunks (rather than reading to the end of the connection) let each side tell an archive
//! that ended from one whose sender died half-way.

pub mod server;

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// The admin socket's file name in the state directory.
pub const SOCKET_NAME: &str = "admin.sock";

/// The largest chunk either side sends or accepts.
pub const MAX_CHUNK: usize = 1 << 20;

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum Request {
    /// Import the archive that follows in chunks.
    Import,
    /// Export these images (ids, references or id prefixes) as one archive.
    Export { images: Vec<String> },
    /// The image pulls (and imports) under way.
    Pulls,
}

/// The server's answer, the last thing it sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum Response {
    Imported(ImportSummary),
    Exported(ExportSummary),
    Pulls { pulls: Vec<PullView> },
    Error { message: String },
}

/// One image an import recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportedImage {
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImportSummary {
    pub images: Vec<ImportedImage>,
    pub skipped_platforms: Vec<String>,
    pub archive_bytes: u64,
    pub layers_unpacked: usize,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportSummary {
    pub images: Vec<String>,
    pub blobs: usize,
    pub blob_bytes: u64,
}

/// A pull under way, as `crius images pulls` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullView {
    pub image: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub elapsed_ms: u64,
    /// The blobs it is downloading or has downloaded.
    #[serde(default)]
    pub blobs: Vec<BlobView>,
}

/// One blob of a pull under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobView {
    pub digest: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// From its first byte to its last so far.
    pub receiving_ms: u64,
    /// Since its last byte; 0 once complete.
    pub stalled_ms: u64,
}

/// Writes `msg` as one JSON line.
pub fn write_line<W: Write, T: Serialize>(w: &mut W, msg: &T) -> io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// Reads one JSON line of at most 64 KiB, a byte at a time (what follows it is not consumed).
pub fn read_line<R: Read, T: for<'de> Deserialize<'de>>(r: &mut R) -> io::Result<T> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        if r.read(&mut byte)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before a whole message",
            ));
        }
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
        if line.len() > 64 << 10 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "message longer than 64 KiB",
            ));
        }
    }
    serde_json::from_slice(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes what it is given as chunks of up to [`MAX_CHUNK`] bytes; [`ChunkWriter::finish`]
/// sends the end.
pub struct ChunkWriter<W: Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> ChunkWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            buf: Vec::with_capacity(MAX_CHUNK),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let len = u32::try_from(self.buf.len()).map_err(io::Error::other)?;
        self.inner.write_all(&len.to_be_bytes())?;
        self.inner.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    /// Sends what is buffered and the end marker; returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.send()?;
        self.inner.write_all(&0u32.to_be_bytes())?;
        self.inner.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for ChunkWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = MAX_CHUNK - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == MAX_CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()?;
        self.inner.flush()
    }
}

/// Reads a chunked stream as plain bytes; ends (0) at the end marker, and fails if the
/// connection ends before it.
pub struct ChunkReader<R: Read> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: Read> ChunkReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            left: 0,
            done: false,
        }
    }

    /// Whether the end marker was read.
    pub fn ended(&self) -> bool {
        self.done
    }

    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: Read> Read for ChunkReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.done || out.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut len = [0u8; 4];
            self.inner.read_exact(&mut len).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    io::Error::new(e.kind(), "the sender stopped before the end of the archive")
                } else {
                    e
                }
            })?;
            let len = u32::from_be_bytes(len) as usize;
            if len == 0 {
                self.done = true;
                return Ok(0);
            }
            if len > MAX_CHUNK {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("chunk of {len} bytes (at most {MAX_CHUNK})"),
                ));
            }
            self.left = len;
        }
        let want = out.len().min(self.left);
        let n = self.inner.read(&mut out[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the sender stopped before the end of the archive",
            ));
        }
        self.left -= n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_and_a_cut_is_an_error() {
        let data: Vec<u8> = (0..3 * MAX_CHUNK + 17).map(|i| i as u8).collect();
        let mut w = ChunkWriter::new(Vec::new());
        w.write_all(&data).unwrap();
        let wire = w.finish().unwrap();
        let mut back = Vec::new();
        let mut r = ChunkReader::new(&wire[..]);
        r.read_to_end(&mut back).unwrap();
        assert!(r.ended());
        assert_eq!(back, data);

        let mut r = ChunkReader::new(&wire[..wire.len() - 4]);
        let err = r.read_to_end(&mut Vec::new()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn lines() {
        let mut wire = Vec::new();
        write_line(
            &mut wire,
            &Request::Export {
                images: vec!["busybox".into()],
            },
        )
        .unwrap();
        wire.extend_from_slice(b"rest");
        let mut r = &wire[..];
        let req: Request = read_line(&mut r).unwrap();
        assert_eq!(
            req,
            Request::Export {
                images: vec!["busybox".into()]
            }
        );
        assert_eq!(r, b"rest");
        assert!(read_line::<_, Request>(&mut &b"{\"op\":\"nope\"}\n"[..]).is_err());
    }
}
