//! Figures read at each scrape rather than recorded: pods and containers by state, the pods'
//! shims and their memory, crius's own memory, the database's size, dropped container
//! events, and how far each pull under way has come.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::config::MetricsConfig;
use crate::daemon::Daemon;
use crate::records::{ContainerState, SandboxState};

/// Reads the daemon at each scrape; holds it weakly, so the endpoint never keeps it alive.
#[derive(Debug)]
pub struct Collector(pub Weak<Daemon>);

impl Daemon {
    /// Serves the metrics endpoint as `config` says ([`super::server::Endpoint::apply`]), each
    /// scrape reading this daemon: at start, and again when SIGHUP changes `[metrics]`. The
    /// address served on, if any.
    pub(crate) async fn serve_metrics(
        self: &Arc<Self>,
        config: &MetricsConfig,
    ) -> anyhow::Result<Option<SocketAddr>> {
        self.metrics_endpoint
            .apply(config, Collector(Arc::downgrade(self)))
            .await
    }
}

/// One gauge with no labels.
fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    ConstGauge::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// One gauge with a value per value of one label.
fn gauges<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    key: &'static str,
    values: impl IntoIterator<Item = (&'a str, i64)>,
) -> std::fmt::Result {
    let mut metric = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value, n) in values {
        ConstGauge::new(n).encode(metric.encode_family(&[(key, value)])?)?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let Some(d) = self.0.upgrade() else {
            return Ok(());
        };
        let pods = d.sandboxes.all();
        let mut by_state = [("ready", 0), ("notready", 0)];
        for p in &pods {
            by_state[usize::from(p.state != SandboxState::Ready)].1 += 1;
        }
        gauges(
            &mut enc,
            "pods",
            "pod sandboxes by CRI state.",
            "state",
            by_state,
        )?;
        let mut by_state = [("created", 0), ("running", 0), ("exited", 0)];
        for c in d.containers.all() {
            let i = match c.state {
                ContainerState::Creating | ContainerState::Created => 0,
                ContainerState::Running => 1,
                ContainerState::Exited => 2,
            };
            by_state[i].1 += 1;
        }
        gauges(
            &mut enc,
            "containers",
            "containers by CRI state.",
            "state",
            by_state,
        )?;

        let (mut shims, mut shim_rss) = (0, 0);
        for p in &pods {
            if let Some(pid) = d.shims.running_pid(&p.id) {
                shims += 1;
                shim_rss += rss_bytes(&pid.to_string()).unwrap_or(0);
            }
        }
        gauge(&mut enc, "shims", "pod shims running.", shims)?;
        gauge(
            &mut enc,
            "shim_resident_memory_bytes",
            "resident memory of all pod shims together.",
            shim_rss,
        )?;
        gauge(
            &mut enc,
            "resident_memory_bytes",
            "resident memory of the crius daemon.",
            rss_bytes("self").unwrap_or(0),
        )?;
        let db = std::fs::metadata(d.config.root.join("crius.db")).map_or(0, |m| m.len());
        gauge(
            &mut enc,
            "database_size_bytes",
            "size of crius's database file.",
            i64::try_from(db).unwrap_or(i64::MAX),
        )?;
        ConstCounter::new(d.events.dropped()).encode(enc.encode_descriptor(
            "cri_container_events_dropped",
            "container events a GetContainerEvents subscriber was too slow to take.",
            None,
            MetricType::Counter,
        )?)?;

        let pulls = d.images.pulls_in_progress();
        gauge(
            &mut enc,
            "cri_in_progress_image_pulls",
            "image pulls under way.",
            i64::try_from(pulls.len()).unwrap_or(i64::MAX),
        )?;
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        gauges(
            &mut enc,
            "image_pull_done_bytes",
            "bytes of an image pull under way present so far (downloaded or already stored).",
            "image",
            pulls
                .iter()
                .map(|p| (p.image.as_str(), as_i64(p.done_bytes))),
        )?;
        gauges(
            &mut enc,
            "image_pull_size_bytes",
            "bytes of an image pull under way in all (0 until its manifest is read).",
            "image",
            pulls
                .iter()
                .map(|p| (p.image.as_str(), as_i64(p.total_bytes))),
        )?;
        let mut metric = enc.encode_descriptor(
            "image_pull_elapsed_seconds",
            "how long an image pull under way has run.",
            None,
            MetricType::Gauge,
        )?;
        for p in &pulls {
            ConstGauge::new(p.elapsed.as_secs_f64())
                .encode(metric.encode_family(&[("image", p.image.as_str())])?)?;
        }
        Ok(())
    }
}

/// VmRSS of `/proc/<pid>` in bytes.
fn rss_bytes(pid: &str) -> Option<i64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: i64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}
