//! The idle timeout of a streaming session (kubelet's `--streaming-connection-idle-timeout`,
//! 4 hours by default): a connection on which nothing has been read or written for that long
//! ends, so a forgotten `kubectl exec` or port-forward does not hold a process and descriptors
//! for ever.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `inner`, ending once it has been idle (no byte read or written) for `timeout`: reads then
/// see the end of the stream and writes fail, which ends the session above it.
pub struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
    expired: bool,
}

impl<S> IdleTimeout<S> {
    pub fn new(inner: S, timeout: Duration) -> IdleTimeout<S> {
        IdleTimeout {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            expired: false,
        }
    }

    fn active(&mut self) {
        let next = Instant::now() + self.timeout;
        self.deadline.as_mut().reset(next);
    }

    /// Whether the idle time is over (registering for a wake-up when it will be).
    fn check(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.expired && self.deadline.as_mut().poll(cx).is_ready() {
            tracing::info!("stream session idle for {:?}; closing it", self.timeout);
            self.expired = true;
        }
        self.expired
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.active();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if this.check(cx) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.active();
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn traffic_keeps_it_open_and_silence_ends_it() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut idle = IdleTimeout::new(server, Duration::from_secs(10));
        let mut buf = [0u8; 8];
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            client.write_all(b"x").await.unwrap();
            assert_eq!(
                idle.read(&mut buf).await.unwrap(),
                1,
                "still open after 30 s of use"
            );
        }
        // Writes count as activity too.
        tokio::time::sleep(Duration::from_secs(6)).await;
        idle.write_all(b"out").await.unwrap();
        tokio::time::sleep(Duration::from_secs(6)).await;
        let read = tokio::time::timeout(Duration::from_secs(1), idle.read(&mut buf)).await;
        assert!(
            read.is_err(),
            "a read waits while the connection is not idle"
        );
        // Then ten silent seconds: the read sees the end, and writes fail.
        assert_eq!(idle.read(&mut buf).await.unwrap(), 0);
        assert!(idle.write_all(b"late").await.is_err());
    }
}
