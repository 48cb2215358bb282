//! `make install` and crius as a systemd service: the installed files, the unit (checked by
//! `systemd-analyze verify`), and the installed crius serving the CRI, answering `crius
//! status`, and telling a (fake) service manager READY=1 once its socket takes calls,
//! RELOADING=1 and READY=1 around a SIGHUP, and STOPPING=1 when it stops. `make deb`: the
//! package holds the same files, and its maintainer scripts add the bridge network only to a
//! node without one.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crius_api::v1::runtime_service_client::RuntimeServiceClient;
use crius_api::v1::*;
use crius_tests::{repo_dir, TestDir};

/// `make -C <repo>` in the environment `make test` ran in: without what cargo sets for this
/// test (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...). The cargo that make runs would take them
/// for a change of its environment: ring's build script watches `CARGO_MANIFEST_DIR`, and a
/// change reruns it and rebuilds everything above ring (40 s here, every time).
fn make() -> Command {
    let mut cmd = Command::new("make");
    cmd.arg("-C").arg(repo_dir());
    for (name, _) in std::env::vars_os() {
        let set_by_cargo = name.to_str().is_some_and(|n| {
            [
                "CARGO_PKG_",
                "CARGO_BIN_EXE_",
                "CARGO_MANIFEST_",
                "CARGO_CRATE_",
            ]
            .iter()
            .any(|p| n.starts_with(p))
                || matches!(n, "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR")
        });
        if set_by_cargo {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// `make install PROFILE=debug` with `vars`; the debug build exists when tests run.
fn make_install(vars: &[String]) {
    let out = make()
        .arg("install")
        .arg("PROFILE=debug")
        .args(vars)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "make install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the ELF file at `path` names a program interpreter (a `PT_INTERP` program header):
/// a dynamically linked executable does, a static one (also static-pie) does not.
fn has_interpreter(path: &Path) -> bool {
    const PT_INTERP: u32 = 3;
    let elf = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &elf[..5],
        b"\x7fELF\x02",
        "{}: not a 64-bit ELF file",
        path.display()
    );
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == PT_INTERP
    })
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn make_install_puts_binaries_unit_config_and_a_network_in_place() {
    let dir = TestDir::new("install").unwrap();
    let dest = dir.join("dest");
    make_install(&[format!("DESTDIR={}", dest.display()), "PREFIX=/usr".into()]);

    for bin in ["crius", "crius-shim", "crius-shim-helper"] {
        let path = dest.join("usr/bin").join(bin);
        assert_eq!(mode(&path), 0o755, "{bin}");
        // Linked statically (the Makefile's STATIC_ENV): no ld.so, no libc.so mapped.
        assert!(!has_interpreter(&path), "{bin} is a dynamic executable");
    }
    let unit_path = dest.join("usr/lib/systemd/system/crius.service");
    assert_eq!(mode(&unit_path), 0o644);
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    for line in [
        "Type=notify",
        "ExecStart=/usr/bin/crius",
        "Delegate=yes",
        "KillMode=process",
        "OOMScoreAdjust=-999",
        "LimitNOFILE=1048576",
        "WantedBy=multi-user.target",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "unit lacks {line:?}:\n{unit}"
        );
    }
    let config = dest.join("etc/crius/config.toml");
    let default = Command::new(crius_tests::binary("crius").unwrap())
        .args(["config", "default"])
        .output()
        .unwrap();
    assert_eq!(std::fs::read(&config).unwrap(), default.stdout);
    let conflist = dest.join("etc/cni/net.d/10-crius-bridge.conflist");
    let net: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&conflist).unwrap()).unwrap();
    assert_eq!(net["plugins"][0]["type"], "bridge");

    // Again over an edited config: the operator's file stays.
    std::fs::write(&config, "log_level = \"debug\"\n").unwrap();
    make_install(&[format!("DESTDIR={}", dest.display()), "PREFIX=/usr".into()]);
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "log_level = \"debug\"\n"
    );

    // A node that has a network already gets no second one.
    let other = dir.join("other");
    let net_d = other.join("etc/cni/net.d");
    std::fs::create_dir_all(&net_d).unwrap();
    std::fs::write(net_d.join("05-cluster.conflist"), "{}").unwrap();
    make_install(&[format!("DESTDIR={}", other.display()), "PREFIX=/usr".into()]);
    let names: Vec<_> = std::fs::read_dir(&net_d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["05-cluster.conflist"]);
}

/// A crius started by hand: stopped (SIGTERM, then SIGKILL after 10 s) if a test fails before
/// it does.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let until = Instant::now() + Duration::from_secs(10);
            while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// CLOCK_MONOTONIC in microseconds, the clock of sd_notify's MONOTONIC_USEC.
fn monotonic_usec() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    ts.tv_sec() as u64 * 1_000_000 + ts.tv_nsec() as u64 / 1_000
}

/// Receive one notification, waiting at most `limit`.
fn next_notification(socket: &UnixDatagram, limit: Duration) -> String {
    socket.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    let n = socket
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no notification within {limit:?}: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn the_installed_crius_serves_and_notifies_its_service_manager() {
    let dir = TestDir::new("installed").unwrap();
    let prefix = dir.join("usr");
    let etc = dir.join("etc");
    // Installed in place (no DESTDIR), so the unit names binaries that exist.
    make_install(&[
        format!("PREFIX={}", prefix.display()),
        format!("SYSCONFDIR={}", etc.display()),
    ]);
    let unit = prefix.join("lib/systemd/system/crius.service");
    match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "systemd-analyze verify: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!("systemd-analyze not run ({e}): the unit is not verified"),
    }

    let notify_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let socket = dir.join("crius.sock");
    let config = dir.join("config.toml");
    std::fs::write(&config, "").unwrap();
    let log = std::fs::File::create(dir.join("crius.log")).unwrap();
    let began = Instant::now();
    let child = Command::new(prefix.join("bin/crius"))
        .arg("--config")
        .arg(&config)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--listen")
        .arg(format!("unix://{}", socket.display()))
        .env("NOTIFY_SOCKET", &notify_path)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut child = Running(child);
    let ready = next_notification(&notify, Duration::from_secs(30));
    let ready_after = began.elapsed();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    eprintln!("READY=1 after {ready_after:?}");

    // READY means the socket takes calls: no retry here.
    let channel = crius_tests::crius::connect(&socket).await.unwrap();
    let mut rt = RuntimeServiceClient::new(channel);
    let version = rt
        .version(VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(version.runtime_name, "crius");
    let pod_config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "installed".into(),
            namespace: "default".into(),
            uid: "installed-uid".into(),
            attempt: 0,
        }),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod = rt
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(pod_config),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;

    // The installed `crius status`, with the socket from the installed config plus --listen.
    let out = Command::new(prefix.join("bin/crius"))
        .arg("--config")
        .arg(&config)
        .arg("--listen")
        .arg(format!("unix://{}", socket.display()))
        .arg("status")
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        status.lines().any(|l| l == "pods:        1 (1 ready)"),
        "{status}"
    );

    // SIGHUP (`systemctl reload`): RELOADING=1 stamped with the monotonic clock, then READY=1.
    let before = monotonic_usec();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let reloading = next_notification(&notify, Duration::from_secs(10));
    assert!(
        reloading.lines().any(|l| l == "RELOADING=1"),
        "{reloading:?}"
    );
    let stamp: u64 = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC in {reloading:?}"))
        .parse()
        .unwrap();
    assert!(
        (before..=monotonic_usec()).contains(&stamp),
        "MONOTONIC_USEC={stamp} not between {before} and now"
    );
    let ready = next_notification(&notify, Duration::from_secs(10));
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");

    rt.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    rt.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: pod,
    })
    .await
    .unwrap();
    drop(rt);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let stopping = next_notification(&notify, Duration::from_secs(10));
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let status = child.0.wait().unwrap();
    assert!(status.success(), "crius exited with {status}");
    // The shims crius started never saw NOTIFY_SOCKET (crius removes it from its environment).
    let log = std::fs::read_to_string(dir.join("crius.log")).unwrap();
    assert!(!log.contains("notify systemd"), "{log}");
}

/// `cmd` run to completion; its stdout, or a panic with its stderr.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn make_deb_packages_what_make_install_installs() {
    let has_cargo_deb = Command::new("cargo")
        .args(["deb", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_cargo_deb {
        eprintln!("skipped make_deb_packages_what_make_install_installs: cargo-deb is not installed (`make deb` installs it)");
        return;
    }
    let began = Instant::now();
    run(make().arg("deb"));
    eprintln!("make deb took {:?}", began.elapsed());
    let arch = run(Command::new("dpkg").arg("--print-architecture"));
    let deb = repo_dir().join(format!(
        "target/debian/crius_{}-1_{}.deb",
        env!("CARGO_PKG_VERSION"),
        arch.trim()
    ));
    assert!(deb.is_file(), "{} not made", deb.display());

    // The listing: every file with its mode, as `make install PREFIX=/usr` puts them.
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let files: Vec<(&str, &str)> = listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let mut fields = l.split_whitespace();
            let mode = fields.next().unwrap();
            (mode, fields.last().unwrap().trim_start_matches('.'))
        })
        .collect();
    for (path, mode) in [
        ("/usr/bin/crius", "-rwxr-xr-x"),
        ("/usr/bin/crius-shim", "-rwxr-xr-x"),
        ("/usr/bin/crius-shim-helper", "-rwxr-xr-x"),
        ("/usr/lib/systemd/system/crius.service", "-rw-r--r--"),
        ("/etc/crius/config.toml", "-rw-r--r--"),
        ("/usr/share/crius/10-crius-bridge.conflist", "-rw-r--r--"),
    ] {
        assert!(
            files.contains(&(mode, path)),
            "{path} ({mode}) missing:\n{listing}"
        );
    }
    // No network is shipped into /etc/cni: postinst decides (below).
    assert!(!listing.contains("etc/cni"), "{listing}");

    let dir = TestDir::new("deb").unwrap();
    let root = dir.join("root");
    let control = dir.join("control");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
    run(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control));

    // The same unit as `make install PREFIX=/usr`, the default config, the repo's network.
    let dest = dir.join("dest");
    make_install(&[format!("DESTDIR={}", dest.display()), "PREFIX=/usr".into()]);
    let unit = "usr/lib/systemd/system/crius.service";
    assert_eq!(
        std::fs::read_to_string(root.join(unit)).unwrap(),
        std::fs::read_to_string(dest.join(unit)).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/crius/config.toml")).unwrap(),
        std::fs::read_to_string(dest.join("etc/crius/config.toml")).unwrap()
    );
    assert_eq!(
        std::fs::read(root.join("usr/share/crius/10-crius-bridge.conflist")).unwrap(),
        std::fs::read(repo_dir().join("contrib/cni/10-crius-bridge.conflist")).unwrap()
    );
    // The packaged binaries run and accept the packaged config.
    let version = run(Command::new(root.join("usr/bin/crius")).arg("--version"));
    assert_eq!(
        version.trim(),
        format!("crius {}", env!("CARGO_PKG_VERSION"))
    );
    run(Command::new(root.join("usr/bin/crius"))
        .args(["config", "check"])
        .arg(root.join("etc/crius/config.toml")));

    // Control: dependencies, the config as a conffile, the maintainer scripts.
    let fields = std::fs::read_to_string(control.join("control")).unwrap();
    let depends = fields
        .lines()
        .find_map(|l| l.strip_prefix("Depends: "))
        .unwrap_or_else(|| panic!("no Depends in:\n{fields}"));
    // The three binaries are static (glibc and libseccomp linked in), so `$auto` adds no
    // shared library: what pods need is all the package depends on.
    for dep in ["containernetworking-plugins", "iptables", "iproute2"] {
        assert!(depends.contains(dep), "Depends lacks {dep}: {depends}");
    }
    for lib in ["libc6", "libseccomp2"] {
        assert!(
            !depends.contains(lib),
            "a static build depends on {lib}: {depends}"
        );
    }
    let conffiles = std::fs::read_to_string(control.join("conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/crius/config.toml");
    for script in ["postinst", "prerm", "postrm"] {
        assert_eq!(mode(&control.join(script)), 0o755, "{script}");
    }

    maintainer_scripts_add_the_network_only_to_a_node_without_one(&root, &control);
}

/// Runs postinst and postrm as dpkg would, in a mount namespace of their own whose /etc and
/// /usr/share are empty tmpfs (plus the package's files) and whose /run hides
/// /run/systemd/system, so they change nothing on this machine and never reach systemctl.
fn maintainer_scripts_add_the_network_only_to_a_node_without_one(root: &Path, control: &Path) {
    let script = format!(
        r#"set -e
mount -t tmpfs tmpfs /etc
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /usr/share
mkdir -p /usr/share/crius
cp {root}/usr/share/crius/10-crius-bridge.conflist /usr/share/crius/
# a fresh node: no CNI config dir at all
sh {control}/postinst configure ''
cmp /etc/cni/net.d/10-crius-bridge.conflist /usr/share/crius/10-crius-bridge.conflist
echo fresh: $(ls /etc/cni/net.d)
# a node with a network of its own gets none
rm /etc/cni/net.d/10-crius-bridge.conflist
echo '{{}}' > /etc/cni/net.d/05-cluster.conflist
sh {control}/postinst configure 0.0.9-1
echo networked: $(ls /etc/cni/net.d)
# purge removes what postinst wrote, nothing else
rm /etc/cni/net.d/05-cluster.conflist
sh {control}/postinst configure 0.0.9-1
sh {control}/postrm purge
echo purged: $(ls /etc/cni/net.d)
"#,
        root = root.display(),
        control = control.display()
    );
    let out = run(Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(script));
    assert_eq!(
        out, "fresh: 10-crius-bridge.conflist\nnetworked: 05-cluster.conflist\npurged:\n",
        "postinst/postrm"
    );
}
