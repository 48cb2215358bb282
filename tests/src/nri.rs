//! A test NRI plugin: the plugin side of the NRI protocol, written here independently of
//! crius's runtime side (critest's NRI specs check crius against containerd/nri's own stub).
//!
//! It registers, takes `Configure` (a non-empty configuration replaces its [`Behaviour`], see
//! [`Behaviour::parse`]), records `Synchronize` and every event, and answers
//! `CreateContainer` with what its [`Behaviour`] says: an env variable, a mount and a CPU
//! limit to add, an error, or no answer at all. Each request is handled in a task of its own,
//! so a hanging `CreateContainer` does not hold up other events.
//!
//! Wire format (NRI's, over one unix socket): chunks of `conn id u32 BE | len u32 BE | bytes`;
//! the plugin serves on connection 1 and calls crius on connection 2; inside, ttrpc frames
//! `len u32 BE | stream id u32 BE | type u8 (1 request, 2 response) | flags u8 | payload`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crius_api::nri::{api, ttrpc};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;

use crate::{Error, Result};

/// What the plugin does with a `CreateContainer`.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// Env variables to add (`KEY`, `VALUE`).
    pub env: Vec<(String, String)>,
    /// Bind mounts to add (host path, container path), read-only.
    pub mounts: Vec<(String, String)>,
    /// CPU quota and period (µs) to set.
    pub cpu: Option<(i64, u64)>,
    /// Answer every `CreateContainer` with this error.
    pub fail_create: Option<String>,
    /// Never answer `CreateContainer`.
    pub hang_create: bool,
}

impl Behaviour {
    /// Reads `key=value` lines (`env=K=V`, `mount=HOST:CONTAINER`, `cpu=QUOTA/PERIOD`,
    /// `fail=MESSAGE`, `hang=true`): the plugin's configuration file, as crius passes it.
    pub fn parse(text: &str) -> Behaviour {
        let mut b = Behaviour::default();
        for line in text.lines() {
            let Some((key, value)) = line.trim().split_once('=') else {
                continue;
            };
            match key {
                "env" => {
                    if let Some((k, v)) = value.split_once('=') {
                        b.env.push((k.into(), v.into()));
                    }
                }
                "mount" => {
                    if let Some((h, c)) = value.split_once(':') {
                        b.mounts.push((h.into(), c.into()));
                    }
                }
                "cpu" => {
                    if let Some((q, p)) = value.split_once('/') {
                        if let (Ok(q), Ok(p)) = (q.parse(), p.parse()) {
                            b.cpu = Some((q, p));
                        }
                    }
                }
                "fail" => b.fail_create = Some(value.into()),
                "hang" => b.hang_create = value == "true",
                _ => {}
            }
        }
        b
    }
}

/// One event the plugin saw: its name and the pod's and container's ids and names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub name: String,
    pub pod_id: String,
    pub pod_name: String,
    pub container_id: String,
    pub container_name: String,
}

/// What the plugin has seen.
#[derive(Debug, Default)]
pub struct Seen {
    pub configured: Option<api::ConfigureRequest>,
    pub synced_pods: Vec<String>,
    pub synced_containers: Vec<String>,
    pub synchronized: bool,
    pub events: Vec<Event>,
}

/// A connected test plugin; dropping it closes the connection.
pub struct Plugin {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Plugin {
    /// Connects to `socket` as `<index>-<name>` (waiting up to 10 s for crius to serve it)
    /// and waits until crius has synchronized it.
    pub async fn connect(socket: &Path, name: &str, index: &str, b: Behaviour) -> Result<Plugin> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let stream = loop {
            match UnixStream::connect(socket).await {
                Ok(s) => break s,
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(Error::io("connect to the NRI socket", socket, e)),
            }
        };
        let plugin = Plugin::serve(stream, name, index, b);
        plugin.wait_synchronized(Duration::from_secs(10)).await?;
        Ok(plugin)
    }

    /// Runs the plugin on an already connected `stream` (registering as `<index>-<name>`).
    pub fn serve(stream: UnixStream, name: &str, index: &str, b: Behaviour) -> Plugin {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (name, index) = (name.to_string(), index.to_string());
        let task = tokio::spawn(run(stream, name, index, b, Arc::clone(&seen)));
        Plugin { seen, task }
    }

    /// A copy of what it has seen.
    pub fn with_seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Event names in the order seen, for events about `id` (a pod or container id).
    pub fn events_of(&self, id: &str) -> Vec<String> {
        self.with_seen(|s| {
            s.events
                .iter()
                .filter(|e| e.container_id == id || (e.container_id.is_empty() && e.pod_id == id))
                .map(|e| e.name.clone())
                .collect()
        })
    }

    /// Waits until `f` holds of what the plugin has seen.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        f: impl Fn(&Seen) -> bool,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.with_seen(&f) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout(format!("NRI test plugin: {what}")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the connection has ended.
    pub async fn closed(mut self) {
        let _ = (&mut self.task).await;
    }

    async fn wait_synchronized(&self, timeout: Duration) -> Result<()> {
        self.wait_for("synchronized", timeout, |s| s.synchronized)
            .await
    }
}

type Writer = Arc<tokio::sync::Mutex<OwnedWriteHalf>>;

async fn send(
    w: &Writer,
    conn: u32,
    stream_id: u32,
    kind: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(18 + payload.len());
    frame.extend_from_slice(&conn.to_be_bytes());
    frame.extend_from_slice(&((10 + payload.len()) as u32).to_be_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&stream_id.to_be_bytes());
    frame.push(kind);
    frame.push(0);
    frame.extend_from_slice(payload);
    w.lock().await.write_all(&frame).await
}

async fn run(
    stream: UnixStream,
    name: String,
    index: String,
    b: Behaviour,
    seen: Arc<Mutex<Seen>>,
) {
    let (mut read, write) = stream.into_split();
    let w: Writer = Arc::new(tokio::sync::Mutex::new(write));
    let register = api::RegisterPluginRequest {
        plugin_name: name,
        plugin_idx: index,
        nri_version: "v0.12.1".into(),
    };
    let req = ttrpc::Request {
        service: "nri.pkg.api.v1alpha1.Runtime".into(),
        method: "RegisterPlugin".into(),
        payload: register.encode_to_vec(),
        timeout_nano: 5_000_000_000,
        metadata: Vec::new(),
    };
    if send(&w, 2, 1, 1, &req.encode_to_vec()).await.is_err() {
        return;
    }
    let b = Arc::new(Mutex::new(b));
    let mut buffers: HashMap<u32, Vec<u8>> = HashMap::new();
    loop {
        let mut header = [0u8; 8];
        if read.read_exact(&mut header).await.is_err() {
            return;
        }
        let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        let mut bytes = vec![0u8; len];
        if read.read_exact(&mut bytes).await.is_err() {
            return;
        }
        let buf = buffers.entry(conn).or_default();
        buf.extend_from_slice(&bytes);
        while buf.len() >= 10 {
            let plen = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() < 10 + plen {
                break;
            }
            let stream_id = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
            let kind = buf[8];
            let payload: Vec<u8> = buf[10..10 + plen].to_vec();
            buf.drain(..10 + plen);
            // Requests from crius come on connection 1; the answer to RegisterPlugin on 2.
            if conn == 1 && kind == 1 {
                let (w, b, seen) = (Arc::clone(&w), Arc::clone(&b), Arc::clone(&seen));
                tokio::spawn(async move {
                    if let Ok(req) = ttrpc::Request::decode(payload.as_slice()) {
                        let answer = handle(&req, &b, &seen).await;
                        let resp = match answer {
                            Ok(p) => ttrpc::Response {
                                status: Some(ttrpc::Status {
                                    code: 0,
                                    message: String::new(),
                                }),
                                payload: p,
                            },
                            Err(message) => ttrpc::Response {
                                status: Some(ttrpc::Status { code: 2, message }),
                                payload: Vec::new(),
                            },
                        };
                        let _ = send(&w, 1, stream_id, 2, &resp.encode_to_vec()).await;
                    }
                });
            }
        }
    }
}

fn record(
    seen: &Mutex<Seen>,
    name: &str,
    pod: Option<&api::PodSandbox>,
    c: Option<&api::Container>,
) {
    let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
    s.events.push(Event {
        name: name.to_string(),
        pod_id: pod.map(|p| p.id.clone()).unwrap_or_default(),
        pod_name: pod.map(|p| p.name.clone()).unwrap_or_default(),
        container_id: c.map(|c| c.id.clone()).unwrap_or_default(),
        container_name: c.map(|c| c.name.clone()).unwrap_or_default(),
    });
}

async fn handle(
    req: &ttrpc::Request,
    b: &Mutex<Behaviour>,
    seen: &Mutex<Seen>,
) -> std::result::Result<Vec<u8>, String> {
    let p = req.payload.as_slice();
    let bad = |e: prost::DecodeError| e.to_string();
    match req.method.as_str() {
        "Configure" => {
            let r = api::ConfigureRequest::decode(p).map_err(bad)?;
            if !r.config.is_empty() {
                *b.lock().unwrap_or_else(|e| e.into_inner()) = Behaviour::parse(&r.config);
            }
            seen.lock().unwrap_or_else(|e| e.into_inner()).configured = Some(r);
            Ok(api::ConfigureResponse { events: 0 }.encode_to_vec())
        }
        "Synchronize" => {
            let r = api::SynchronizeRequest::decode(p).map_err(bad)?;
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            s.synced_pods.extend(r.pods.iter().map(|p| p.id.clone()));
            s.synced_containers
                .extend(r.containers.iter().map(|c| c.id.clone()));
            if !r.more {
                s.synchronized = true;
            }
            Ok(api::SynchronizeResponse {
                update: Vec::new(),
                more: r.more,
            }
            .encode_to_vec())
        }
        "StateChange" => {
            let r = api::StateChangeEvent::decode(p).map_err(bad)?;
            let name = api::Event::try_from(r.event)
                .map(|e| format!("{e:?}"))
                .unwrap_or_else(|_| r.event.to_string());
            record(seen, &name, r.pod.as_ref(), r.container.as_ref());
            Ok(api::Empty {}.encode_to_vec())
        }
        "CreateContainer" => {
            let r = api::CreateContainerRequest::decode(p).map_err(bad)?;
            record(
                seen,
                "CreateContainer",
                r.pod.as_ref(),
                r.container.as_ref(),
            );
            let b = b.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if b.hang_create {
                std::future::pending::<()>().await;
            }
            if let Some(msg) = &b.fail_create {
                return Err(msg.clone());
            }
            Ok(api::CreateContainerResponse {
                adjust: Some(adjustment(&b)),
                update: Vec::new(),
                evict: Vec::new(),
            }
            .encode_to_vec())
        }
        "StopContainer" => {
            let r = api::StopContainerRequest::decode(p).map_err(bad)?;
            record(seen, "StopContainer", r.pod.as_ref(), r.container.as_ref());
            Ok(api::StopContainerResponse::default().encode_to_vec())
        }
        "UpdateContainer" => {
            let r = api::UpdateContainerRequest::decode(p).map_err(bad)?;
            record(
                seen,
                "UpdateContainer",
                r.pod.as_ref(),
                r.container.as_ref(),
            );
            Ok(api::UpdateContainerResponse::default().encode_to_vec())
        }
        "UpdatePodSandbox" => {
            let r = api::UpdatePodSandboxRequest::decode(p).map_err(bad)?;
            record(seen, "UpdatePodSandbox", r.pod.as_ref(), None);
            Ok(api::UpdatePodSandboxResponse {}.encode_to_vec())
        }
        "Shutdown" => Ok(api::Empty {}.encode_to_vec()),
        other => Err(format!("{other} is not handled by the test plugin")),
    }
}

fn adjustment(b: &Behaviour) -> api::ContainerAdjustment {
    api::ContainerAdjustment {
        env: b
            .env
            .iter()
            .map(|(k, v)| api::KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
        mounts: b
            .mounts
            .iter()
            .map(|(h, c)| api::Mount {
                destination: c.clone(),
                r#type: "bind".into(),
                source: h.clone(),
                options: vec!["rbind".into(), "ro".into()],
            })
            .collect(),
        linux: b.cpu.map(|(quota, period)| api::LinuxContainerAdjustment {
            resources: Some(api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    quota: Some(api::OptionalInt64 { value: quota }),
                    period: Some(api::OptionalUInt64 { value: period }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
