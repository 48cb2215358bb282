//! A small client of crius's streaming server, for the end-to-end tests: the HTTP upgrade to
//! SPDY/3.1, then the client's side of the Kubernetes remote-command and port-forward
//! protocols (open the streams, send, collect what comes back).
//!
//! The frame codec is the daemon's own (`runtime/src/stream/spdy.rs`, compiled in here as a
//! module): the tests check the sessions, not the codec, which has its unit tests and is also
//! what crictl and critest talk to.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

#[allow(dead_code)]
#[path = "../../runtime/src/stream/spdy.rs"]
mod spdy;

use spdy::{Decoder, Encoder, Frame, Headers};

/// Errors of the streaming client.
#[derive(Debug, thiserror::Error)]
pub enum StreamClientError {
    #[error("bad streaming URL {0:?}")]
    Url(String),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("upgrade refused: {0}")]
    Refused(String),
    #[error("spdy: {0}")]
    Spdy(String),
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
}

type Result<T> = std::result::Result<T, StreamClientError>;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StreamClientError {
    let what = what.into();
    move |source| StreamClientError::Io { what, source }
}

/// What the client has received on one stream.
#[derive(Debug, Default, Clone)]
pub struct Received {
    pub data: Vec<u8>,
    /// The server ended its side.
    pub fin: bool,
    pub reset: bool,
}

/// A connection to the streaming server: plain TCP, or TLS for an `https://` URL.
pub trait Conn: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Conn for T {}

/// One SPDY session as a client.
pub struct Client {
    tcp: Box<dyn Conn>,
    /// The certificate the server presented (DER), for an `https://` URL.
    pub peer_certificate: Option<Vec<u8>>,
    encoder: Encoder,
    decoder: Decoder,
    buf: Vec<u8>,
    next_id: u32,
    /// The protocol the server chose.
    pub protocol: String,
    pub streams: BTreeMap<u32, Received>,
    /// The server closed the connection.
    pub closed: bool,
}

/// What [`upgrade`] answers: the connection, the response head, the bytes after it, and the
/// server's certificate over TLS.
type Upgraded = (Box<dyn Conn>, String, Vec<u8>, Option<Vec<u8>>);

/// Connect to `url` (`http://host:port/path`, or `https://`: TLS that accepts any certificate,
/// as crictl and kubelet's stream proxy do, and reports it), send the upgrade request
/// `request(host, path)` makes and read the response head.
async fn upgrade(url: &str, request: impl FnOnce(&str, &str) -> String) -> Result<Upgraded> {
    let (tls, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(rest), _) => (false, rest),
        (None, Some(rest)) => (true, rest),
        (None, None) => return Err(StreamClientError::Url(url.to_owned())),
    };
    let (host, path) = rest
        .split_once('/')
        .ok_or_else(|| StreamClientError::Url(url.to_owned()))?;
    let plain = TcpStream::connect(host)
        .await
        .map_err(io(format!("connect to {host}")))?;
    let (mut tcp, peer_certificate): (Box<dyn Conn>, _) = if tls {
        let (conn, cert) = tls_connect(plain).await?;
        (Box::new(conn), Some(cert))
    } else {
        (Box::new(plain), None)
    };
    tcp.write_all(request(host, path).as_bytes())
        .await
        .map_err(io("send the upgrade request"))?;
    let mut buf = Vec::new();
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = tcp
            .read(&mut chunk)
            .await
            .map_err(io("read the upgrade response"))?;
        if n == 0 {
            return Err(StreamClientError::Refused(
                String::from_utf8_lossy(&buf).into_owned(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end);
    Ok((tcp, head, buf, peer_certificate))
}

/// A TLS client handshake on `tcp` accepting any certificate; answers the certificate.
async fn tls_connect(
    tcp: TcpStream,
) -> Result<(tokio_rustls::client::TlsStream<TcpStream>, Vec<u8>)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StreamClientError::Refused(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost")
        .map_err(|e| StreamClientError::Refused(e.to_string()))?;
    let conn = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(io("TLS handshake"))?;
    let cert = conn
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    Ok((conn, cert))
}

/// The test client's certificate check: none (the tests compare the certificate themselves).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Append what `tcp` has to `buf`, waiting until `deadline` at the latest (then the error
/// names `what` and its `limit`); 0 once the peer closed.
async fn read_some(
    tcp: &mut Box<dyn Conn>,
    buf: &mut Vec<u8>,
    deadline: Instant,
    limit: Duration,
    what: &str,
) -> Result<usize> {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut chunk = [0u8; 16 * 1024];
    let n = match tokio::time::timeout(left, tcp.read(&mut chunk)).await {
        Err(_) => return Err(StreamClientError::Timeout(limit, what.to_owned())),
        Ok(r) => r.map_err(io("read frames"))?,
    };
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// The value of header `name` (any case) in a response head.
fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

impl Client {
    /// Upgrade a request on `url` (`http://host:port/path` or `https://`) to SPDY, offering
    /// `protocols`.
    pub async fn connect(url: &str, protocols: &[&str]) -> Result<Client> {
        let (tcp, head, buf, peer_certificate) = upgrade(url, |host, path| {
            let mut request = format!(
                "POST /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nContent-Length: 0\r\n"
            );
            for p in protocols {
                request.push_str(&format!("X-Stream-Protocol-Version: {p}\r\n"));
            }
            request.push_str("\r\n");
            request
        })
        .await?;
        if !head.starts_with("HTTP/1.1 101") {
            return Err(StreamClientError::Refused(head));
        }
        let protocol = header(&head, "x-stream-protocol-version").unwrap_or_default();
        Ok(Client {
            tcp,
            peer_certificate,
            encoder: Encoder::new(),
            decoder: Decoder::new(),
            buf,
            next_id: 1,
            protocol,
            streams: BTreeMap::new(),
            closed: false,
        })
    }

    async fn send(&mut self, frame: Frame) -> Result<()> {
        let mut out = Vec::new();
        self.encoder
            .encode(&frame, &mut out)
            .map_err(|e| StreamClientError::Spdy(e.to_string()))?;
        self.tcp.write_all(&out).await.map_err(io("send a frame"))
    }

    /// Open a stream with these headers; returns its id.
    pub async fn open(&mut self, headers: &[(&str, &str)]) -> Result<u32> {
        let id = self.next_id;
        self.next_id += 2;
        let mut h = Headers::new();
        for (k, v) in headers {
            h.entry((*k).to_owned()).or_default().push((*v).to_owned());
        }
        self.streams.insert(id, Received::default());
        self.send(Frame::SynStream {
            stream: id,
            fin: false,
            headers: h,
        })
        .await?;
        Ok(id)
    }

    /// Send `data` on stream `id`, with `fin` ending our side.
    pub async fn write(&mut self, id: u32, data: &[u8], fin: bool) -> Result<()> {
        self.send(Frame::Data {
            stream: id,
            fin,
            data: data.to_vec(),
        })
        .await
    }

    /// Reset stream `id`.
    pub async fn reset(&mut self, id: u32) -> Result<()> {
        self.send(Frame::RstStream {
            stream: id,
            status: spdy::RST_CANCEL,
        })
        .await
    }

    /// Read frames until `done` says so (or the connection closes), at most `limit`.
    pub async fn read_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&Client) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            while let Some((frame, used)) = self
                .decoder
                .decode(&self.buf)
                .map_err(|e| StreamClientError::Spdy(e.to_string()))?
            {
                self.buf.drain(..used);
                self.take(frame).await?;
            }
            if done(self) || self.closed {
                return Ok(());
            }
            if read_some(&mut self.tcp, &mut self.buf, deadline, limit, what).await? == 0 {
                self.closed = true;
            }
        }
    }

    async fn take(&mut self, frame: Frame) -> Result<()> {
        match frame {
            Frame::Data { stream, fin, data } => {
                let s = self.streams.entry(stream).or_default();
                s.data.extend_from_slice(&data);
                s.fin |= fin;
            }
            Frame::SynReply { stream, fin, .. } => {
                self.streams.entry(stream).or_default().fin |= fin;
            }
            Frame::RstStream { stream, .. } => {
                self.streams.entry(stream).or_default().reset = true;
            }
            Frame::Ping { id } => self.send(Frame::Ping { id }).await?,
            _ => {}
        }
        Ok(())
    }

    /// What stream `id` has received so far.
    pub fn received(&self, id: u32) -> Received {
        self.streams.get(&id).cloned().unwrap_or_default()
    }

    /// Whether the server has ended stream `id` (or reset it, or closed the connection).
    pub fn ended(&self, id: u32) -> bool {
        self.closed || self.streams.get(&id).is_some_and(|s| s.fin || s.reset)
    }
}

/// The remote-command streams of a session, as a client opens them.
#[derive(Debug, Default, Clone, Copy)]
pub struct CommandStreams {
    pub error: u32,
    pub stdin: Option<u32>,
    pub stdout: Option<u32>,
    pub stderr: Option<u32>,
    pub resize: Option<u32>,
}

impl Client {
    /// Open the streams of an exec or attach (`error` first, as client-go does).
    pub async fn open_command(
        &mut self,
        stdin: bool,
        stdout: bool,
        stderr: bool,
        tty: bool,
    ) -> Result<CommandStreams> {
        let mut s = CommandStreams {
            error: self.open(&[("streamtype", "error")]).await?,
            ..Default::default()
        };
        if stdin {
            s.stdin = Some(self.open(&[("streamtype", "stdin")]).await?);
        }
        if stdout {
            s.stdout = Some(self.open(&[("streamtype", "stdout")]).await?);
        }
        if stderr && !tty {
            s.stderr = Some(self.open(&[("streamtype", "stderr")]).await?);
        }
        if tty {
            s.resize = Some(self.open(&[("streamtype", "resize")]).await?);
        }
        Ok(s)
    }

    /// Read until the error stream has ended; returns its text (a `metav1.Status` in v4).
    pub async fn wait_status(&mut self, s: &CommandStreams, limit: Duration) -> Result<String> {
        let error = s.error;
        let outputs: Vec<u32> = [s.stdout, s.stderr].into_iter().flatten().collect();
        self.read_until("the end of the session", limit, |c| {
            c.ended(error) && outputs.iter().all(|o| c.ended(*o))
        })
        .await?;
        Ok(String::from_utf8_lossy(&self.received(error).data).into_owned())
    }
}

/// The exit code a v4 status reports: 0 for `Success`, the `ExitCode` cause for a non-zero
/// exit, `None` for anything else.
pub fn exit_code_of(status: &str) -> Option<i32> {
    let v: serde_json::Value = serde_json::from_str(status).ok()?;
    match v.get("status")?.as_str()? {
        "Success" => Some(0),
        "Failure" if v.get("reason")?.as_str()? == "NonZeroExitCode" => v
            .pointer("/details/causes")?
            .as_array()?
            .iter()
            .find(|c| c.get("reason").and_then(|r| r.as_str()) == Some("ExitCode"))?
            .get("message")?
            .as_str()?
            .parse()
            .ok(),
        _ => None,
    }
}

/// A WebSocket client of the channel protocols (`v5.channel.k8s.io` and older): every binary
/// message is a channel byte and that channel's data.
pub struct WsClient {
    tcp: Box<dyn Conn>,
    buf: Vec<u8>,
    /// The subprotocol the server chose.
    pub protocol: String,
    /// What each channel has received.
    pub channels: BTreeMap<u8, Vec<u8>>,
    /// Pongs received.
    pub pongs: usize,
    /// The server sent a close frame or closed the connection.
    pub closed: bool,
}

impl WsClient {
    /// Upgrade a GET on `url` to WebSocket, offering `protocols` as subprotocols.
    pub async fn connect(url: &str, protocols: &[&str]) -> Result<WsClient> {
        let (tcp, head, buf, _) = upgrade(url, |host, path| {
            format!(
                "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                 Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: Y3JpdXMtdGVzdC1rZXktMQ==\r\n\
                 Sec-WebSocket-Protocol: {}\r\n\r\n",
                protocols.join(", ")
            )
        })
        .await?;
        // RFC 6455's accept value for the key above.
        if !head.starts_with("HTTP/1.1 101")
            || header(&head, "sec-websocket-accept").as_deref()
                != Some("n14Gz0byVDiXs3TBJK+bHFnuhjU=")
        {
            return Err(StreamClientError::Refused(head));
        }
        let protocol = header(&head, "sec-websocket-protocol").unwrap_or_default();
        Ok(WsClient {
            tcp,
            buf,
            protocol,
            channels: BTreeMap::new(),
            pongs: 0,
            closed: false,
        })
    }

    async fn frame(&mut self, opcode: u8, payload: &[u8]) -> Result<()> {
        let mask = [0x5a, 0x17, 0xc3, 0x08];
        let mut out = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => out.push(0x80 | n as u8),
            n if n <= 0xffff => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.tcp.write_all(&out).await.map_err(io("send a frame"))
    }

    /// Send `data` on `channel`.
    pub async fn send(&mut self, channel: u8, data: &[u8]) -> Result<()> {
        let mut msg = vec![channel];
        msg.extend_from_slice(data);
        self.frame(0x2, &msg).await
    }

    /// Half-close `channel` (v5).
    pub async fn close_channel(&mut self, channel: u8) -> Result<()> {
        self.frame(0x2, &[255, channel]).await
    }

    /// Send a ping.
    pub async fn ping(&mut self) -> Result<()> {
        self.frame(0x9, b"crius-test").await
    }

    /// Read messages until `done` says so or the server closes, at most `limit`.
    pub async fn read_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&WsClient) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            while let Some((opcode, payload, used)) = server_frame(&self.buf) {
                self.buf.drain(..used);
                match opcode {
                    0x2 => {
                        if let Some((&channel, data)) = payload.split_first() {
                            self.channels.entry(channel).or_default().extend(data);
                        }
                    }
                    0x8 => self.closed = true,
                    0xA => self.pongs += 1,
                    _ => {}
                }
            }
            if done(self) || self.closed {
                return Ok(());
            }
            if read_some(&mut self.tcp, &mut self.buf, deadline, limit, what).await? == 0 {
                self.closed = true;
            }
        }
    }

    /// What `channel` has received.
    pub fn channel(&self, channel: u8) -> Vec<u8> {
        self.channels.get(&channel).cloned().unwrap_or_default()
    }
}

/// One unmasked, unfragmented server frame: (opcode, payload, bytes used).
fn server_frame(buf: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    let (b0, b1) = (*buf.first()?, *buf.get(1)?);
    let (len, pos) = match b1 & 0x7f {
        126 => (u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?]) as usize, 4),
        127 => {
            let mut n = [0u8; 8];
            n.copy_from_slice(buf.get(2..10)?);
            (u64::from_be_bytes(n) as usize, 10)
        }
        n => (n as usize, 2),
    };
    let payload = buf.get(pos..pos + len)?.to_vec();
    Some((b0 & 0x0f, payload, pos + len))
}
