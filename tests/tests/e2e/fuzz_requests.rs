//! Pod and container configs made at random from a valid one, each with one to three fields
//! set to values a confused or hostile client might send (paths with `..` or a NUL, numbers at
//! the edges of their types, devices and mounts in odd places, unknown words and modes). Every
//! answer must be a refusal with the request's code, or a pod and container that start and
//! run an exec: never Internal or Unknown from deep inside the runtime or the kernel, never a
//! message without bounds, and nothing left behind. The seeds are fixed, so a run is the same
//! each time; `CRIUS_FUZZ_SEED=N` (with `CRIUS_FUZZ_ROUNDS`) runs another.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use crate::common;
use crate::common::{Env, Rng};
use crius_api::v1::*;
use tonic::Code;

const PATHS: &[&str] = &[
    "",
    "/",
    "relative",
    ".",
    "..",
    "/a/../../etc",
    "/var/run/../run",
    "/proc",
    "/proc/self",
    "/proc/1/root",
    "/proc/sys/kernel",
    "/sys",
    "/sys/fs/cgroup",
    "/sys/kernel/security",
    "/dev",
    "/dev/null",
    "/dev/zero",
    "/dev/shm",
    "/dev/pts",
    "/etc",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/passwd",
    "/bin",
    "/bin/sh",
    "/tmp",
    "/tmp/x\u{0}y",
    "/run/crius-fuzz-missing/f",
    "/very/long/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
     aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
     aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
];

/// Device host paths: nodes, directories of /dev and elsewhere, and paths that are not.
const DEVICES: &[&str] = &[
    "",
    "relative",
    "/",
    "/dev",
    "/dev/null",
    "/dev/zero",
    "/dev/pts",
    "/dev/../etc",
    "/etc/hosts",
    "/no/such/device",
    "/dev/x\u{0}y",
];

/// What host paths and cgroup parents may name: paths inside the test's own directory and
/// cgroup, and values refused before anything is made. A mount of a host directory can have
/// the runtime make mount points and device nodes in it (a read-write bind at `/dev`), and a
/// missing host path, log directory or cgroup parent is made: on the node's own `/etc` or
/// cgroup root that would change the machine.
struct Host {
    paths: Vec<String>,
    cgroups: Vec<String>,
    dir: crius_tests::TestDir,
    _cgroup: common::HostCgroup,
}

impl Host {
    /// `tag` keeps the cgroups of tests running side by side apart.
    fn new(tag: &str) -> Host {
        let dir = crius_tests::TestDir::new("fuzz-host").unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("dir/sub")).unwrap();
        std::fs::write(d.join("file"), "x").unwrap();
        std::os::unix::fs::symlink("/no/such/target", d.join("dangling")).unwrap();
        std::os::unix::fs::symlink("loop", d.join("loop")).unwrap();
        let at = |rel: &str| d.join(rel).to_str().unwrap().to_string();
        let mut paths: Vec<String> = ["dir", "dir/sub", "file", "dangling", "loop", "missing/a"]
            .into_iter()
            .map(at)
            .collect();
        paths.extend(["", "relative", "..", "/dev/null"].map(String::from));
        paths.push(format!("{}/dir/../file", d.display()));
        paths.push(format!("{}/x\0y", d.display()));
        paths.push(format!("{}/{}", d.display(), "l".repeat(300)));
        let cgroup = common::HostCgroup::new(&format!("crius-fuzz-{tag}"));
        let mut cgroups: Vec<String> = ["", "/x", "/a b", "/../.."]
            .into_iter()
            .map(|rel| format!("{}{rel}", cgroup.name))
            .collect();
        cgroups.extend(["..", "/../../..", "//", "a/../..", "x\u{0}"].map(String::from));
        Host {
            paths,
            cgroups,
            dir,
            _cgroup: cgroup,
        }
    }

    fn pick(&self, rng: &mut Rng) -> String {
        self.paths[rng.below(self.paths.len() as u64) as usize].clone()
    }

    /// A path of [`Host::pick`] below the test's own directory, for a request that makes a
    /// file at `<path>/<name>`: joined to `""` or `..` it would name `/<name>` or a file
    /// beside crius's working directory, and a checkpoint written there stayed on the node.
    fn pick_inside(&self, rng: &mut Rng) -> String {
        let dir = self.dir.path().to_str().unwrap();
        let inside: Vec<&String> = self.paths.iter().filter(|p| p.starts_with(dir)).collect();
        inside[rng.below(inside.len() as u64) as usize].clone()
    }

    fn pick_cgroup(&self, rng: &mut Rng) -> String {
        self.cgroups[rng.below(self.cgroups.len() as u64) as usize].clone()
    }
}

const WORDS: &[&str] = &[
    "",
    "x",
    "=",
    "a=b",
    "\u{0}",
    "../x",
    "ALL",
    "CAP_SYS_ADMIN",
    "CAP_FOO",
    "sys_admin",
    "NET_RAW",
    "rwm",
    "rwmx",
    "r",
    "0",
    "99",
    "0-1",
    "1-0",
    "0,,1",
    "abc",
    "-1",
    "2MB",
    "1GB",
    "bogus",
    "memory.max",
    "cpu.weight",
    "pids.max",
    "io.max",
    "ro",
    "noexec",
    "strictatime",
];

const NUMBERS: &[i64] = &[
    0,
    -1,
    1,
    2,
    -1000,
    1000,
    4096,
    65535,
    65536,
    i32::MAX as i64,
    i32::MAX as i64 + 1,
    u32::MAX as i64,
    1 << 40,
    i64::MAX,
    i64::MIN,
];

fn number(rng: &mut Rng) -> i64 {
    NUMBERS[rng.below(NUMBERS.len() as u64) as usize]
}

/// Sets one field of `c` to an odd value; returns what it did.
fn mutate(c: &mut ContainerConfig, rng: &mut Rng, host: &Host) -> String {
    let linux = c.linux.get_or_insert_with(Default::default);
    let res = linux.resources.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    match rng.below(30) {
        0 => {
            let m = Mount {
                container_path: rng.pick(PATHS).into(),
                host_path: host.pick(rng),
                readonly: rng.below(2) == 1,
                propagation: rng.below(5) as i32,
                recursive_read_only: rng.below(4) == 0,
                selinux_relabel: rng.below(4) == 0,
                mount_options: match rng.below(3) {
                    0 => vec![rng.pick(WORDS).into()],
                    _ => Vec::new(),
                },
                ..Default::default()
            };
            let done = format!("{m:?}");
            c.mounts.push(m);
            done
        }
        1 => {
            let d = Device {
                container_path: rng.pick(PATHS).into(),
                host_path: rng.pick(DEVICES).into(),
                permissions: rng.pick(WORDS).into(),
            };
            let done = format!("{d:?}");
            c.devices.push(d);
            done
        }
        2 => {
            let (key, value) = (rng.pick(WORDS), rng.pick(WORDS));
            c.envs.push(KeyValue {
                key: key.into(),
                value: value.into(),
            });
            format!("env {key:?}={value:?}")
        }
        3 => {
            c.command = vec![rng.pick(PATHS).into()];
            format!("command {:?}", c.command)
        }
        4 => {
            c.working_dir = rng.pick(PATHS).into();
            format!("working_dir {:?}", c.working_dir)
        }
        5 => {
            res.cpu_period = number(rng);
            format!("cpu_period {}", res.cpu_period)
        }
        6 => {
            res.cpu_quota = number(rng);
            format!("cpu_quota {}", res.cpu_quota)
        }
        7 => {
            res.cpu_shares = number(rng);
            format!("cpu_shares {}", res.cpu_shares)
        }
        8 => {
            res.memory_limit_in_bytes = number(rng);
            format!("memory_limit {}", res.memory_limit_in_bytes)
        }
        9 => {
            res.oom_score_adj = number(rng);
            format!("oom_score_adj {}", res.oom_score_adj)
        }
        10 => {
            res.cpuset_cpus = rng.pick(WORDS).into();
            format!("cpuset_cpus {:?}", res.cpuset_cpus)
        }
        11 => {
            res.cpuset_mems = rng.pick(WORDS).into();
            format!("cpuset_mems {:?}", res.cpuset_mems)
        }
        12 => {
            let h = HugepageLimit {
                page_size: rng.pick(WORDS).into(),
                limit: number(rng) as u64,
            };
            let done = format!("{h:?}");
            res.hugepage_limits.push(h);
            done
        }
        13 => {
            let (key, value) = (rng.pick(WORDS), rng.pick(WORDS));
            res.unified.insert(key.into(), value.into());
            format!("unified {key:?}={value:?}")
        }
        14 => {
            res.memory_swap_limit_in_bytes = number(rng);
            format!("swap_limit {}", res.memory_swap_limit_in_bytes)
        }
        15 => {
            sc.run_as_user = Some(Int64Value { value: number(rng) });
            format!("run_as_user {:?}", sc.run_as_user)
        }
        16 => {
            sc.run_as_group = Some(Int64Value { value: number(rng) });
            sc.run_as_user.get_or_insert(Int64Value { value: 0 });
            format!("run_as_group {:?}", sc.run_as_group)
        }
        17 => {
            sc.run_as_username = rng.pick(WORDS).into();
            format!("run_as_username {:?}", sc.run_as_username)
        }
        18 => {
            let g = number(rng);
            sc.supplemental_groups.push(g);
            format!("supplemental_group {g}")
        }
        19 => {
            let cap = rng.pick(WORDS).to_string();
            let caps = sc.capabilities.get_or_insert_with(Default::default);
            let list = match rng.below(3) {
                0 => &mut caps.add_capabilities,
                1 => &mut caps.drop_capabilities,
                _ => &mut caps.add_ambient_capabilities,
            };
            list.push(cap.clone());
            format!("capability {cap:?}")
        }
        20 => {
            sc.privileged = rng.below(2) == 1;
            sc.readonly_rootfs = rng.below(2) == 1;
            sc.no_new_privs = rng.below(2) == 1;
            format!(
                "privileged {} readonly_rootfs {} no_new_privs {}",
                sc.privileged, sc.readonly_rootfs, sc.no_new_privs
            )
        }
        21 => {
            let p = rng.pick(PATHS).to_string();
            let list = match rng.below(2) {
                0 => &mut sc.masked_paths,
                _ => &mut sc.readonly_paths,
            };
            list.push(p.clone());
            format!("masked or read-only path {p:?}")
        }
        22 => {
            sc.seccomp = Some(SecurityProfile {
                profile_type: rng.below(4) as i32,
                localhost_ref: rng.pick(PATHS).into(),
            });
            format!("seccomp {:?}", sc.seccomp)
        }
        23 => {
            sc.apparmor = Some(SecurityProfile {
                profile_type: rng.below(4) as i32,
                localhost_ref: rng.pick(WORDS).into(),
            });
            format!("apparmor {:?}", sc.apparmor)
        }
        24 => {
            let ns = sc.namespace_options.get_or_insert_with(Default::default);
            ns.pid = rng.below(5) as i32;
            ns.ipc = rng.below(5) as i32;
            ns.network = rng.below(5) as i32;
            ns.target_id = rng.pick(WORDS).into();
            format!("namespaces {ns:?}")
        }
        25 => {
            c.log_path = rng.pick(PATHS).into();
            format!("log_path {:?}", c.log_path)
        }
        26 => {
            c.tty = rng.below(2) == 1;
            c.stdin = rng.below(2) == 1;
            c.stdin_once = rng.below(2) == 1;
            format!(
                "tty {} stdin {} stdin_once {}",
                c.tty, c.stdin, c.stdin_once
            )
        }
        27 => {
            let image = rng.pick(&[
                "",
                "nonexistent:tag",
                "sha256:abc",
                "UPPER",
                "a/b/c/d/e:f",
                "localhost:99999/x",
            ]);
            c.image = Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            });
            format!("image {image:?}")
        }
        28 => {
            let name = rng.pick(WORDS);
            c.metadata = Some(ContainerMetadata {
                name: name.into(),
                attempt: rng.below(3) as u32,
            });
            format!("name {name:?}")
        }
        _ => {
            sc.selinux_options = Some(SeLinuxOption {
                user: rng.pick(WORDS).into(),
                role: rng.pick(WORDS).into(),
                r#type: rng.pick(WORDS).into(),
                level: rng.pick(WORDS).into(),
            });
            format!("selinux {:?}", sc.selinux_options)
        }
    }
}

/// Sets one field of pod config `c` to an odd value; returns what it did.
fn mutate_pod(c: &mut PodSandboxConfig, rng: &mut Rng, host: &Host) -> String {
    let linux = c.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    match rng.below(20) {
        0 => {
            c.hostname = rng.pick(WORDS).into();
            format!("hostname {:?}", c.hostname)
        }
        1 => {
            c.log_directory = host.pick(rng);
            format!("log_directory {:?}", c.log_directory)
        }
        2 => {
            let dns = c.dns_config.get_or_insert_with(Default::default);
            dns.servers.push(rng.pick(ADDRESSES).into());
            dns.searches.push(rng.pick(WORDS).into());
            dns.options.push(rng.pick(WORDS).into());
            format!("dns {dns:?}")
        }
        3 => {
            let p = PortMapping {
                protocol: rng.below(4) as i32,
                container_port: number(rng) as i32,
                host_port: number(rng) as i32,
                host_ip: rng.pick(ADDRESSES).into(),
            };
            let done = format!("{p:?}");
            c.port_mappings.push(p);
            done
        }
        4 => {
            let (key, value) = (rng.pick(WORDS), rng.pick(WORDS));
            c.labels.insert(key.into(), value.into());
            format!("label {key:?}={value:?}")
        }
        5 => {
            let (key, value) = (rng.pick(WORDS), rng.pick(WORDS));
            c.annotations.insert(key.into(), value.into());
            format!("annotation {key:?}={value:?}")
        }
        6 => {
            linux.cgroup_parent = host.pick_cgroup(rng);
            format!("cgroup_parent {:?}", linux.cgroup_parent)
        }
        7 => {
            let (key, value) = (rng.pick(SYSCTLS), rng.pick(WORDS));
            linux.sysctls.insert(key.into(), value.into());
            format!("sysctl {key:?}={value:?}")
        }
        8 => {
            let ns = sc.namespace_options.get_or_insert_with(Default::default);
            ns.network = rng.below(5) as i32;
            ns.pid = rng.below(5) as i32;
            ns.ipc = rng.below(5) as i32;
            ns.target_id = rng.pick(WORDS).into();
            format!("namespaces {ns:?}")
        }
        9 => {
            sc.run_as_user = Some(Int64Value { value: number(rng) });
            format!("run_as_user {:?}", sc.run_as_user)
        }
        10 => {
            sc.run_as_group = Some(Int64Value { value: number(rng) });
            format!("run_as_group {:?}", sc.run_as_group)
        }
        11 => {
            let g = number(rng);
            sc.supplemental_groups.push(g);
            format!("supplemental_group {g}")
        }
        12 => {
            sc.privileged = rng.below(2) == 1;
            sc.readonly_rootfs = rng.below(2) == 1;
            format!(
                "privileged {} readonly_rootfs {}",
                sc.privileged, sc.readonly_rootfs
            )
        }
        13 => {
            sc.seccomp = Some(SecurityProfile {
                profile_type: rng.below(4) as i32,
                localhost_ref: rng.pick(PATHS).into(),
            });
            format!("seccomp {:?}", sc.seccomp)
        }
        14 => {
            sc.selinux_options = Some(SeLinuxOption {
                user: rng.pick(WORDS).into(),
                role: rng.pick(WORDS).into(),
                r#type: rng.pick(WORDS).into(),
                level: rng.pick(WORDS).into(),
            });
            format!("selinux {:?}", sc.selinux_options)
        }
        15 => {
            let ns = sc.namespace_options.get_or_insert_with(Default::default);
            let m = IdMapping {
                host_id: number(rng) as u32,
                container_id: number(rng) as u32,
                length: number(rng) as u32,
            };
            ns.userns_options = Some(UserNamespace {
                mode: rng.below(4) as i32,
                uids: vec![m],
                gids: vec![m],
            });
            format!("userns {:?}", ns.userns_options)
        }
        16 => {
            let r = linux.resources.get_or_insert_with(Default::default);
            r.cpu_period = number(rng);
            r.cpu_quota = number(rng);
            r.memory_limit_in_bytes = number(rng);
            format!("pod resources {r:?}")
        }
        17 => {
            let r = linux.overhead.get_or_insert_with(Default::default);
            r.cpu_shares = number(rng);
            r.memory_limit_in_bytes = number(rng);
            r.cpuset_cpus = rng.pick(WORDS).into();
            format!("overhead {r:?}")
        }
        18 => {
            let m = c.metadata.get_or_insert_with(Default::default);
            m.name = rng.pick(WORDS).into();
            m.namespace = rng.pick(WORDS).into();
            m.uid = rng.pick(WORDS).into();
            m.attempt = number(rng) as u32;
            format!("metadata {m:?}")
        }
        _ => {
            let r = linux.resources.get_or_insert_with(Default::default);
            r.hugepage_limits.push(HugepageLimit {
                page_size: rng.pick(WORDS).into(),
                limit: number(rng) as u64,
            });
            r.unified
                .insert(rng.pick(WORDS).into(), rng.pick(WORDS).into());
            format!("pod resources {r:?}")
        }
    }
}

const ADDRESSES: &[&str] = &[
    "",
    "x",
    "1.2.3.4",
    "::1",
    "256.1.1.1",
    "0.0.0.0",
    "127.0.0.1",
];

const SYSCTLS: &[&str] = &[
    "",
    "=",
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_forward",
    "net.core.somaxconn",
    "kernel.msgmax",
    "vm.swappiness",
    "kernel.domainname",
    "net/ipv4/ping_group_range",
];

/// Codes a run, create, start or exec may answer an odd request with.
fn acceptable(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument | Code::NotFound | Code::FailedPrecondition | Code::AlreadyExists
    )
}

/// The seeds of a run and the rounds of each.
fn schedule() -> (Vec<u64>, u64) {
    let seeds = match std::env::var("CRIUS_FUZZ_SEED") {
        Ok(s) => vec![s.parse().expect("CRIUS_FUZZ_SEED is a number")],
        Err(_) => vec![7, 1234, 9001],
    };
    let rounds = std::env::var("CRIUS_FUZZ_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    (seeds, rounds)
}

/// Creates `config` in `pod`; if it is created, starts it and runs `true` in it, then stops
/// and removes it. Returns the last step taken and its answer; a failed removal is a problem.
async fn try_container(
    env: &Env,
    pod: &str,
    pod_config: &PodSandboxConfig,
    config: ContainerConfig,
    problems: &mut Vec<String>,
) -> (&'static str, Result<(), tonic::Status>) {
    let id = match env.try_create(pod, pod_config, config).await {
        Err(status) => return ("create", Err(status)),
        Ok(id) => id,
    };
    let started = env
        .rt()
        .start_container(StartContainerRequest {
            container_id: id.clone(),
        })
        .await;
    let outcome = match started {
        Err(status) => ("start", Err(status)),
        Ok(_) => {
            let exec = env
                .rt()
                .exec_sync(ExecSyncRequest {
                    container_id: id.clone(),
                    cmd: vec!["true".into()],
                    timeout: 10,
                })
                .await;
            ("exec", exec.map(|_| ()))
        }
    };
    let _ = env
        .rt()
        .stop_container(StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await;
    if let Err(s) = env
        .rt()
        .remove_container(RemoveContainerRequest { container_id: id })
        .await
    {
        problems.push(format!("remove container: {s:?}"));
    }
    outcome
}

/// Notes the answer; an answer with a code of crius's own failing, or an unbounded message,
/// is a problem.
fn judge(
    step: &str,
    result: Result<(), tonic::Status>,
    edits: &[String],
    answers: &mut BTreeMap<String, u32>,
    problems: &mut Vec<String>,
) {
    let code = result.as_ref().err().map_or(Code::Ok, |s| s.code());
    *answers.entry(format!("{step} {code:?}")).or_default() += 1;
    if let Err(s) = result {
        if !acceptable(s.code()) || s.message().len() > 2048 {
            problems.push(format!(
                "{step} {:?} {:?} after {edits:?}",
                s.code(),
                s.message()
            ));
        }
    }
}

#[tokio::test]
async fn odd_container_configs_are_refused_by_the_request_or_run() {
    let mut env = Env::with_image().await;
    let host = Host::new("containers");
    let (seeds, rounds) = schedule();
    let pod_config = env.pod_config("fuzz", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let mut problems = Vec::new();
    let mut answers = BTreeMap::new();
    for seed in seeds {
        let mut rng = Rng(seed | 1);
        for round in 0..rounds {
            let mut config = env.container_config(&format!("c{seed}-{round}"), &["sleep", "60"]);
            let edits: Vec<String> = (0..1 + rng.below(3))
                .map(|_| mutate(&mut config, &mut rng, &host))
                .collect();
            let mut found = Vec::new();
            let (step, result) = try_container(&env, &pod, &pod_config, config, &mut found).await;
            judge(step, result, &edits, &mut answers, &mut found);
            problems.extend(
                found
                    .into_iter()
                    .map(|p| format!("seed {seed} round {round}: {p}")),
            );
        }
    }
    println!("answers: {answers:?}");
    assert!(problems.is_empty(), "{problems:#?}");
    let left = env.list_containers(ContainerFilter::default()).await;
    assert!(left.is_empty(), "containers left: {left:?}");
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn odd_pod_configs_are_refused_by_the_request_or_run() {
    let env = Env::with_image().await;
    let host = Host::new("pods");
    let (seeds, rounds) = schedule();
    let mut problems = Vec::new();
    let mut answers = BTreeMap::new();
    for seed in seeds {
        let mut rng = Rng(seed | 1);
        for round in 0..rounds {
            let mut config = env.pod_config(&format!("p{seed}-{round}"), false);
            let edits: Vec<String> = (0..1 + rng.below(3))
                .map(|_| mutate_pod(&mut config, &mut rng, &host))
                .collect();
            let mut found = Vec::new();
            let ran = env
                .rt()
                .run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                })
                .await;
            let (step, result) = match ran {
                Err(status) => ("run", Err(status)),
                Ok(reply) => {
                    let pod = reply.into_inner().pod_sandbox_id;
                    let container = env.container_config("c", &["sleep", "60"]);
                    let outcome = try_container(&env, &pod, &config, container, &mut found).await;
                    let stopped = env
                        .rt()
                        .stop_pod_sandbox(StopPodSandboxRequest {
                            pod_sandbox_id: pod.clone(),
                        })
                        .await;
                    let removed = env
                        .rt()
                        .remove_pod_sandbox(RemovePodSandboxRequest {
                            pod_sandbox_id: pod,
                        })
                        .await;
                    for (what, r) in [("stop", stopped.err()), ("remove", removed.err())] {
                        if let Some(s) = r {
                            found.push(format!("{what} pod: {s:?}"));
                        }
                    }
                    outcome
                }
            };
            judge(step, result, &edits, &mut answers, &mut found);
            problems.extend(
                found
                    .into_iter()
                    .map(|p| format!("seed {seed} round {round}: {p}")),
            );
        }
    }
    println!("answers: {answers:?}");
    assert!(problems.is_empty(), "{problems:#?}");
    let left = env.list_pods(PodSandboxFilter::default()).await;
    assert!(left.is_empty(), "pods left: {left:?}");
    env.assert_no_leaks().await;
}

/// Calls on a running pod and container with odd arguments: ids that are whole, a prefix,
/// the other kind's or words; resources, commands, ports, checkpoint locations and list
/// filters at the edges. Each answer is a refusal with the request's code or an answer; the
/// container keeps running through them all, and nothing is left afterwards.
#[tokio::test]
async fn odd_calls_on_a_running_container_are_refused_by_the_request_or_answered() {
    let mut env = Env::with_image().await;
    let host = Host::new("calls");
    let (seeds, rounds) = schedule();
    let pod_config = env.pod_config("calls", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let ctr = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("c", &["sleep", "600"]),
        )
        .await;
    let mut problems = Vec::new();
    let mut answers = BTreeMap::new();
    for seed in seeds {
        let mut rng = Rng(seed | 1);
        for round in 0..rounds {
            let id = match rng.below(4) {
                0 => ctr.clone(),
                1 => pod.clone(),
                2 => ctr[..rng.below(12) as usize].to_string(),
                _ => rng.pick(WORDS).to_string(),
            };
            let flag = |rng: &mut Rng| rng.below(2) == 1;
            let (step, result) = match rng.below(12) {
                0 => {
                    let resources = LinuxContainerResources {
                        cpu_period: number(&mut rng),
                        cpu_quota: number(&mut rng),
                        cpu_shares: number(&mut rng),
                        memory_limit_in_bytes: number(&mut rng),
                        memory_swap_limit_in_bytes: number(&mut rng),
                        oom_score_adj: number(&mut rng),
                        cpuset_cpus: rng.pick(WORDS).into(),
                        unified: [(rng.pick(WORDS).to_string(), rng.pick(WORDS).to_string())]
                            .into(),
                        ..Default::default()
                    };
                    let req = UpdateContainerResourcesRequest {
                        container_id: id,
                        linux: Some(resources),
                        ..Default::default()
                    };
                    let got = env.rt().update_container_resources(req).await;
                    ("update", got.map(|_| ()))
                }
                1 => {
                    let req = ReopenContainerLogRequest { container_id: id };
                    let got = env.rt().reopen_container_log(req).await;
                    ("reopen log", got.map(|_| ()))
                }
                2 => {
                    let cmd = (0..rng.below(3))
                        .map(|_| {
                            let words = if flag(&mut rng) { WORDS } else { PATHS };
                            rng.pick(words).into()
                        })
                        .collect();
                    let req = ExecSyncRequest {
                        container_id: id,
                        cmd,
                        timeout: rng.below(3) as i64,
                    };
                    ("exec sync", env.rt().exec_sync(req).await.map(|_| ()))
                }
                3 => {
                    let req = ExecRequest {
                        container_id: id,
                        cmd: vec![rng.pick(WORDS).into()],
                        tty: flag(&mut rng),
                        stdin: flag(&mut rng),
                        stdout: flag(&mut rng),
                        stderr: flag(&mut rng),
                    };
                    ("exec", env.rt().exec(req).await.map(|_| ()))
                }
                4 => {
                    let req = AttachRequest {
                        container_id: id,
                        tty: flag(&mut rng),
                        stdin: flag(&mut rng),
                        stdout: flag(&mut rng),
                        stderr: flag(&mut rng),
                    };
                    ("attach", env.rt().attach(req).await.map(|_| ()))
                }
                5 => {
                    let req = PortForwardRequest {
                        pod_sandbox_id: id,
                        port: vec![number(&mut rng) as i32],
                    };
                    ("port forward", env.rt().port_forward(req).await.map(|_| ()))
                }
                6 => {
                    let req = ContainerStatusRequest {
                        container_id: id,
                        verbose: flag(&mut rng),
                    };
                    let got = env.rt().container_status(req).await;
                    ("container status", got.map(|_| ()))
                }
                7 => {
                    let req = PodSandboxStatusRequest {
                        pod_sandbox_id: id,
                        verbose: flag(&mut rng),
                    };
                    (
                        "pod status",
                        env.rt().pod_sandbox_status(req).await.map(|_| ()),
                    )
                }
                8 => {
                    let req = ContainerStatsRequest { container_id: id };
                    (
                        "container stats",
                        env.rt().container_stats(req).await.map(|_| ()),
                    )
                }
                9 => {
                    let req = PodSandboxStatsRequest { pod_sandbox_id: id };
                    (
                        "pod stats",
                        env.rt().pod_sandbox_stats(req).await.map(|_| ()),
                    )
                }
                10 => {
                    let location = match rng.below(2) {
                        0 => format!("{}/cp{seed}-{round}.tar", host.pick_inside(&mut rng)),
                        _ => host.pick(&mut rng),
                    };
                    let req = CheckpointContainerRequest {
                        container_id: id,
                        location,
                        timeout: rng.below(40) as i64 - 5,
                    };
                    let got = env.rt().checkpoint_container(req).await;
                    ("checkpoint", got.map(|_| ()))
                }
                _ => {
                    let filter = ContainerFilter {
                        id: id.clone(),
                        state: Some(ContainerStateValue {
                            state: number(&mut rng) as i32,
                        }),
                        pod_sandbox_id: id,
                        label_selector: [(
                            rng.pick(WORDS).to_string(),
                            rng.pick(WORDS).to_string(),
                        )]
                        .into(),
                    };
                    let req = ListContainersRequest {
                        filter: Some(filter),
                    };
                    ("list", env.rt().list_containers(req).await.map(|_| ()))
                }
            };
            let mut found = Vec::new();
            let result = result.or_else(|s| match (step, s.code()) {
                // the call's own limit, or a call crius does not serve
                ("exec sync", Code::DeadlineExceeded) | (_, Code::Unimplemented) => Ok(()),
                _ => Err(s),
            });
            judge(step, result, &[], &mut answers, &mut found);
            problems.extend(
                found
                    .into_iter()
                    .map(|p| format!("seed {seed} round {round}: {p}")),
            );
        }
    }
    println!("answers: {answers:?}");
    assert!(problems.is_empty(), "{problems:#?}");
    // Checkpoints went to the test's directory only, none to the node's root.
    let strays: Vec<_> = std::fs::read_dir("/")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cp") && n.ends_with(".tar"))
        .collect();
    assert!(strays.is_empty(), "checkpoints left in /: {strays:?}");
    let status = env.status(&ctr).await;
    assert_eq!(
        status.state,
        ContainerState::ContainerRunning as i32,
        "{status:?}"
    );
    env.stop(&ctr, 0).await;
    env.remove_all_and_check(&[&ctr], &pod).await;
}
