//! crius's own log: text or JSON lines on stderr, with a level that SIGHUP can change while
//! crius runs (the rest of the configuration is read once, at start).

use anyhow::Context as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::config::{Config, LogFormat};

/// Changes the level of the installed log.
pub struct LogHandle(reload::Handle<EnvFilter, Registry>);

/// The filter a level stands for: a plain level applies to crius's own crates, with everything
/// else at `warn` (libraries' debug output drowns crius's own); anything else is a tracing
/// filter, taken as written.
pub fn filter_for(level: &str) -> String {
    const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];
    if LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
        let crates = ["crius", "crius_image", "crius_cni", "crius_api"];
        let own: Vec<String> = crates.iter().map(|c| format!("{c}={level}")).collect();
        format!("warn,{}", own.join(","))
    } else {
        level.to_string()
    }
}

/// Installs the process's log at `level` in `format`.
pub fn init(level: &str, format: LogFormat) -> anyhow::Result<LogHandle> {
    let filter =
        EnvFilter::try_new(filter_for(level)).with_context(|| format!("log level {level:?}"))?;
    let (filter, handle) = reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    }
    .context("install the log")?;
    Ok(LogHandle(handle))
}

impl LogHandle {
    /// Sets the level (or filter) of the log from now on.
    pub fn set_level(&self, level: &str) -> anyhow::Result<()> {
        let filter = EnvFilter::try_new(filter_for(level))
            .with_context(|| format!("log level {level:?}"))?;
        self.0.reload(filter).context("change the log level")
    }
}

/// What differs between the configuration in force and one read again, apart from the log
/// level (which SIGHUP applies): the keys whose change waits for a restart.
pub fn needs_restart(old: &Config, new: &Config) -> Vec<String> {
    let (Ok(serde_json::Value::Object(old)), Ok(serde_json::Value::Object(new))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for (key, value) in &new {
        if key == "log_level" {
            continue;
        }
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
    keys
}

/// Re-reads the configuration (`read`) on every SIGHUP until the process ends: the log level
/// changes at once; every other change is named in the log as waiting for a restart. systemd
/// hears `RELOADING=1` before and `READY=1` after each re-read, whatever its outcome.
pub fn reload_on_hangup(
    mut hangup: tokio::signal::unix::Signal,
    handle: LogHandle,
    mut in_force: Config,
    read: impl Fn() -> anyhow::Result<Config> + Send + 'static,
) {
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            crate::notify::reloading();
            reload(&handle, &mut in_force, &read);
            let socket = in_force.socket_path().unwrap_or_default();
            crate::notify::notify(&format!(
                "READY=1\nSTATUS=serving the CRI on {}",
                socket.display()
            ));
        }
    });
}

/// One SIGHUP's re-read: apply the new log level, name the changes that wait for a restart.
fn reload(handle: &LogHandle, in_force: &mut Config, read: &impl Fn() -> anyhow::Result<Config>) {
    let new = match read() {
        Ok(new) => new,
        Err(e) => {
            tracing::warn!("SIGHUP: the configuration does not load, nothing changed: {e:#}");
            return;
        }
    };
    if new.log_level != in_force.log_level {
        match handle.set_level(&new.log_level) {
            Ok(()) => {
                tracing::info!(
                    from = %in_force.log_level,
                    to = %new.log_level,
                    "SIGHUP: log level changed"
                );
                in_force.log_level = new.log_level.clone();
            }
            Err(e) => tracing::warn!("SIGHUP: {e:#}"),
        }
    }
    let waiting = needs_restart(in_force, &new);
    if waiting.is_empty() {
        tracing::info!("SIGHUP: configuration re-read");
    } else {
        tracing::warn!(
            keys = %waiting.join(", "),
            "SIGHUP: configuration re-read; these changes take effect at the next start"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_levels_apply_to_crius_and_filters_pass_through() {
        assert_eq!(
            filter_for("debug"),
            "warn,crius=debug,crius_image=debug,crius_cni=debug,crius_api=debug"
        );
        assert_eq!(filter_for("info,h2=trace"), "info,h2=trace");
    }

    #[test]
    fn changes_that_wait_for_a_restart_are_named() {
        let old = Config::default();
        let mut new = Config {
            log_level: "debug".into(),
            ..Config::default()
        };
        assert!(needs_restart(&old, &new).is_empty());
        new.root = "/elsewhere".into();
        new.stream.port = 1234;
        assert_eq!(needs_restart(&old, &new), ["root", "stream.port"]);
    }
}
