//! The crius side of the shim's streaming requests (`exec_stream`, `attach`): one connection
//! per session, the stdio descriptors received with the `streams` answer, and async I/O on
//! them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use crius_api::shim::{
    decode_frame, encode_frame, Op, Reply, Request, Response, StreamFd, MAX_FRAME,
};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use super::StreamError;

/// A streaming request's connection to the shim, after its `streams` answer.
pub struct ShimSession {
    stream: UnixStream,
    buf: Vec<u8>,
    path: PathBuf,
}

/// The process's stdio ends crius got from the shim, ready for async I/O.
#[derive(Default)]
pub struct Stdio {
    pub stdin: Option<AsyncFd<OwnedFd>>,
    pub stdout: Option<AsyncFd<OwnedFd>>,
    pub stderr: Option<AsyncFd<OwnedFd>>,
    /// The pty master, for window size changes.
    pub pty: Option<OwnedFd>,
}

/// Send `op` to the shim at `socket` and wait for its `streams` answer: the session and the
/// descriptors it named.
pub async fn open(socket: &Path, op: Op) -> Result<(ShimSession, Stdio), StreamError> {
    let shim = |source: io::Error| StreamError::Shim {
        path: socket.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(socket).await.map_err(shim)?;
    let frame = encode_frame(&Request::new(op)).map_err(|e| shim(io::Error::other(e)))?;
    stream.write_all(&frame).await.map_err(shim)?;
    let mut session = ShimSession {
        stream,
        buf: Vec::new(),
        path: socket.to_path_buf(),
    };
    let mut fds = Vec::new();
    let response = session.next_with_fds(&mut fds).await?;
    let streams = match response {
        Some(Response::Ok(Reply::Streams(streams))) => streams,
        Some(Response::Err(e)) => return Err(StreamError::Refused(e)),
        Some(Response::Ok(_)) | None => {
            return Err(shim(io::Error::other(
                "unexpected answer to a streaming request",
            )))
        }
    };
    if fds.len() != streams.fds.len() {
        return Err(shim(io::Error::other(format!(
            "the shim named {} descriptors and sent {}",
            streams.fds.len(),
            fds.len()
        ))));
    }
    let mut stdio = Stdio::default();
    for (kind, fd) in streams.fds.iter().zip(fds) {
        match kind {
            StreamFd::Pty => stdio.pty = Some(fd),
            StreamFd::Stdin => stdio.stdin = Some(async_fd(fd).map_err(shim)?),
            StreamFd::Stdout => stdio.stdout = Some(async_fd(fd).map_err(shim)?),
            StreamFd::Stderr => stdio.stderr = Some(async_fd(fd).map_err(shim)?),
        }
    }
    Ok((session, stdio))
}

impl ShimSession {
    /// The next answer on the connection; `None` when the shim closed it.
    pub async fn next(&mut self) -> Result<Option<Response>, StreamError> {
        let mut fds = Vec::new();
        self.next_with_fds(&mut fds).await
    }

    async fn next_with_fds(
        &mut self,
        fds: &mut Vec<OwnedFd>,
    ) -> Result<Option<Response>, StreamError> {
        loop {
            match decode_frame::<Response>(&self.buf) {
                Ok(Some((response, used))) => {
                    self.buf.drain(..used);
                    return Ok(Some(response));
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(StreamError::Shim {
                        path: self.path.clone(),
                        source: io::Error::other(e),
                    })
                }
            }
            if self.buf.len() > MAX_FRAME + 4 {
                return Ok(None);
            }
            let mut chunk = [0u8; 4096];
            let raw = self.stream.as_raw_fd();
            let n = self
                .stream
                .async_io(Interest::READABLE, || recv_with_fds(raw, &mut chunk, fds))
                .await
                .map_err(|source| StreamError::Shim {
                    path: self.path.clone(),
                    source,
                })?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// One `recvmsg`, keeping any descriptors that came with the bytes (close-on-exec).
fn recv_with_fds(fd: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    // Room for 8 descriptors.
    let mut control = [0u8; 128];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty header we then fill in.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() as _;
    // SAFETY: recvmsg writes into `buf` and `control`, both owned here and described by `msg`.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: walking the control messages the kernel wrote into `control`, with the CMSG_*
    // helpers that keep every access inside `msg_controllen`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned(data.add(i));
                    // The kernel gave us a new descriptor nothing else owns.
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(n as usize)
}

fn async_fd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    set_nonblocking(fd.as_raw_fd())?;
    // SAFETY: an OwnedFd keeps its descriptor open and unchanged until it is dropped, which
    // only the AsyncFd can do.
    unsafe { AsyncFd::register(fd) }.map_err(|e| io::Error::other(e.to_string()))
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own only change its status flags.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Read from a pipe or pty master; `Ok(0)` at its end (a pty master whose slave is closed
/// reads EIO, which is its end too).
pub async fn read(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let result = fd
            .async_io(Interest::READABLE, |inner| {
                // SAFETY: reading into a buffer we own, of the length we pass.
                let n =
                    unsafe { libc::read(inner.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                syscall_len(n)
            })
            .await;
        match result {
            Ok(n) => return Ok(n),
            Err(e) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Write all of `data` to a pipe or pty master.
pub async fn write_all(fd: &AsyncFd<OwnedFd>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let result = fd
            .async_io(Interest::WRITABLE, |inner| {
                // SAFETY: writing from a buffer we own, of the length we pass.
                let n = unsafe { libc::write(inner.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                syscall_len(n)
            })
            .await;
        match result {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The length a `read`/`write` returned, or its error.
fn syscall_len(n: libc::ssize_t) -> io::Result<usize> {
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Set the window size of a pty (`TIOCSWINSZ` on its master).
pub fn resize(pty: &OwnedFd, width: u16, height: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize struct we own from the pointer we pass.
    if unsafe { libc::ioctl(pty.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
