//! Just enough D-Bus to drive systemd's manager over its private socket.
//!
//! systemd (PID 1, or a user manager) listens on a private socket (`/run/systemd/private`) that
//! speaks D-Bus peer to peer: no bus daemon, no `Hello`, no names; root authenticates with
//! `EXTERNAL` and calls the manager's methods directly, as `systemctl` does. crius needs a handful
//! of calls (start a transient unit, change or stop one, read a property), so this module writes
//! the wire format itself (little-endian, protocol version 1) instead of pulling in a general
//! D-Bus library, and it is blocking, like the rest of the cgroups module: one short-lived
//! connection per operation, so no signal queue grows between calls.
//!
//! systemd sends its signals (`UnitNew`, `JobRemoved`, …) to every private connection
//! unasked; [`Connection::call`] skips them while it waits for its reply, and
//! [`Connection::wait_job`] reads them until the job it started is done.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why talking to systemd failed.
#[derive(Debug, thiserror::Error)]
pub enum DbusError {
    #[error("connect to systemd at {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("talk to systemd at {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("systemd at {} refused authentication: {reply:?}", path.display())]
    Auth { path: PathBuf, reply: String },
    /// systemd answered the call with a D-Bus error.
    #[error("{method}: {name}: {message}")]
    Call {
        method: String,
        name: String,
        message: String,
    },
    #[error("malformed message from systemd: {0}")]
    Malformed(&'static str),
    #[error("{what}: no answer from systemd within {secs} s")]
    Timeout { what: String, secs: u64 },
}

pub type Result<T> = std::result::Result<T, DbusError>;

/// The D-Bus error systemd answers for a unit it does not know.
pub const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// The D-Bus error for a transient unit whose name is taken.
pub const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";

/// A value of a systemd unit property, as the `v` of an `a(sv)` array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Str(String),
    Bool(bool),
    U64(u64),
    /// `au`, e.g. `PIDs`.
    U32s(Vec<u32>),
    /// `ay`, e.g. `AllowedCPUs` (a CPU bitmask).
    Bytes(Vec<u8>),
}

impl Value {
    fn signature(&self) -> &'static str {
        match self {
            Value::Str(_) => "s",
            Value::Bool(_) => "b",
            Value::U64(_) => "t",
            Value::U32s(_) => "au",
            Value::Bytes(_) => "ay",
        }
    }
}

/// One argument of a method call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg<'a> {
    Str(&'a str),
    Bool(bool),
    /// `a(sv)`: unit properties.
    Properties(&'a [(String, Value)]),
    /// `a(sa(sv))`: auxiliary units of `StartTransientUnit` (crius never sends any).
    NoAuxUnits,
}

impl Arg<'_> {
    fn signature(&self) -> &'static str {
        match self {
            Arg::Str(_) => "s",
            Arg::Bool(_) => "b",
            Arg::Properties(_) => "a(sv)",
            Arg::NoAuxUnits => "a(sa(sv))",
        }
    }
}

const METHOD_CALL: u8 = 1;
const METHOD_RETURN: u8 = 2;
const ERROR: u8 = 3;
const SIGNAL: u8 = 4;

const FIELD_PATH: u8 = 1;
const FIELD_INTERFACE: u8 = 2;
const FIELD_MEMBER: u8 = 3;
const FIELD_ERROR_NAME: u8 = 4;
const FIELD_REPLY_SERIAL: u8 = 5;
const FIELD_SIGNATURE: u8 = 8;

/// Marshals values in D-Bus's little-endian format. Alignment is relative to the start of the
/// buffer, which is right for a message (the header starts it) and for a body (which starts
/// on an 8-byte boundary of its message).
#[derive(Debug, Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn align(&mut self, n: usize) {
        while !self.buf.len().is_multiple_of(n) {
            self.buf.push(0);
        }
    }

    fn byte(&mut self, b: u8) {
        self.buf.push(b);
    }

    fn u32(&mut self, v: u32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.align(8);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn bool(&mut self, v: bool) {
        self.u32(u32::from(v));
    }

    /// `s` and `o`.
    fn str(&mut self, s: &str) {
        self.u32(len32(s.len()));
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    /// `g`: a signature (at most 255 bytes).
    fn signature(&mut self, s: &str) {
        self.buf.push(u8::try_from(s.len()).unwrap_or(u8::MAX));
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    /// An array whose elements align to `elem_align`; `f` writes the elements. The length
    /// counts the elements' bytes only, not the padding before the first.
    fn array(&mut self, elem_align: usize, f: impl FnOnce(&mut Writer)) {
        self.u32(0);
        let len_at = self.buf.len() - 4;
        self.align(elem_align);
        let start = self.buf.len();
        f(self);
        let len = len32(self.buf.len() - start);
        self.buf[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
    }

    fn variant(&mut self, v: &Value) {
        self.signature(v.signature());
        match v {
            Value::Str(s) => self.str(s),
            Value::Bool(b) => self.bool(*b),
            Value::U64(n) => self.u64(*n),
            Value::U32s(ns) => self.array(4, |w| ns.iter().for_each(|n| w.u32(*n))),
            Value::Bytes(bs) => self.array(1, |w| w.buf.extend_from_slice(bs)),
        }
    }

    fn properties(&mut self, props: &[(String, Value)]) {
        self.array(8, |w| {
            for (name, value) in props {
                w.align(8);
                w.str(name);
                w.variant(value);
            }
        });
    }

    fn arg(&mut self, a: &Arg<'_>) {
        match a {
            Arg::Str(s) => self.str(s),
            Arg::Bool(b) => self.bool(*b),
            Arg::Properties(p) => self.properties(p),
            Arg::NoAuxUnits => self.array(8, |_| {}),
        }
    }

    /// A header field `(yv)` whose variant holds a string-like value of signature `sig`.
    fn field_str(&mut self, code: u8, sig: &str, value: &str) {
        self.align(8);
        self.byte(code);
        self.signature(sig);
        if sig == "g" {
            self.signature(value);
        } else {
            self.str(value);
        }
    }
}

/// Lengths in crius's messages are far below 4 GiB; a larger one is clamped (and then
/// refused by systemd rather than truncated silently into a valid message).
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A method call to `member` of `interface` on `path`, numbered `serial`.
pub fn method_call(
    serial: u32,
    path: &str,
    interface: &str,
    member: &str,
    args: &[Arg<'_>],
) -> Vec<u8> {
    let mut body = Writer::default();
    for a in args {
        body.arg(a);
    }
    let signature: String = args.iter().map(Arg::signature).collect();
    let mut m = Writer::default();
    m.byte(b'l');
    m.byte(METHOD_CALL);
    m.byte(0);
    m.byte(1);
    m.u32(len32(body.buf.len()));
    m.u32(serial);
    m.array(8, |w| {
        w.field_str(FIELD_PATH, "o", path);
        w.field_str(FIELD_INTERFACE, "s", interface);
        w.field_str(FIELD_MEMBER, "s", member);
        if !signature.is_empty() {
            w.field_str(FIELD_SIGNATURE, "g", &signature);
        }
    });
    m.align(8);
    m.buf.extend_from_slice(&body.buf);
    m.buf
}

/// Reads D-Bus values of a little-endian message part (alignment relative to its start).
#[derive(Debug)]
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    fn align(&mut self, n: usize) -> Result<()> {
        let aligned = self.pos.div_ceil(n) * n;
        if aligned > self.buf.len() {
            return Err(DbusError::Malformed("padding past the end"));
        }
        self.pos = aligned;
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(DbusError::Malformed("value past the end"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        self.align(4)?;
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64> {
        self.align(8)?;
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn str(&mut self) -> Result<String> {
        let len = self.u32()? as usize;
        let s = self.take(len)?;
        self.take(1)?;
        String::from_utf8(s.to_vec()).map_err(|_| DbusError::Malformed("string is not UTF-8"))
    }

    fn signature(&mut self) -> Result<String> {
        let len = usize::from(self.byte()?);
        let s = self.take(len)?;
        self.take(1)?;
        String::from_utf8(s.to_vec()).map_err(|_| DbusError::Malformed("signature is not UTF-8"))
    }

    /// Skips one value of the single complete type at the start of `sig`; returns the rest of
    /// the signature. Enough for header fields, whose variants are basic types.
    fn skip<'s>(&mut self, sig: &'s str) -> Result<&'s str> {
        let (c, rest) = sig.split_at(1);
        match c {
            "y" => {
                self.byte()?;
            }
            "b" | "u" | "i" => {
                self.u32()?;
            }
            "t" | "x" => {
                self.u64()?;
            }
            "s" | "o" => {
                self.str()?;
            }
            "g" => {
                self.signature()?;
            }
            "v" => {
                let inner = self.signature()?;
                let left = self.skip(&inner)?;
                if !left.is_empty() {
                    return Err(DbusError::Malformed("variant with more than one type"));
                }
            }
            _ => return Err(DbusError::Malformed("unexpected type in a header field")),
        }
        Ok(rest)
    }
}

/// A message received from systemd, with what crius looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub kind: u8,
    pub reply_serial: Option<u32>,
    pub member: Option<String>,
    pub error_name: Option<String>,
    pub signature: String,
    pub body: Vec<u8>,
}

impl Message {
    /// Parses one whole message (as [`message_len`] delimited it).
    pub fn parse(buf: &[u8]) -> Result<Message> {
        if buf.len() < 16 || buf[0] != b'l' {
            return Err(DbusError::Malformed("not a little-endian D-Bus message"));
        }
        let mut r = Reader::new(buf);
        r.take(1)?;
        let kind = r.byte()?;
        r.take(2)?;
        let body_len = r.u32()? as usize;
        r.u32()?;
        let fields_len = r.u32()? as usize;
        let fields_end = r
            .pos
            .checked_add(fields_len)
            .filter(|&e| e <= buf.len())
            .ok_or(DbusError::Malformed("header fields past the end"))?;
        let mut msg = Message {
            kind,
            reply_serial: None,
            member: None,
            error_name: None,
            signature: String::new(),
            body: Vec::new(),
        };
        while r.pos < fields_end {
            r.align(8)?;
            let code = r.byte()?;
            let sig = r.signature()?;
            match (code, sig.as_str()) {
                (FIELD_REPLY_SERIAL, "u") => msg.reply_serial = Some(r.u32()?),
                (FIELD_MEMBER, "s") => msg.member = Some(r.str()?),
                (FIELD_ERROR_NAME, "s") => msg.error_name = Some(r.str()?),
                (FIELD_SIGNATURE, "g") => msg.signature = r.signature()?,
                _ => {
                    if !r.skip(&sig)?.is_empty() {
                        return Err(DbusError::Malformed("header field of more than one type"));
                    }
                }
            }
        }
        r.pos = fields_end;
        r.align(8)?;
        msg.body = r.take(body_len)?.to_vec();
        Ok(msg)
    }

    /// The first string (or object path) of the body, as errors and most replies start.
    pub fn first_str(&self) -> Option<String> {
        match self.signature.chars().next() {
            Some('s' | 'o') => Reader::new(&self.body).str().ok(),
            _ => None,
        }
    }

    /// The body of a `Properties.Get` reply: a variant holding `s`, `o` or `t`.
    pub fn variant(&self) -> Result<Value> {
        if self.signature != "v" {
            return Err(DbusError::Malformed("expected a variant"));
        }
        let mut r = Reader::new(&self.body);
        match r.signature()?.as_str() {
            "s" | "o" => Ok(Value::Str(r.str()?)),
            "t" => Ok(Value::U64(r.u64()?)),
            "b" => Ok(Value::Bool(r.u32()? != 0)),
            _ => Err(DbusError::Malformed("unexpected property type")),
        }
    }

    /// `JobRemoved(u id, o job, s unit, s result)`: the job and its result.
    fn job_removed(&self) -> Option<(String, String)> {
        if self.kind != SIGNAL || self.member.as_deref() != Some("JobRemoved") {
            return None;
        }
        if self.signature != "uoss" {
            return None;
        }
        let mut r = Reader::new(&self.body);
        r.u32().ok()?;
        let job = r.str().ok()?;
        r.str().ok()?;
        let result = r.str().ok()?;
        Some((job, result))
    }
}

/// The whole length of the message whose first 16 bytes are `head`.
pub fn message_len(head: &[u8; 16]) -> Result<usize> {
    if head[0] != b'l' {
        return Err(DbusError::Malformed("not a little-endian D-Bus message"));
    }
    let body = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    let fields = u32::from_le_bytes([head[12], head[13], head[14], head[15]]) as usize;
    let header = (16 + fields).div_ceil(8) * 8;
    let total = header + body;
    // The D-Bus limit for one message.
    if total > 128 << 20 {
        return Err(DbusError::Malformed("message larger than 128 MiB"));
    }
    Ok(total)
}

/// One authenticated connection to systemd's private socket.
#[derive(Debug)]
pub struct Connection {
    stream: UnixStream,
    path: PathBuf,
    serial: u32,
    timeout: Duration,
    /// `JobRemoved` signals seen while waiting for replies: (job, result).
    jobs_done: Vec<(String, String)>,
}

impl Connection {
    /// Connects to `path` and authenticates as this process's uid. Every read and write gives
    /// up after `timeout`.
    pub fn open(path: &Path, timeout: Duration) -> Result<Connection> {
        let stream = UnixStream::connect(path).map_err(|source| DbusError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        let io = |source| DbusError::Io {
            path: path.to_path_buf(),
            source,
        };
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        let mut c = Connection {
            stream,
            path: path.to_path_buf(),
            serial: 0,
            timeout,
            jobs_done: Vec::new(),
        };
        c.authenticate()?;
        Ok(c)
    }

    fn io_err(&self, source: std::io::Error) -> DbusError {
        if matches!(
            source.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            return DbusError::Timeout {
                what: format!("systemd at {}", self.path.display()),
                secs: self.timeout.as_secs(),
            };
        }
        DbusError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// SASL `EXTERNAL` with our uid, then `BEGIN`.
    fn authenticate(&mut self) -> Result<()> {
        // SAFETY: getuid(2) cannot fail and has no preconditions.
        let uid = unsafe { libc::getuid() };
        let hex: String = uid
            .to_string()
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect();
        let hello = format!("\0AUTH EXTERNAL {hex}\r\n");
        self.stream
            .write_all(hello.as_bytes())
            .map_err(|e| self.io_err(e))?;
        let line = self.read_line()?;
        if !line.starts_with("OK ") {
            return Err(DbusError::Auth {
                path: self.path.clone(),
                reply: line,
            });
        }
        self.stream
            .write_all(b"BEGIN\r\n")
            .map_err(|e| self.io_err(e))?;
        self.wait_consumed()
    }

    /// Waits until the peer has read everything written so far. systemd's D-Bus server (seen
    /// with v252) leaves a message that arrives in the same read as `BEGIN` in its buffer until
    /// more data comes, so the first call must not go out before `BEGIN` has been read.
    /// `SIOCOUTQ` on a unix socket counts the bytes the peer has not read yet.
    fn wait_consumed(&self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let mut unread: libc::c_int = 0;
            // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int through the pointer, which points to a
            // live c_int; the fd is this connection's open socket.
            let rc = unsafe {
                libc::ioctl(
                    std::os::fd::AsRawFd::as_raw_fd(&self.stream),
                    libc::TIOCOUTQ,
                    &mut unread,
                )
            };
            if rc != 0 {
                return Err(self.io_err(std::io::Error::last_os_error()));
            }
            if unread == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(DbusError::Timeout {
                    what: "authentication".to_string(),
                    secs: self.timeout.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// One `\r\n`-terminated line of the authentication exchange, read byte by byte so that
    /// nothing of the first message is consumed.
    fn read_line(&mut self) -> Result<String> {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            if line.len() > 512 {
                return Err(DbusError::Malformed("authentication line too long"));
            }
            let n = self.stream.read(&mut b).map_err(|e| self.io_err(e))?;
            if n == 0 {
                return Err(self.io_err(std::io::ErrorKind::UnexpectedEof.into()));
            }
            line.push(b[0]);
        }
        line.truncate(line.len() - 2);
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    fn read_message(&mut self) -> Result<Message> {
        let mut head = [0u8; 16];
        self.stream
            .read_exact(&mut head)
            .map_err(|e| self.io_err(e))?;
        let len = message_len(&head)?;
        let mut buf = vec![0u8; len];
        buf[..16].copy_from_slice(&head);
        self.stream
            .read_exact(&mut buf[16..])
            .map_err(|e| self.io_err(e))?;
        Message::parse(&buf)
    }

    /// Calls `member` and returns its reply; a D-Bus error reply becomes [`DbusError::Call`].
    pub fn call(
        &mut self,
        path: &str,
        interface: &str,
        member: &str,
        args: &[Arg<'_>],
    ) -> Result<Message> {
        self.serial += 1;
        let serial = self.serial;
        let msg = method_call(serial, path, interface, member, args);
        self.stream.write_all(&msg).map_err(|e| self.io_err(e))?;
        let deadline = Instant::now() + self.timeout;
        loop {
            if Instant::now() > deadline {
                return Err(DbusError::Timeout {
                    what: member.to_string(),
                    secs: self.timeout.as_secs(),
                });
            }
            let reply = self.read_message()?;
            if let Some(done) = reply.job_removed() {
                self.jobs_done.push(done);
                continue;
            }
            if reply.reply_serial != Some(serial) {
                continue;
            }
            return match reply.kind {
                METHOD_RETURN => Ok(reply),
                ERROR => Err(DbusError::Call {
                    method: member.to_string(),
                    name: reply.error_name.clone().unwrap_or_default(),
                    message: reply.first_str().unwrap_or_default(),
                }),
                _ => Err(DbusError::Malformed("reply of an unknown kind")),
            };
        }
    }

    /// Waits for systemd's `JobRemoved` of `job` and returns the job's result (`done` when it
    /// succeeded; `failed`, `timeout`, `canceled`, `dependency`, … otherwise).
    pub fn wait_job(&mut self, job: &str) -> Result<String> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(i) = self.jobs_done.iter().position(|(j, _)| j == job) {
                return Ok(self.jobs_done.swap_remove(i).1);
            }
            if Instant::now() > deadline {
                return Err(DbusError::Timeout {
                    what: format!("job {job}"),
                    secs: self.timeout.as_secs(),
                });
            }
            let msg = self.read_message()?;
            if let Some(done) = msg.job_removed() {
                self.jobs_done.push(done);
            }
        }
    }
}

/// The object path of a unit: `/org/freedesktop/systemd1/unit/` and the name with every byte
/// other than an ASCII letter or digit (and a leading digit) written `_xx` in hex.
pub fn unit_object_path(unit: &str) -> String {
    let mut p = String::from("/org/freedesktop/systemd1/unit/");
    for (i, b) in unit.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (b.is_ascii_digit() && i > 0) {
            p.push(char::from(b));
        } else {
            p.push_str(&format!("_{b:02x}"));
        }
    }
    p
}

/// Messages as systemd sends them, for fake managers in tests.
#[cfg(test)]
pub(crate) mod fake {
    use super::*;

    /// A message of `kind` answering `reply_serial`, with the `extra` string header fields.
    pub(crate) fn message(
        kind: u8,
        reply_serial: Option<u32>,
        extra: &[(u8, &str, &str)],
        sig: &str,
        body: &[u8],
    ) -> Vec<u8> {
        let mut m = Writer::default();
        m.byte(b'l');
        m.byte(kind);
        m.byte(0);
        m.byte(1);
        m.u32(len32(body.len()));
        m.u32(1000);
        m.array(8, |w| {
            if let Some(serial) = reply_serial {
                w.align(8);
                w.byte(FIELD_REPLY_SERIAL);
                w.signature("u");
                w.u32(serial);
            }
            for (code, t, v) in extra {
                w.field_str(*code, t, v);
            }
            if !sig.is_empty() {
                w.field_str(FIELD_SIGNATURE, "g", sig);
            }
        });
        m.align(8);
        m.buf.extend_from_slice(body);
        m.buf
    }

    /// A method return whose body is one string-like value of signature `sig` (`s`, `o`), or a
    /// variant holding a string when `sig` is `v`.
    pub(crate) fn method_return(reply_serial: u32, sig: &str, value: &str) -> Vec<u8> {
        let mut body = Writer::default();
        if sig == "v" {
            body.signature("s");
        }
        body.str(value);
        message(METHOD_RETURN, Some(reply_serial), &[], sig, &body.buf)
    }

    pub(crate) fn error(reply_serial: u32, name: &str, text: &str) -> Vec<u8> {
        let mut body = Writer::default();
        body.str(text);
        message(
            ERROR,
            Some(reply_serial),
            &[(FIELD_ERROR_NAME, "s", name)],
            "s",
            &body.buf,
        )
    }

    pub(crate) fn job_removed(job: &str, unit: &str, result: &str) -> Vec<u8> {
        let mut body = Writer::default();
        body.u32(1);
        body.str(job);
        body.str(unit);
        body.str(result);
        message(
            SIGNAL,
            None,
            &[
                (FIELD_PATH, "o", "/org/freedesktop/systemd1"),
                (FIELD_INTERFACE, "s", "org.freedesktop.systemd1.Manager"),
                (FIELD_MEMBER, "s", "JobRemoved"),
            ],
            "uoss",
            &body.buf,
        )
    }

    /// A method call as the fake server reads it: its serial, member and first string argument.
    pub(crate) fn read_call(stream: &mut UnixStream) -> Option<(u32, String, String)> {
        let mut head = [0u8; 16];
        stream.read_exact(&mut head).ok()?;
        let len = message_len(&head).ok()?;
        let mut buf = vec![0u8; len];
        buf[..16].copy_from_slice(&head);
        stream.read_exact(&mut buf[16..]).ok()?;
        let serial = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
        let m = Message::parse(&buf).ok()?;
        Some((serial, m.member.clone()?, m.first_str().unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_unit_call_is_byte_exact() {
        let m = method_call(
            1,
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "StopUnit",
            &[Arg::Str("a.scope"), Arg::Str("replace")],
        );
        // Fixed header: little endian, method call, no flags, version 1, body 24 bytes, serial 1.
        assert_eq!(&m[..12], &[b'l', 1, 0, 1, 24, 0, 0, 0, 1, 0, 0, 0]);
        let head: [u8; 16] = m[..16].try_into().unwrap();
        assert_eq!(message_len(&head).unwrap(), m.len());
        // Body: "a.scope" (u32 7, bytes, NUL), padding to 4, "replace".
        let body = &m[m.len() - 24..];
        assert_eq!(&body[..4], &7u32.to_le_bytes());
        assert_eq!(&body[4..12], b"a.scope\0");
        assert_eq!(&body[12..16], &7u32.to_le_bytes());
        assert_eq!(&body[16..24], b"replace\0");
        // The header names the path, interface, member and the signature "ss".
        let text = String::from_utf8_lossy(&m);
        assert!(text.contains("/org/freedesktop/systemd1\0"), "{text:?}");
        assert!(text.contains("StopUnit\0"));
        assert!(m.windows(4).any(|w| w == [2, b's', b's', 0]));
        assert_eq!((m.len() - 24) % 8, 0, "body starts 8-aligned");
    }

    #[test]
    fn properties_marshal_with_struct_alignment() {
        let props = vec![
            ("Delegate".to_string(), Value::Bool(true)),
            ("TasksMax".to_string(), Value::U64(u64::MAX)),
            ("PIDs".to_string(), Value::U32s(vec![42])),
            ("AllowedCPUs".to_string(), Value::Bytes(vec![0b101])),
        ];
        let mut w = Writer::default();
        w.properties(&props);
        let b = &w.buf;
        // Array length, then the first struct at offset 8 (structs align to 8).
        let len = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
        assert_eq!(len, b.len() - 8);
        assert_eq!(&b[8..12], &8u32.to_le_bytes());
        assert_eq!(&b[12..21], b"Delegate\0");
        assert_eq!(&b[21..24], &[1, b'b', 0]);
        assert_eq!(&b[24..28], &1u32.to_le_bytes());
        // "TasksMax" struct at 32, its u64 aligned to 8 after the "t" signature.
        assert_eq!(&b[32..36], &8u32.to_le_bytes());
        assert_eq!(&b[45..48], &[1, b't', 0]);
        assert_eq!(&b[48..56], &u64::MAX.to_le_bytes());
        // "PIDs": au with one element.
        assert_eq!(&b[56..60], &4u32.to_le_bytes());
        assert_eq!(&b[60..65], b"PIDs\0");
        assert_eq!(&b[65..69], &[2, b'a', b'u', 0]);
        assert_eq!(&b[72..76], &4u32.to_le_bytes());
        assert_eq!(&b[76..80], &42u32.to_le_bytes());
        // "AllowedCPUs": ay of one byte.
        assert_eq!(&b[80..84], &11u32.to_le_bytes());
        assert_eq!(&b[96..100], &[2, b'a', b'y', 0]);
        assert_eq!(&b[100..104], &1u32.to_le_bytes());
        assert_eq!(b[104], 0b101);
    }

    #[test]
    fn replies_errors_and_signals_parse() {
        let mut body = Writer::default();
        body.str("/org/freedesktop/systemd1/job/17");
        let reply = fake::message(METHOD_RETURN, Some(3), &[], "o", &body.buf);
        let m = Message::parse(&reply).unwrap();
        assert_eq!((m.kind, m.reply_serial), (METHOD_RETURN, Some(3)));
        assert_eq!(
            m.first_str().as_deref(),
            Some("/org/freedesktop/systemd1/job/17")
        );

        let mut body = Writer::default();
        body.str("Unit x.scope not loaded.");
        let err = fake::message(
            ERROR,
            None,
            &[(FIELD_ERROR_NAME, "s", NO_SUCH_UNIT)],
            "s",
            &body.buf,
        );
        let m = Message::parse(&err).unwrap();
        assert_eq!(m.error_name.as_deref(), Some(NO_SUCH_UNIT));
        assert_eq!(m.first_str().as_deref(), Some("Unit x.scope not loaded."));

        let mut body = Writer::default();
        body.u32(17);
        body.str("/org/freedesktop/systemd1/job/17");
        body.str("crius-c1.scope");
        body.str("done");
        let sig = fake::message(
            SIGNAL,
            None,
            &[
                (FIELD_PATH, "o", "/org/freedesktop/systemd1"),
                (FIELD_MEMBER, "s", "JobRemoved"),
            ],
            "uoss",
            &body.buf,
        );
        let m = Message::parse(&sig).unwrap();
        assert_eq!(
            m.job_removed(),
            Some(("/org/freedesktop/systemd1/job/17".into(), "done".into()))
        );

        let mut body = Writer::default();
        body.signature("s");
        body.str("/kubepods.slice");
        let get = fake::message(METHOD_RETURN, None, &[], "v", &body.buf);
        assert_eq!(
            Message::parse(&get).unwrap().variant().unwrap(),
            Value::Str("/kubepods.slice".into())
        );
        // Truncated input is an error, not a panic.
        for cut in [0, 10, 16, sig.len() - 1] {
            assert!(Message::parse(&sig[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn unit_names_escape_into_object_paths() {
        assert_eq!(
            unit_object_path("-.slice"),
            "/org/freedesktop/systemd1/unit/_2d_2eslice"
        );
        assert_eq!(
            unit_object_path("crius-ab12.scope"),
            "/org/freedesktop/systemd1/unit/crius_2dab12_2escope"
        );
        assert_eq!(
            unit_object_path("1a.slice"),
            "/org/freedesktop/systemd1/unit/_31a_2eslice"
        );
    }

    #[test]
    fn missing_socket_is_a_connect_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("private");
        let err = Connection::open(&path, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, DbusError::Connect { .. }), "{err:?}");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    }
}
