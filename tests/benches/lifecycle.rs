//! Pod and container lifecycle benchmark through the CRI (issue 5), against crius or any CRI
//! runtime listening on a unix socket.
//!
//! Build the release binaries first, then run the bench (as root, like the e2e tests):
//!
//! ```text
//! make build-release    # crius and the shim as installed, in target/<host-triple>/release{,-shim}
//! CRIUS_BIN=target/x86_64-unknown-linux-gnu/release/crius \
//!   CRIUS_SHIM_BIN=target/x86_64-unknown-linux-gnu/release-shim/crius-shim \
//!   cargo bench -p crius-tests --bench lifecycle -- [--iterations 50] [--pods 50]
//! ```
//!
//! The binaries are found through `CRIUS_BIN` / `CRIUS_SHIM_BIN` or in `target/release`. The
//! bench starts Debian's docker-registry on loopback, pushes the busybox test image and a
//! generated ~200 MB five-layer image (shaped like the one of `image/benches/pull.rs`), starts
//! crius on a temp root with its own bridge CNI network (bridge `crius-bench0`, subnet
//! `10.88.164.0/22`), then measures, with `--iterations` runs each:
//!
//! - `Version`, a call that does nothing: the cost of a call itself;
//! - cold `PullImage` of the big image (empty root), then of busybox (whose one layer is the
//!   big image's first: after the big image, only its manifest and config are fetched);
//! - `RunPodSandbox` without network (`NamespaceMode::NODE`) and with the bridge network, and
//!   with the bridge network in a user namespace (when the runtime advertises them);
//! - `CreateContainer` + `StartContainer` of busybox `sleep 3600` (together and each alone), also
//!   in a user-namespaced pod;
//! - `ExecSync` of `true`;
//! - `StopContainer` (timeout 0) + `RemoveContainer`, and `RemoveContainer` alone;
//! - `StopPodSandbox` and then `RemovePodSandbox` of a pod with the bridge network;
//! - RSS and PSS (`/proc/<pid>/smaps_rollup`) of the shim of a pod with one container, and
//!   the CPU one `ExecSync` costs there (a kubelet probe): the daemon's and the shim's with its
//!   reaped children (helpers, the command), over at least 200 calls in a row;
//! - the daemon's RSS with `--pods` pods running, each with one `sleep` container.
//!
//! and prints median and p95 in ms. Everything it created is removed at the end, also after a
//! failure: pods through the CRI, the daemon by PID, the bridge, the `crius-bench` cgroups.
//!
//! `--endpoint unix:///path/to.sock` measures another runtime instead (containerd, see
//! `tests/benches/README.md`): nothing is started but the registry. That runtime must read
//! registry hosts from `--hosts-dir DIR` (containerd's `config_path`): the bench writes
//! `DIR/<mirror>/hosts.toml` sending `--mirror HOST` (default `crius.bench`) to the local
//! registry, so the runtime's `sandbox_image` can be `<mirror>/crius-bench/pause:latest`, an image
//! of crius-pause the bench pushes and pulls before any timing. `--daemon-pid PID` names the
//! process whose RSS is reported with the pods running.
//!
//! `--serve --hosts-dir DIR` only pushes the images, writes the mirror and keeps the registry up
//! until stdin is closed (to time `crictl pull` by hand). `--no-big-pull` skips the big image;
//! `--runtime-handler NAME` runs every pod under that RuntimeClass handler; `--crius-log FILE`
//! keeps crius's log there; `--nri off|on|plugin` runs crius with NRI off, on without a plugin
//! (the default), or with one test plugin connected that takes every event and adjusts
//! nothing; `--metrics ADDRESS` turns crius's metrics endpoint on (`[metrics] address`) and
//! scrapes it once with the pods running (its size and time).
//!
//! More, each opt-in:
//! - `--steady SECS`: kubelet's steady call pattern over the `--pods` running pods for SECS
//!   seconds (ListPodSandbox + ListContainers every second, ListContainerStats +
//!   ListPodSandboxStats every 10 s, an ExecSync probe of each container every 10 s spread over
//!   the period): CPU seconds per minute of the daemon and of the pods' shims (their reaped
//!   children included), and their RSS afterwards;
//! - `--restart`: with the `--pods` pods running (after `--steady`), the daemon killed with
//!   SIGKILL and started again: how long from its start until it answers `Version`, until it
//!   lists every pod ready and every container running, and until an `ExecSync` works. crius
//!   started by the bench is started again as before; the runtime at `--daemon-pid` has its
//!   command line, environment and working directory run again, in a session of its own, and
//!   keeps running under its new pid (printed) after the bench;
//! - `--burst`: pods with one container each started several at a time as kubelet does after a
//!   node reboot: 20 pods 1, 2, 5, 10 and 20 at a time (the curve), 30 by 10 and 60 by 20; wall
//!   time and each pod's p50 and p99;
//! - `--interleave` (with `--endpoint` and `--hosts-dir` of another runtime): crius is
//!   started too, and each iteration runs the same calls on both, one runtime after the other
//!   (which goes first alternates): a pod with the bridge network started, stopped and
//!   removed, then a container created, started, probed, stopped and removed in a pod of
//!   each. Both runtimes meet the machine in the same state, so the ratio of their medians
//!   does not move with the machine's drift between runs; only those calls are timed. It
//!   prints the medians, the medians of each half of the run, and the p99s. With
//!   `--against DIR` instead of `--endpoint`, the second runtime is another build of crius
//!   (`DIR/crius` and `DIR/crius-shim`, started beside the first with its own directories and
//!   bridge network): an A/B of two builds that the drift between runs does not blur;
//! - `--reads N`: the calls kubelet makes most (ContainerStatus, PodSandboxStatus,
//!   ListContainers, ListPodSandbox, ImageStatus), N times each in a row, first with nothing
//!   else going on, then while 10 workers run pods through RunPodSandbox, CreateContainer,
//!   StartContainer, StopPodSandbox and RemovePodSandbox (critest's 10-at-a-time mix): p50 and
//!   p99 of each, and the loaded figure against the idle one — whether reads queue behind
//!   writes (issue 50);
//! - `--scale 10,110,500`: pods with one container each started 10 at a time up to each count
//!   (kubelet's cgroupfs layout, the bridge network); at each: the daemon's RSS, the shims' PSS
//!   summed, the idle CPU of daemon and shims per minute, ContainerStatus, ListContainers and
//!   ListPodSandbox (p50, p99 of 100), ListContainerStats and ListPodSandboxStats (p50 of 5),
//!   and one more pod's RunPodSandbox and create + start (p50 of 5); with `--restart`, the
//!   restart is timed at the last count. Against another runtime (`--endpoint`, `--daemon-pid`)
//!   the same, so two runs give the curve of each;
//! - `--host-mounts N`: N more mounts on the host (small tmpfs mounts in a temporary directory,
//!   removed at the end) for the whole run, as a node with many pods and volumes has: how the
//!   calls grow with the size of the mount table. The bench prints the host's mount count.
//!
//! With crius started by the bench, its log has a debug line of the phases of every
//! RunPodSandbox (checks, the name and record reserved, files, netns, then CNI ADD and the
//! pause's start side by side, record), StopPodSandbox (containers, pause kill, cgroup reap,
//! CNI DEL, shm and record), CreateContainer (checks, record, rootfs, image config, volumes,
//! spec, bundle, shim create, the `Created` record, after: the events and NRI's post-create),
//! RemoveContainer (stop, shim delete, cgroup, rootfs and dirs, image lease, records) and
//! RemovePodSandbox (stop, containers, pause delete, shim shutdown, netns and dirs, cgroups,
//! record), and the bench prints each phase's p50 and p95: where the time of a call goes inside
//! crius. The daemon's RSS is split into anonymous and file-backed (its text) memory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crius_api::v1::runtime_service_client::RuntimeServiceClient;
use crius_api::v1::*;
use crius_tests::images::{self, TestImage};
use crius_tests::registry::Registry;
use crius_tests::TestDir;
use serde_json::json;
use tonic::transport::Channel;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, BoxError>;

const CNI_BIN: &str = "/usr/lib/cni";
const BRIDGE: &str = "crius-bench0";
/// A /22: room for the 500 pods of `--scale`.
const SUBNET: &str = "10.88.164.0/22";
/// The network of the second crius of `--interleave --against`.
const BRIDGE_B: &str = "crius-bench1";
const SUBNET_B: &str = "10.88.168.0/22";
/// Pods are placed below this cgroup (kubelet-like: one parent per pod); removed at the end.
const CGROUP_ROOT: &str = "crius-bench";
const NAMESPACE: &str = "crius-bench";
const LABEL: &str = "io.crius.bench";
const BIG_REPOSITORY: &str = "crius-bench/big";
const PAUSE_REPOSITORY: &str = "crius-bench/pause";

#[derive(Debug)]
struct Args {
    iterations: usize,
    pods: usize,
    endpoint: Option<PathBuf>,
    hosts_dir: Option<PathBuf>,
    mirror: String,
    daemon_pid: Option<u32>,
    big_pull: bool,
    crius_log: Option<PathBuf>,
    /// crius's `[metrics] address`.
    metrics: Option<String>,
    serve: bool,
    handler: String,
    /// `off`: `[nri] enable = false`; `on` (the default): NRI on, no plugin; `plugin`: one
    /// test plugin connected that subscribes to every event and adjusts nothing.
    nri: String,
    /// Bursts of pods started several at a time (`--burst`).
    burst: bool,
    /// Seconds of kubelet's steady call pattern over the running pods (`--steady SECS`; 0: none).
    steady: u64,
    /// Mounts added on the host for the run (`--host-mounts N`).
    host_mounts: usize,
    /// The calls on crius and on `--endpoint`'s runtime in turn (`--interleave`).
    interleave: bool,
    /// With `--interleave`: another build of crius (`DIR/crius`, `DIR/crius-shim`) instead of
    /// `--endpoint`'s runtime (`--against DIR`).
    against: Option<PathBuf>,
    /// The daemon killed and started again with the pods running (`--restart`).
    restart: bool,
    /// Reads timed idle and under 10 writers, this many of each (`--reads N`; 0: none).
    reads: usize,
    /// The scale curve's steps, in pods running (`--scale 10,110,500`; empty: none).
    scale: Vec<usize>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        iterations: 50,
        pods: 50,
        endpoint: None,
        hosts_dir: None,
        mirror: "crius.bench".into(),
        daemon_pid: None,
        big_pull: true,
        crius_log: None,
        metrics: None,
        serve: false,
        handler: String::new(),
        nri: "on".into(),
        burst: false,
        steady: 0,
        host_mounts: 0,
        interleave: false,
        against: None,
        restart: false,
        reads: 0,
        scale: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--iterations" => args.iterations = value()?.parse()?,
            "--pods" => args.pods = value()?.parse()?,
            "--endpoint" => {
                let v = value()?;
                let path = v
                    .strip_prefix("unix://")
                    .ok_or_else(|| format!("--endpoint {v}: only unix:// endpoints"))?;
                args.endpoint = Some(PathBuf::from(path));
            }
            "--hosts-dir" => args.hosts_dir = Some(PathBuf::from(value()?)),
            "--mirror" => args.mirror = value()?,
            "--daemon-pid" => args.daemon_pid = Some(value()?.parse()?),
            "--no-big-pull" => args.big_pull = false,
            "--crius-log" => args.crius_log = Some(PathBuf::from(value()?)),
            "--serve" => args.serve = true,
            "--runtime-handler" => args.handler = value()?,
            "--metrics" => args.metrics = Some(value()?),
            "--burst" => args.burst = true,
            "--steady" => args.steady = value()?.parse()?,
            "--host-mounts" => args.host_mounts = value()?.parse()?,
            "--interleave" => args.interleave = true,
            "--against" => args.against = Some(PathBuf::from(value()?)),
            "--restart" => args.restart = true,
            "--reads" => args.reads = value()?.parse()?,
            "--scale" => {
                args.scale = value()?
                    .split(',')
                    .map(|n| n.trim().parse::<usize>())
                    .collect::<std::result::Result<_, _>>()?;
                if args.scale.windows(2).any(|w| w[0] >= w[1]) || args.scale.first() == Some(&0) {
                    return Err("--scale: pod counts that grow, such as 10,110,500".into());
                }
            }
            "--nri" => {
                args.nri = value()?;
                if !["on", "off", "plugin"].contains(&args.nri.as_str()) {
                    return Err(format!("--nri {}: on, off or plugin", args.nri).into());
                }
            }
            // cargo bench passes --bench to every harness = false target.
            "--bench" => {}
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if args.iterations == 0 {
        return Err("--iterations must be at least 1".into());
    }
    if args.interleave && args.endpoint.is_some() == args.against.is_some() {
        return Err(
            "--interleave needs --endpoint (another runtime) or --against (another crius build)"
                .into(),
        );
    }
    if args.against.is_some() && !args.interleave {
        return Err("--against is for --interleave".into());
    }
    if args.restart && args.endpoint.is_some() && args.daemon_pid.is_none() {
        return Err("--restart with --endpoint needs --daemon-pid (the process to restart)".into());
    }
    if (args.endpoint.is_some() || args.serve) && args.hosts_dir.is_none() {
        return Err("--endpoint needs --hosts-dir (the runtime's registry config_path)".into());
    }
    Ok(args)
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("lifecycle bench: {err}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("lifecycle bench: start tokio: {err}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(async {
        match run(&args).await {
            Ok(()) => 0,
            Err(err) => {
                eprintln!("lifecycle bench failed: {err}");
                1
            }
        }
    });
    drop(rt);
    std::process::exit(code);
}

async fn run(args: &Args) -> Result<()> {
    let registry = Registry::start()?;
    let busybox = images::push(&registry, TestImage::Busybox)?;
    let big = if args.big_pull {
        let t = Instant::now();
        let big = push_big_image(&registry)?;
        println!(
            "generated and pushed {}: {} layers, {:.1} MB compressed, {:.1} MB uncompressed, in {:.1} s",
            BIG_REPOSITORY,
            big.layers,
            mb(big.compressed),
            mb(big.uncompressed),
            t.elapsed().as_secs_f64()
        );
        Some(big)
    } else {
        None
    };

    let work = TestDir::new("bench")?;
    // Dropped (its mounts detached) when the run ends, whichever way.
    let _host_mounts = add_host_mounts(args.host_mounts)?;
    println!(
        "host mounts: {} ({} added)",
        host_mount_count()?,
        args.host_mounts
    );
    let logs = work.join("logs");
    std::fs::create_dir(&logs)?;

    if args.serve {
        return serve(args, &registry, &work).await;
    }
    if args.interleave {
        let result = interleaved(args, &registry, &work, &busybox.reference).await;
        remove_cgroups();
        delete_link(BRIDGE);
        delete_link(BRIDGE_B);
        return result;
    }

    let mut daemon = None;
    // kept for the whole run
    let mut _nri_plugin = None;
    let (channel, daemon_pid, names, socket) = match &args.endpoint {
        None => {
            let d = Daemon::start(
                &work,
                args.crius_log.as_deref(),
                args.metrics.as_deref(),
                &args.nri,
            )?;
            let channel = d.connect().await?;
            if args.nri == "plugin" {
                let socket = work.join("crius").join("nri.sock");
                let p = crius_tests::nri::Plugin::connect(
                    &socket,
                    "bench",
                    "50",
                    crius_tests::nri::Behaviour::default(),
                )
                .await?;
                println!("nri: one plugin connected (every event, no adjustment)");
                _nri_plugin = Some(p);
            } else {
                println!("nri: {}", args.nri);
            }
            let pid = d.pid();
            let socket = d.socket.clone();
            daemon = Some(d);
            let host = registry.host_port();
            let names = Names {
                busybox: busybox.reference.clone(),
                big: format!("{host}/{BIG_REPOSITORY}:v1"),
                pause: None,
            };
            (channel, Some(pid), names, socket)
        }
        Some(socket) => {
            let hosts_dir = args.hosts_dir.as_deref().ok_or("--hosts-dir missing")?;
            write_mirror(hosts_dir, &args.mirror, &registry.host_port())?;
            push_pause_image(&registry, &work)?;
            let channel = crius_tests::crius::connect(socket).await?;
            let m = &args.mirror;
            let names = Names {
                busybox: format!("{m}/{}:latest", TestImage::Busybox.repository()),
                big: format!("{m}/{BIG_REPOSITORY}:v1"),
                pause: Some(format!("{m}/{PAUSE_REPOSITORY}:latest")),
            };
            (channel, args.daemon_pid, names, socket.clone())
        }
    };

    let mut bench = Bench {
        socket,
        handler: args.handler.clone(),
        rt: RuntimeServiceClient::new(channel.clone()),
        images: image_service_client::ImageServiceClient::new(channel),
        logs,
        busybox: names.busybox.clone(),
        seq: 0,
    };
    let log = work.join("restarted.log");
    let restart = match (args.restart, daemon.as_mut(), daemon_pid) {
        (false, _, _) => None,
        (true, Some(d), _) => Some(Restart::Crius(d)),
        (true, None, Some(pid)) => Some(Restart::Other { pid, log }),
        (true, None, None) => return Err("--restart: no daemon to restart".into()),
    };
    let result = measure(args, &mut bench, &names, big.as_ref(), daemon_pid, restart).await;
    let cleanup = bench.remove_all_pods().await;
    let log = daemon
        .as_ref()
        .and_then(|d| std::fs::read_to_string(&d.log).ok())
        .unwrap_or_default();
    if let Some(d) = daemon.take() {
        d.stop();
    }
    remove_cgroups();
    if args.endpoint.is_none() {
        delete_link(BRIDGE);
    }
    drop(work);
    drop(registry);
    let report = result?;
    cleanup?;
    report.print(args);
    for (what, title) in [
        ("run", "RunPodSandbox"),
        ("stop", "StopPodSandbox"),
        ("create", "CreateContainer"),
        ("remove", "RemoveContainer"),
        ("remove pod", "RemovePodSandbox"),
    ] {
        let lines = phase_breakdown(&log, what);
        if !lines.is_empty() {
            println!();
            println!(
                "{title} inside crius, by phase: {:>7} {:>8}",
                "p50 ms", "p95 ms"
            );
            for l in lines {
                println!("{l}");
            }
        }
    }
    Ok(())
}

/// `--interleave`: the calls on crius and on `--endpoint`'s runtime (or on the crius build of
/// `--against`) in turn, one iteration at a time, and the ratio of their medians.
async fn interleaved(
    args: &Args,
    registry: &Registry,
    work: &TestDir,
    busybox: &str,
) -> Result<()> {
    let daemon = Daemon::start(work, args.crius_log.as_deref(), None, &args.nri)?;
    let crius_channel = daemon.connect().await?;
    let crius_socket = daemon.socket.clone();
    // The second runtime: another crius build, with its own directories and network, or the
    // runtime at --endpoint, which pulls through the bench's mirror.
    let (other_channel, other_socket, other_image, second) = match (&args.against, &args.endpoint) {
        (Some(dir), _) => {
            let (bin, shim) = (dir.join("crius"), dir.join("crius-shim"));
            let d = Daemon::start_build(work, (&bin, &shim), true, None, None, &args.nri)?;
            let socket = d.socket.clone();
            (d.connect().await?, socket, busybox.to_string(), Some(d))
        }
        (None, Some(socket)) => {
            let hosts_dir = args.hosts_dir.as_deref().ok_or("--hosts-dir missing")?;
            write_mirror(hosts_dir, &args.mirror, &registry.host_port())?;
            push_pause_image(registry, work)?;
            let image = format!("{}/{}:latest", args.mirror, TestImage::Busybox.repository());
            (
                crius_tests::crius::connect(socket).await?,
                socket.clone(),
                image,
                None,
            )
        }
        (None, None) => return Err("--interleave needs --endpoint or --against".into()),
    };
    let mut benches = Vec::new();
    for (channel, socket, image, seq) in [
        (crius_channel, crius_socket, busybox.to_string(), 0),
        // Other pod names (and so other pod cgroups) than the first's.
        (other_channel, other_socket, other_image, 1_000_000),
    ] {
        let logs = work.join(format!("logs-{seq}"));
        std::fs::create_dir_all(&logs)?;
        benches.push(Bench {
            socket,
            handler: args.handler.clone(),
            rt: RuntimeServiceClient::new(channel.clone()),
            images: image_service_client::ImageServiceClient::new(channel),
            logs,
            busybox: image,
            seq,
        });
    }
    let mut names = Vec::new();
    for b in &mut benches {
        let v = b.rt.version(VersionRequest::default()).await?.into_inner();
        names.push(format!("{} {}", v.runtime_name, v.runtime_version));
    }
    if let Some(dir) = &args.against {
        names[1] = format!("{} from {}", names[1], dir.display());
    } else {
        benches[1]
            .pull(&format!("{}/{PAUSE_REPOSITORY}:latest", args.mirror))
            .await?;
    }
    for b in &mut benches {
        let image = b.busybox.clone();
        b.pull(&image).await?;
    }
    let result = interleaved_calls(args.iterations, &mut benches).await;
    let mut cleanup = Ok(());
    for b in &mut benches {
        if let Err(e) = b.remove_all_pods().await {
            cleanup = Err(e);
        }
    }
    daemon.stop();
    if let Some(d) = second {
        d.stop();
    }
    let ops = result?;
    cleanup?;
    if args.against.is_some() {
        println!(
            "crius (a) from {}",
            crius_tests::binary("crius")?
                .parent()
                .unwrap_or(Path::new(""))
                .display()
        );
    }
    println!(
        "interleaved: {} (a) and {} (b), {} iterations, medians in ms",
        names[0], names[1], args.iterations
    );
    println!(
        "{:<40} {:>9} {:>9} {:>8} {:>22}",
        "operation", "a", "b", "a / b", "a / b, halves"
    );
    let ratio = |a: f64, b: f64| a / b.max(f64::MIN_POSITIVE);
    for (label, [a, b]) in &ops {
        let half = a.len() / 2;
        let halves = [(0, half), (half, a.len())]
            .map(|(from, to)| ratio(at(&a[from..to], 50), at(&b[from..to], 50)));
        let (ma, mb) = (at(a, 50), at(b, 50));
        println!(
            "{label:<40} {ma:>9.2} {mb:>9.2} {:>8.3} {:>11.3} {:>10.3}",
            ratio(ma, mb),
            halves[0],
            halves[1]
        );
    }
    // Issue 18's targets are on the p99 too; with fewer than 100 iterations it is the
    // slowest call or next to it, so a single stall moves it.
    println!("p99 in ms");
    println!("{:<40} {:>9} {:>9} {:>8}", "operation", "a", "b", "a / b");
    for (label, [a, b]) in &ops {
        let (pa, pb) = (at(a, 99), at(b, 99));
        println!("{label:<40} {pa:>9.2} {pb:>9.2} {:>8.3}", ratio(pa, pb));
    }
    Ok(())
}

/// The `p`th percentile of unsorted samples, in ms.
fn at(samples: &[Duration], p: usize) -> f64 {
    let mut v = samples.to_vec();
    v.sort();
    ms(percentile(&v, p))
}

/// The calls of [`interleaved`]: per operation, the times on crius (`[0]`) and on the other
/// runtime (`[1]`), the warm-up iteration left out.
async fn interleaved_calls(
    n: usize,
    benches: &mut [Bench],
) -> Result<Vec<(&'static str, [Vec<Duration>; 2])>> {
    const LABELS: [&str; 9] = [
        "RunPodSandbox (bridge CNI)",
        "StopPodSandbox (bridge CNI)",
        "RemovePodSandbox (stopped, bridge CNI)",
        "CreateContainer+StartContainer",
        "CreateContainer",
        "StartContainer",
        "ExecSync true",
        "StopContainer(0)",
        "RemoveContainer (stopped)",
    ];
    let mut times: Vec<[Vec<Duration>; 2]> =
        (0..LABELS.len()).map(|_| Default::default()).collect();
    let mut pods = Vec::new();
    for b in benches.iter_mut() {
        let config = b.pod_config(true);
        let pod = b.run_pod(&config).await?;
        pods.push((pod, config));
    }
    for i in 0..=n {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let b = &mut benches[which];
            let config = b.pod_config(false);
            let (run, stop, remove_pod) = b.pod_cycle(&config).await?;
            let (pod, pod_config) = &pods[which];
            let t = b.container_cycle(pod, pod_config).await?;
            if i > 0 {
                let took = [
                    run,
                    stop,
                    remove_pod,
                    t.create + t.start,
                    t.create,
                    t.start,
                    t.exec,
                    t.stop,
                    t.remove,
                ];
                for (t, took) in times.iter_mut().zip(took) {
                    t[which].push(took);
                }
            }
        }
    }
    for (b, (pod, _)) in benches.iter_mut().zip(&pods) {
        b.remove_pod(pod).await?;
    }
    Ok(LABELS.into_iter().zip(times).collect())
}

/// `--host-mounts N`: N small tmpfs mounts in a temporary directory, which detaches them when
/// dropped.
fn add_host_mounts(n: usize) -> Result<Option<TestDir>> {
    if n == 0 {
        return Ok(None);
    }
    let dir = TestDir::new("host-mounts")?;
    for i in 0..n {
        let target = dir.join(i.to_string());
        std::fs::create_dir(&target)?;
        nix::mount::mount(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=4k"),
        )
        .map_err(|e| format!("mount a tmpfs on {}: {e}", target.display()))?;
    }
    Ok(Some(dir))
}

/// Entries in the bench's own `/proc/self/mountinfo`: the host's mount table.
fn host_mount_count() -> Result<usize> {
    Ok(std::fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .count())
}

/// `--serve`: pushes the pause image too, points `--hosts-dir`'s mirror at the registry and
/// keeps it serving until stdin is closed, for pulls timed from outside (e.g. `crictl pull`).
async fn serve(args: &Args, registry: &Registry, work: &TestDir) -> Result<()> {
    let hosts_dir = args.hosts_dir.as_deref().ok_or("--hosts-dir missing")?;
    write_mirror(hosts_dir, &args.mirror, &registry.host_port())?;
    push_pause_image(registry, work)?;
    let m = &args.mirror;
    println!("registry {} serves (as {m}):", registry.host_port());
    println!("  {m}/{BIG_REPOSITORY}:v1");
    println!("  {m}/{}:latest", TestImage::Busybox.repository());
    println!("  {m}/{PAUSE_REPOSITORY}:latest");
    println!("close stdin to stop");
    tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
        .await??;
    Ok(())
}

struct Names {
    busybox: String,
    big: String,
    pause: Option<String>,
}

#[derive(Default)]
struct Report {
    /// Lines of the burst and steady-state sections, printed as they are.
    extra: Vec<String>,
    daemon: String,
    big_pull: Option<(Duration, BigImage)>,
    busybox_pull: Duration,
    ops: Vec<(&'static str, Vec<Duration>)>,
    shim: Option<Memory>,
    shim_pid: u32,
    daemon_idle: Option<Memory>,
    daemon_loaded: Option<Memory>,
    shims_loaded: Memory,
    shims_found: usize,
    pods_started: usize,
    pods_start_time: Duration,
    pods_remove_time: Duration,
}

async fn measure(
    args: &Args,
    bench: &mut Bench,
    names: &Names,
    big: Option<&BigImage>,
    daemon_pid: Option<u32>,
    restart: Option<Restart<'_>>,
) -> Result<Report> {
    let version = bench
        .rt
        .version(VersionRequest::default())
        .await?
        .into_inner();
    let mut report = Report {
        daemon: format!("{} {}", version.runtime_name, version.runtime_version),
        ..Default::default()
    };
    println!("runtime: {}", report.daemon);

    if let Some(big) = big {
        let t = Instant::now();
        bench.pull(&names.big).await?;
        report.big_pull = Some((t.elapsed(), big.clone()));
        println!(
            "cold PullImage {}: {:.2} s",
            names.big,
            t.elapsed().as_secs_f64()
        );
    }
    if let Some(pause) = &names.pause {
        bench.pull(pause).await?;
    }
    let t = Instant::now();
    bench.pull(&names.busybox).await?;
    report.busybox_pull = t.elapsed();

    let n = args.iterations;
    // A call that does nothing: what a call costs the client, the transport and the server
    // before any of its work (the floor under every figure below).
    let mut versions = Vec::with_capacity(n);
    for i in 0..=n {
        let (done, took) = timed(bench.rt.version(VersionRequest::default())).await;
        done?;
        if i > 0 {
            versions.push(took);
        }
    }
    report.ops.push(("Version (does nothing)", versions));
    // RunPodSandbox, host network then bridge network (also with a user namespace where the
    // runtime advertises them); each pod removed again untimed.
    let userns = bench.advertises_userns().await?;
    for (label, host, own_users) in [
        ("RunPodSandbox (no network)", true, false),
        ("RunPodSandbox (bridge CNI)", false, false),
        ("RunPodSandbox (bridge CNI, user namespace)", false, true),
    ] {
        if own_users && !userns {
            continue;
        }
        let mut times = Vec::with_capacity(n);
        let (mut stops, mut removes) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..=n {
            let mut config = bench.pod_config(host);
            if own_users {
                with_userns(&mut config);
            }
            let (took, stop_took, remove_took) = bench.pod_cycle(&config).await?;
            // The first run is a warm-up.
            if i > 0 {
                times.push(took);
                stops.push(stop_took);
                removes.push(remove_took);
            }
        }
        report.ops.push((label, times));
        if !host && !own_users {
            report.ops.push(("StopPodSandbox (bridge CNI)", stops));
            report
                .ops
                .push(("RemovePodSandbox (stopped, bridge CNI)", removes));
        }
    }

    // Container operations in one pod without network.
    let pod_config = bench.pod_config(true);
    let pod = bench.run_pod(&pod_config).await?;
    let mut create_start = Vec::with_capacity(n);
    let mut creates = Vec::with_capacity(n);
    let mut starts = Vec::with_capacity(n);
    let mut exec = Vec::with_capacity(n);
    let mut stop_remove = Vec::with_capacity(n);
    let mut removes = Vec::with_capacity(n);
    for i in 0..=n {
        let t = bench.container_cycle(&pod, &pod_config).await?;
        if i > 0 {
            create_start.push(t.create + t.start);
            creates.push(t.create);
            starts.push(t.start);
            exec.push(t.exec);
            stop_remove.push(t.stop + t.remove);
            removes.push(t.remove);
        }
    }
    report
        .ops
        .push(("CreateContainer+StartContainer", create_start));
    report.ops.push(("CreateContainer", creates));
    report.ops.push(("StartContainer", starts));
    report.ops.push(("ExecSync true", exec));
    report
        .ops
        .push(("StopContainer(0)+RemoveContainer", stop_remove));
    report.ops.push(("RemoveContainer (stopped)", removes));
    bench.remove_pod(&pod).await?;

    // The same in a user-namespaced pod: the rootfs is an overlay over idmapped layers.
    if userns {
        let mut pod_config = bench.pod_config(false);
        with_userns(&mut pod_config);
        let pod = bench.run_pod(&pod_config).await?;
        let mut create_start = Vec::with_capacity(n);
        for i in 0..=n {
            let (id, took) = timed(bench.create_start(&pod, &pod_config)).await;
            let id = id?;
            bench.stop_remove(&id).await?;
            if i > 0 {
                create_start.push(took);
            }
        }
        report.ops.push((
            "CreateContainer+StartContainer (user namespace)",
            create_start,
        ));
        bench.remove_pod(&pod).await?;
    }

    // One pod (bridge network) with one sleep container: its shim's memory.
    let pod_config = bench.pod_config(false);
    let pod = bench.run_pod(&pod_config).await?;
    let container = bench.create_start(&pod, &pod_config).await?;
    // Let the shim settle after the start (buffers of the start are freed, log file open).
    tokio::time::sleep(Duration::from_millis(500)).await;
    match find_shim(&pod) {
        Some(pid) => {
            report.shim = Some(Memory::of(pid)?);
            report.shim_pid = pid;
        }
        None => eprintln!("no shim process found for pod {pod}"),
    }
    // What a probe costs in CPU: ExecSync `true` in that container, one call after another.
    // The clock ticks are 10 ms, hence many calls.
    if report.shim_pid != 0 {
        let calls = (n * 5).max(200);
        let daemon = daemon_pid.map_or(0.0, cpu_seconds);
        let shim = cpu_seconds(report.shim_pid);
        for _ in 0..calls {
            bench.exec_true(&container).await?;
        }
        let per_call = |before: f64, after: f64| (after - before) * 1e3 / calls as f64;
        let daemon = daemon_pid.map(|pid| per_call(daemon, cpu_seconds(pid)));
        let shim = per_call(shim, cpu_seconds(report.shim_pid));
        report.extra.push(String::new());
        report.extra.push(match daemon {
            Some(daemon) => format!(
                "CPU per ExecSync ({calls} in a row): daemon {daemon:.2} ms, shim and its \
                 children {shim:.2} ms, together {:.2} ms",
                daemon + shim
            ),
            None => {
                format!("CPU per ExecSync ({calls} in a row): shim and its children {shim:.2} ms")
            }
        });
    }
    bench.stop_remove(&container).await?;
    bench.remove_pod(&pod).await?;

    // Many pods at once, each with one sleep container.
    if let Some(pid) = daemon_pid {
        report.daemon_idle = Some(Memory::of(pid)?);
    }
    let t = Instant::now();
    let mut pods = Vec::with_capacity(args.pods);
    let mut containers = Vec::with_capacity(args.pods);
    for _ in 0..args.pods {
        let config = bench.pod_config(false);
        let id = bench.run_pod(&config).await?;
        containers.push(bench.create_start(&id, &config).await?);
        pods.push(id);
    }
    report.pods_start_time = t.elapsed();
    let running = bench.running_containers().await?;
    report.pods_started = running;
    if running != args.pods {
        eprintln!("only {running} of {} containers are running", args.pods);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let Some(pid) = daemon_pid {
        report.daemon_loaded = Some(Memory::of(pid)?);
    }
    if let Some(address) = &args.metrics {
        let t = Instant::now();
        let bytes = scrape(address)?;
        println!(
            "metrics scrape with {} pods: {} bytes in {:.2} ms",
            args.pods,
            bytes,
            t.elapsed().as_secs_f64() * 1e3
        );
        if let Some(pid) = daemon_pid {
            report.daemon_loaded = Some(Memory::of(pid)?);
        }
    }
    for pod in &pods {
        if let Some(pid) = find_shim(pod) {
            let m = Memory::of(pid)?;
            report.shims_loaded.rss_kib += m.rss_kib;
            report.shims_loaded.pss_kib += m.pss_kib;
            report.shims_found += 1;
        }
    }
    if args.steady > 0 {
        let lines = steady(bench, &pods, &containers, args.steady, daemon_pid).await?;
        report.extra.extend(lines);
    }
    // With --scale the restart is timed at its last step instead.
    let restart = match restart {
        Some(how) if args.scale.is_empty() => {
            let lines = restart_with_pods(bench, how, pods.len()).await?;
            report.extra.extend(lines);
            None
        }
        other => other,
    };
    let t = Instant::now();
    for pod in &pods {
        bench.remove_pod(pod).await?;
    }
    report.pods_remove_time = t.elapsed();
    if args.reads > 0 {
        let lines = reads_under_writes(bench, &names.busybox, args.reads, 10).await?;
        report.extra.extend(lines);
    }
    if !args.scale.is_empty() {
        let lines = scale_curve(bench, &args.scale, daemon_pid, restart).await?;
        report.extra.extend(lines);
    }
    if args.burst {
        report.extra.push(String::new());
        report.extra.push(format!(
            "{:<34} {:>8} {:>12} {:>12}",
            "burst (pod + 1 container)", "wall s", "p50 pod ms", "p99 pod ms"
        ));
        let curve = [1, 2, 5, 10, 20].map(|p| (20, p));
        for (total, parallel) in curve.into_iter().chain([(30, 10), (60, 20)]) {
            let (wall, mut times) = burst(bench, total, parallel).await?;
            times.sort();
            report.extra.push(format!(
                "{:<34} {:>8.2} {:>12.1} {:>12.1}",
                format!("{total} pods, {parallel} at a time"),
                wall.as_secs_f64(),
                ms(percentile(&times, 50)),
                ms(percentile(&times, 99))
            ));
        }
    }
    Ok(report)
}

/// Seconds over which the scale curve measures the idle CPU of the daemon and the shims.
const SCALE_IDLE_SECS: u64 = 20;

/// `--scale`: pods with one container each started 10 at a time up to each step; at each step
/// the daemon's RSS, the shims' PSS, the idle CPU of daemon and shims per minute, the reads
/// kubelet makes (p50, p99), the two stats lists, and one more pod's RunPodSandbox and create +
/// start; at the last step the restart (with `--restart`). One row per step, then everything is
/// removed.
async fn scale_curve(
    bench: &mut Bench,
    steps: &[usize],
    daemon_pid: Option<u32>,
    restart: Option<Restart<'_>>,
) -> Result<Vec<String>> {
    let mut pods: Vec<String> = Vec::new();
    let mut containers: Vec<String> = Vec::new();
    let mut rows = vec![
        String::new(),
        format!(
            "{:<6} {:>8} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8}",
            "pods",
            "rss MB",
            "shims MB",
            "cpu s/m",
            "CS p50",
            "CS p99",
            "LC p50",
            "LC p99",
            "LP p50",
            "LP p99",
            "LCS ms",
            "LPS ms",
            "+pod ms",
            "+c+s ms"
        ),
    ];
    for &step in steps {
        while pods.len() < step {
            let batch = (step - pods.len()).min(10);
            let mut tasks = Vec::with_capacity(batch);
            for _ in 0..batch {
                let mut b = bench.clone();
                bench.seq += 1_000;
                tasks.push(tokio::spawn(async move {
                    let config = b.pod_config(false);
                    let pod = b.run_pod(&config).await.map_err(|e| e.to_string())?;
                    let container = b
                        .create_start(&pod, &config)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>((pod, container))
                }));
            }
            for t in tasks {
                let (pod, container) = t.await??;
                pods.push(pod);
                containers.push(container);
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let shims = shims_of(&pods);
        if shims.len() < pods.len() {
            eprintln!("scale: {} shims found for {} pods", shims.len(), pods.len());
        }
        let rss = daemon_pid
            .map(Memory::of)
            .transpose()?
            .map_or(0.0, |m| m.rss_kib as f64 / 1024.0);
        let mut shims_pss = 0u64;
        for pid in &shims {
            shims_pss += Memory::of(*pid).map_or(0, |m| m.pss_kib);
        }
        let mut all: Vec<u32> = shims.clone();
        all.extend(daemon_pid);
        let cpu = |pids: &[u32]| -> f64 { pids.iter().map(|p| cpu_seconds(*p)).sum() };
        let before = cpu(&all);
        tokio::time::sleep(Duration::from_secs(SCALE_IDLE_SECS)).await;
        let idle_cpu = (cpu(&all) - before) * 60.0 / SCALE_IDLE_SECS as f64;

        let n = 100;
        let (mut cs, mut lc, mut lp) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let id = containers[i % containers.len()].clone();
            let t = Instant::now();
            bench
                .rt
                .container_status(ContainerStatusRequest {
                    container_id: id,
                    verbose: false,
                })
                .await?;
            cs.push(t.elapsed());
            let t = Instant::now();
            bench
                .rt
                .list_containers(ListContainersRequest::default())
                .await?;
            lc.push(t.elapsed());
            let t = Instant::now();
            bench
                .rt
                .list_pod_sandbox(ListPodSandboxRequest::default())
                .await?;
            lp.push(t.elapsed());
        }
        let (mut lcs, mut lps) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let t = Instant::now();
            bench
                .rt
                .list_container_stats(ListContainerStatsRequest::default())
                .await?;
            lcs.push(t.elapsed());
            let t = Instant::now();
            bench
                .rt
                .list_pod_sandbox_stats(ListPodSandboxStatsRequest::default())
                .await?;
            lps.push(t.elapsed());
        }
        let (mut more_pod, mut more_cs) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let config = bench.pod_config(false);
            let t = Instant::now();
            let pod = bench.run_pod(&config).await?;
            more_pod.push(t.elapsed());
            let t = Instant::now();
            let made = bench.create_start(&pod, &config).await;
            more_cs.push(t.elapsed());
            bench.remove_pod(&pod).await?;
            made?;
        }
        for v in [
            &mut cs,
            &mut lc,
            &mut lp,
            &mut lcs,
            &mut lps,
            &mut more_pod,
            &mut more_cs,
        ] {
            v.sort();
        }
        let p = |v: &[Duration], q: usize| ms(percentile(v, q));
        rows.push(format!(
            "{:<6} {:>8.1} {:>9.1} {:>9.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            pods.len(),
            rss,
            shims_pss as f64 / 1024.0,
            idle_cpu,
            p(&cs, 50),
            p(&cs, 99),
            p(&lc, 50),
            p(&lc, 99),
            p(&lp, 50),
            p(&lp, 99),
            p(&lcs, 50),
            p(&lps, 50),
            p(&more_pod, 50),
            p(&more_cs, 50)
        ));
        println!("{}", rows[rows.len() - 1]);
    }
    rows.push(
        "(rss: the daemon's; shims: their PSS summed; cpu: daemon + shims, CPU seconds a minute \
         idle; CS ContainerStatus, LC ListContainers, LP ListPodSandbox, ms; LCS/LPS \
         ListContainerStats/ListPodSandboxStats p50; +pod one more RunPodSandbox, +c+s its \
         CreateContainer + StartContainer, p50 of 5)"
            .into(),
    );
    if let Some(how) = restart {
        rows.extend(restart_with_pods(bench, how, pods.len()).await?);
    }
    let t = Instant::now();
    for pod in &pods {
        bench.remove_pod(pod).await?;
    }
    rows.push(format!(
        "scale: {} pods removed in {:.1} s",
        pods.len(),
        t.elapsed().as_secs_f64()
    ));
    Ok(rows)
}

/// The shims of `pods`, from one pass over `/proc` (a pass per pod is slow with 500 of them).
fn shims_of(pods: &[String]) -> Vec<u32> {
    let wanted: std::collections::HashSet<&[u8]> = pods.iter().map(|p| p.as_bytes()).collect();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let mut args = cmdline.split(|b| *b == 0);
        let Some(argv0) = args.next() else { continue };
        let program = String::from_utf8_lossy(argv0);
        let base = program.rsplit('/').next().unwrap_or("");
        if base.contains("shim") && !base.contains("helper") && args.any(|a| wanted.contains(a)) {
            found.push(pid);
        }
    }
    found
}

/// How `--restart` restarts the daemon.
enum Restart<'a> {
    /// crius, started by the bench: started again on the same directories.
    Crius(&'a mut Daemon),
    /// The runtime at `--daemon-pid`: its command line (with its environment and working
    /// directory) run again in a session of its own, its output to `log`.
    Other { pid: u32, log: PathBuf },
}

/// `--restart`: with `pods` pods running (one container each), the daemon killed with SIGKILL
/// and started again, as by an upgrade or a crash and its service manager. Times from the
/// start until it answers `Version`, until it lists every pod ready and every container
/// running, and until an `ExecSync` in a container works (what kubelet needs of it again).
async fn restart_with_pods(
    bench: &mut Bench,
    how: Restart<'_>,
    pods: usize,
) -> Result<Vec<String>> {
    let started = match how {
        Restart::Crius(daemon) => {
            daemon.kill()?;
            let t = Instant::now();
            daemon.start_again()?;
            println!("crius restarted (pid {})", daemon.pid());
            t
        }
        Restart::Other { pid, log } => {
            let (t, new) = restart_process(pid, &log)?;
            println!(
                "daemon {pid} killed and started again as pid {new} (output: {})",
                log.display()
            );
            t
        }
    };
    let deadline = started + Duration::from_secs(120);
    let poll = || async {
        if Instant::now() > deadline {
            return Err::<(), BoxError>("the daemon was not back within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok(())
    };
    while bench.rt.version(VersionRequest::default()).await.is_err() {
        poll().await?;
    }
    let answers = started.elapsed();
    loop {
        let listed = matches!(bench.ready_pods().await, Ok(n) if n == pods)
            && matches!(bench.running_containers().await, Ok(n) if n == pods);
        if listed {
            break;
        }
        poll().await?;
    }
    let lists = started.elapsed();
    let last = bench
        .running_container_ids()
        .await?
        .pop()
        .ok_or("no running container after the restart")?;
    loop {
        if matches!(bench.exec_true(&last).await, Ok(0)) {
            break;
        }
        poll().await?;
    }
    let execs = started.elapsed();
    Ok(vec![
        String::new(),
        format!("restart with {pods} pods (one container each), SIGKILL then started again:"),
        format!(
            "  answers Version after                      {:>9.1} ms",
            ms(answers)
        ),
        format!(
            "  lists every pod ready, container running   {:>9.1} ms",
            ms(lists)
        ),
        format!(
            "  ExecSync in a container works              {:>9.1} ms",
            ms(execs)
        ),
    ])
}

/// Kills `pid` with SIGKILL and runs its command line again (same environment and working
/// directory, a session of its own, output appended to `log`); returns when the new process
/// was started, and its pid.
fn restart_process(pid: u32, log: &Path) -> Result<(Instant, u32)> {
    use std::os::unix::ffi::OsStringExt;
    use std::os::unix::process::CommandExt;
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let split = |bytes: Vec<u8>| -> Vec<OsString> {
        bytes
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| OsString::from_vec(a.to_vec()))
            .collect()
    };
    let argv = split(std::fs::read(proc_dir.join("cmdline"))?);
    let env = split(std::fs::read(proc_dir.join("environ"))?);
    let cwd = std::fs::read_link(proc_dir.join("cwd"))?;
    let (program, args) = argv.split_first().ok_or("the daemon has no command line")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    // Gone once its parent (not the bench) has reaped it, or a zombie until then.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::read_to_string(proc_dir.join("stat")) {
            Err(_) => break,
            Ok(stat)
                if stat
                    .rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z')) =>
            {
                break
            }
            Ok(_) if Instant::now() > deadline => {
                return Err(format!("{pid} survived SIGKILL").into())
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    for var in &env {
        let bytes = var.as_encoded_bytes();
        if let Some(eq) = bytes.iter().position(|b| *b == b'=') {
            command.env(
                OsString::from_vec(bytes[..eq].to_vec()),
                OsString::from_vec(bytes[eq + 1..].to_vec()),
            );
        }
    }
    let t = Instant::now();
    let child = command.spawn()?;
    Ok((t, child.id()))
}

/// `--reads`: each read call `n` times in a row against one running pod and container, idle and
/// then while `writers` workers start and remove pods with a container each; a table of p50
/// and p99 idle and loaded, and loaded against idle.
async fn reads_under_writes(
    bench: &mut Bench,
    image: &str,
    n: usize,
    writers: usize,
) -> Result<Vec<String>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let pod_config = bench.pod_config(false);
    let pod = bench.run_pod(&pod_config).await?;
    let container = bench.create_start(&pod, &pod_config).await?;
    let names = [
        "ContainerStatus",
        "PodSandboxStatus",
        "ListContainers",
        "ListPodSandbox",
        "ImageStatus",
    ];
    async fn sample(
        b: &mut Bench,
        pod: &str,
        container: &str,
        image: &str,
        n: usize,
    ) -> Result<Vec<Vec<Duration>>> {
        let mut out: Vec<Vec<Duration>> = (0..5).map(|_| Vec::with_capacity(n)).collect();
        for _ in 0..n {
            let t = Instant::now();
            b.rt.container_status(ContainerStatusRequest {
                container_id: container.into(),
                verbose: false,
            })
            .await?;
            out[0].push(t.elapsed());
            let t = Instant::now();
            b.rt.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: pod.into(),
                verbose: false,
            })
            .await?;
            out[1].push(t.elapsed());
            let t = Instant::now();
            b.rt.list_containers(ListContainersRequest::default())
                .await?;
            out[2].push(t.elapsed());
            let t = Instant::now();
            b.rt.list_pod_sandbox(ListPodSandboxRequest::default())
                .await?;
            out[3].push(t.elapsed());
            let t = Instant::now();
            b.images
                .image_status(ImageStatusRequest {
                    image: Some(ImageSpec {
                        image: image.into(),
                        ..Default::default()
                    }),
                    verbose: false,
                })
                .await?;
            out[4].push(t.elapsed());
        }
        Ok(out)
    }
    let idle = sample(bench, &pod, &container, image, n).await?;

    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..writers {
        let mut b = bench.clone();
        b.seq = bench.seq + (w + 1) * 1_000_000;
        let stop = std::sync::Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let mut cycles = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let config = b.pod_config(false);
                let id = b.run_pod(&config).await.map_err(|e| e.to_string())?;
                let made = b
                    .create_start(&id, &config)
                    .await
                    .map_err(|e| e.to_string());
                b.remove_pod(&id).await.map_err(|e| e.to_string())?;
                made?;
                cycles += 1;
            }
            Ok::<_, String>((b, cycles))
        }));
    }
    // The writers get going before the reads are timed. The reads are made from a thread and
    // a connection of their own, so that they do not queue behind the writers' work in this
    // process (its two workers) but only behind what the runtime does.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reader = {
        let (socket, pod, container, image) = (
            bench.socket.clone(),
            pod.clone(),
            container.clone(),
            image.to_string(),
        );
        let mut b = bench.clone();
        std::thread::spawn(move || -> std::result::Result<Vec<Vec<Duration>>, String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let channel = crius_tests::crius::connect(&socket)
                    .await
                    .map_err(|e| e.to_string())?;
                b.rt = RuntimeServiceClient::new(channel.clone());
                b.images = image_service_client::ImageServiceClient::new(channel);
                sample(&mut b, &pod, &container, &image, n)
                    .await
                    .map_err(|e| e.to_string())
            })
        })
    };
    let loaded = tokio::task::spawn_blocking(move || {
        reader
            .join()
            .unwrap_or_else(|_| Err("the reader thread panicked".into()))
    })
    .await?
    .map_err(BoxError::from);
    stop.store(true, Ordering::SeqCst);
    let mut cycles = 0;
    let mut first_error = None;
    for w in workers {
        match w.await {
            Ok(Ok((b, c))) => {
                bench.seq = bench.seq.max(b.seq);
                cycles += c;
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    bench.remove_pod(&pod).await?;
    if let Some(e) = first_error {
        return Err(e.into());
    }
    let loaded = loaded?;
    let mut lines = vec![
        String::new(),
        format!(
            "{:<34} {:>9} {:>9} {:>10} {:>10} {:>8} {:>8}",
            format!("reads, idle / under {writers} writers"),
            "idle p50",
            "idle p99",
            "load p50",
            "load p99",
            "p50 ×",
            "p99 ×"
        ),
    ];
    for (i, name) in names.iter().enumerate() {
        let (mut a, mut b) = (idle[i].clone(), loaded[i].clone());
        a.sort();
        b.sort();
        let (a50, a99, b50, b99) = (
            ms(percentile(&a, 50)),
            ms(percentile(&a, 99)),
            ms(percentile(&b, 50)),
            ms(percentile(&b, 99)),
        );
        lines.push(format!(
            "{:<34} {a50:>9.2} {a99:>9.2} {b50:>10.2} {b99:>10.2} {:>8.1} {:>8.1}",
            format!("{name} ms"),
            b50 / a50,
            b99 / a99
        ));
    }
    lines.push(format!(
        "{:<34} {cycles} pods started and removed while {n} reads of each ran",
        "writers"
    ));
    Ok(lines)
}

/// Starts `total` pods, each with one container, `parallel` at a time (as kubelet does after
/// a node reboot); returns the wall time and each pod's time, then removes them (untimed).
async fn burst(
    bench: &mut Bench,
    total: usize,
    parallel: usize,
) -> Result<(Duration, Vec<Duration>)> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = std::sync::Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let mut workers = Vec::new();
    for w in 0..parallel {
        let mut b = bench.clone();
        b.seq = bench.seq + (w + 1) * 1_000_000;
        let next = std::sync::Arc::clone(&next);
        workers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            while next.fetch_add(1, Ordering::SeqCst) < total {
                let t = Instant::now();
                let config = b.pod_config(false);
                let id = b.run_pod(&config).await.map_err(|e| e.to_string())?;
                b.create_start(&id, &config)
                    .await
                    .map_err(|e| e.to_string())?;
                out.push((id, t.elapsed()));
            }
            Ok::<_, String>((b, out))
        }));
    }
    let mut done = Vec::new();
    let mut first_error = None;
    for w in workers {
        match w.await {
            Ok(Ok((b, out))) => {
                bench.seq = bench.seq.max(b.seq);
                done.extend(out);
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    let wall = t.elapsed();
    for (id, _) in &done {
        bench.remove_pod(id).await?;
    }
    if let Some(e) = first_error {
        return Err(e.into());
    }
    Ok((wall, done.into_iter().map(|(_, d)| d).collect()))
}

/// Kubelet's calls in steady state for `secs` seconds over the running pods: relist (pods and
/// containers) every second, stats every 10 s, and an ExecSync probe of each container every
/// 10 s, spread over the period. Reports the CPU time of the daemon and the pods' shims per
/// minute, and their memory afterwards.
async fn steady(
    bench: &mut Bench,
    pods: &[String],
    containers: &[String],
    secs: u64,
    daemon_pid: Option<u32>,
) -> Result<Vec<String>> {
    let shims: Vec<u32> = pods.iter().filter_map(|p| find_shim(p)).collect();
    let cpu = |pids: &[u32]| -> f64 { pids.iter().map(|p| cpu_seconds(*p)).sum() };
    let daemon: Vec<u32> = daemon_pid.into_iter().collect();
    let (d0, s0) = (cpu(&daemon), cpu(&shims));
    let end = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    let rt = bench.rt.clone();
    tasks.push(tokio::spawn(async move {
        let mut rt = rt;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        while Instant::now() < end {
            tick.tick().await;
            let _ = rt.list_pod_sandbox(ListPodSandboxRequest::default()).await;
            let _ = rt.list_containers(ListContainersRequest::default()).await;
        }
    }));
    let rt = bench.rt.clone();
    tasks.push(tokio::spawn(async move {
        let mut rt = rt;
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        while Instant::now() < end {
            tick.tick().await;
            let _ = rt
                .list_container_stats(ListContainerStatsRequest::default())
                .await;
            let _ = rt
                .list_pod_sandbox_stats(ListPodSandboxStatsRequest::default())
                .await;
        }
    }));
    let n = containers.len().max(1) as u32;
    for (i, c) in containers.iter().enumerate() {
        let (mut b, c) = (bench.clone(), c.clone());
        let offset = Duration::from_secs(10) * i as u32 / n;
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            while Instant::now() < end {
                tick.tick().await;
                let _ = b.exec_true(&c).await;
            }
        }));
    }
    tokio::time::sleep_until(end.into()).await;
    for t in tasks {
        t.abort();
    }
    let (d1, s1) = (cpu(&daemon), cpu(&shims));
    let per_min = 60.0 / secs as f64;
    let mut lines = vec![
        String::new(),
        format!(
            "steady state, {} pods, {secs} s (relist 1 s, stats 10 s, ExecSync probe per pod 10 s):",
            pods.len()
        ),
        format!(
            "  CPU per minute: daemon {:.2} s, {} shims {:.2} s, together {:.2} s",
            (d1 - d0) * per_min,
            shims.len(),
            (s1 - s0) * per_min,
            (d1 - d0 + s1 - s0) * per_min
        ),
    ];
    if let Some(pid) = daemon_pid {
        lines.push(format!(
            "  daemon RSS afterwards: {} KiB",
            Memory::of(pid)?.rss_kib
        ));
    }
    let rss: u64 = shims
        .iter()
        .filter_map(|p| Memory::of(*p).ok())
        .map(|m| m.rss_kib)
        .sum();
    if !shims.is_empty() {
        lines.push(format!(
            "  shim RSS afterwards: {} KiB each on average",
            rss / shims.len() as u64
        ));
    }
    Ok(lines)
}

/// User + system CPU time of process `pid` and its reaped children so far, in seconds (0 if
/// it is gone).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // after the command name, which may hold spaces, in parentheses
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields 14 to 17 of the line (utime, stime, and the same of reaped children: a shim's
    // helpers, the daemon's CNI plugins) are 11 to 14 after the name
    let ticks: u64 = [11, 12, 13, 14]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf reads a constant of the system; no memory is touched.
    let hz = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    ticks as f64 / hz.max(1) as f64
}

/// Medians and p95 of each phase of `<what> phases` debug lines in crius's log.
fn phase_breakdown(log: &str, what: &str) -> Vec<String> {
    let mut phases: Vec<(String, Vec<Duration>)> = Vec::new();
    let needle = format!("{what} phases");
    for line in log.lines().filter(|l| l.contains(&needle)) {
        let Some((_, rest)) = line.split_once("phases=") else {
            continue;
        };
        for kv in rest.split_whitespace() {
            let Some((name, v)) = kv.split_once('=') else {
                continue;
            };
            let Some(ms) = v.strip_suffix("ms").and_then(|v| v.parse::<f64>().ok()) else {
                continue;
            };
            let d = Duration::from_secs_f64(ms / 1e3);
            match phases.iter_mut().find(|(n, _)| n == name) {
                Some((_, v)) => v.push(d),
                None => phases.push((name.to_string(), vec![d])),
            }
        }
    }
    // in the order of the call with the most phases (a pod with a network)
    let order: Vec<String> = log
        .lines()
        .filter(|l| l.contains(&needle))
        .filter_map(|l| l.split_once("phases=").map(|(_, r)| r))
        .max_by_key(|r| r.split_whitespace().count())
        .map(|r| {
            r.split_whitespace()
                .filter_map(|kv| kv.split_once('=').map(|(n, _)| n.to_string()))
                .collect()
        })
        .unwrap_or_default();
    phases.sort_by_key(|(name, _)| order.iter().position(|o| o == name));
    phases
        .into_iter()
        .map(|(name, mut v)| {
            v.sort();
            format!(
                "  {:<16} {:>8.2} {:>8.2}   (n = {})",
                name,
                ms(percentile(&v, 50)),
                ms(percentile(&v, 95)),
                v.len()
            )
        })
        .collect()
}

impl Report {
    fn print(&self, args: &Args) {
        println!();
        println!("runtime: {}", self.daemon);
        if let Some((t, big)) = &self.big_pull {
            println!(
                "cold PullImage of a {}-layer image, {:.1} MB compressed / {:.1} MB unpacked: {:.2} s ({:.0} MB/s unpacked)",
                big.layers,
                mb(big.compressed),
                mb(big.uncompressed),
                t.as_secs_f64(),
                mb(big.uncompressed) / t.as_secs_f64().max(1e-9)
            );
        }
        // The big image's first layer is busybox's: pulled after it, busybox's manifest and
        // config are all there is to fetch.
        let what = match self.big_pull {
            Some(_) => "its 1 MB layer already stored by the big image",
            None => "one 1 MB layer fetched and unpacked",
        };
        println!(
            "PullImage busybox ({what}): {:.1} ms",
            ms(self.busybox_pull)
        );
        println!();
        println!(
            "{:<48} {:>10} {:>10} {:>10}   (n = {})",
            "operation", "median ms", "p95 ms", "max ms", args.iterations
        );
        for (label, times) in &self.ops {
            let mut sorted = times.clone();
            sorted.sort();
            println!(
                "{:<48} {:>10.2} {:>10.2} {:>10.2}",
                label,
                ms(percentile(&sorted, 50)),
                ms(percentile(&sorted, 95)),
                ms(sorted.last().copied().unwrap_or_default())
            );
        }
        println!();
        if let Some(m) = &self.shim {
            println!(
                "shim (pid {}) with 1 container: RSS {} KiB, PSS {} KiB (anon {} KiB)",
                self.shim_pid, m.rss_kib, m.pss_kib, m.anon_kib
            );
        }
        if let Some(m) = &self.daemon_idle {
            println!(
                "daemon RSS before the {} pods: {} KiB (anon {} KiB, {} threads)",
                args.pods, m.rss_kib, m.anon_kib, m.threads
            );
        }
        if let Some(m) = &self.daemon_loaded {
            println!(
                "daemon RSS with {} pods running: {} KiB (PSS {} KiB; anon {} KiB, file {} KiB; {} threads)",
                self.pods_started,
                m.rss_kib,
                m.pss_kib,
                m.anon_kib,
                m.rss_kib - m.anon_kib,
                m.threads
            );
        }
        println!(
            "{} shims of those pods: RSS {} KiB, PSS {} KiB in total",
            self.shims_found, self.shims_loaded.rss_kib, self.shims_loaded.pss_kib
        );
        println!(
            "start of {} pods with one container each: {:.2} s; removal: {:.2} s",
            args.pods,
            self.pods_start_time.as_secs_f64(),
            self.pods_remove_time.as_secs_f64()
        );
        for line in &self.extra {
            println!("{line}");
        }
    }
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

async fn timed<T>(f: impl Future<Output = T>) -> (T, Duration) {
    let t = Instant::now();
    let out = f.await;
    (out, t.elapsed())
}

/// The CRI calls of the bench, on one connection.
/// Gives the pod a user namespace mapping 65536 ids from host id 400000 (kubelet's shape).
fn with_userns(config: &mut PodSandboxConfig) {
    let map = vec![IdMapping {
        host_id: 400_000,
        container_id: 0,
        length: 65536,
    }];
    if let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        // a user namespace goes with the pod's own PID namespace
        ns.pid = NamespaceMode::Pod as i32;
        ns.userns_options = Some(UserNamespace {
            mode: NamespaceMode::Pod as i32,
            uids: map.clone(),
            gids: map,
        });
    }
}

/// How long each call of [`Bench::container_cycle`] took.
struct ContainerCycle {
    create: Duration,
    start: Duration,
    exec: Duration,
    stop: Duration,
    remove: Duration,
}

#[derive(Clone)]
struct Bench {
    rt: RuntimeServiceClient<Channel>,
    /// The runtime's socket, for a connection of another thread's own (`--reads`).
    socket: PathBuf,
    /// The RuntimeClass handler every pod names (`--runtime-handler`; empty: the default).
    handler: String,
    images: image_service_client::ImageServiceClient<Channel>,
    logs: PathBuf,
    busybox: String,
    seq: usize,
}

impl Bench {
    async fn pull(&mut self, image: &str) -> Result<String> {
        let reply = self
            .images
            .pull_image(PullImageRequest {
                image: Some(ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .map_err(|s| format!("PullImage {image}: {s}"))?;
        Ok(reply.into_inner().image_ref)
    }

    /// A kubelet-like pod config with a fresh name; `host` selects the node's network.
    fn pod_config(&mut self, host: bool) -> PodSandboxConfig {
        self.seq += 1;
        let name = format!("crius-bench-{}", self.seq);
        let uid = format!("uid-{name}");
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.clone(),
                uid: uid.clone(),
                namespace: NAMESPACE.into(),
                attempt: 0,
            }),
            hostname: if host { String::new() } else { name.clone() },
            log_directory: self.logs.join(&name).display().to_string(),
            labels: HashMap::from([(LABEL.to_string(), "true".to_string())]),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("/{CGROUP_ROOT}/pod-{uid}"),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: if host {
                            NamespaceMode::Node as i32
                        } else {
                            NamespaceMode::Pod as i32
                        },
                        pid: NamespaceMode::Container as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Whether the handler the bench uses advertises user namespaces.
    async fn advertises_userns(&mut self) -> Result<bool> {
        let status = self
            .rt
            .status(StatusRequest { verbose: false })
            .await
            .map_err(|s| format!("Status: {s}"))?
            .into_inner();
        Ok(status
            .runtime_handlers
            .iter()
            .any(|h| h.name == self.handler && h.features.is_some_and(|f| f.user_namespaces)))
    }

    async fn run_pod(&mut self, config: &PodSandboxConfig) -> Result<String> {
        let reply = self
            .rt
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: self.handler.clone(),
            })
            .await
            .map_err(|s| format!("RunPodSandbox: {s}"))?;
        Ok(reply.into_inner().pod_sandbox_id)
    }

    async fn stop_pod(&mut self, id: &str) -> Result<()> {
        self.rt
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .map_err(|s| format!("StopPodSandbox {id}: {s}"))?;
        Ok(())
    }

    /// StopPodSandbox + RemovePodSandbox.
    async fn remove_pod(&mut self, id: &str) -> Result<()> {
        self.stop_pod(id).await?;
        self.rt
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .map_err(|s| format!("RemovePodSandbox {id}: {s}"))?;
        Ok(())
    }

    /// CreateContainer + StartContainer of busybox `sleep 3600`.
    async fn create_start(&mut self, pod: &str, pod_config: &PodSandboxConfig) -> Result<String> {
        Ok(self.create_start_split(pod, pod_config).await?.0)
    }

    /// [`Self::create_start`], with how long each of the two calls took.
    async fn create_start_split(
        &mut self,
        pod: &str,
        pod_config: &PodSandboxConfig,
    ) -> Result<(String, Duration, Duration)> {
        self.seq += 1;
        let name = format!("sleep-{}", self.seq);
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.clone(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: self.busybox.clone(),
                ..Default::default()
            }),
            command: vec!["sleep".into(), "3600".into()],
            log_path: format!("{name}.log"),
            labels: HashMap::from([(LABEL.to_string(), "true".to_string())]),
            // as kubelet: the pod's namespaces, its user namespace included (containerd 2
            // refuses a container whose user namespace differs from its pod's)
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    namespace_options: pod_config
                        .linux
                        .as_ref()
                        .and_then(|l| l.security_context.as_ref())
                        .and_then(|s| s.namespace_options.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let t = Instant::now();
        let id = self
            .rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .map_err(|s| format!("CreateContainer in {pod}: {s}"))?
            .into_inner()
            .container_id;
        let created = t.elapsed();
        let t = Instant::now();
        self.rt
            .start_container(StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .map_err(|s| format!("StartContainer {id}: {s}"))?;
        Ok((id, created, t.elapsed()))
    }

    /// A pod started, stopped and removed: how long each of the three calls took.
    async fn pod_cycle(
        &mut self,
        config: &PodSandboxConfig,
    ) -> Result<(Duration, Duration, Duration)> {
        let (id, run) = timed(self.run_pod(config)).await;
        let id = id?;
        let (done, stop) = timed(self.stop_pod(&id)).await;
        done?;
        let (done, remove) = timed(self.remove_pod(&id)).await;
        done?;
        Ok((run, stop, remove))
    }

    /// A container's whole life in `pod`: created, started, probed with `true`, stopped and
    /// removed, each call timed.
    async fn container_cycle(
        &mut self,
        pod: &str,
        pod_config: &PodSandboxConfig,
    ) -> Result<ContainerCycle> {
        let (id, create, start) = self.create_start_split(pod, pod_config).await?;
        let (code, exec) = timed(self.exec_true(&id)).await;
        let code = code?;
        if code != 0 {
            return Err(format!("ExecSync true in {id} exited {code}").into());
        }
        let (done, stop) = timed(self.stop(&id)).await;
        done?;
        let (done, remove) = timed(self.remove(&id)).await;
        done?;
        Ok(ContainerCycle {
            create,
            start,
            exec,
            stop,
            remove,
        })
    }

    async fn exec_true(&mut self, id: &str) -> Result<i32> {
        let reply = self
            .rt
            .exec_sync(ExecSyncRequest {
                container_id: id.into(),
                cmd: vec!["true".into()],
                timeout: 10,
            })
            .await
            .map_err(|s| format!("ExecSync {id}: {s}"))?;
        Ok(reply.into_inner().exit_code)
    }

    /// StopContainer with timeout 0 (straight to SIGKILL) + RemoveContainer.
    async fn stop_remove(&mut self, id: &str) -> Result<()> {
        self.stop(id).await?;
        self.remove(id).await
    }

    /// StopContainer with timeout 0.
    async fn stop(&mut self, id: &str) -> Result<()> {
        self.rt
            .stop_container(StopContainerRequest {
                container_id: id.into(),
                timeout: 0,
            })
            .await
            .map_err(|s| format!("StopContainer {id}: {s}"))?;
        Ok(())
    }

    async fn remove(&mut self, id: &str) -> Result<()> {
        self.rt
            .remove_container(RemoveContainerRequest {
                container_id: id.into(),
            })
            .await
            .map_err(|s| format!("RemoveContainer {id}: {s}"))?;
        Ok(())
    }

    async fn running_containers(&mut self) -> Result<usize> {
        Ok(self.running_container_ids().await?.len())
    }

    /// The ids of the bench's running containers.
    async fn running_container_ids(&mut self) -> Result<Vec<String>> {
        let list = self
            .rt
            .list_containers(ListContainersRequest {
                filter: Some(ContainerFilter {
                    state: Some(ContainerStateValue {
                        state: ContainerState::ContainerRunning as i32,
                    }),
                    label_selector: HashMap::from([(LABEL.to_string(), "true".to_string())]),
                    ..Default::default()
                }),
            })
            .await
            .map_err(|s| format!("ListContainers: {s}"))?;
        Ok(list
            .into_inner()
            .containers
            .into_iter()
            .map(|c| c.id)
            .collect())
    }

    async fn ready_pods(&mut self) -> Result<usize> {
        let list = self
            .rt
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    state: Some(PodSandboxStateValue {
                        state: PodSandboxState::SandboxReady as i32,
                    }),
                    label_selector: HashMap::from([(LABEL.to_string(), "true".to_string())]),
                    ..Default::default()
                }),
            })
            .await
            .map_err(|s| format!("ListPodSandbox: {s}"))?;
        Ok(list.into_inner().items.len())
    }

    /// Stops and removes every pod carrying the bench's label (also after a failure).
    async fn remove_all_pods(&mut self) -> Result<()> {
        let list = self
            .rt
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    label_selector: HashMap::from([(LABEL.to_string(), "true".to_string())]),
                    ..Default::default()
                }),
            })
            .await
            .map_err(|s| format!("ListPodSandbox: {s}"))?;
        let mut first_error = None;
        for pod in list.into_inner().items {
            if let Err(err) = self.remove_pod(&pod.id).await {
                eprintln!("cleanup: {err}");
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

/// Resident and proportional set size from `/proc/<pid>/smaps_rollup`.
#[derive(Debug, Default, Clone, Copy)]
struct Memory {
    rss_kib: u64,
    pss_kib: u64,
    /// Of the RSS: anonymous memory (heap, thread stacks); the rest is file-backed (text).
    anon_kib: u64,
    threads: u64,
}

impl Memory {
    fn of(pid: u32) -> Result<Memory> {
        let path = format!("/proc/{pid}/smaps_rollup");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("read {path}: {e}"))?;
        let field = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let threads =
            std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count() as u64);
        Ok(Memory {
            rss_kib: field("Rss:"),
            pss_kib: field("Pss:"),
            anon_kib: field("Anonymous:"),
            threads,
        })
    }
}

/// The shim serving `pod`: a process whose program name contains "shim" and whose arguments
/// include the pod id (crius-shim `--id <pod>`, containerd-shim-runc-v2 `-id <pod>`).
fn find_shim(pod: &str) -> Option<u32> {
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let mut args = cmdline.split(|b| *b == 0);
        let Some(argv0) = args.next() else { continue };
        let program = String::from_utf8_lossy(argv0);
        let base = program.rsplit('/').next().unwrap_or("");
        if base.contains("shim") && !base.contains("helper") && args.any(|a| a == pod.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// One `GET /metrics` on `address`: the bytes of the answer.
fn scrape(address: &str) -> Result<usize> {
    use std::io::Read as _;
    let mut tcp = std::net::TcpStream::connect(address)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(tcp, "GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw)?;
    if !raw.starts_with(b"HTTP/1.0 200") {
        return Err(format!("scrape {address}: {}", String::from_utf8_lossy(&raw)).into());
    }
    Ok(raw.len())
}

/// crius on `<work>/crius`, with its own CNI config and registry hosts dir, logging at info.
struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    /// The binary and its `--config`, `--root`, `--state` and `--listen`: started again so by
    /// `--restart`.
    command: (PathBuf, Vec<OsString>),
}

impl Daemon {
    /// crius as `CRIUS_BIN` and `CRIUS_SHIM_BIN` say (see [`Daemon::start_build`]).
    fn start(
        work: &TestDir,
        log: Option<&Path>,
        metrics: Option<&str>,
        nri: &str,
    ) -> Result<Daemon> {
        let bin = crius_tests::binary("crius")?;
        let shim = crius_tests::binary("crius-shim")?;
        Daemon::start_build(work, (&bin, &shim), false, log, metrics, nri)
    }

    /// Starts `crius` with `shim` in `work`; `second`: the other one of `--against`, with
    /// directories and a bridge network of its own.
    fn start_build(
        work: &TestDir,
        (bin, shim): (&Path, &Path),
        second: bool,
        log: Option<&Path>,
        metrics: Option<&str>,
        nri: &str,
    ) -> Result<Daemon> {
        // The shim the bench measures is the one the daemon starts, so A/B runs of two shim
        // builds work; made absolute, as the daemon resolves it itself.
        let shim =
            std::fs::canonicalize(shim).map_err(|e| format!("resolve {}: {e}", shim.display()))?;
        let (name, network, bridge, subnet) = match second {
            false => ("crius", "crius-bench", BRIDGE, SUBNET),
            true => ("crius-b", "crius-bench-b", BRIDGE_B, SUBNET_B),
        };
        let dir = work.join(name);
        let conf_dir = dir.join("net.d");
        let hosts = work.join("certs.d");
        for d in [&dir, &conf_dir, &hosts] {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(
            conf_dir.join("10-crius-bench.conflist"),
            conflist(network, bridge, subnet, &dir.join("ipam")),
        )?;
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "log_level = \"info,crius::pod::run=debug,crius::pod::stop=debug,crius::container::create=debug,crius::container::remove=debug,crius::pod::remove=debug\"\n\n[registry]\nconfig_path = \"{}\"\n\n\
                 [cni]\nconf_dir = \"{}\"\nbin_dirs = [\"{CNI_BIN}\"]\n\n\
                 [runtime]\nshim_path = \"{}\"\n{}",
                hosts.display(),
                conf_dir.display(),
                shim.display(),
                metrics.map_or(String::new(), |a| format!(
                    "\n[metrics]\naddress = \"{a}\"\n"
                ))
            ) + &format!(
                "\n[nri]\nenable = {}\nsocket_path = \"{}\"\n",
                nri != "off",
                dir.join("nri.sock").display()
            ),
        )?;
        let socket = dir.join("crius.sock");
        let log_path = log.map_or_else(|| dir.join("crius.log"), Path::to_path_buf);
        std::fs::File::create(&log_path)
            .map_err(|e| format!("create {}: {e}", log_path.display()))?;
        let args = vec![
            "--config".into(),
            config.into_os_string(),
            "--root".into(),
            dir.join("root").into_os_string(),
            "--state".into(),
            dir.join("state").into_os_string(),
            "--listen".into(),
            format!("unix://{}", socket.display()).into(),
        ];
        let command = (bin.to_path_buf(), args);
        let child = spawn_crius(&command, &log_path)?;
        println!(
            "crius: {} (pid {}), shim {}",
            bin.display(),
            child.id(),
            shim.display()
        );
        Ok(Daemon {
            child,
            socket,
            log: log_path,
            command,
        })
    }

    /// `--restart`: SIGKILL and reaped; returns once it is gone.
    fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Started again after [`Daemon::kill`], with the same command line and directories (its
    /// log appended to).
    fn start_again(&mut self) -> Result<()> {
        self.child = spawn_crius(&self.command, &self.log)?;
        Ok(())
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn connect(&self) -> Result<Channel> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if tokio::net::UnixStream::connect(&self.socket).await.is_ok() {
                return Ok(crius_tests::crius::connect(&self.socket).await?);
            }
            if Instant::now() > deadline {
                return Err(
                    format!("crius socket {} not up in 30 s", self.socket.display()).into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, then SIGKILL after 10 s; reaps it.
    fn stop(mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("crius did not stop within 10 s of SIGTERM; killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_crius((bin, args): &(PathBuf, Vec<OsString>), log: &Path) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(log)
        .map_err(|e| format!("open {}: {e}", log.display()))?;
    Ok(Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("start {}: {e}", bin.display()))?)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A bridge network conflist like the e2e tests use (no masquerade: no iptables rules).
fn conflist(name: &str, bridge: &str, subnet: &str, ipam_dir: &Path) -> String {
    json!({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": subnet}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": ipam_dir.display().to_string(),
            }
        }]
    })
    .to_string()
}

/// `<hosts_dir>/<mirror>/hosts.toml` sending pulls of `<mirror>/...` to the local registry.
fn write_mirror(hosts_dir: &Path, mirror: &str, registry: &str) -> Result<()> {
    let dir = hosts_dir.join(mirror);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\n\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )?;
    Ok(())
}

fn delete_link(name: &str) {
    let exists = Path::new("/sys/class/net").join(name).exists();
    if exists {
        match Command::new("ip").args(["link", "del", name]).status() {
            Ok(s) if s.success() => {}
            other => eprintln!("cleanup: ip link del {name}: {other:?}"),
        }
    }
}

/// Removes the (empty) cgroups below `crius-bench` in every hierarchy, deepest first.
fn remove_cgroups() {
    fn remove_tree(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    remove_tree(&entry.path());
                }
            }
        }
        if let Err(err) = std::fs::remove_dir(dir) {
            eprintln!("cleanup: rmdir {}: {err}", dir.display());
        }
    }
    let root = Path::new("/sys/fs/cgroup");
    let mut candidates = vec![root.join(CGROUP_ROOT)];
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            candidates.push(entry.path().join(CGROUP_ROOT));
        }
    }
    for dir in candidates {
        // Hierarchies mounted twice (cpu,cpuacct and its links) show the same dir again.
        if dir.is_dir() && !entry_is_symlinked(&dir) {
            remove_tree(&dir);
        }
    }
}

fn entry_is_symlinked(dir: &Path) -> bool {
    dir.parent()
        .and_then(|p| std::fs::symlink_metadata(p).ok())
        .map(|m| m.file_type().is_symlink())
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------------------------
// Images the bench pushes besides busybox.

#[derive(Debug, Clone, Default)]
struct BigImage {
    layers: usize,
    compressed: u64,
    uncompressed: u64,
}

/// A layer as pushed: gzip blob and the digest of the uncompressed tar.
struct Blob {
    gz: Vec<u8>,
    diff_id: String,
}

fn blob_of_tar(tar: &[u8]) -> Result<Blob> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(tar)?;
    Ok(Blob {
        gz: enc.finish()?,
        diff_id: crius_tests::sha256_digest(tar),
    })
}

/// Pushes an OCI image of `layers` (the busybox layer first) with `config` (an image config's
/// `config` object) to `repository:tag`.
fn push_image(
    registry: &Registry,
    repository: &str,
    tag: &str,
    config: serde_json::Value,
    layers: &[Blob],
) -> Result<()> {
    let client = registry.client();
    let base = images::busybox_layer()?;
    let mut diff_ids = vec![base.diff_id.clone()];
    let mut descriptors = vec![json!({
        "mediaType": images::OCI_LAYER_GZIP,
        "digest": client.push_blob(repository, &base.blob)?,
        "size": base.blob.len(),
    })];
    for layer in layers {
        diff_ids.push(layer.diff_id.clone());
        descriptors.push(json!({
            "mediaType": images::OCI_LAYER_GZIP,
            "digest": client.push_blob(repository, &layer.gz)?,
            "size": layer.gz.len(),
        }));
    }
    let config = serde_json::to_vec(&json!({
        "architecture": images::host_arch(),
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": images::OCI_MANIFEST,
        "config": {
            "mediaType": images::OCI_CONFIG,
            "digest": client.push_blob(repository, &config)?,
            "size": config.len(),
        },
        "layers": descriptors,
    }))?;
    client.push_manifest(repository, tag, images::OCI_MANIFEST, &manifest)?;
    Ok(())
}

/// A tar of regular files (parent dirs added as entries), all owned by root with a fixed mtime.
fn tar_of(files: &[(String, Vec<u8>)]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for (path, data) in files {
        let mut parent = String::new();
        for part in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map(|x| x.1)
            .unwrap_or(&[])
        {
            parent.push_str(part);
            parent.push('/');
            if dirs.insert(parent.clone()) {
                let mut h = tar::Header::new_ustar();
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_uid(0);
                h.set_gid(0);
                h.set_mtime(1_700_000_000);
                h.set_size(0);
                builder.append_data(&mut h, &parent, std::io::empty())?;
            }
        }
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(if path == "pause" { 0o755 } else { 0o644 });
        // Owner fields filled in: the layer unpacker refuses a header without them.
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        builder.append_data(&mut h, path, &data[..])?;
    }
    Ok(builder.into_inner()?)
}

/// The sandbox image for another runtime: crius-pause (static) as `/pause`.
fn push_pause_image(registry: &Registry, work: &TestDir) -> Result<()> {
    let shim = crius_tests::binary("crius-shim")?;
    let dest = work.join("pause");
    let status = Command::new(&shim)
        .arg("--install-pause")
        .arg(&dest)
        .status()?;
    if !status.success() {
        return Err(format!("{} --install-pause: {status}", shim.display()).into());
    }
    let layer = blob_of_tar(&tar_of(&[("pause".into(), std::fs::read(&dest)?)])?)?;
    push_image(
        registry,
        PAUSE_REPOSITORY,
        "latest",
        json!({"Entrypoint": ["/pause"], "Env": [images::ENV_PATH]}),
        &[layer],
    )
}

/// Text-like bytes: words from a small vocabulary picked by a xorshift generator (the data of
/// `image/benches/pull.rs`, so both benches pull an image of the same shape and compressibility).
struct Words {
    state: u64,
    vocab: Vec<Vec<u8>>,
}

impl Words {
    fn new(seed: u64) -> Words {
        let mut w = Words {
            state: seed | 1,
            vocab: Vec::new(),
        };
        for _ in 0..4096 {
            let len = 2 + (w.next() % 9) as usize;
            let word: Vec<u8> = (0..len).map(|_| b'a' + (w.next() % 26) as u8).collect();
            w.vocab.push(word);
        }
        w
    }

    fn next(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 16);
        while out.len() < n {
            let i = (self.next() % self.vocab.len() as u64) as usize;
            out.extend_from_slice(&self.vocab[i]);
            out.push(if self.next().is_multiple_of(12) {
                b'\n'
            } else {
                b' '
            });
        }
        out.truncate(n);
        out
    }
}

fn small_files(words: &mut Words, dir: &str, count: usize, max: usize) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for i in 0..count {
        if i % 100 == 0 {
            files.push((format!("{dir}/d{}/.keep", i / 100), Vec::new()));
        }
        let size = 256 + (words.next() as usize % max);
        files.push((format!("{dir}/d{}/f{i}.txt", i / 100), words.bytes(size)));
    }
    files
}

/// busybox plus four generated layers, ~200 MB unpacked: 8000 small files; two 40 MB files;
/// 4000 small files and a 30 MB file; one 30 MB file.
fn push_big_image(registry: &Registry) -> Result<BigImage> {
    let mut words = Words::new(0x5eed);
    let mut tars = vec![tar_of(&small_files(&mut words, "small-a", 8000, 7000))?];
    tars.push(tar_of(&[
        ("large/one.txt".into(), words.bytes(40_000_000)),
        ("large/two.txt".into(), words.bytes(40_000_000)),
    ])?);
    let mut files = small_files(&mut words, "small-b", 4000, 11000);
    files.push(("large/three.txt".into(), words.bytes(30_000_000)));
    tars.push(tar_of(&files)?);
    tars.push(tar_of(&[(
        "large/four.bin".into(),
        words.bytes(30_000_000),
    )])?);

    let base = images::busybox_layer()?;
    let mut info = BigImage {
        layers: tars.len() + 1,
        compressed: base.blob.len() as u64,
        uncompressed: 0,
    };
    let mut blobs = Vec::new();
    for tar in &tars {
        info.uncompressed += tar.len() as u64;
        let blob = blob_of_tar(tar)?;
        info.compressed += blob.gz.len() as u64;
        blobs.push(blob);
    }
    drop(tars);
    // busybox's own tar size is not known here; its blob is ~1 MB and counted compressed only.
    push_image(
        registry,
        BIG_REPOSITORY,
        "v1",
        json!({"Cmd": ["sh"], "Env": [images::ENV_PATH]}),
        &blobs,
    )?;
    Ok(info)
}
