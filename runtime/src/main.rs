//! The `crius` binary: serve the CRI, or print the default configuration.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use crius::config::{Config, DEFAULT_CONFIG, DEFAULT_CONFIG_PATH};
use crius::daemon::Daemon;
use crius::server::{self, Socket, StopSignals};

/// A Kubernetes container runtime (CRI v1) on a unix socket.
#[derive(Parser, Debug)]
#[command(name = "crius", version, about)]
struct Cli {
    /// Configuration file [default: /etc/crius/config.toml; missing means all defaults].
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Directory for persistent data (overrides `root`).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Directory for runtime state (overrides `state`).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Endpoint to serve, unix:///PATH (overrides `listen`).
    #[arg(long)]
    listen: Option<String>,
    /// Log level or filter (overrides `log_level`).
    #[arg(long)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Configuration helpers.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print the complete default configuration, every key with a comment.
    Default,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Config {
        command: ConfigCommand::Default,
    }) = cli.command
    {
        print!("{DEFAULT_CONFIG}");
        return ExitCode::SUCCESS;
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crius: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(cli: &Cli) -> anyhow::Result<Config> {
    let (path, required) = match &cli.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
    };
    let mut config = Config::load(&path, required)?;
    if let Some(root) = &cli.root {
        config.root = root.clone();
    }
    if let Some(state) = &cli.state {
        config.state = state.clone();
    }
    if let Some(listen) = &cli.listen {
        config.listen = listen.clone();
    }
    if let Some(level) = &cli.log_level {
        config.log_level = level.clone();
    }
    config.validate(&path)?;
    Ok(config)
}

/// A bare level applies to crius's own crates; the libraries below (h2, hyper, tonic) stay at
/// warn, or debug logs drown in frame dumps. A full filter directive is used as written.
fn log_filter(level: &str) -> String {
    const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];
    if LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
        let crates = ["crius", "crius_image", "crius_cni", "crius_api"];
        let own: Vec<String> = crates.iter().map(|c| format!("{c}={level}")).collect();
        format!("warn,{}", own.join(","))
    } else {
        level.to_string()
    }
}

/// Raises the soft limit of open files to the hard limit. systemd and most shells start
/// services with a soft limit of 1024, which a node's pods, shims and stream clients exceed;
/// the hard limit is what the administrator allows.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::warn!(
            "getrlimit(RLIMIT_NOFILE): {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    if lim.rlim_cur >= lim.rlim_max {
        return;
    }
    let before = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: setrlimit reads the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        tracing::warn!(
            "raise the open-files limit from {before} to {}: {}",
            lim.rlim_max,
            std::io::Error::last_os_error()
        );
        return;
    }
    tracing::info!(
        from = before,
        to = lim.rlim_max,
        "raised the open-files limit"
    );
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let config = load_config(&cli)?;
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter(&config.log_level))
        .with_context(|| format!("log level {:?}", config.log_level))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    raise_nofile();
    let socket_path = config
        .socket_path()
        .map_err(|m| anyhow::anyhow!("listen {:?}: {m}", config.listen))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("crius")
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async move {
        let signals = StopSignals::install()?;
        // Claim the socket first: a second crius must fail before it touches the database.
        let socket = Socket::claim(&socket_path)?;
        let daemon = Daemon::open(config)?;
        daemon.start().await?;
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            root = %daemon.config.root.display(),
            state = %daemon.config.state.display(),
            "crius starting"
        );
        server::serve(daemon, socket, signals).await
    })?;
    tracing::info!("crius stopped");
    Ok(())
}
