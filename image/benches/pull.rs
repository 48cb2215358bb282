//! Cold pull benchmark: starts a local docker-registry, pushes a generated ~200 MB image (five
//! layers: busybox, many small files, a few large ones; text-like data that compresses about
//! 3:1), then pulls it into empty stores and prints seconds and MB/s for fetch alone, unpack
//! alone, and the pipelined pull+unpack crius does for real. Run:
//! `cargo bench -p crius-image --bench pull`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use crius_image::{Auth, ImageStore, PullOptions, StoreConfig};

/// Text-like bytes: words from a small vocabulary picked by a xorshift generator.
struct Words {
    state: u64,
    vocab: Vec<Vec<u8>>,
}

impl Words {
    fn new(seed: u64) -> Self {
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

fn small_files(words: &mut Words, dir: &str, count: usize, max: usize) -> Vec<Entry> {
    let mut entries = Vec::new();
    for i in 0..count {
        if i % 100 == 0 {
            entries.push(Entry::File(
                format!("{dir}/d{}/.keep", i / 100),
                vec![],
                0o644,
            ));
        }
        let size = 256 + (words.next() as usize % max);
        entries.push(Entry::File(
            format!("{dir}/d{}/f{i}.txt", i / 100),
            words.bytes(size),
            0o644,
        ));
    }
    entries
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn rate(bytes: u64, t: Duration) -> f64 {
    mb(bytes) / t.as_secs_f64().max(1e-9)
}

fn store(root: &std::path::Path, sync: bool) -> ImageStore {
    ImageStore::open(StoreConfig {
        root: root.to_path_buf(),
        registry_config_dir: None,
        sync_snapshots: sync,
        ..Default::default()
    })
    .unwrap()
}

/// This thread's (user, system) CPU seconds.
fn thread_cpu() -> (f64, f64) {
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to ru.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

/// The same cold pull+unpack with containerd (Debian's 1.6 here), through `ctr`, against the
/// same registry: the figure to beat.
fn containerd_pull(name: &str) -> Option<Duration> {
    if !std::path::Path::new("/usr/bin/containerd").exists() {
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("crius-image-bench-containerd")
        .tempdir()
        .unwrap();
    let sock = dir.path().join("containerd.sock");
    let config = format!(
        "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = \"{1}\"\n",
        dir.path().display(),
        sock.display()
    );
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let mut child = std::process::Command::new("/usr/bin/containerd")
        .arg("--config")
        .arg(dir.path().join("config.toml"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = Instant::now();
    let status = std::process::Command::new("/usr/bin/ctr")
        .arg("--address")
        .arg(&sock)
        .args([
            "--namespace",
            "crius-bench",
            "images",
            "pull",
            "--plain-http",
            name,
        ])
        .stdout(std::process::Stdio::null())
        .status();
    let elapsed = t.elapsed();
    // SAFETY: signalling the containerd process this function started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    status.ok().filter(|s| s.success()).map(|_| elapsed)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let t = Instant::now();
    let mut words = Words::new(0x5eed);
    let layers = vec![
        busybox_layer(),
        tar(&small_files(&mut words, "small-a", 8000, 7000)),
        tar(&[
            Entry::File("large/one.txt".into(), words.bytes(40_000_000), 0o644),
            Entry::File("large/two.txt".into(), words.bytes(40_000_000), 0o644),
        ]),
        {
            let mut e = small_files(&mut words, "small-b", 4000, 11000);
            e.push(Entry::File(
                "large/three.txt".into(),
                words.bytes(30_000_000),
                0o644,
            ));
            tar(&e)
        },
        tar(&[Entry::File(
            "large/four.bin".into(),
            words.bytes(30_000_000),
            0o644,
        )]),
    ];
    let tar_bytes: u64 = layers.iter().map(|l| l.len() as u64).sum();
    let reg = Registry::start();
    let pushed = Pusher::new(&reg)
        .image("crius/bench", "v1", &ImageSpec::new(layers.clone()))
        .await;
    let name = format!("{}/crius/bench:v1", reg.host());
    println!(
        "image: {} layers, {:.1} MB uncompressed, generated and pushed in {:.1} s",
        layers.len(),
        mb(tar_bytes),
        t.elapsed().as_secs_f64()
    );

    // Raw inflate speed of the biggest compressed layer, to see whether it bounds unpacking.
    let big = gzip(&layers[2]);
    let t = Instant::now();
    let mut d = flate2::read::MultiGzDecoder::new(&big[..]);
    let n = std::io::copy(&mut d, &mut std::io::sink()).unwrap();
    let inflate = t.elapsed();
    println!(
        "inflate (flate2 zlib-rs): {:.1} MB -> {:.0} MB/s",
        mb(n),
        rate(n, inflate)
    );

    let none = Auth::default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average: {}", load.trim());
    // Each layer alone, one at a time: user against system CPU time shows where unpacking
    // spends its time (on this VM, creating a file costs about 0.5 ms of kernel time).
    {
        let root = tempfile::Builder::new()
            .prefix("crius-image-bench")
            .tempdir()
            .unwrap();
        let s = store(root.path(), false);
        s.pull_with(&name, &none, PullOptions { unpack: false })
            .await
            .unwrap();
        for (i, layer) in pushed.layer_digests.iter().enumerate() {
            let digest = crius_image::Digest::parse(layer).unwrap();
            let diff = crius_image::Digest::parse(&sha256(&layers[i])).unwrap();
            let blob = s.content().path(&digest);
            let dest = root.path().join(format!("layer{i}"));
            let (wall, cpu, stats) = tokio::task::spawn_blocking(move || {
                let cpu0 = thread_cpu();
                let t = Instant::now();
                let st =
                    crius_image::unpack::unpack_layer(&blob, &digest, &diff, &dest, false).unwrap();
                let cpu = thread_cpu();
                (t.elapsed(), (cpu.0 - cpu0.0, cpu.1 - cpu0.1), st)
            })
            .await
            .unwrap();
            println!(
                "layer {i}: {} entries, {:.1} MB: wall {:.2} s, user {:.2} s, sys {:.2} s, {:.0} MB/s",
                stats.entries,
                mb(stats.tar_bytes),
                wall.as_secs_f64(),
                cpu.0,
                cpu.1,
                rate(stats.tar_bytes, wall)
            );
        }
    }

    // Split figures, once: fetch alone into an empty store, then unpack alone from it.
    {
        let root = tempfile::Builder::new()
            .prefix("crius-image-bench")
            .tempdir()
            .unwrap();
        let s = store(root.path(), true);
        let (_, fetch) = s
            .pull_with(&name, &none, PullOptions { unpack: false })
            .await
            .unwrap();
        let (rec, unpack) = s
            .pull_with(&name, &none, PullOptions::default())
            .await
            .unwrap();
        assert_eq!(rec.unwrap().id, pushed.config_digest);
        println!(
            "fetch {:.1} MB in {:.2} s = {:.0} MB/s | unpack {:.1} MB in {:.2} s = {:.0} MB/s",
            mb(fetch.fetched_bytes),
            fetch.fetch_time.as_secs_f64(),
            rate(fetch.fetched_bytes, fetch.fetch_time),
            mb(unpack.unpacked_bytes),
            unpack.unpack_time.as_secs_f64(),
            rate(unpack.unpacked_bytes, unpack.unpack_time),
        );
    }

    // Cold pull+unpack, crius and containerd taking turns so both see the same machine load.
    for run in 1..=3 {
        let n = name.clone();
        match tokio::task::spawn_blocking(move || containerd_pull(&n))
            .await
            .unwrap()
        {
            Some(d) => println!(
                "run {run}: containerd 1.6 cold pull+unpack {:.2} s = {:.0} MB/s of image",
                d.as_secs_f64(),
                rate(tar_bytes, d)
            ),
            None => println!("run {run}: containerd not available or failed"),
        }
        for sync in [true, false] {
            let root = tempfile::Builder::new()
                .prefix("crius-image-bench")
                .tempdir()
                .unwrap();
            let s = store(root.path(), sync);
            let t = Instant::now();
            s.pull_with(&name, &none, PullOptions::default())
                .await
                .unwrap();
            let total = t.elapsed();
            println!(
                "run {run}: crius (sync_snapshots={sync}) cold pull+unpack {:.2} s = {:.0} MB/s of image",
                total.as_secs_f64(),
                rate(tar_bytes, total),
            );
        }
    }
}
