//! The shim's own log: a minimal `tracing` subscriber appending lines to one file.
//!
//! The shim never writes to stdout/stderr (they are /dev/null once it has daemonized), and
//! libcontainer's events, also those emitted inside a container's init before it execs, land
//! here rather than in container output. Level from `CRIUS_SHIM_LOG` (`error`, `warn`, `info`,
//! `debug`, `trace`; default `info`); libcontainer's own events are kept at `error` unless the
//! level is `debug` or `trace`.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::time::{now_unix_nanos, rfc3339_nanos};

/// Environment variable naming the log level.
pub const LEVEL_ENV: &str = "CRIUS_SHIM_LOG";

static LOG_FD: AtomicI32 = AtomicI32::new(-1);

/// The log file's fd (-1 before [`init`]).
pub fn fd() -> RawFd {
    LOG_FD.load(Ordering::Relaxed)
}

struct FileLogger {
    file: File,
    own: Level,
    others: Level,
}

/// Install the file logger as the global subscriber; returns the log's fd, which helpers
/// keep open.
pub fn init(file: File) -> RawFd {
    let own = std::env::var(LEVEL_ENV)
        .ok()
        .and_then(|v| v.parse::<Level>().ok())
        .unwrap_or(Level::INFO);
    // libcontainer's warnings (e.g. every v1 controller the host lacks, on every create and
    // exec) would grow the log of a long-lived pod without end; its errors reach the shim in
    // the helper's report anyway.
    let others = if own >= Level::DEBUG {
        own
    } else {
        Level::ERROR
    };
    let fd = file.as_raw_fd();
    LOG_FD.store(fd, Ordering::Relaxed);
    // Only fails if a subscriber is already set, which would then keep serving.
    let _ = tracing::subscriber::set_global_default(FileLogger { file, own, others });
    fd
}

impl Subscriber for FileLogger {
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        let limit = if meta.target().starts_with("crius") {
            self.own
        } else {
            self.others
        };
        *meta.level() <= limit
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::from_level(
            self.own.max(self.others),
        ))
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let mut line = format!(
            "{} {} [{}] {}:",
            rfc3339_nanos(now_unix_nanos()),
            meta.level(),
            std::process::id(),
            meta.target()
        );
        event.record(&mut LineVisitor(&mut line));
        line.push('\n');
        let _ = (&self.file).write_all(line.as_bytes());
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

struct LineVisitor<'a>(&'a mut String);

impl Visit for LineVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}
