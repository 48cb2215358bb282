//! SIGHUP: crius reads its configuration again and applies what can change while it runs —
//! the log level, the metrics endpoint and the registry settings — and names in its log every
//! other change, which waits for the next start. systemd hears `RELOADING=1` before and
//! `READY=1` after each re-read, whatever its outcome.

use std::sync::Arc;

use crate::config::Config;
use crate::daemon::Daemon;
use crate::logging::LogHandle;

/// The keys that differ between `old` and `new`, as `table.key` (or `key` at the top level),
/// leaving out those in `applied`.
pub fn changed_keys(old: &Config, new: &Config, applied: &[&str]) -> Vec<String> {
    let (Ok(serde_json::Value::Object(old)), Ok(serde_json::Value::Object(new))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for (key, value) in &new {
        match (old.get(key), value) {
            (Some(serde_json::Value::Object(a)), serde_json::Value::Object(b)) => {
                for (sub, v) in b {
                    if a.get(sub) != Some(v) {
                        keys.push(format!("{key}.{sub}"));
                    }
                }
            }
            (a, b) if a != Some(b) => keys.push(key.clone()),
            _ => {}
        }
    }
    keys.retain(|k| !applied.contains(&k.as_str()));
    keys
}

/// Re-reads the configuration (`read`) on every SIGHUP until the process ends.
pub fn on_hangup(
    mut hangup: tokio::signal::unix::Signal,
    log: LogHandle,
    daemon: Arc<Daemon>,
    mut in_force: Config,
    read: impl Fn() -> anyhow::Result<Config> + Send + Sync + 'static,
) {
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            crate::notify::reloading();
            reload(&log, &daemon, &mut in_force, &read).await;
            let socket = in_force.socket_path().unwrap_or_default();
            crate::notify::notify(&format!(
                "READY=1\nSTATUS=serving the CRI on {}",
                socket.display()
            ));
        }
    });
}

/// One SIGHUP's re-read.
async fn reload(
    log: &LogHandle,
    daemon: &Arc<Daemon>,
    in_force: &mut Config,
    read: &impl Fn() -> anyhow::Result<Config>,
) {
    let new = match read() {
        Ok(new) => new,
        Err(e) => {
            tracing::warn!("SIGHUP: the configuration does not load, nothing changed: {e:#}");
            return;
        }
    };
    let mut applied = daemon.apply_live(&new).await;
    if new.log_level != in_force.log_level {
        match log.set_level(&new.log_level) {
            Ok(()) => {
                tracing::info!(
                    from = %in_force.log_level,
                    to = %new.log_level,
                    "SIGHUP: log level changed"
                );
                applied.push("log_level");
            }
            Err(e) => tracing::warn!("SIGHUP: {e:#}"),
        }
    } else {
        applied.push("log_level");
    }
    let waiting = changed_keys(in_force, &new, &applied);
    // What was applied is in force now; what waits stays as it was until the next start.
    let mut next = new;
    for key in &waiting {
        keep_key(&mut next, in_force, key);
    }
    *in_force = next;
    if waiting.is_empty() {
        tracing::info!("SIGHUP: configuration re-read");
    } else {
        tracing::warn!(
            keys = %waiting.join(", "),
            "SIGHUP: configuration re-read; these changes take effect at the next start"
        );
    }
}

/// Puts `key`'s value in `old` back into `new` (through JSON, as the key names come from it).
fn keep_key(new: &mut Config, old: &Config, key: &str) {
    let (Ok(mut n), Ok(o)) = (serde_json::to_value(&*new), serde_json::to_value(old)) else {
        return;
    };
    let path: Vec<&str> = key.split('.').collect();
    let (Some(from), Some(to)) = (lookup(&o, &path).cloned(), lookup_mut(&mut n, &path)) else {
        return;
    };
    *to = from;
    if let Ok(mut kept) = serde_json::from_value::<Config>(n) {
        kept.source = new.source.clone();
        *new = kept;
    }
}

fn lookup<'a>(v: &'a serde_json::Value, path: &[&str]) -> Option<&'a serde_json::Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn lookup_mut<'a>(
    v: &'a mut serde_json::Value,
    path: &[&str],
) -> Option<&'a mut serde_json::Value> {
    path.iter().try_fold(v, |v, k| v.get_mut(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_that_wait_for_a_restart_are_named() {
        let old = Config::default();
        let mut new = Config {
            log_level: "debug".into(),
            ..Config::default()
        };
        let live = ["log_level", "metrics.address"];
        assert!(changed_keys(&old, &new, &live).is_empty());
        new.root = "/elsewhere".into();
        new.stream.port = 1234;
        new.metrics.address = "127.0.0.1:1338".into();
        assert_eq!(changed_keys(&old, &new, &live), ["root", "stream.port"]);
    }

    #[test]
    fn a_key_that_waits_keeps_its_old_value() {
        let old = Config::default();
        let mut new = Config::default();
        new.stream.port = 1234;
        new.metrics.address = "127.0.0.1:1338".into();
        keep_key(&mut new, &old, "stream.port");
        assert_eq!(new.stream.port, 0);
        assert_eq!(new.metrics.address, "127.0.0.1:1338");
    }
}
