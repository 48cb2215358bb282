//! NRI plugins against a real crius: a plugin that adjusts containers (env, a mount, a CPU
//! limit, checked inside the container and in its cgroup) and sees every event in order; one
//! that refuses a create (nothing leaks, a retry works); one that hangs (timed out and
//! disconnected, other pods unaffected); one that connects while pods run (synchronized, then
//! live events); and a plugin crius starts itself from `[nri] plugin_path`, again after a
//! restart. The plugin is `crius_tests::nri`, the plugin side written independently of crius.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::common::{wait_for, Env};
use crius_api::v1::*;
use crius_tests::nri::{Behaviour, Plugin};
use crius_tests::TestDir;
use tonic::Code;

async fn plugin(env: &Env, name: &str, index: &str, b: Behaviour) -> Plugin {
    Plugin::connect(&env.crius.nri_socket(), name, index, b)
        .await
        .unwrap()
}

/// `nri` of a verbose Status.
async fn nri_status(env: &Env) -> serde_json::Value {
    env.runtime_info("nri").await
}

/// `<index>-<name>` of the connected plugins, in event order.
async fn connected(env: &Env) -> Vec<String> {
    nri_status(env).await["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}-{}",
                p["index"].as_str().unwrap(),
                p["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// Whether the environment of container `id` holds `var` (`KEY=VALUE`).
async fn has_env(env: &Env, id: &str, var: &str) -> bool {
    let out = env.exec(id, &["env"], 10).await.unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l == var)
}

/// The container's CPU quota and period as the kernel shows them in its cgroup (v2 or v1).
async fn cpu_limit(env: &Env, id: &str) -> String {
    let spec = env.status_info(id).await;
    let path = spec["runtimeSpec"]["linux"]["cgroupsPath"]
        .as_str()
        .unwrap()
        .trim_start_matches('/')
        .to_string();
    let root = std::path::Path::new("/sys/fs/cgroup");
    let read = |p: std::path::PathBuf| std::fs::read_to_string(&p).unwrap().trim().to_string();
    if root.join("cgroup.controllers").exists() {
        read(root.join(&path).join("cpu.max"))
    } else {
        let dir = root.join("cpu").join(&path);
        format!(
            "{} {}",
            read(dir.join("cpu.cfs_quota_us")),
            read(dir.join("cpu.cfs_period_us"))
        )
    }
}

#[tokio::test]
async fn a_plugin_adjusts_env_mounts_and_cpu_and_sees_every_event_in_order() {
    let mut env = Env::with_image().await;
    let data = env.crius.dir().join("nri-data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("hello"), "from the plugin\n").unwrap();
    let p = plugin(
        &env,
        "adjuster",
        "10",
        Behaviour {
            env: vec![("NRI_INJECTED".into(), "yes".into())],
            mounts: vec![(data.display().to_string(), "/nri-data".into())],
            cpu: Some((20000, 100000)),
            ..Default::default()
        },
    )
    .await;
    p.with_seen(|s| {
        let c = s.configured.as_ref().unwrap();
        assert_eq!(c.runtime_name, "crius");
        assert_eq!(c.request_timeout, 2000);
    });
    assert_eq!(connected(&env).await, ["10-adjuster"]);

    let config = env.pod_config("nri", false);
    let pod = env.run_pod(config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &config,
            env.container_config("work", &["sleep", "1000"]),
        )
        .await;
    assert!(has_env(&env, &c, "NRI_INJECTED=yes").await);
    let out = env.exec(&c, &["cat", "/nri-data/hello"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from the plugin\n");
    // read-only, as the plugin asked
    let out = env.exec(&c, &["touch", "/nri-data/x"], 10).await.unwrap();
    assert_ne!(out.exit_code, 0);
    assert_eq!(cpu_limit(&env, &c).await, "20000 100000");
    let status = env.status(&c).await;
    let cpu = status.resources.and_then(|r| r.linux).unwrap();
    assert_eq!((cpu.cpu_quota, cpu.cpu_period), (20000, 100000));

    let more_cpu = LinuxContainerResources {
        cpu_quota: 50000,
        cpu_period: 100000,
        ..Default::default()
    };
    env.rt()
        .update_container_resources(UpdateContainerResourcesRequest {
            container_id: c.clone(),
            linux: Some(more_cpu.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(cpu_limit(&env, &c).await, "50000 100000");
    env.rt()
        .update_pod_sandbox_resources(UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: pod.clone(),
            resources: Some(more_cpu),
            ..Default::default()
        })
        .await
        .unwrap();

    env.stop(&c, 0).await;
    env.remove(&c).await;
    env.stop_pod(&pod).await;
    env.stop_pod(&pod).await; // a second stop tells plugins nothing
    env.remove_pod(&pod).await;
    p.wait_for("RemovePodSandbox", Duration::from_secs(5), |s| {
        s.events.iter().any(|e| e.name == "RemovePodSandbox")
    })
    .await
    .unwrap();
    assert_eq!(
        p.events_of(&c),
        [
            "CreateContainer",
            "PostCreateContainer",
            "StartContainer",
            "PostStartContainer",
            "UpdateContainer",
            "PostUpdateContainer",
            "StopContainer",
            "RemoveContainer"
        ]
    );
    assert_eq!(
        p.events_of(&pod),
        [
            "RunPodSandbox",
            "UpdatePodSandbox",
            "PostUpdatePodSandbox",
            "StopPodSandbox",
            "RemovePodSandbox"
        ]
    );
    p.with_seen(|s| {
        let create = s
            .events
            .iter()
            .find(|e| e.name == "CreateContainer")
            .unwrap();
        assert_eq!(
            (create.container_name.as_str(), create.pod_name.as_str()),
            ("work", "nri")
        );
    });
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn a_plugin_refusing_a_create_fails_it_and_nothing_is_left() {
    let mut env = Env::with_image().await;
    let refuser = plugin(
        &env,
        "refuser",
        "10",
        Behaviour {
            fail_create: Some("no room on this node".into()),
            ..Default::default()
        },
    )
    .await;
    let config = env.pod_config("refused", false);
    let pod = env.run_pod(config.clone()).await;
    let err = env
        .rt()
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(env.container_config("work", &["sleep", "1000"])),
            sandbox_config: Some(config.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("10-refuser") && err.message().contains("no room on this node"),
        "{err:?}"
    );
    assert!(env
        .list_containers(ContainerFilter::default())
        .await
        .is_empty());
    let dirs: Vec<_> = std::fs::read_dir(env.crius.state().join("containers"))
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(dirs.is_empty(), "container dirs left: {dirs:?}");

    // Without the plugin the same name is free again.
    drop(refuser);
    wait_for("the plugin gone", Duration::from_secs(5), || async {
        connected(&env).await.is_empty().then_some(())
    })
    .await;
    let c = env
        .create_start(
            &pod,
            &config,
            env.container_config("work", &["sleep", "1000"]),
        )
        .await;
    env.remove(&c).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn a_hanging_plugin_is_timed_out_and_disconnected_without_stalling_other_pods() {
    let mut env = Env::with_image_and_config("[nri]\nplugin_request_timeout = \"3s\"\n").await;
    let hanger = plugin(
        &env,
        "hanger",
        "10",
        Behaviour {
            hang_create: true,
            ..Default::default()
        },
    )
    .await;
    let watcher = plugin(&env, "watcher", "20", Behaviour::default()).await;
    let config = env.pod_config("hang", false);
    let pod = env.run_pod(config.clone()).await;

    let rt = env.rt();
    let (pod_id, cfg, c_cfg) = (
        pod.clone(),
        config.clone(),
        env.container_config("work", &["sleep", "1000"]),
    );
    let create = tokio::spawn(async move {
        rt.clone()
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod_id,
                config: Some(c_cfg),
                sandbox_config: Some(cfg),
            })
            .await
    });
    hanger
        .wait_for("the hanging create", Duration::from_secs(5), |s| {
            s.events.iter().any(|e| e.name == "CreateContainer")
        })
        .await
        .unwrap();
    // Another pod starts while the plugin holds up the create.
    let other_config = env.pod_config("other", false);
    let other = env.run_pod(other_config).await;
    assert!(
        !create.is_finished(),
        "the create should still wait for the plugin"
    );

    let err = create.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(err.message().contains("10-hanger"), "{err:?}");
    assert_eq!(connected(&env).await, ["20-watcher"]);
    let c = env
        .create_start(
            &pod,
            &config,
            env.container_config("work", &["sleep", "1000"]),
        )
        .await;
    assert_eq!(watcher.events_of(&c)[0], "CreateContainer");
    assert!(hanger.events_of(&c).is_empty());
    env.remove(&c).await;
    env.remove_pod(&pod).await;
    env.remove_pod(&other).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn a_plugin_connecting_while_pods_run_is_synchronized_then_gets_live_events() {
    let mut env = Env::with_image().await;
    let config = env.pod_config("early", false);
    let pod = env.run_pod(config.clone()).await;
    let first = env
        .create_start(
            &pod,
            &config,
            env.container_config("first", &["sleep", "1000"]),
        )
        .await;

    let late = plugin(&env, "late", "50", Behaviour::default()).await;
    late.with_seen(|s| {
        assert_eq!(s.synced_pods, std::slice::from_ref(&pod));
        assert_eq!(s.synced_containers, std::slice::from_ref(&first));
    });
    let second = env
        .create_start(
            &pod,
            &config,
            env.container_config("second", &["sleep", "1000"]),
        )
        .await;
    assert_eq!(late.events_of(&second)[0], "CreateContainer");
    env.remove_pod(&pod).await;
    late.wait_for("RemovePodSandbox", Duration::from_secs(5), |s| {
        s.events.iter().any(|e| e.name == "RemovePodSandbox")
    })
    .await
    .unwrap();
    // what it learnt of in the snapshot it hears the end of
    assert_eq!(late.events_of(&first), ["StopContainer", "RemoveContainer"]);
    assert_eq!(late.events_of(&pod), ["StopPodSandbox", "RemovePodSandbox"]);
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn crius_starts_the_plugins_of_plugin_path_with_their_config_and_again_after_a_restart() {
    let dirs = TestDir::new("nri-plugins").unwrap();
    let (bin, conf) = (dirs.join("plugins"), dirs.join("conf.d"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_nri-plugin"), bin.join("05-injector")).unwrap();
    std::fs::write(conf.join("05-injector.conf"), "env=FROM_CONF=1\n").unwrap();
    let extra = format!(
        "[nri]\nplugin_path = \"{}\"\nplugin_config_path = \"{}\"\n",
        bin.display(),
        conf.display()
    );
    let mut env = Env::with_image_and_config(&extra).await;
    let launched = || async {
        let status = nri_status(&env).await;
        let plugins = status["plugins"].as_array().cloned().unwrap_or_default();
        plugins
            .iter()
            .any(|p| p["name"] == "injector" && p["index"] == "05" && p["launched"] == true)
            .then_some(())
    };
    wait_for("the injector plugin", Duration::from_secs(10), launched).await;

    let config = env.pod_config("pre", false);
    let pod = env.run_pod(config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &config,
            env.container_config("work", &["sleep", "1000"]),
        )
        .await;
    assert!(has_env(&env, &c, "FROM_CONF=1").await);

    env.crius.restart().await.unwrap();
    wait_for(
        "the injector plugin after the restart",
        Duration::from_secs(10),
        || async {
            let status = nri_status(&env).await;
            status["plugins"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["name"] == "injector"))
                .then_some(())
        },
    )
    .await;
    let c2 = env
        .create_start(
            &pod,
            &config,
            env.container_config("again", &["sleep", "1000"]),
        )
        .await;
    assert!(has_env(&env, &c2, "FROM_CONF=1").await);
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}
