//! Figures for the benchmarks: shim RSS/PSS with one container, create+start latency,
//! ExecSync `true` latency. Ignored by default (it takes a while and asserts only loosely);
//! run with `cargo test -p crius-shim --release --test measure -- --ignored --nocapture`
//! (`CRIUS_SHIM_BIN=<dir>/crius-shim` measures another build, its helper next to it).
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::{exec_process, runtime, Pod};
use crius_api::shim::ExecSync;

fn smaps_kib(pid: i32, key: &str) -> u64 {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.trim().trim_end_matches(" kB").trim().parse().ok()
        })
        .unwrap()
}

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let median = samples[samples.len() / 2];
    let p95 = samples[(samples.len() * 95 / 100).min(samples.len() - 1)];
    println!(
        "{name}: n={} median={:.2}ms p95={:.2}ms",
        samples.len(),
        median.as_secs_f64() * 1e3,
        p95.as_secs_f64() * 1e3
    );
}

#[test]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
fn footprint_and_latency() {
    // Launching a shim (fork, detach, control socket, pid file) until it reports ready.
    let mut launch = Vec::new();
    for i in 0..10 {
        let t = Instant::now();
        let pod = Pod::start_logging(&format!("launch{i}"), "info");
        launch.push(t.elapsed());
        drop(pod);
    }
    summary("shim launch", launch);

    // Exec and initialisation of the helper binary alone: an operation it refuses at once.
    let helper = common::shim_bin().with_file_name("crius-shim-helper");
    let mut noop = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let out = std::process::Command::new(&helper)
            .arg("no-op")
            .output()
            .unwrap();
        noop.push(t.elapsed());
        assert!(!out.status.success());
    }
    summary("helper exec (no-op)", noop);

    // The default log level, as in production.
    let pod = Pod::start_logging("measure", "info");
    runtime().block_on(async {
        let client = pod.client().await;

        let mut create_start = Vec::new();
        let (mut create, mut start, mut stop, mut delete) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..20 {
            let bundle = pod.bundle(&format!("cs{i}"), &["sleep", "1000"]);
            let t = Instant::now();
            let pid = client
                .create_container(pod.create_request(&bundle))
                .await
                .unwrap();
            create.push(t.elapsed());
            let t2 = Instant::now();
            client.start(&bundle.id).await.unwrap();
            start.push(t2.elapsed());
            create_start.push(t.elapsed());
            pod.track(pid);
            // As crius stops a container: signal the whole cgroup, wait for the exit.
            let t = Instant::now();
            client.kill(&bundle.id, libc::SIGKILL, true).await.unwrap();
            client
                .wait(&bundle.id, Some(Duration::from_secs(10)))
                .await
                .unwrap();
            stop.push(t.elapsed());
            let t = Instant::now();
            client.delete(&bundle.id, false).await.unwrap();
            delete.push(t.elapsed());
        }
        summary("create (busybox sleep)", create);
        summary("start", start);
        summary("kill all SIGKILL + wait", stop);
        summary("delete (exited)", delete);
        summary("create+start (busybox sleep)", create_start);

        // A create whose helper was started ahead (`prepare`, as crius asks for at the start of
        // CreateContainer), against one that spawns it, alternately.
        let (mut plain, mut prepared) = (Vec::new(), Vec::new());
        for i in 0..40 {
            let bundle = pod.bundle(&format!("p{i}"), &["sleep", "1000"]);
            if i % 2 == 1 {
                client.prepare().await.unwrap();
                // crius's own work before it asks for the create.
                std::thread::sleep(Duration::from_millis(2));
            }
            let t = Instant::now();
            let pid = client
                .create_container(pod.create_request(&bundle))
                .await
                .unwrap();
            match i % 2 {
                1 => prepared.push(t.elapsed()),
                _ => plain.push(t.elapsed()),
            }
            pod.track(pid);
            client.delete(&bundle.id, true).await.unwrap();
        }
        summary("create, helper spawned", plain);
        summary("create, helper prepared", prepared);

        let bundle = pod.bundle("main", &["sleep", "1000"]);
        pod.run(&client, &bundle).await;

        let mut exec = Vec::new();
        for _ in 0..30 {
            let t = Instant::now();
            let out = client
                .exec_sync(ExecSync {
                    id: bundle.id.clone(),
                    process: exec_process(&["true"]),
                    timeout_ms: 10_000,
                    output_limit: 0,
                })
                .await
                .unwrap();
            exec.push(t.elapsed());
            assert_eq!(out.exit_code, 0);
        }
        summary("exec_sync true", exec);

        std::thread::sleep(Duration::from_millis(300));
        let rss = smaps_kib(pod.shim_pid, "Rss");
        let pss = smaps_kib(pod.shim_pid, "Pss");
        let private = smaps_kib(pod.shim_pid, "Private_Dirty");
        println!("shim with 1 running container: rss={rss} KiB pss={pss} KiB private_dirty={private} KiB");
        client.delete(&bundle.id, true).await.unwrap();
    });
}
