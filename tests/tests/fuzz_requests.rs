//! Container configs made at random from a valid one, each with one to three fields set to
//! values a confused or hostile client might send (paths with `..` or a NUL, numbers at the
//! edges of their types, devices and mounts in odd places, unknown words). Every answer must
//! be a refusal with the request's code, or a container that starts and runs an exec: never
//! Internal or Unknown from deep inside the runtime or the kernel, never a message without
//! bounds, and nothing left behind. The seeds are fixed, so a run is the same each time;
//! `CRIUS_FUZZ_SEED=N` (with `CRIUS_FUZZ_ROUNDS`) runs another.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::{Env, Rng};
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
fn mutate(c: &mut ContainerConfig, rng: &mut Rng) -> String {
    let linux = c.linux.get_or_insert_with(Default::default);
    let res = linux.resources.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    match rng.below(30) {
        0 => {
            let m = Mount {
                container_path: rng.pick(PATHS).into(),
                host_path: rng.pick(PATHS).into(),
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
                host_path: rng.pick(PATHS).into(),
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

/// Codes a create, start or exec may answer an odd request with.
fn acceptable(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument | Code::NotFound | Code::FailedPrecondition | Code::AlreadyExists
    )
}

#[tokio::test]
async fn odd_container_configs_are_refused_by_the_request_or_run() {
    let mut env = Env::with_image(124).await;
    let seeds: Vec<u64> = match std::env::var("CRIUS_FUZZ_SEED") {
        Ok(s) => vec![s.parse().expect("CRIUS_FUZZ_SEED is a number")],
        Err(_) => vec![7, 1234, 9001],
    };
    let rounds: u64 = std::env::var("CRIUS_FUZZ_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    let pod_config = env.pod_config("fuzz", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let mut problems = Vec::new();
    let mut answers: BTreeMap<String, u32> = BTreeMap::new();
    for seed in seeds {
        let mut rng = Rng(seed | 1);
        for round in 0..rounds {
            let mut config = env.container_config(&format!("c{seed}-{round}"), &["sleep", "60"]);
            let edits: Vec<String> = (0..1 + rng.below(3))
                .map(|_| mutate(&mut config, &mut rng))
                .collect();
            let created = env
                .rt()
                .create_container(CreateContainerRequest {
                    pod_sandbox_id: pod.clone(),
                    config: Some(config),
                    sandbox_config: Some(pod_config.clone()),
                })
                .await;
            let (step, result) = match created {
                Err(status) => ("create", Err(status)),
                Ok(reply) => {
                    let id = reply.into_inner().container_id;
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
                        .remove_container(RemoveContainerRequest {
                            container_id: id.clone(),
                        })
                        .await
                    {
                        problems.push(format!("seed {seed} round {round}: remove: {s:?}"));
                    }
                    outcome
                }
            };
            let code = result.as_ref().err().map_or(Code::Ok, |s| s.code());
            *answers.entry(format!("{step} {code:?}")).or_default() += 1;
            if let Err(s) = result {
                if !acceptable(s.code()) || s.message().len() > 2048 {
                    problems.push(format!(
                        "seed {seed} round {round}: {step} {:?} {:?} after {edits:?}",
                        s.code(),
                        s.message()
                    ));
                }
            }
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
