//! Writer of the CRI container log format.
//!
//! Each line is `<timestamp> <stream> <tag> <content>\n`: the timestamp is RFC 3339 UTC with
//! nanoseconds (the time the shim read the data), the stream `stdout` or `stderr`, the tag `F`
//! for a full line or `P` for a partial one. Content longer than the maximum line size is split
//! into `P` chunks of that size followed by an `F` chunk with the rest, so a reader joins `P`
//! chunks up to the next `F`. A trailing `\r\n` or `\n` is not part of the content. Output
//! that ends without a newline (`printf abcd` as a container's whole output) is written as `P`
//! chunks when the stream ends: a reader that joins chunks (kubelet) then shows exactly the
//! bytes the container wrote, with no newline it never wrote (as CRI-O's conmon does).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::time::rfc3339_nanos;

/// Default maximum content bytes of one log line (containerd's `max_container_log_line_size`).
pub const DEFAULT_MAX_LINE: usize = 16 * 1024;

/// An output stream of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout = 0,
    Stderr = 1,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// One container's log file and the unfinished line of each stream.
#[derive(Debug)]
pub struct CriLog {
    path: PathBuf,
    file: File,
    max_line: usize,
    pending: [Vec<u8>; 2],
}

impl CriLog {
    /// Open (create or append to) the log file at `path`.
    pub fn open(path: &Path, max_line: usize) -> io::Result<Self> {
        Ok(Self {
            path: path.to_path_buf(),
            file: open_log_file(path)?,
            max_line: max_line.max(1),
            pending: [Vec::new(), Vec::new()],
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Open the path again (creating the file if it was rotated away) and write there from now
    /// on; on failure the old file stays in use.
    pub fn reopen(&mut self) -> io::Result<()> {
        self.file = open_log_file(&self.path)?;
        Ok(())
    }

    /// Log `data` read from `stream` at `now` (Unix nanoseconds).
    pub fn write(&mut self, stream: Stream, data: &[u8], now: i64) -> io::Result<()> {
        let mut out = Vec::new();
        let ts = rfc3339_nanos(now);
        let max = self.max_line;
        let pending = &mut self.pending[stream as usize];
        pending.extend_from_slice(data);
        let mut start = 0;
        while let Some(nl) = pending[start..].iter().position(|&b| b == b'\n') {
            let mut line = &pending[start..start + nl];
            if let Some(stripped) = line.strip_suffix(b"\r") {
                line = stripped;
            }
            emit_line(&mut out, &ts, stream, line, max);
            start += nl + 1;
        }
        // An unfinished line longer than the maximum goes out in full-size partial chunks now;
        // a chunk of exactly the maximum waits, as the next byte may end the line.
        while pending.len() - start > max {
            emit(&mut out, &ts, stream, "P", &pending[start..start + max]);
            start += max;
        }
        pending.drain(..start);
        self.write_out(&out)
    }

    /// The stream ended: write its unfinished line, if any, as partial chunks (no newline
    /// ended it).
    pub fn finish(&mut self, stream: Stream, now: i64) -> io::Result<()> {
        let pending = std::mem::take(&mut self.pending[stream as usize]);
        let ts = rfc3339_nanos(now);
        let mut out = Vec::new();
        for chunk in pending.chunks(self.max_line) {
            emit(&mut out, &ts, stream, "P", chunk);
        }
        self.write_out(&out)
    }

    fn write_out(&mut self, out: &[u8]) -> io::Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.file.write_all(out)
    }
}

fn open_log_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// A complete line: `P` chunks of `max` bytes while more than `max` remain, then `F`.
fn emit_line(out: &mut Vec<u8>, ts: &str, stream: Stream, mut line: &[u8], max: usize) {
    while line.len() > max {
        emit(out, ts, stream, "P", &line[..max]);
        line = &line[max..];
    }
    emit(out, ts, stream, "F", line);
}

fn emit(out: &mut Vec<u8>, ts: &str, stream: Stream, tag: &str, content: &[u8]) {
    out.extend_from_slice(ts.as_bytes());
    out.push(b' ');
    out.extend_from_slice(stream.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(tag.as_bytes());
    out.push(b' ');
    out.extend_from_slice(content);
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_700_000_000_123_456_789;
    const TS: &str = "2023-11-14T22:13:20.123456789Z";

    fn log_with(max: usize) -> (tempfile::TempDir, CriLog) {
        let dir = tempfile::tempdir().unwrap();
        let log = CriLog::open(&dir.path().join("c.log"), max).unwrap();
        (dir, log)
    }

    fn contents(log: &CriLog) -> String {
        std::fs::read_to_string(log.path()).unwrap()
    }

    #[test]
    fn full_lines_get_f_and_stream_tags() {
        let (_d, mut log) = log_with(DEFAULT_MAX_LINE);
        log.write(Stream::Stdout, b"hello\nwor", T).unwrap();
        log.write(Stream::Stderr, b"oops\r\n", T).unwrap();
        log.write(Stream::Stdout, b"ld\n\n", T).unwrap();
        assert_eq!(
            contents(&log),
            format!(
                "{TS} stdout F hello\n{TS} stderr F oops\n{TS} stdout F world\n{TS} stdout F \n"
            )
        );
    }

    #[test]
    fn long_lines_split_into_partial_chunks() {
        let (_d, mut log) = log_with(4);
        log.write(Stream::Stdout, b"abcdefghij\n", T).unwrap();
        log.write(Stream::Stdout, b"1234", T).unwrap();
        log.write(Stream::Stdout, b"\n", T).unwrap();
        log.write(Stream::Stdout, b"xyzuv", T).unwrap();
        assert_eq!(
            contents(&log),
            format!(
                "{TS} stdout P abcd\n{TS} stdout P efgh\n{TS} stdout F ij\n\
                 {TS} stdout F 1234\n{TS} stdout P xyzu\n"
            )
        );
        log.finish(Stream::Stdout, T).unwrap();
        log.finish(Stream::Stderr, T).unwrap();
        assert!(contents(&log).ends_with(&format!("{TS} stdout P v\n")));
    }

    #[test]
    fn output_without_newline_ends_as_partial() {
        let (_d, mut log) = log_with(4);
        log.write(Stream::Stdout, b"abcd", T).unwrap();
        log.write(Stream::Stderr, b"x\ny", T).unwrap();
        log.finish(Stream::Stdout, T).unwrap();
        log.finish(Stream::Stderr, T).unwrap();
        assert_eq!(
            contents(&log),
            format!("{TS} stderr F x\n{TS} stdout P abcd\n{TS} stderr P y\n")
        );
    }

    #[test]
    fn reopen_creates_a_rotated_file() {
        let (_d, mut log) = log_with(DEFAULT_MAX_LINE);
        log.write(Stream::Stdout, b"one\n", T).unwrap();
        let rotated = log.path().with_extension("1");
        std::fs::rename(log.path(), &rotated).unwrap();
        log.write(Stream::Stdout, b"two\n", T).unwrap();
        log.reopen().unwrap();
        log.write(Stream::Stdout, b"three\n", T).unwrap();
        assert_eq!(
            std::fs::read_to_string(&rotated).unwrap(),
            format!("{TS} stdout F one\n{TS} stdout F two\n")
        );
        assert_eq!(contents(&log), format!("{TS} stdout F three\n"));
    }
}
