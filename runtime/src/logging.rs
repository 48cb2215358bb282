//! crius's own log: text or JSON lines on stderr, with a level that SIGHUP can change while
//! crius runs (see `reload`).

use anyhow::Context as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::config::LogFormat;

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
}
