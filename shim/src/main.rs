//! `crius-shim`: see the crate documentation of `crius_shim`.
//!
//! ```text
//! crius-shim --id <pod-id> --state-dir <dir> [--log <file>] [--max-log-line <bytes>]
//!            [--helper <crius-shim-helper>]
//! crius-shim --install-pause <path>
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use crius_shim::cri_log::DEFAULT_MAX_LINE;
use crius_shim::daemon::{self, Options};
use crius_shim::server::Config;

const USAGE: &str = "usage: crius-shim --id <pod-id> --state-dir <dir> [--log <file>] \
                     [--max-log-line <bytes>] [--helper <path>]\n       crius-shim --install-pause <path>";

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)) {
        Ok(Command::Serve(opts)) => ExitCode::from(daemon::launch(opts) as u8),
        Ok(Command::InstallPause(dest)) => match daemon::install_pause(&dest) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("crius-shim: install pause to {}: {e}", dest.display());
                ExitCode::FAILURE
            }
        },
        Err(message) => {
            eprintln!("crius-shim: {message}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

enum Command {
    Serve(Options),
    InstallPause(PathBuf),
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let mut id = None;
    let mut state_dir = None;
    let mut log = None;
    let mut max_log_line = DEFAULT_MAX_LINE;
    let mut helper = None;
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--id" => id = Some(value()?),
            "--state-dir" => state_dir = Some(PathBuf::from(value()?)),
            "--log" => log = Some(PathBuf::from(value()?)),
            "--helper" => helper = Some(PathBuf::from(value()?)),
            "--max-log-line" => {
                max_log_line = value()?
                    .parse()
                    .map_err(|e| format!("--max-log-line: {e}"))?
            }
            "--install-pause" => return Ok(Command::InstallPause(PathBuf::from(value()?))),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let pod_id = id.ok_or("--id is required")?;
    if pod_id.is_empty() || pod_id.contains('/') {
        return Err(format!("invalid pod id {pod_id:?}"));
    }
    let state_dir = state_dir.ok_or("--state-dir is required")?;
    if !state_dir.is_absolute() {
        return Err("--state-dir must be absolute".to_owned());
    }
    // By default the helper sits next to this binary.
    let helper = match helper {
        Some(path) => path,
        None => std::env::current_exe()
            .map_err(|e| format!("locate crius-shim: {e}"))?
            .with_file_name("crius-shim-helper"),
    };
    if !helper.is_file() {
        return Err(format!("helper {} not found (--helper)", helper.display()));
    }
    Ok(Command::Serve(Options {
        config: Config {
            pod_id,
            state_dir,
            max_log_line,
            helper,
        },
        log,
    }))
}
