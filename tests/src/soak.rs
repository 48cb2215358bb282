//! A soak: many pods running for a long time under a kubelet-like load, with the daemon's and the
//! shims' resources sampled as it goes (issue 49).
//!
//! [`run`] starts [`Plan::pods`] pods, each with one container that writes a numbered line to its
//! log every second, and keeps them under this load until [`Plan::duration`] has passed:
//!
//! - PLEG's relist: `ListPodSandbox` and `ListContainers` every second;
//! - the stats of the summary API: `ListContainerStats` and `ListPodSandboxStats` every 10 s;
//! - a probe of each pod every [`Plan::probe_every`], spread over that period: `ExecSync` of
//!   `true`, then `ContainerStatus` and `PodSandboxStatus`, as kubelet's prober and status
//!   manager ask;
//! - churn: every [`Plan::churn_every`] the oldest pod is stopped (its log checked: every line
//!   there, numbered from 0, no gap and none twice), removed, and a new one started in its place.
//!
//! Every [`Plan::sample_every`] a [`Node`] reports the daemon's RSS, open files, threads and CPU,
//! the database's size, and the same of every shim ([`SAMPLER`], one Python script for this
//! machine and the node VM alike). The [`Report`] prints them as a table and sets the first
//! sample after [`Plan::warmup`] against the last. Every failed call is counted with its message;
//! one on a pod the churn was removing at that moment is the client's doing and is not.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crius_api::v1::runtime_service_client::RuntimeServiceClient;
use crius_api::v1::*;
use tokio::sync::Semaphore;
use tonic::transport::Channel;

use crate::{Error, Result};

/// The container of every soak pod: a numbered line a second, until SIGTERM.
pub const LOGGER: &[&str] = &[
    "sh",
    "-c",
    "trap 'exit 0' TERM; i=0; while :; do echo \"line $i\"; i=$((i+1)); sleep 1; done",
];

/// Reads `/proc` once: the daemon (`--daemon-pid`), the database file (`--db`), and every
/// process whose program is named `--shim` and whose command line holds `--filter`. Prints one
/// JSON object: `daemon`, `db_bytes` and `shims` (by pid), each process's `rss_kib`, `pss_kib`,
/// `threads`, `fds` and `cpu_s` (user + system time with its reaped children's).
pub const SAMPLER: &str = r#"
import json, os, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
hz = os.sysconf('SC_CLK_TCK')
def usage(pid):
    d = '/proc/%s' % pid
    with open(d + '/stat') as f:
        st = f.read().rsplit(')', 1)[1].split()
    status = {}
    with open(d + '/status') as f:
        for line in f:
            k, _, v = line.partition(':')
            status[k] = v.split()
    pss = 0
    with open(d + '/smaps_rollup') as f:
        for line in f:
            if line.startswith('Pss:'):
                pss = int(line.split()[1])
    return {'rss_kib': int(status['VmRSS'][0]), 'pss_kib': pss,
            'threads': int(status['Threads'][0]), 'fds': len(os.listdir(d + '/fd')),
            'cpu_s': sum(int(st[i]) for i in (11, 12, 13, 14)) / hz}
out = {'daemon': usage(args['--daemon-pid']), 'db_bytes': os.stat(args['--db']).st_size,
       'shims': {}}
for e in os.listdir('/proc'):
    if not e.isdigit():
        continue
    try:
        with open('/proc/%s/cmdline' % e, 'rb') as f:
            argv = f.read().split(b'\0')
        if os.path.basename(argv[0]).decode('utf-8', 'replace') != args['--shim']:
            continue
        if args['--filter'].encode() not in b' '.join(argv):
            continue
        out['shims'][e] = usage(e)
    except (OSError, IndexError, KeyError, ValueError):
        pass
print(json.dumps(out))
"#;

/// Where the soak runs: this machine or a guest, read through [`SAMPLER`] and its files.
pub trait Node: Send {
    /// [`SAMPLER`]'s output, parsed.
    fn sample(&mut self) -> Result<Sample>;
    /// The text of a file on the node (a container's log).
    fn read(&mut self, path: &str) -> Result<String>;
    /// The lines of crius's log at WARN or ERROR since it started.
    fn complaints(&mut self) -> Result<Vec<String>>;
}

/// One process's resources at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub rss_kib: u64,
    pub pss_kib: u64,
    pub threads: u64,
    pub fds: u64,
    pub cpu_s: f64,
}

/// The daemon's and the shims' resources at one moment.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub daemon: Usage,
    pub db_bytes: u64,
    pub shims: HashMap<String, Usage>,
}

impl Sample {
    /// Parses [`SAMPLER`]'s output.
    pub fn parse(text: &str) -> Result<Sample> {
        let value: serde_json::Value = serde_json::from_str(text.trim())
            .map_err(|e| Error::Node(format!("sampler output {:?}: {e}", excerpt(text))))?;
        let usage = |v: &serde_json::Value| Usage {
            rss_kib: v["rss_kib"].as_u64().unwrap_or(0),
            pss_kib: v["pss_kib"].as_u64().unwrap_or(0),
            threads: v["threads"].as_u64().unwrap_or(0),
            fds: v["fds"].as_u64().unwrap_or(0),
            cpu_s: v["cpu_s"].as_f64().unwrap_or(0.0),
        };
        let shims = value["shims"]
            .as_object()
            .map(|m| m.iter().map(|(pid, u)| (pid.clone(), usage(u))).collect())
            .unwrap_or_default();
        Ok(Sample {
            daemon: usage(&value["daemon"]),
            db_bytes: value["db_bytes"].as_u64().unwrap_or(0),
            shims,
        })
    }
}

/// The command line of [`SAMPLER`] (after `python3 -c SCRIPT` or `python3 - <<EOF`).
pub fn sampler_args(daemon_pid: &str, db: &str, shim: &str, filter: &str) -> Vec<String> {
    [
        "--daemon-pid",
        daemon_pid,
        "--db",
        db,
        "--shim",
        shim,
        "--filter",
        filter,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// How much, how long, how often.
#[derive(Debug, Clone)]
pub struct Plan {
    pub pods: usize,
    pub duration: Duration,
    /// One pod replaced each time this passes.
    pub churn_every: Duration,
    pub probe_every: Duration,
    pub sample_every: Duration,
    /// Samples before this are the warm-up; the report's growth starts after it.
    pub warmup: Duration,
    /// Pods started at once while filling up (kubelet starts pods in parallel, by pod workers).
    pub parallel_starts: usize,
}

/// The pods and containers a soak makes, by name.
pub struct Shape {
    pub pod: Box<dyn Fn(&str) -> PodSandboxConfig + Send + Sync>,
    /// A container running [`LOGGER`].
    pub container: Box<dyn Fn(&str) -> ContainerConfig + Send + Sync>,
}

/// One figure of a row, for the report's growth lines.
type Figure<'a> = dyn Fn(&Row) -> f64 + 'a;

/// One row of the report's table.
#[derive(Debug, Clone)]
pub struct Row {
    pub at: Duration,
    pub pods: usize,
    pub sample: Sample,
    /// CPU seconds per minute since the row before: the daemon's, and the shims' alive at both.
    pub daemon_cpu_per_min: f64,
    pub shims_cpu_per_min: f64,
    pub calls: u64,
    pub failures: u64,
    pub exec_p50_ms: f64,
    pub exec_p99_ms: f64,
    pub cycles: u64,
}

/// What a soak saw.
#[derive(Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// Each failed call (bounded: the first 50), with the call and the message.
    pub failures: Vec<String>,
    pub failed: u64,
    pub calls: u64,
    /// Pods replaced by the churn.
    pub cycles: u64,
    /// Logs with a gap or a line twice (the container's log, read when it stopped).
    pub log_problems: Vec<String>,
    /// Log lines checked, over every churned container.
    pub log_lines: u64,
    /// The sample after every pod was removed.
    pub after: Option<Sample>,
    pub warmup: Duration,
}

#[derive(Debug, Clone)]
struct Slot {
    name: String,
    pod: String,
    container: String,
    log: String,
    leaving: bool,
}

#[derive(Default)]
struct Tally {
    slots: Vec<Slot>,
    calls: u64,
    failed: u64,
    failures: Vec<String>,
    exec_ms: Vec<f64>,
    cycles: u64,
    log_problems: Vec<String>,
    log_lines: u64,
}

impl Tally {
    fn fail(&mut self, what: String) {
        self.failed += 1;
        if self.failures.len() < 50 {
            self.failures.push(what);
        }
    }
}

type Shared = Arc<Mutex<Tally>>;

fn lock(t: &Shared) -> std::sync::MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

fn excerpt(text: &str) -> String {
    text.chars().take(300).collect()
}

/// The outcome of one call, counted: `Some` of its answer, or `None` with the failure noted
/// unless `excused` says the pod was being removed by the churn.
fn count<T>(
    tally: &Shared,
    what: &str,
    result: std::result::Result<tonic::Response<T>, tonic::Status>,
    excused: impl FnOnce(&Tally) -> bool,
) -> Option<T> {
    let mut t = lock(tally);
    t.calls += 1;
    match result {
        Ok(r) => Some(r.into_inner()),
        Err(status) => {
            if !excused(&t) {
                t.fail(format!(
                    "{what}: {:?}: {}",
                    status.code(),
                    excerpt(status.message())
                ));
            }
            None
        }
    }
}

/// Runs the soak of `plan` against the runtime behind `rt`, on `node`.
pub async fn run(
    rt: RuntimeServiceClient<Channel>,
    plan: &Plan,
    shape: Arc<Shape>,
    node: Box<dyn Node>,
) -> Report {
    let node = Arc::new(Mutex::new(node));
    let tally: Shared = Arc::default();
    let started = Instant::now();
    let mut next_name = 0usize;

    // Fill up.
    let gate = Arc::new(Semaphore::new(plan.parallel_starts.max(1)));
    let mut starts = Vec::new();
    for _ in 0..plan.pods {
        let name = format!("soak-{next_name}");
        next_name += 1;
        let (rt, shape, tally, gate) = (rt.clone(), shape.clone(), tally.clone(), gate.clone());
        starts.push(tokio::spawn(async move {
            let _permit = gate.acquire().await;
            if let Some(slot) = start_pod(rt, &shape, &tally, &name).await {
                lock(&tally).slots.push(slot);
            }
        }));
    }
    for s in starts {
        let _ = s.await;
    }
    let filled = started.elapsed();
    eprintln!(
        "soak: {} pods running after {filled:.1?}",
        lock(&tally).slots.len()
    );

    let end = Instant::now() + plan.duration;
    let load = [
        tokio::spawn(relist(rt.clone(), tally.clone(), end)),
        tokio::spawn(probes(rt.clone(), tally.clone(), end, plan.probe_every)),
    ];

    let mut report = Report {
        warmup: plan.warmup,
        ..Report::default()
    };
    let soak_started = Instant::now();
    let mut next_sample = soak_started;
    let mut next_churn = soak_started + plan.churn_every;
    let mut last: Option<(Instant, Sample)> = None;
    let mut last_calls = (0u64, 0u64, 0u64);
    while Instant::now() < end {
        let now = Instant::now();
        if now >= next_sample {
            next_sample += plan.sample_every;
            let sample = sample(&node).await;
            match sample {
                Ok(sample) => {
                    let row = row(
                        soak_started,
                        &tally,
                        &sample,
                        last.as_ref(),
                        &mut last_calls,
                    );
                    eprintln!("soak: {}", row_line(&row));
                    report.rows.push(row);
                    last = Some((now, sample));
                }
                Err(e) => lock(&tally).fail(format!("sample: {e}")),
            }
        }
        if now >= next_churn {
            next_churn += plan.churn_every;
            let name = format!("soak-{next_name}");
            next_name += 1;
            churn_one(&rt, &shape, &tally, &node, &name).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for task in load {
        task.abort();
        let _ = task.await;
    }

    // Empty the node again.
    let slots: Vec<Slot> = std::mem::take(&mut lock(&tally).slots);
    let gate = Arc::new(Semaphore::new(plan.parallel_starts.max(1)));
    let mut stops = Vec::new();
    for slot in slots {
        let (rt, tally, gate) = (rt.clone(), tally.clone(), gate.clone());
        stops.push(tokio::spawn(async move {
            let _permit = gate.acquire().await;
            remove_pod(rt, &tally, &slot.pod).await;
        }));
    }
    for s in stops {
        let _ = s.await;
    }
    match sample(&node).await {
        Ok(s) => report.after = Some(s),
        Err(e) => lock(&tally).fail(format!("sample after: {e}")),
    }
    let t = std::mem::take(&mut *lock(&tally));
    report.failures = t.failures;
    report.failed = t.failed;
    report.calls = t.calls;
    report.cycles = t.cycles;
    report.log_problems = t.log_problems;
    report.log_lines = t.log_lines;
    report
}

async fn sample(node: &Arc<Mutex<Box<dyn Node>>>) -> Result<Sample> {
    let node = node.clone();
    tokio::task::spawn_blocking(move || node.lock().unwrap_or_else(|p| p.into_inner()).sample())
        .await
        .map_err(|e| Error::Node(format!("sampler task: {e}")))?
}

fn row(
    started: Instant,
    tally: &Shared,
    sample: &Sample,
    last: Option<&(Instant, Sample)>,
    last_calls: &mut (u64, u64, u64),
) -> Row {
    let (daemon_cpu_per_min, shims_cpu_per_min) = match last {
        Some((at, before)) => {
            let mins = at.elapsed().as_secs_f64() / 60.0;
            let shims: f64 = sample
                .shims
                .iter()
                .filter_map(|(pid, u)| before.shims.get(pid).map(|b| u.cpu_s - b.cpu_s))
                .sum();
            (
                (sample.daemon.cpu_s - before.daemon.cpu_s) / mins.max(1e-9),
                shims / mins.max(1e-9),
            )
        }
        None => (0.0, 0.0),
    };
    let mut t = lock(tally);
    // The latencies are kept only until their row is made.
    let mut exec = std::mem::take(&mut t.exec_ms);
    exec.sort_by(|a, b| a.total_cmp(b));
    let at = |p: usize| -> f64 {
        if exec.is_empty() {
            return 0.0;
        }
        exec[((exec.len() - 1) * p / 100).min(exec.len() - 1)]
    };
    let r = Row {
        at: started.elapsed(),
        pods: t.slots.len(),
        sample: sample.clone(),
        daemon_cpu_per_min,
        shims_cpu_per_min,
        calls: t.calls - last_calls.0,
        failures: t.failed - last_calls.1,
        exec_p50_ms: at(50),
        exec_p99_ms: at(99),
        cycles: t.cycles - last_calls.2,
    };
    *last_calls = (t.calls, t.failed, t.cycles);
    r
}

fn row_line(r: &Row) -> String {
    let shims = r.sample.shims.len().max(1) as u64;
    let sum = |f: fn(&Usage) -> u64| -> u64 { r.sample.shims.values().map(f).sum() };
    format!(
        "{:>6.1} min  pods {:>3}  daemon {:>6.1} MiB {:>4} fds {:>3} thr {:>5.2} cpu-s/min  db {:>6} KiB  \
         shims {:>3}: {:>5.2} MiB rss {:>5.2} MiB pss each, {:>4} fds {:>4} thr, {:>5.2} cpu-s/min  \
         calls {:>5} failed {:>2}  exec p50 {:>6.1} p99 {:>6.1} ms  churned {:>2}",
        r.at.as_secs_f64() / 60.0,
        r.pods,
        r.sample.daemon.rss_kib as f64 / 1024.0,
        r.sample.daemon.fds,
        r.sample.daemon.threads,
        r.daemon_cpu_per_min,
        r.sample.db_bytes / 1024,
        r.sample.shims.len(),
        sum(|u| u.rss_kib) as f64 / shims as f64 / 1024.0,
        sum(|u| u.pss_kib) as f64 / shims as f64 / 1024.0,
        sum(|u| u.fds),
        sum(|u| u.threads),
        r.shims_cpu_per_min,
        r.calls,
        r.failures,
        r.exec_p50_ms,
        r.exec_p99_ms,
        r.cycles,
    )
}

impl Report {
    /// Whether every sample found a shim for each pod running: a sampler that finds none would
    /// make "no shim left" true of any run.
    pub fn saw_every_shim(&self) -> bool {
        !self.rows.is_empty() && self.rows.iter().all(|r| r.sample.shims.len() >= r.pods)
    }

    /// The table, the growth after the warm-up, the failures and the log checks.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for r in &self.rows {
            let _ = writeln!(out, "{}", row_line(r));
        }
        if let (Some(first), Some(last)) = (
            self.rows.iter().find(|r| r.at >= self.warmup),
            self.rows.last(),
        ) {
            let per_shim = |r: &Row, f: fn(&Usage) -> u64| -> f64 {
                let n = r.sample.shims.len().max(1) as f64;
                r.sample.shims.values().map(f).sum::<u64>() as f64 / n
            };
            let max = |f: &Figure<'_>| -> f64 {
                self.rows
                    .iter()
                    .filter(|r| r.at >= self.warmup)
                    .map(f)
                    .fold(f64::MIN, f64::max)
            };
            let _ = writeln!(
                out,
                "after the warm-up ({:.0} min) to the end ({:.0} min), first -> last (max):",
                first.at.as_secs_f64() / 60.0,
                last.at.as_secs_f64() / 60.0
            );
            let lines: [(&str, &Figure<'_>); 8] = [
                ("daemon RSS MiB", &|r| {
                    r.sample.daemon.rss_kib as f64 / 1024.0
                }),
                ("daemon fds", &|r| r.sample.daemon.fds as f64),
                ("daemon threads", &|r| r.sample.daemon.threads as f64),
                ("database KiB", &|r| (r.sample.db_bytes / 1024) as f64),
                ("shim RSS MiB each", &|r| {
                    per_shim(r, |u| u.rss_kib) / 1024.0
                }),
                ("shim PSS MiB each", &|r| {
                    per_shim(r, |u| u.pss_kib) / 1024.0
                }),
                ("shim fds each", &|r| per_shim(r, |u| u.fds)),
                ("shim threads each", &|r| per_shim(r, |u| u.threads)),
            ];
            for (name, f) in lines {
                let _ = writeln!(
                    out,
                    "  {name:<18} {:>9.2} -> {:>9.2} ({:.2})",
                    f(first),
                    f(last),
                    max(f)
                );
            }
        }
        if let Some(after) = &self.after {
            let _ = writeln!(
                out,
                "after every pod was removed: daemon {:.1} MiB, {} fds, {} threads; db {} KiB; {} shims left",
                after.daemon.rss_kib as f64 / 1024.0,
                after.daemon.fds,
                after.daemon.threads,
                after.db_bytes / 1024,
                after.shims.len()
            );
        }
        let _ = writeln!(
            out,
            "{} calls, {} failed; {} pods replaced; {} log lines checked, {} logs with a gap or a repeat",
            self.calls,
            self.failed,
            self.cycles,
            self.log_lines,
            self.log_problems.len()
        );
        for f in self.failures.iter().chain(&self.log_problems) {
            let _ = writeln!(out, "  {f}");
        }
        out
    }
}

/// Log lines grouped by their shape: the timestamp dropped, ids, numbers and quoted values
/// replaced, each shape with how many lines had it, most first (at most 300 characters each).
pub fn shapes(lines: &[String]) -> Vec<(String, usize)> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for line in lines {
        let text = line.split_once(' ').map_or(line.as_str(), |(first, rest)| {
            if first.contains('T') && first.ends_with('Z') {
                rest
            } else {
                line
            }
        });
        let mut shape = String::new();
        let mut quoted = false;
        let mut last_digit = false;
        for ch in text.chars() {
            match ch {
                '"' => {
                    quoted = !quoted;
                    shape.push_str(if quoted { "\"…" } else { "\"" });
                }
                _ if quoted => {}
                c if c.is_ascii_digit() => {
                    if !last_digit {
                        shape.push('N');
                    }
                }
                c => shape.push(c),
            }
            last_digit = ch.is_ascii_digit() && !quoted;
        }
        *counts
            .entry(shape.trim().chars().take(300).collect())
            .or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

async fn start_pod(
    mut rt: RuntimeServiceClient<Channel>,
    shape: &Shape,
    tally: &Shared,
    name: &str,
) -> Option<Slot> {
    let config = (shape.pod)(name);
    let result = rt
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await;
    let pod = count(tally, "RunPodSandbox", result, |_| false)?.pod_sandbox_id;
    let container = (shape.container)(name);
    let log = format!("{}/{}", config.log_directory, container.log_path);
    let result = rt
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(container),
            sandbox_config: Some(config),
        })
        .await;
    let Some(created) = count(tally, "CreateContainer", result, |_| false) else {
        remove_pod(rt, tally, &pod).await;
        return None;
    };
    let id = created.container_id;
    let result = rt
        .start_container(StartContainerRequest {
            container_id: id.clone(),
        })
        .await;
    if count(tally, "StartContainer", result, |_| false).is_none() {
        remove_pod(rt, tally, &pod).await;
        return None;
    }
    Some(Slot {
        name: name.to_string(),
        pod,
        container: id,
        log,
        leaving: false,
    })
}

async fn remove_pod(mut rt: RuntimeServiceClient<Channel>, tally: &Shared, pod: &str) {
    let result = rt
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.to_string(),
        })
        .await;
    count(tally, "StopPodSandbox", result, |_| false);
    let result = rt
        .remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod.to_string(),
        })
        .await;
    count(tally, "RemovePodSandbox", result, |_| false);
}

/// The oldest pod stopped, its log checked, removed, and a new pod `name` in its place.
async fn churn_one(
    rt: &RuntimeServiceClient<Channel>,
    shape: &Arc<Shape>,
    tally: &Shared,
    node: &Arc<Mutex<Box<dyn Node>>>,
    name: &str,
) {
    let slot = {
        let mut t = lock(tally);
        let Some(slot) = t.slots.iter_mut().find(|s| !s.leaving) else {
            return;
        };
        slot.leaving = true;
        slot.clone()
    };
    let mut c = rt.clone();
    let result = c
        .stop_container(StopContainerRequest {
            container_id: slot.container.clone(),
            timeout: 10,
        })
        .await;
    count(tally, "StopContainer", result, |_| false);
    let path = slot.log.clone();
    let node2 = node.clone();
    let text = tokio::task::spawn_blocking(move || {
        node2.lock().unwrap_or_else(|p| p.into_inner()).read(&path)
    })
    .await;
    match text {
        Ok(Ok(text)) => check_log(tally, &slot, &text),
        Ok(Err(e)) => lock(tally).fail(format!("read the log of {}: {e}", slot.name)),
        Err(e) => lock(tally).fail(format!("read the log of {}: {e}", slot.name)),
    }
    let result = c
        .remove_container(RemoveContainerRequest {
            container_id: slot.container.clone(),
        })
        .await;
    count(tally, "RemoveContainer", result, |_| false);
    remove_pod(c.clone(), tally, &slot.pod).await;
    {
        let mut t = lock(tally);
        t.slots.retain(|s| s.pod != slot.pod);
        t.cycles += 1;
    }
    if let Some(new) = start_pod(c, shape, tally, name).await {
        lock(tally).slots.push(new);
    }
}

/// The CRI log of a [`LOGGER`] container: `line 0`, `line 1`, … each once, in order.
fn check_log(tally: &Shared, slot: &Slot, text: &str) {
    let mut expect = 0u64;
    let mut problem = None;
    for line in text.lines() {
        // <timestamp> <stream> <tag> <text>
        let content = line.splitn(4, ' ').nth(3).unwrap_or("");
        let Some(n) = content
            .strip_prefix("line ")
            .and_then(|n| n.trim().parse::<u64>().ok())
        else {
            problem.get_or_insert_with(|| format!("a line not of the logger: {:?}", excerpt(line)));
            continue;
        };
        if n != expect && problem.is_none() {
            problem = Some(format!("line {n} where line {expect} was due"));
        }
        expect = n + 1;
    }
    let mut t = lock(tally);
    t.log_lines += expect;
    if expect == 0 {
        problem.get_or_insert_with(|| "no line at all".to_string());
    }
    if let Some(p) = problem {
        t.log_problems
            .push(format!("log of {} ({}): {p}", slot.name, slot.log));
    }
}

/// PLEG's relist every second, the summary API's stats every 10 s.
async fn relist(mut rt: RuntimeServiceClient<Channel>, tally: Shared, end: Instant) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut n = 0u64;
    while Instant::now() < end {
        tick.tick().await;
        let r = rt.list_pod_sandbox(ListPodSandboxRequest::default()).await;
        count(&tally, "ListPodSandbox", r, |_| false);
        let r = rt.list_containers(ListContainersRequest::default()).await;
        count(&tally, "ListContainers", r, |_| false);
        if n.is_multiple_of(10) {
            let r = rt
                .list_container_stats(ListContainerStatsRequest::default())
                .await;
            count(&tally, "ListContainerStats", r, |_| false);
            let r = rt
                .list_pod_sandbox_stats(ListPodSandboxStatsRequest::default())
                .await;
            count(&tally, "ListPodSandboxStats", r, |_| false);
        }
        n += 1;
    }
}

/// Each pod probed once every `every`, the probes spread evenly over it, up to 8 at once.
async fn probes(rt: RuntimeServiceClient<Channel>, tally: Shared, end: Instant, every: Duration) {
    let gate = Arc::new(Semaphore::new(8));
    let mut i = 0usize;
    while Instant::now() < end {
        let n = lock(&tally).slots.len().max(1);
        tokio::time::sleep(every / n as u32).await;
        let slot = {
            let t = lock(&tally);
            t.slots.get(i % t.slots.len().max(1)).cloned()
        };
        i += 1;
        let Some(slot) = slot.filter(|s| !s.leaving) else {
            continue;
        };
        let Ok(permit) = gate.clone().acquire_owned().await else {
            return;
        };
        let (mut rt, tally) = (rt.clone(), tally.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let gone = |t: &Tally| {
                !t.slots
                    .iter()
                    .any(|s| s.container == slot.container && !s.leaving)
            };
            let started = Instant::now();
            let r = rt
                .exec_sync(ExecSyncRequest {
                    container_id: slot.container.clone(),
                    cmd: vec!["true".into()],
                    timeout: 10,
                })
                .await;
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            if let Some(answer) = count(&tally, "ExecSync", r, gone) {
                let mut t = lock(&tally);
                t.exec_ms.push(ms);
                if answer.exit_code != 0 && !gone(&t) {
                    t.fail(format!(
                        "ExecSync true in {}: exit {}: {}",
                        slot.name,
                        answer.exit_code,
                        excerpt(&String::from_utf8_lossy(&answer.stderr))
                    ));
                }
            }
            let r = rt
                .container_status(ContainerStatusRequest {
                    container_id: slot.container.clone(),
                    verbose: false,
                })
                .await;
            count(&tally, "ContainerStatus", r, gone);
            let r = rt
                .pod_sandbox_status(PodSandboxStatusRequest {
                    pod_sandbox_id: slot.pod.clone(),
                    verbose: false,
                })
                .await;
            count(&tally, "PodSandboxStatus", r, gone);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_samplers_output() {
        let s = Sample::parse(
            r#"{"daemon": {"rss_kib": 10, "pss_kib": 9, "threads": 3, "fds": 20, "cpu_s": 1.5},
                "db_bytes": 4096, "shims": {"42": {"rss_kib": 2, "pss_kib": 1, "threads": 1,
                "fds": 9, "cpu_s": 0.25}}}"#,
        )
        .unwrap();
        assert_eq!(s.daemon.rss_kib, 10);
        assert_eq!(s.db_bytes, 4096);
        assert_eq!(s.shims["42"].fds, 9);
        assert!(Sample::parse("Traceback").is_err());
    }

    #[test]
    fn lines_of_one_shape_are_counted_together() {
        let lines = [
            "2026-12-03T14:29:39.155329Z  WARN rpc{id=15}: container \"158d\" not found elapsed_ms=0.10",
            "2026-12-03T14:30:09.193135Z  WARN rpc{id=3}: container \"0354\" not found elapsed_ms=0.14",
            "2026-12-03T14:30:09.193135Z ERROR other",
        ]
        .map(String::from);
        let shapes = shapes(&lines);
        assert_eq!(shapes.len(), 2, "{shapes:?}");
        assert_eq!(shapes[0].1, 2);
        assert_eq!(
            shapes[0].0,
            "WARN rpc{id=N}: container \"…\" not found elapsed_ms=N.N"
        );
    }

    #[test]
    fn a_log_with_a_gap_or_a_repeat_is_a_problem() {
        let tally: Shared = Arc::default();
        let slot = Slot {
            name: "p".into(),
            pod: "p".into(),
            container: "c".into(),
            log: "/l".into(),
            leaving: false,
        };
        let line = |n: u64| format!("2026-12-03T00:00:00Z stdout F line {n}\n");
        let whole: String = (0..5).map(line).collect();
        check_log(&tally, &slot, &whole);
        assert!(lock(&tally).log_problems.is_empty());
        assert_eq!(lock(&tally).log_lines, 5);
        let gap: String = [0, 1, 3].into_iter().map(line).collect();
        check_log(&tally, &slot, &gap);
        let repeat: String = [0, 1, 1, 2].into_iter().map(line).collect();
        check_log(&tally, &slot, &repeat);
        assert_eq!(lock(&tally).log_problems.len(), 2);
    }
}
