//! The soak of issue 49 on this machine: 110 pods (kubelet's default maximum) for an hour under
//! kubelet's load and a churn of pods, the daemon's and the shims' resources printed as a curve
//! (`crius_tests::soak`). Runs only when `CRIUS_SOAK_MINUTES` is set (`make soak`: 60);
//! `CRIUS_SOAK_PODS` changes the number of pods. Prints figures; what it asserts is that no call
//! failed, no log lost or repeated a line, crius logged no error, and nothing was left.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::Env;
use crius_tests::soak::{self, Node, Plan, Sample, Shape};
use crius_tests::Error;

/// crius of the test's [`Env`], read from this machine's `/proc`.
struct Local {
    args: Vec<String>,
    log: std::path::PathBuf,
}

impl Node for Local {
    fn sample(&mut self) -> crius_tests::Result<Sample> {
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(soak::SAMPLER)
            .args(&self.args)
            .output()
            .map_err(|e| Error::Node(format!("run python3: {e}")))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(Error::Node(format!("sampler: {err}")));
        }
        Sample::parse(&String::from_utf8_lossy(&out.stdout))
    }

    fn read(&mut self, path: &str) -> crius_tests::Result<String> {
        std::fs::read_to_string(path).map_err(|e| Error::Node(format!("read {path}: {e}")))
    }

    fn complaints(&mut self) -> crius_tests::Result<Vec<String>> {
        complaints(&self.log)
    }
}

/// The lines of crius's log at `log` at WARN or ERROR.
fn complaints(log: &std::path::Path) -> crius_tests::Result<Vec<String>> {
    let text = std::fs::read_to_string(log)
        .map_err(|e| Error::Node(format!("read {}: {e}", log.display())))?;
    Ok(text
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .map(String::from)
        .collect())
}

fn minutes(var: &str) -> Option<f64> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn soak_of_110_pods_with_churn_probes_and_logs() {
    let Some(mins) = minutes("CRIUS_SOAK_MINUTES") else {
        eprintln!("skipped: set CRIUS_SOAK_MINUTES (make soak)");
        return;
    };
    let pods = std::env::var("CRIUS_SOAK_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(110);
    let env = Env::with_image().await;
    let duration = Duration::from_secs_f64(mins * 60.0);
    let plan = Plan {
        pods,
        duration,
        churn_every: Duration::from_secs(6),
        probe_every: Duration::from_secs(10),
        sample_every: Duration::from_secs(60).min(duration / 4),
        warmup: Duration::from_secs(300).min(duration / 4),
        parallel_starts: 10,
    };
    let node = Local {
        args: soak::sampler_args(
            &env.crius.pid().expect("crius runs").to_string(),
            env.crius.root().join("crius.db").to_str().unwrap(),
            "crius-shim",
            env.crius.state().to_str().unwrap(),
        ),
        log: env.crius.log_path(),
    };
    let report = soak::run(env.rt(), &plan, Arc::new(shape(&env)), Box::new(node)).await;
    println!("{}", report.render());
    let complaints = complaints(&env.crius.log_path()).unwrap();
    let errors: Vec<&String> = complaints
        .iter()
        .filter(|l| l.contains(" ERROR "))
        .collect();
    println!(
        "crius logged {} warnings and {} errors",
        complaints.len() - errors.len(),
        errors.len()
    );
    for (shape, n) in soak::shapes(&complaints) {
        println!("  {n:>5} x {shape}");
    }
    assert_eq!(report.failed, 0, "failed calls: {:#?}", report.failures);
    assert!(report.log_problems.is_empty(), "{:#?}", report.log_problems);
    assert!(report.cycles > 0, "the churn replaced no pod");
    assert!(report.saw_every_shim(), "the sampler missed shims");
    assert!(errors.is_empty(), "crius logged errors: {errors:#?}");
    let after = report.after.expect("a sample after the pods were removed");
    assert!(
        after.shims.is_empty(),
        "shims left: {:?}",
        after.shims.keys()
    );
    env.assert_no_leaks().await;
}

/// The test's pods on its bridge network, each with one [`soak::LOGGER`] container logging to
/// `<pod's log dir>/<name>.log`.
fn shape(env: &Env) -> Shape {
    let template = env.pod_config("template", false);
    let logs = env.crius.dir().join("logs");
    let container = env.container_config("template", soak::LOGGER);
    Shape {
        pod: Box::new(move |name| {
            let mut config = template.clone();
            if let Some(m) = config.metadata.as_mut() {
                m.name = name.to_string();
                m.uid = format!("uid-{name}");
            }
            config.log_directory = logs.join(name).display().to_string();
            config.labels.insert("pod".into(), name.into());
            config
        }),
        container: Box::new(move |name| {
            let mut config = container.clone();
            if let Some(m) = config.metadata.as_mut() {
                m.name = name.to_string();
            }
            config.log_path = format!("{name}.log");
            config.labels.insert("container".into(), name.into());
            config
        }),
    }
}
