//! CheckpointPod and RestorePod end to end: a pod of two containers, each counting in its
//! shell's memory with a file in its writable layer, is checkpointed (it runs on, thawed),
//! removed, restored into a new pod whose containers wait created until StartContainer, and
//! both count on from where the checkpoint found them, files intact. Also: the built-in
//! handler (whose dumps are taken from the frozen cgroup through CRIU's configuration file),
//! refusals by field that leave nothing behind, and a deadline too short for the dumps (the
//! pod runs on, thawed, and `output_path` stays empty). Prints the times it measures. Run as
//! root; networks 104–107.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::checkpoints::{
    big_shell, checkpoint_info, counter_named, criu_config, files_in, gvisor_sleeper, numbers,
    pod_config, remove_all,
};
use crate::common::{assert_status, Env};
use crius_api::v1::{
    CheckpointPodRequest, ContainerConfig, ContainerState, NamespaceMode, PodSandboxConfig,
    PodSandboxFilter, RestorePodRequest, RestorePodResponse,
};
use tonic::Code;

/// A counter that writes `<name>-in-the-layer` into `/root/note` first.
fn counter(env: &Env, name: &str) -> ContainerConfig {
    counter_named(env, name, &format!("{name}-in-the-layer"))
}

/// Name and size of every file in `dir`.
fn listing(dir: &Path) -> BTreeMap<String, u64> {
    files_in(dir)
        .iter()
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::metadata(p).unwrap().len(),
            )
        })
        .collect()
}

/// The freezer's view of a container's cgroup (crius's own `/crius/<pod>/<id>` with the
/// cgroupfs driver): `THAWED`, `FREEZING` or `FROZEN`.
fn freezer_state(pod: &str, id: &str) -> String {
    let v1 = PathBuf::from(format!(
        "/sys/fs/cgroup/freezer/crius/{pod}/{id}/freezer.state"
    ));
    if v1.exists() {
        return std::fs::read_to_string(v1).unwrap().trim().to_string();
    }
    let v2 = PathBuf::from(format!("/sys/fs/cgroup/crius/{pod}/{id}/cgroup.freeze"));
    match std::fs::read_to_string(&v2).unwrap().trim() {
        "1" => "FROZEN".into(),
        _ => "THAWED".into(),
    }
}

fn request<T>(message: T, timeout: Option<Duration>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Some(t) = timeout {
        r.set_timeout(t);
    }
    r
}

async fn checkpoint_pod(
    env: &Env,
    pod: &str,
    output: &Path,
    ids: &[&str],
    timeout: Option<Duration>,
) -> Result<(), tonic::Status> {
    env.rt()
        .checkpoint_pod(request(
            CheckpointPodRequest {
                pod_sandbox_id: pod.into(),
                output_path: output.display().to_string(),
                container_ids: ids.iter().map(|s| s.to_string()).collect(),
                options: HashMap::new(),
            },
            timeout,
        ))
        .await
        .map(|_| ())
}

async fn restore_pod(
    env: &Env,
    req: RestorePodRequest,
    timeout: Option<Duration>,
) -> Result<RestorePodResponse, tonic::Status> {
    env.rt()
        .restore_pod(request(req, timeout))
        .await
        .map(|r| r.into_inner())
}

fn restore_request(
    dir: &Path,
    config: &PodSandboxConfig,
    handler: &str,
    containers: Vec<ContainerConfig>,
) -> RestorePodRequest {
    RestorePodRequest {
        checkpoint_path: dir.display().to_string(),
        config: Some(config.clone()),
        runtime_handler: handler.into(),
        options: HashMap::new(),
        container_configs: containers,
    }
}

/// A refused request: what it is, its result, the code and words its status must have.
type Case<'a, T> = (&'a str, Result<T, tonic::Status>, Code, &'a [&'a str]);

/// A RestorePod request to be refused: what it is, the request and its deadline, the code
/// and words its status must have.
type RestoreCase<'a> = (
    &'a str,
    (RestorePodRequest, Option<Duration>),
    Code,
    &'a [&'a str],
);

async fn pod_count(env: &Env) -> usize {
    env.list_pods(PodSandboxFilter::default()).await.len()
}

/// Runs a pod of `handler` with two counters, `alpha` and `beta`, checkpoints both with
/// CheckpointPod, checks they run on thawed, removes the pod, restores it into a new one of
/// `handler` and checks both count on with their files. Returns the measured times.
async fn round_trip(env: &mut Env, handler: &str, tag: &str) -> (Duration, Duration) {
    let pod_name = format!("{tag}-a");
    let config_a = pod_config(env, &pod_name);
    let pod_a = env.run_pod_with_handler(config_a.clone(), handler).await;
    let mut ids = Vec::new();
    for name in ["alpha", "beta"] {
        ids.push(
            env.create_start(&pod_a, &config_a, counter(env, name))
                .await,
        );
    }
    let logs_a: Vec<PathBuf> = ["alpha", "beta"]
        .iter()
        .map(|n| env.log_dir(&pod_name).join(format!("{n}.log")))
        .collect();
    for log in &logs_a {
        env.wait_log(log, Duration::from_secs(10), |l| l.len() >= 5)
            .await;
    }

    let out = env.crius.dir().join(format!("{tag}-checkpoint"));
    std::fs::create_dir_all(&out).unwrap();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    // Watches the freezer meanwhile: both containers are seen frozen together.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (stop, pod, ids) = (stop.clone(), pod_a.clone(), ids.clone());
        std::thread::spawn(move || {
            let mut both = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if ids.iter().all(|id| freezer_state(&pod, id) == "FROZEN") {
                    both += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            both
        })
    };
    let began = Instant::now();
    let result = checkpoint_pod(env, &pod_a, &out, &id_refs, Some(Duration::from_secs(60))).await;
    let checkpoint_took = began.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen_frozen_together = watcher.join().unwrap();
    result.unwrap();
    assert!(
        seen_frozen_together > 0,
        "the two containers were never seen frozen at once"
    );
    eprintln!("CheckpointPod of two busybox counters ({tag}): {checkpoint_took:?}");
    let at: Vec<u64> = logs_a.iter().map(|l| *numbers(l).last().unwrap()).collect();

    // Running, thawed, counting on.
    for (id, log) in ids.iter().zip(&logs_a) {
        assert_eq!(freezer_state(&pod_a, id), "THAWED", "container {id}");
        assert_eq!(
            env.status(id).await.state,
            ContainerState::ContainerRunning as i32
        );
        let before = *numbers(log).last().unwrap();
        env.wait_log(log, Duration::from_secs(10), |_| {
            numbers(log).last().is_some_and(|n| *n >= before + 5)
        })
        .await;
    }

    // The layout: pod.json and one archive per container, nothing else.
    let mut expected: Vec<String> = ids.iter().map(|id| format!("{id}.tar")).collect();
    expected.push("pod.json".into());
    expected.sort();
    let names: Vec<String> = listing(&out).into_keys().collect();
    assert_eq!(names, expected);
    let pod_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("pod.json")).unwrap()).unwrap();
    assert_eq!(pod_json["version"], 1);
    assert_eq!(pod_json["podSandboxId"], pod_a.as_str());
    assert_eq!(pod_json["runtimeHandler"], handler);
    let names: Vec<&str> = pod_json["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);
    let first = &pod_json["containers"][0];
    assert!(first["cwd"].as_str().unwrap().starts_with('/'), "{first}");
    assert_eq!(first["args"][0], "sh", "{first}");

    for id in &ids {
        env.stop(id, 0).await;
        env.remove(id).await;
    }
    env.stop_pod(&pod_a).await;
    env.remove_pod(&pod_a).await;

    // Restored into a new pod: created, not counting until started.
    let before = listing(&out);
    let pod_name_b = format!("{tag}-b");
    let config_b = pod_config(env, &pod_name_b);
    let began = Instant::now();
    let restored = restore_pod(
        env,
        restore_request(
            &out,
            &config_b,
            handler,
            vec![counter(env, "beta"), counter(env, "alpha")],
        ),
        Some(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let restore_took = began.elapsed();
    eprintln!("RestorePod of two busybox counters ({tag}): {restore_took:?}");
    env.pods.push(restored.pod_sandbox_id.clone());
    assert_eq!(listing(&out), before, "the checkpoint was changed");
    let mut by_name: BTreeMap<String, String> = restored
        .restored_containers
        .iter()
        .map(|c| (c.name.clone(), c.container_id.clone()))
        .collect();
    assert_eq!(by_name.len(), 2, "{restored:?}");
    let pod_b = restored.pod_sandbox_id.clone();
    assert_eq!(
        env.pod_status(&pod_b).await.state,
        crius_api::v1::PodSandboxState::SandboxReady as i32
    );
    for id in by_name.values() {
        let s = env.status(id).await;
        assert_eq!(s.state, ContainerState::ContainerCreated as i32);
        assert_eq!(s.image.as_ref().unwrap().image, env.image);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for name in ["alpha", "beta"] {
        let log = env.log_dir(&pod_name_b).join(format!("{name}.log"));
        assert!(numbers(&log).is_empty(), "{name} counted before its start");
    }
    for (i, name) in ["alpha", "beta"].iter().enumerate() {
        let id = by_name.remove(*name).unwrap();
        env.start(&id).await;
        let log = env.log_dir(&pod_name_b).join(format!("{name}.log"));
        env.wait_log(&log, Duration::from_secs(10), |_| numbers(&log).len() >= 5)
            .await;
        let counted = numbers(&log);
        assert!(
            counted[0] > 1 && counted[0] <= at[i] + 1,
            "{name}: restored counter starts at {} (at the checkpoint: {})",
            counted[0],
            at[i]
        );
        assert!(
            counted.windows(2).all(|w| w[1] == w[0] + 1),
            "{name}: not one count after another: {counted:?}"
        );
        let note = env.exec(&id, &["cat", "/root/note"], 10).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&note.stdout),
            format!("{name}-in-the-layer\n")
        );
        env.stop(&id, 0).await;
        env.remove(&id).await;
    }
    env.stop_pod(&pod_b).await;
    env.remove_pod(&pod_b).await;
    (checkpoint_took, restore_took)
}

#[tokio::test]
async fn a_pod_of_two_counters_round_trips_through_checkpoint_pod_and_restore_pod() {
    // CRIU's runs reset the cgroup2 mount's options; each crius puts back what it saw, which
    // another crius's run in between would spoil for the tests after this binary.
    let _turn = common::checkpoints::criu_turn().await;
    let mut env = Env::with_image_and_config(&criu_config()).await;
    let ck = checkpoint_info(&env).await;
    assert_eq!(ck["pods"], "CheckpointPod, RestorePod", "{ck}");
    round_trip(&mut env, "runc", "ckp-runc").await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn the_builtin_handler_checkpoints_a_pod_from_its_frozen_cgroups() {
    // CRIU's runs reset the cgroup2 mount's options; each crius puts back what it saw, which
    // another crius's run in between would spoil for the tests after this binary.
    let _turn = common::checkpoints::criu_turn().await;
    let mut env = Env::with_image_and_config(&criu_config()).await;
    round_trip(&mut env, "", "ckp-builtin").await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn bad_pod_checkpoint_requests_are_refused_by_field_and_leave_nothing() {
    // Some of its requests reach CRIU (see above).
    let _turn = common::checkpoints::criu_turn().await;
    let mut env = Env::with_image_and_config(&criu_config()).await;
    let config = pod_config(&env, "ckp-bad");
    let pod = env.run_pod_with_handler(config.clone(), "runc").await;
    let running = env
        .create_start(&pod, &config, counter(&env, "alpha"))
        .await;
    let stopped = env.create_start(&pod, &config, counter(&env, "beta")).await;
    env.stop(&stopped, 0).await;
    let other_config = pod_config(&env, "ckp-other");
    let other_pod = env.run_pod_with_handler(other_config.clone(), "runc").await;
    let other = env
        .create_start(&other_pod, &other_config, counter(&env, "gamma"))
        .await;
    let log = env.log_dir("ckp-bad").join("alpha.log");
    env.wait_log(&log, Duration::from_secs(10), |l| l.len() >= 3)
        .await;

    let out = env.crius.dir().join("bad-checkpoint");
    std::fs::create_dir_all(&out).unwrap();
    let full = env.crius.dir().join("full");
    std::fs::create_dir_all(&full).unwrap();
    std::fs::write(full.join("something"), b"x").unwrap();
    let t = Some(Duration::from_secs(30));
    let pods = pod_count(&env).await;

    let cases: Vec<Case<()>> = vec![
        (
            "no deadline",
            checkpoint_pod(&env, &pod, &out, &[&running], None).await,
            Code::InvalidArgument,
            &["deadline"],
        ),
        (
            "empty output_path",
            checkpoint_pod(&env, &pod, Path::new(""), &[&running], t).await,
            Code::InvalidArgument,
            &["output_path"],
        ),
        (
            "relative output_path",
            checkpoint_pod(&env, &pod, Path::new("relative/dir"), &[&running], t).await,
            Code::InvalidArgument,
            &["output_path", "absolute"],
        ),
        (
            "missing output_path",
            checkpoint_pod(&env, &pod, Path::new("/no/such/dir"), &[&running], t).await,
            Code::InvalidArgument,
            &["output_path", "does not exist"],
        ),
        (
            "non-empty output_path",
            checkpoint_pod(&env, &pod, &full, &[&running], t).await,
            Code::InvalidArgument,
            &["output_path", "not empty"],
        ),
        (
            "no containers",
            checkpoint_pod(&env, &pod, &out, &[], t).await,
            Code::InvalidArgument,
            &["container_ids"],
        ),
        (
            "unknown container",
            checkpoint_pod(&env, &pod, &out, &[&running, "no-such-container"], t).await,
            Code::NotFound,
            &["container_ids[1]", "no-such-container"],
        ),
        (
            "container of another pod",
            checkpoint_pod(&env, &pod, &out, &[&other], t).await,
            Code::InvalidArgument,
            &["container_ids[0]", "not of"],
        ),
        (
            "duplicate id",
            checkpoint_pod(&env, &pod, &out, &[&running, &running], t).await,
            Code::InvalidArgument,
            &["container_ids[1]"],
        ),
        (
            "stopped container",
            checkpoint_pod(&env, &pod, &out, &[&running, &stopped], t).await,
            Code::FailedPrecondition,
            &["container_ids[1]", "not running"],
        ),
        (
            "unknown pod",
            checkpoint_pod(&env, "no-such-pod", &out, &[&running], t).await,
            Code::NotFound,
            &["no-such-pod"],
        ),
    ];
    for (what, result, code, needles) in cases {
        eprintln!("{what}: {result:?}");
        assert_status(result, code, needles);
        assert!(
            files_in(&out).is_empty(),
            "{what}: files left in output_path"
        );
    }
    // Two running containers of one name (attempts 0 and 1): a restore could not tell them
    // apart.
    let mut again = counter(&env, "alpha");
    again.metadata.as_mut().unwrap().attempt = 1;
    again.log_path = "alpha_1.log".into();
    let again = env.create_start(&pod, &config, again).await;
    let err = checkpoint_pod(&env, &pod, &out, &[&running, &again], t).await;
    assert_status(
        err,
        Code::InvalidArgument,
        &["container_ids[1]", "\"alpha\""],
    );
    assert!(files_in(&out).is_empty());
    env.stop(&again, 0).await;
    env.remove(&again).await;

    let err = env
        .rt()
        .checkpoint_pod(request(
            CheckpointPodRequest {
                pod_sandbox_id: pod.clone(),
                output_path: out.display().to_string(),
                container_ids: vec![running.clone()],
                options: HashMap::from([("tcp-established".to_string(), "true".to_string())]),
            },
            t,
        ))
        .await
        .map(|_| ());
    assert_status(err, Code::InvalidArgument, &["options", "tcp-established"]);
    assert!(files_in(&out).is_empty());
    assert_eq!(freezer_state(&pod, &running), "THAWED");
    assert_eq!(
        env.status(&running).await.state,
        ContainerState::ContainerRunning as i32
    );
    assert_eq!(pod_count(&env).await, pods);

    // A real checkpoint for the restore refusals.
    checkpoint_pod(&env, &pod, &out, &[&running], t)
        .await
        .unwrap();
    let before = listing(&out);
    let config_b = pod_config(&env, "ckp-bad-b");
    let mut with_option = restore_request(&out, &config_b, "runc", vec![counter(&env, "alpha")]);
    with_option
        .options
        .insert("leave-running".into(), "1".into());
    let mut wrong_image = counter(&env, "alpha");
    wrong_image.image.as_mut().unwrap().image = "no-such-image:1".into();
    let other_command = env.container_config("alpha", &["sleep", "1000"]);
    let mut other_dir = counter(&env, "alpha");
    other_dir.working_dir = "/root".into();
    let user_image = crius_tests::images::push(&env.registry, crius_tests::images::TestImage::User)
        .unwrap()
        .reference;
    env.pull(&user_image).await;
    let mut other_image = counter(&env, "alpha");
    other_image.image.as_mut().unwrap().image = user_image.clone();
    let not_a_checkpoint = env.crius.dir().join("not-a-checkpoint");
    std::fs::create_dir_all(&not_a_checkpoint).unwrap();
    let cases: Vec<RestoreCase> = vec![
        (
            "no deadline",
            (
                restore_request(&out, &config_b, "runc", vec![counter(&env, "alpha")]),
                None,
            ),
            Code::InvalidArgument,
            &["deadline"],
        ),
        (
            "a name not in the checkpoint",
            (
                restore_request(&out, &config_b, "runc", vec![counter(&env, "other")]),
                t,
            ),
            Code::InvalidArgument,
            &["container_configs", "missing: [\"alpha\"]", "\"other\""],
        ),
        (
            "one name more",
            (
                restore_request(
                    &out,
                    &config_b,
                    "runc",
                    vec![counter(&env, "alpha"), counter(&env, "beta")],
                ),
                t,
            ),
            Code::InvalidArgument,
            &["container_configs", "not in the checkpoint: [\"beta\"]"],
        ),
        (
            "a name twice",
            (
                restore_request(
                    &out,
                    &config_b,
                    "runc",
                    vec![counter(&env, "alpha"), counter(&env, "alpha")],
                ),
                t,
            ),
            Code::InvalidArgument,
            &["container_configs[1]", "twice"],
        ),
        (
            "no container configs",
            (restore_request(&out, &config_b, "runc", vec![]), t),
            Code::InvalidArgument,
            &["container_configs"],
        ),
        (
            "unknown handler",
            (
                restore_request(
                    &out,
                    &config_b,
                    "no-such-handler",
                    vec![counter(&env, "alpha")],
                ),
                t,
            ),
            Code::InvalidArgument,
            &["runtime_handler", "no-such-handler"],
        ),
        (
            "unknown option",
            (with_option, t),
            Code::InvalidArgument,
            &["options", "leave-running"],
        ),
        (
            "relative checkpoint_path",
            (
                restore_request(
                    Path::new("some/dir"),
                    &config_b,
                    "runc",
                    vec![counter(&env, "alpha")],
                ),
                t,
            ),
            Code::InvalidArgument,
            &["checkpoint_path", "absolute"],
        ),
        (
            "missing checkpoint_path",
            (
                restore_request(
                    Path::new("/no/such/dir"),
                    &config_b,
                    "runc",
                    vec![counter(&env, "alpha")],
                ),
                t,
            ),
            Code::NotFound,
            &["checkpoint_path"],
        ),
        (
            "not a pod checkpoint",
            (
                restore_request(
                    &not_a_checkpoint,
                    &config_b,
                    "runc",
                    vec![counter(&env, "alpha")],
                ),
                t,
            ),
            Code::InvalidArgument,
            &["checkpoint_path", "pod.json"],
        ),
        (
            "another command",
            (
                restore_request(&out, &config_b, "runc", vec![other_command]),
                t,
            ),
            Code::InvalidArgument,
            &["container_configs[0].command/args", "sleep 1000"],
        ),
        (
            "another working directory",
            (restore_request(&out, &config_b, "runc", vec![other_dir]), t),
            Code::InvalidArgument,
            &["container_configs[0].working_dir", "/root"],
        ),
        (
            "another image",
            (
                restore_request(&out, &config_b, "runc", vec![other_image]),
                t,
            ),
            Code::InvalidArgument,
            &["container_configs[0].image.image", "not the image"],
        ),
        (
            "an image not on the node",
            (
                restore_request(&out, &config_b, "runc", vec![wrong_image]),
                t,
            ),
            Code::NotFound,
            &["container_configs[0].image.image", "no-such-image"],
        ),
    ];
    for (what, (req, timeout), code, needles) in cases {
        let result = restore_pod(&env, req, timeout).await;
        eprintln!("{what}: {:?}", result.as_ref().map(|_| ()));
        assert_status(result, code, needles);
        assert_eq!(pod_count(&env).await, pods, "{what}: a pod was left");
        assert_eq!(listing(&out), before, "{what}: the checkpoint was changed");
    }

    // The pod's PID namespace, which runc cannot restore into: refused before a pod is made.
    let mut shared_pid = config_b.clone();
    common::pod_sc(&mut shared_pid)
        .namespace_options
        .as_mut()
        .unwrap()
        .pid = NamespaceMode::Pod as i32;
    let err = restore_pod(
        &env,
        restore_request(&out, &shared_pid, "runc", vec![counter(&env, "alpha")]),
        t,
    )
    .await;
    assert_status(err, Code::FailedPrecondition, &["PID namespace"]);
    assert_eq!(pod_count(&env).await, pods);
    // A container create that fails once the pod is made (its log path, checked by
    // CreateContainer): the pod goes with it.
    let mut bad_log = counter(&env, "alpha");
    bad_log.log_path = "/absolute.log".into();
    let err = restore_pod(
        &env,
        restore_request(&out, &config_b, "runc", vec![bad_log]),
        t,
    )
    .await;
    assert_status(err, Code::InvalidArgument, &["log_path"]);
    assert_eq!(pod_count(&env).await, pods, "the restore's pod was left");
    assert_eq!(listing(&out), before);

    // gVisor: Unimplemented both ways.
    if let Some((g_pod, _, g)) = gvisor_sleeper(&mut env, "ckp-gvisor").await {
        let empty = env.crius.dir().join("gvisor-checkpoint");
        std::fs::create_dir_all(&empty).unwrap();
        let err = checkpoint_pod(&env, &g_pod, &empty, &[&g], t).await;
        assert_status(err, Code::Unimplemented, &["runsc", "gVisor"]);
        assert!(files_in(&empty).is_empty());
        let pods = pod_count(&env).await;
        let err = restore_pod(
            &env,
            restore_request(&out, &config_b, "runsc", vec![counter(&env, "alpha")]),
            t,
        )
        .await;
        assert_status(err, Code::Unimplemented, &["runsc", "cannot restore"]);
        assert_eq!(pod_count(&env).await, pods);
        remove_all(&env, &g_pod, &g).await;
    }

    // A crius killed in the middle of a pod checkpoint leaves its containers frozen: the next
    // start thaws them.
    let state = PathBuf::from(format!(
        "/sys/fs/cgroup/freezer/crius/{pod}/{running}/freezer.state"
    ));
    if state.exists() {
        env.crius.kill9().unwrap();
        std::fs::write(&state, "FROZEN").unwrap();
        common::wait_for("the freeze", Duration::from_secs(5), || async {
            (freezer_state(&pod, &running) == "FROZEN").then_some(())
        })
        .await;
        env.crius.restart().await.unwrap();
        assert_eq!(freezer_state(&pod, &running), "THAWED");
        let at = numbers(&log).last().copied().unwrap_or(0);
        env.wait_log(&log, Duration::from_secs(10), |_| {
            numbers(&log).last().is_some_and(|n| *n >= at + 3)
        })
        .await;
    }

    for id in [&running, &stopped] {
        env.stop(id, 0).await;
        env.remove(id).await;
    }
    env.stop(&other, 0).await;
    env.remove(&other).await;
    for p in [&pod, &other_pod] {
        env.stop_pod(p).await;
        env.remove_pod(p).await;
    }
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn a_too_short_deadline_leaves_the_pod_running_thawed_and_output_path_empty() {
    // CRIU's runs reset the cgroup2 mount's options; each crius puts back what it saw, which
    // another crius's run in between would spoil for the tests after this binary.
    let _turn = common::checkpoints::criu_turn().await;
    let mut env = Env::with_image_and_config(&criu_config()).await;
    let config = pod_config(&env, "ckp-late");
    let pod = env.run_pod_with_handler(config.clone(), "runc").await;
    let big = big_shell(&env);
    let big_config = big.clone();
    let big = env.create_start(&pod, &config, big).await;
    let small = env
        .create_start(&pod, &config, counter(&env, "alpha"))
        .await;
    let big_log = env.log_dir("ckp-late").join("big.log");
    let small_log = env.log_dir("ckp-late").join("alpha.log");
    env.wait_log(&big_log, Duration::from_secs(60), |l| l.len() >= 3)
        .await;
    env.wait_log(&small_log, Duration::from_secs(10), |l| l.len() >= 3)
        .await;

    let out = env.crius.dir().join("late-checkpoint");
    std::fs::create_dir_all(&out).unwrap();
    let began = Instant::now();
    let err = checkpoint_pod(
        &env,
        &pod,
        &out,
        &[&big, &small],
        Some(Duration::from_secs(1)),
    )
    .await;
    let answered = began.elapsed();
    eprintln!("too short deadline: answered after {answered:?}: {err:?}");
    assert_status(err, Code::DeadlineExceeded, &[]);
    // At the answer: nothing in output_path, and the container CRIU was not dumping already
    // runs.
    assert!(files_in(&out).is_empty(), "{:?}", files_in(&out));
    assert_eq!(freezer_state(&pod, &small), "THAWED");
    // The one under CRIU is thawed when its dump ends; then nothing of the dump is left.
    let layers = env.crius.root().join("containers");
    common::wait_for(
        "the big container to be thawed and the dump cleaned up",
        Duration::from_secs(60),
        || async {
            let staged = [&big, &small].iter().any(|id| {
                files_in(&layers.join(id)).iter().any(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with("checkpoint-")
                })
            });
            (!staged && freezer_state(&pod, &big) == "THAWED").then_some(())
        },
    )
    .await;
    eprintln!(
        "the abandoned dump was thawed and cleaned up after {:?}",
        began.elapsed()
    );
    assert!(files_in(&out).is_empty(), "{:?}", files_in(&out));
    for (id, log) in [(&big, &big_log), (&small, &small_log)] {
        let at = numbers(log).last().copied().unwrap_or(0);
        env.wait_log(log, Duration::from_secs(20), |_| {
            numbers(log).last().is_some_and(|n| *n >= at + 5)
        })
        .await;
        assert_eq!(
            env.status(id).await.state,
            ContainerState::ContainerRunning as i32
        );
    }

    // With time enough it works: the figures for a pod with a large process, without the
    // ballast.
    env.exec(&big, &["rm", "/dev/ballast"], 10).await.unwrap();
    let began = Instant::now();
    checkpoint_pod(
        &env,
        &pod,
        &out,
        &[&big, &small],
        Some(Duration::from_secs(120)),
    )
    .await
    .unwrap();
    eprintln!(
        "CheckpointPod of the 256 MiB shell and a counter (runc): {:?}",
        began.elapsed()
    );
    let sizes: u64 = listing(&out).values().sum();
    eprintln!("pod checkpoint size: {} MiB", sizes >> 20);
    for id in [&big, &small] {
        assert_eq!(freezer_state(&pod, id), "THAWED");
        env.stop(id, 0).await;
        env.remove(id).await;
    }
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;

    // A restore with too little time: DeadlineExceeded, and the pod it made goes.
    let config_b = pod_config(&env, "ckp-late-b");
    let pods = pod_count(&env).await;
    let before = listing(&out);
    let request = || {
        restore_request(
            &out,
            &config_b,
            "runc",
            vec![big_config.clone(), counter(&env, "alpha")],
        )
    };
    let began = Instant::now();
    let err = restore_pod(&env, request(), Some(Duration::from_millis(500))).await;
    eprintln!(
        "RestorePod with 500 ms: answered after {:?}: {:?}",
        began.elapsed(),
        err.as_ref().map(|_| ())
    );
    assert_status(err, Code::DeadlineExceeded, &[]);
    // The late restore holds the pod's name until it has undone itself (it is not listed
    // while it runs): a client's retry is refused with AlreadyExists until then, and no longer.
    let waiting = Instant::now();
    let (restored, took) = loop {
        let began = Instant::now();
        let retry = restore_pod(&env, request(), Some(Duration::from_secs(120))).await;
        match retry {
            Err(status)
                if status.code() == Code::AlreadyExists
                    && waiting.elapsed() < Duration::from_secs(60) =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => break (other.unwrap(), began.elapsed()),
        }
    };
    // The late restore left nothing: its pod is gone and the checkpoint is as it was.
    assert_eq!(pod_count(&env).await, pods + 1);
    assert_eq!(listing(&out), before);
    eprintln!(
        "RestorePod of the 256 MiB shell and a counter (runc): {took:?}, the name free after \
         {:?}",
        waiting.elapsed() - took
    );
    env.pods.push(restored.pod_sandbox_id.clone());
    for c in &restored.restored_containers {
        env.start(&c.container_id).await;
        let log = env.log_dir("ckp-late-b").join(format!("{}.log", c.name));
        env.wait_log(&log, Duration::from_secs(20), |_| numbers(&log).len() >= 3)
            .await;
        assert!(numbers(&log)[0] > 1, "{}: {:?}", c.name, numbers(&log));
        env.stop(&c.container_id, 0).await;
        env.remove(&c.container_id).await;
    }
    env.stop_pod(&restored.pod_sandbox_id).await;
    env.remove_pod(&restored.pod_sandbox_id).await;
    env.assert_no_leaks().await;
}
