//! crius killed with SIGKILL at random moments while clients run pods through their whole
//! lifecycle: whatever moment the kill hits, what a client was told stays true after the
//! restart, a call that was cut off left a state the audit can name, and once everything is
//! removed nothing is left on the machine.
//!
//! `crash_windows.rs` and `restart.rs` kill crius at chosen moments; this test finds the
//! moments nobody chose. Its schedule is random (the seed is printed; set
//! `CRIUS_CRASH_SEED` to run a schedule again, timing aside).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common;
use crate::common::{Env, Rng};
use crius_api::v1::image_service_client::ImageServiceClient;
use crius_api::v1::runtime_service_client::RuntimeServiceClient;
use crius_api::v1::*;
use crius_tests::images::{self, TestImage};
use tonic::transport::Channel;
use tonic::Code;

/// Clients running rounds side by side, and the kills they go through.
const WORKERS: usize = 3;
const KILLS: usize = 16;
/// Rounds a client has ready (it stops after the last kill, long before these run out).
const ROUNDS: usize = 400;
/// Every `KEEP`th round leaves its pod and container running.
const KEEP: usize = 3;
/// No call may take longer, kill or not.
const CALL_LIMIT: Duration = Duration::from_secs(60);

/// The calls of a round, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    RunPod,
    Create,
    Start,
    Exec,
    Stop,
    Remove,
    StopPod,
    RemovePod,
}

/// What one round of one client did: the steps that succeeded, and the step a kill cut off
/// (after which the round ends, its outcome unknown to the client).
#[derive(Debug, Default)]
struct Round {
    name: String,
    pod: Option<String>,
    container: Option<String>,
    done: Vec<Step>,
    cut: Option<Step>,
}

impl Round {
    fn did(&self, step: Step) -> bool {
        self.done.contains(&step)
    }
}

/// How the kills and the calls meet: a call's failure is a kill's doing only if crius was
/// down when the call began or was killed while it ran.
#[derive(Default)]
struct Schedule {
    kills: AtomicU64,
    up: AtomicBool,
    /// Set after the last kill: the clients finish the round they are in.
    over: AtomicBool,
    /// A step whose next answer sets off the kill at once: the moment right after a reply,
    /// when what the client was told must already be on disk.
    armed: std::sync::Mutex<Option<Step>>,
    fire: tokio::sync::Notify,
}

struct Worker {
    socket: PathBuf,
    schedule: Arc<Schedule>,
    /// Failures no kill explains: the test fails on any.
    unexplained: Vec<String>,
}

impl Worker {
    async fn client(&self) -> Result<RuntimeServiceClient<Channel>, tonic::Status> {
        crius_tests::crius::connect(&self.socket)
            .await
            .map(RuntimeServiceClient::new)
            .map_err(|e| tonic::Status::unavailable(e.to_string()))
    }

    /// Runs one call; `Some` with its answer, or `None` when a kill cut it off (recorded in
    /// the round). A failure with crius up all along is recorded as unexplained.
    async fn call<T, F, Fut>(&mut self, round: &mut Round, step: Step, f: F) -> Option<T>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let kills = self.schedule.kills.load(Ordering::SeqCst);
        let up = self.schedule.up.load(Ordering::SeqCst);
        let outcome = match tokio::time::timeout(CALL_LIMIT, async {
            let rt = self.client().await?;
            f(rt).await
        })
        .await
        {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {CALL_LIMIT:?}"
            ))),
        };
        match outcome {
            Ok(resp) => {
                round.done.push(step);
                let mut armed = self.schedule.armed.lock().unwrap();
                if *armed == Some(step) {
                    *armed = None;
                    self.schedule.fire.notify_one();
                }
                Some(resp.into_inner())
            }
            Err(status) => {
                let killed = self.schedule.kills.load(Ordering::SeqCst) != kills || !up;
                let transport = matches!(
                    status.code(),
                    Code::Unavailable | Code::Unknown | Code::Cancelled
                );
                if !(killed && transport) {
                    self.unexplained.push(format!(
                        "{} {step:?}: {:?} {} (crius up: {up}, killed meanwhile: {killed})",
                        round.name,
                        status.code(),
                        status.message()
                    ));
                }
                round.cut = Some(step);
                None
            }
        }
    }

    async fn round(
        &mut self,
        pod_config: PodSandboxConfig,
        ctr: ContainerConfig,
        keep: bool,
    ) -> Round {
        let mut round = Round {
            name: pod_config.metadata.as_ref().unwrap().name.clone(),
            ..Default::default()
        };
        let pc = pod_config.clone();
        let Some(r) = self
            .call(&mut round, Step::RunPod, |mut rt| async move {
                rt.run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(pc),
                    runtime_handler: String::new(),
                })
                .await
            })
            .await
        else {
            return round;
        };
        let pod = r.pod_sandbox_id;
        round.pod = Some(pod.clone());
        let (p, pc) = (pod.clone(), pod_config.clone());
        let Some(r) = self
            .call(&mut round, Step::Create, |mut rt| async move {
                rt.create_container(CreateContainerRequest {
                    pod_sandbox_id: p,
                    config: Some(ctr),
                    sandbox_config: Some(pc),
                })
                .await
            })
            .await
        else {
            return round;
        };
        let id = r.container_id;
        round.container = Some(id.clone());
        let c = id.clone();
        let steps: [(Step, bool); 6] = [
            (Step::Start, true),
            (Step::Exec, true),
            (Step::Stop, !keep),
            (Step::Remove, !keep),
            (Step::StopPod, !keep),
            (Step::RemovePod, !keep),
        ];
        for (step, wanted) in steps {
            if !wanted {
                break;
            }
            let (c, p) = (c.clone(), pod.clone());
            let ok = match step {
                Step::Start => self
                    .call(&mut round, step, |mut rt| async move {
                        rt.start_container(StartContainerRequest { container_id: c })
                            .await
                    })
                    .await
                    .is_some(),
                Step::Exec => {
                    let answer = self
                        .call(&mut round, step, |mut rt| async move {
                            rt.exec_sync(ExecSyncRequest {
                                container_id: c,
                                cmd: vec!["true".into()],
                                timeout: 20,
                            })
                            .await
                        })
                        .await;
                    if let Some(a) = &answer {
                        if a.exit_code != 0 {
                            self.unexplained
                                .push(format!("{} exec: exit code {}", round.name, a.exit_code));
                        }
                    }
                    answer.is_some()
                }
                Step::Stop => self
                    .call(&mut round, step, |mut rt| async move {
                        rt.stop_container(StopContainerRequest {
                            container_id: c,
                            timeout: 0,
                        })
                        .await
                    })
                    .await
                    .is_some(),
                Step::Remove => self
                    .call(&mut round, step, |mut rt| async move {
                        rt.remove_container(RemoveContainerRequest { container_id: c })
                            .await
                    })
                    .await
                    .is_some(),
                Step::StopPod => self
                    .call(&mut round, step, |mut rt| async move {
                        rt.stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: p })
                            .await
                    })
                    .await
                    .is_some(),
                Step::RemovePod => self
                    .call(&mut round, step, |mut rt| async move {
                        rt.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: p })
                            .await
                    })
                    .await
                    .is_some(),
                Step::RunPod | Step::Create => unreachable!("not in the list"),
            };
            if !ok {
                break;
            }
        }
        round
    }
}

/// A fourth client pulls and removes an image whose lowest layer is the pods' image's, so
/// that the kills also meet the image store's writes and its collection of layers no image
/// holds any more, while containers use the shared one. Returns whether the image must be
/// there (`None`: the last call was cut off), its failures no kill explains, and how many
/// calls it made.
async fn pull_and_remove(
    socket: PathBuf,
    schedule: Arc<Schedule>,
    image: String,
) -> (Option<bool>, Vec<String>, usize) {
    let mut there = Some(false);
    let mut unexplained = Vec::new();
    let mut n = 0;
    while !schedule.over.load(Ordering::SeqCst) {
        while !schedule.up.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        n += 1;
        let pull = n % 2 == 1;
        let kills = schedule.kills.load(Ordering::SeqCst);
        let up = schedule.up.load(Ordering::SeqCst);
        let image = image.clone();
        let answer = tokio::time::timeout(CALL_LIMIT, async {
            let mut client = crius_tests::crius::connect(&socket)
                .await
                .map(ImageServiceClient::new)
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let spec = Some(ImageSpec {
                image,
                ..Default::default()
            });
            match pull {
                true => client
                    .pull_image(PullImageRequest {
                        image: spec,
                        ..Default::default()
                    })
                    .await
                    .map(|_| ()),
                false => client
                    .remove_image(RemoveImageRequest { image: spec })
                    .await
                    .map(|_| ()),
            }
        })
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answer")));
        match answer {
            Ok(()) => there = Some(pull),
            Err(status) => {
                let killed = schedule.kills.load(Ordering::SeqCst) != kills || !up;
                let transport = matches!(
                    status.code(),
                    Code::Unavailable | Code::Unknown | Code::Cancelled
                );
                if !(killed && transport) {
                    unexplained.push(format!(
                        "{} {n}: {:?} {}",
                        if pull { "PullImage" } else { "RemoveImage" },
                        status.code(),
                        status.message()
                    ));
                }
                there = None;
            }
        }
    }
    (there, unexplained, n)
}

fn seed() -> u64 {
    match std::env::var("CRIUS_CRASH_SEED") {
        Ok(s) => s.parse().expect("CRIUS_CRASH_SEED: a number"),
        Err(_) => {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        }
    }
}

#[tokio::test]
async fn crius_killed_at_random_moments_keeps_what_it_said_and_leaves_nothing() {
    let mut env = Env::with_image().await;
    let seed = seed();
    println!("CRIUS_CRASH_SEED={seed}");
    let mut rng = Rng(seed);
    let schedule = Arc::new(Schedule::default());
    schedule.up.store(true, Ordering::SeqCst);

    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let rounds: Vec<_> = (0..ROUNDS)
            .map(|r| {
                let name = format!("crash-w{w}-r{r}");
                (
                    env.pod_config(&name, false),
                    env.container_config("c", &["sleep", "3600"]),
                    r % KEEP == KEEP - 1,
                )
            })
            .collect();
        let mut worker = Worker {
            socket: env.crius.socket(),
            schedule: Arc::clone(&schedule),
            unexplained: Vec::new(),
        };
        workers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            for (pod, ctr, keep) in rounds {
                if worker.schedule.over.load(Ordering::SeqCst) {
                    break;
                }
                // A round begins with crius up: the kills, not the rounds, pick the moments.
                while !worker.schedule.up.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                done.push(worker.round(pod, ctr, keep).await);
            }
            (done, worker.unexplained)
        }));
    }

    let layered = images::push(&env.registry, TestImage::MultiLayer).unwrap();
    assert_eq!(
        layered.layers[0].diff_id, env.pushed.layers[0].diff_id,
        "the layered image is built on the pods' image"
    );
    let puller = tokio::spawn(pull_and_remove(
        env.crius.socket(),
        Arc::clone(&schedule),
        layered.reference.clone(),
    ));

    // Kill at random moments while the clients go on: half of the kills after a random
    // wait, the other half right after an answer, to each step once (in random order).
    const STEPS: [Step; 8] = [
        Step::RunPod,
        Step::Create,
        Step::Start,
        Step::Exec,
        Step::Stop,
        Step::Remove,
        Step::StopPod,
        Step::RemovePod,
    ];
    let mut after: Vec<Option<Step>> = STEPS.iter().copied().map(Some).collect();
    after.resize(KILLS, None);
    for i in (1..after.len()).rev() {
        after.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for armed in after {
        if let Some(step) = armed {
            *schedule.armed.lock().unwrap() = Some(step);
            // Kept rounds do not stop their containers: a step may not come soon.
            let _ = tokio::time::timeout(Duration::from_secs(3), schedule.fire.notified()).await;
            *schedule.armed.lock().unwrap() = None;
        } else {
            tokio::time::sleep(Duration::from_millis(100 + rng.below(900))).await;
        }
        assert!(
            !workers.iter().any(|w| w.is_finished()),
            "a client ran out of rounds"
        );
        schedule.up.store(false, Ordering::SeqCst);
        schedule.kills.fetch_add(1, Ordering::SeqCst);
        env.crius.kill9().unwrap();
        // Sometimes crius stays away a while, as under a supervisor's back-off.
        if rng.below(4) == 0 {
            tokio::time::sleep(Duration::from_millis(rng.below(500))).await;
        }
        env.crius.restart().await.unwrap();
        schedule.up.store(true, Ordering::SeqCst);
    }
    schedule.over.store(true, Ordering::SeqCst);
    let mut rounds = Vec::new();
    let mut unexplained = Vec::new();
    for w in workers {
        let (r, u) = w.await.unwrap();
        rounds.extend(r);
        unexplained.extend(u);
    }
    let (layered_there, u, image_calls) = puller.await.unwrap();
    unexplained.extend(u);
    let whole = rounds.iter().filter(|r| r.cut.is_none()).count();
    let cut: HashMap<String, usize> =
        rounds
            .iter()
            .filter_map(|r| r.cut)
            .fold(HashMap::new(), |mut m, s| {
                *m.entry(format!("{s:?}")).or_default() += 1;
                m
            });
    println!(
        "{KILLS} kills; {whole} of {} rounds whole; cut off at: {cut:?}; \
         {image_calls} PullImage and RemoveImage calls",
        rounds.len()
    );
    assert!(
        unexplained.is_empty(),
        "failures no kill explains: {unexplained:#?}"
    );

    let problems = audit(&env, &rounds).await;
    // Every pod crius has is one of this test's (the drop removes them should a check fail).
    let listed = env.list_pods(PodSandboxFilter::default()).await;
    env.pods.extend(listed.iter().map(|p| p.id.clone()));
    env.pods.extend(rounds.iter().filter_map(|r| r.pod.clone()));
    assert!(
        problems.is_empty(),
        "after {KILLS} kills (seed {seed}): {problems:#?}"
    );

    // Everything goes through the CRI, as kubelet would remove it.
    for pod in &listed {
        env.stop_pod(&pod.id).await;
        env.remove_pod(&pod.id).await;
    }
    let left = env.list_containers(ContainerFilter::default()).await;
    assert!(left.is_empty(), "containers left: {left:?}");
    env.pods.sort();
    env.pods.dedup();
    env.assert_no_leaks().await;

    // The images: the layered one as its last answer left it, the pods' one whole, and once
    // the layered one is removed, nothing in the store but the pods' image.
    let status = env.image_status(&layered.reference).await;
    if let Some(there) = layered_there {
        assert_eq!(status.is_some(), there, "the layered image after the kills");
    }
    if status.is_some() {
        env.crius
            .image()
            .remove_image(RemoveImageRequest {
                image: Some(ImageSpec {
                    image: layered.reference.clone(),
                    ..Default::default()
                }),
            })
            .await
            .unwrap();
    }
    let pods_image = env.image_status(&env.image).await.expect("the pods' image");
    assert_eq!(pods_image.id, env.pushed.config_digest);
    let blobs: HashSet<String> = std::fs::read_dir(env.crius.root().join("content/sha256"))
        .unwrap()
        .map(|e| format!("sha256:{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    let wanted: HashSet<String> = [&env.pushed.digest, &env.pushed.config_digest]
        .into_iter()
        .cloned()
        .chain(env.pushed.layers.iter().map(|l| l.digest.clone()))
        .collect();
    assert_eq!(blobs, wanted, "blobs in the store");
    let snapshots = std::fs::read_dir(env.crius.root().join("snapshots"))
        .unwrap()
        .count();
    assert_eq!(snapshots, env.pushed.layers.len(), "snapshots in the store");
    // A container from the image the store kept still starts.
    let config = env.pod_config("crash-after", false);
    let pod = env.run_pod(config.clone()).await;
    let c = env
        .create_start(&pod, &config, env.container_config("c", &["true"]))
        .await;
    assert_eq!(
        env.wait_exited(&c, Duration::from_secs(10)).await.exit_code,
        0
    );
    env.remove_all_and_check(&[&c], &pod).await;
}

/// Checks crius's pods and containers against what the rounds were told; returns what does
/// not match.
async fn audit(env: &Env, rounds: &[Round]) -> Vec<String> {
    let mut problems = Vec::new();
    let pods: HashMap<String, PodSandbox> = env
        .list_pods(PodSandboxFilter::default())
        .await
        .into_iter()
        .map(|p| (p.id.clone(), p))
        .collect();
    let containers: HashMap<String, Container> = env
        .list_containers(ContainerFilter::default())
        .await
        .into_iter()
        .map(|c| (c.id.clone(), c))
        .collect();
    let ready = PodSandboxState::SandboxReady as i32;
    let not_ready = PodSandboxState::SandboxNotready as i32;
    let (created, running, exited) = (
        ContainerState::ContainerCreated as i32,
        ContainerState::ContainerRunning as i32,
        ContainerState::ContainerExited as i32,
    );
    let by_name: HashMap<&str, &Round> = rounds.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut explained_pods = HashSet::new();
    let mut explained_containers = HashSet::new();
    let mut resurrected = 0;

    for r in rounds {
        let name = &r.name;
        // The pod.
        let pod_state = r.pod.as_ref().and_then(|id| pods.get(id)).map(|p| p.state);
        if let Some(id) = &r.pod {
            explained_pods.insert(id.clone());
            let allowed: &[Option<i32>] = if r.did(Step::RemovePod) {
                &[None]
            } else if r.cut == Some(Step::RemovePod) {
                &[None, Some(not_ready)]
            } else if r.did(Step::StopPod) {
                &[Some(not_ready)]
            } else if r.cut == Some(Step::StopPod) {
                &[Some(ready), Some(not_ready)]
            } else {
                &[Some(ready)]
            };
            if !allowed.contains(&pod_state) {
                problems.push(format!(
                    "{name}: pod {id} is {pod_state:?}, expected one of {allowed:?} (done {:?}, cut {:?})",
                    r.done, r.cut
                ));
            }
        }
        // The container.
        let Some(id) = &r.container else { continue };
        explained_containers.insert(id.clone());
        let state = containers.get(id).map(|c| c.state);
        let allowed: &[Option<i32>] = if r.did(Step::Remove) {
            // Its removal may be undone by a kill within 100 ms (docs/architecture.md):
            // the container comes back exited, and a second removal takes it.
            &[None, Some(exited)]
        } else if r.cut == Some(Step::Remove) || r.did(Step::StopPod) {
            &[None, Some(exited)]
        } else if r.did(Step::Stop) {
            &[Some(exited)]
        } else if r.cut == Some(Step::Stop) {
            &[Some(running), Some(exited)]
        } else if r.did(Step::Start) {
            &[Some(running)]
        } else if r.cut == Some(Step::Start) {
            &[Some(created), Some(running)]
        } else {
            &[Some(created)]
        };
        if !allowed.contains(&state) {
            problems.push(format!(
                "{name}: container {id} is {state:?}, expected one of {allowed:?} (done {:?}, cut {:?})",
                r.done, r.cut
            ));
        }
        if r.did(Step::Remove) && state.is_some() {
            resurrected += 1;
        }
    }

    // A pod or container no client was told of comes only from a call a kill cut off, and
    // only as that call would have left it.
    for (id, p) in &pods {
        if explained_pods.contains(id) {
            continue;
        }
        let name = p.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
        let cut_run = by_name
            .get(name)
            .is_some_and(|r| r.pod.is_none() && r.cut == Some(Step::RunPod));
        if !cut_run || p.state != ready {
            problems.push(format!(
                "pod {id} ({name}, state {}) was never handed out",
                p.state
            ));
        }
    }
    for (id, c) in &containers {
        if explained_containers.contains(id) {
            continue;
        }
        let cut_create = rounds.iter().any(|r| {
            r.pod.as_deref() == Some(c.pod_sandbox_id.as_str())
                && r.container.is_none()
                && r.cut == Some(Step::Create)
        });
        if !cut_create || c.state != created {
            problems.push(format!(
                "container {id} (pod {}, state {}) was never handed out",
                c.pod_sandbox_id, c.state
            ));
        }
    }

    // Running containers run, and their shims answer.
    for (id, c) in &containers {
        if c.state != running {
            continue;
        }
        let pid = env.pid(id).await;
        if !common::alive(pid) {
            problems.push(format!(
                "container {id} is reported running, its pid {pid} is gone"
            ));
            continue;
        }
        match env.exec(id, &["true"], 20).await {
            Ok(r) if r.exit_code == 0 => {}
            other => problems.push(format!(
                "container {id}: ExecSync after the kills: {other:?}"
            )),
        }
    }
    // A removal a kill undid is done again by a second RemoveContainer.
    for r in rounds.iter().filter(|r| r.did(Step::Remove)) {
        let id = r.container.as_ref().unwrap();
        if containers.contains_key(id) {
            env.remove(id).await;
        }
    }
    println!(
        "audit: {} pods, {} containers listed; {resurrected} removed containers came back exited",
        pods.len(),
        containers.len()
    );
    problems
}
