//! The `crius` binary: serve the CRI; print or check a configuration; ask a running crius how
//! it is (`crius status`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use crius::config::{Config, DEFAULT_CONFIG, DEFAULT_CONFIG_PATH};
use crius::daemon::Daemon;
use crius::server::{self, Socket, StopSignals};

/// `pow` for the whole binary, so that it does not load `libm.so.6`: tokio's scheduler
/// (`f64::powf`, its poll-time average) is the one caller in crius, and mapping glibc's libm for
/// it cost 520 KiB of the daemon's RSS (smaps, 30 pods, 2026-11-26). The linker takes this
/// definition before `-lm`, which `--as-needed` then leaves out. musl's `pow`, ported by the
/// `libm` crate: within 1 ULP, as glibc's.
// SAFETY: `pow` is not defined elsewhere in the program (libm.so.6 is no longer linked), and
// this has its C signature and semantics (no errno: Rust's callers never read it).
#[unsafe(no_mangle)]
pub extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

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
    /// Print the default configuration, or check a configuration file.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Ask a running crius how it is: version, uptime, config files, pods, containers.
    ///
    /// Prints the version, pid and uptime, the configuration files it read, its conditions,
    /// its pods and containers by state and its runtime handlers, all from CRI calls on its
    /// socket; exits 1 if it does not answer within 10 s.
    Status {
        /// Its socket, a path or unix:///PATH [default: `listen` of the configuration].
        #[arg(long)]
        socket: Option<String>,
    },
    /// Import, export and watch images through the running crius (its admin socket, root only).
    Images {
        /// The admin socket [default: <state>/admin.sock of the configuration].
        #[arg(long, global = true)]
        admin_socket: Option<PathBuf>,
        #[command(subcommand)]
        command: ImagesCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ImagesCommand {
    /// Import the images of an archive: an OCI image layout or a `docker save` tar (plain, gzip or
    /// zstd), from FILE or from stdin (`-`). Prints each image's id and names.
    ///
    /// With --from-containerd, copies the images of a containerd namespace instead, read
    /// through containerd's API (for moving a node from containerd to crius).
    Import {
        /// The archive, or `-` for stdin.
        #[arg(required_unless_present = "from_containerd")]
        file: Option<String>,
        /// Copy the images of containerd on this socket [default socket:
        /// /run/containerd/containerd.sock].
        #[arg(long, value_name = "SOCKET", num_args = 0..=1, conflicts_with = "file",
              default_missing_value = crius::cli::containerd::DEFAULT_SOCKET)]
        from_containerd: Option<PathBuf>,
        /// The containerd namespace to copy (containerd's CRI keeps kubelet's images in k8s.io).
        #[arg(long, default_value = crius::cli::containerd::DEFAULT_NAMESPACE,
              requires = "from_containerd")]
        namespace: String,
    },
    /// Export images (ids, references or id prefixes) as one tar that is an OCI image layout
    /// and a `docker save` archive at once.
    Export {
        /// The images to export.
        #[arg(required = true)]
        images: Vec<String>,
        /// Where to write the archive (`-` for stdout).
        #[arg(short, long)]
        output: String,
    },
    /// The image pulls (and imports) under way: each blob's bytes, rate and stall time.
    /// Redraws in a terminal until interrupted; piped, prints one snapshot (or one per
    /// interval with --watch).
    Pulls {
        /// Piped: keep printing a snapshot every interval.
        #[arg(long)]
        watch: bool,
        /// Seconds between snapshots.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print the complete default configuration, every key with a comment.
    Default,
    /// Check a configuration file (with its `config.d/` drop-ins) as crius would load it:
    /// print `OK` and exit 0, or the error naming the key and exit 1.
    Check {
        /// The file to check [default: --config, else /etc/crius/config.toml].
        file: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    // Before any thread exists: it changes the environment.
    crius::notify::take_socket();
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::Config {
            command: ConfigCommand::Default,
        }) => {
            print!("{DEFAULT_CONFIG}");
            return ExitCode::SUCCESS;
        }
        Some(Command::Config {
            command: ConfigCommand::Check { file },
        }) => return check_config(file.as_ref().or(cli.config.as_ref())),
        Some(Command::Status { socket }) => return status(&cli, socket.as_deref()),
        Some(Command::Images {
            admin_socket,
            command,
        }) => return images(&cli, admin_socket.as_deref(), command),
        None => {}
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crius: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `crius config check`: load and validate as a start would, without starting.
fn check_config(file: Option<&PathBuf>) -> ExitCode {
    let path = file
        .cloned()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
    let checked = Config::load(&path, true).and_then(|config| config.validate(&path));
    match checked {
        Ok(()) => {
            println!("{}: OK", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crius: {}", crius_common::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `crius status`: query the crius on `socket`, else on the configured `listen` socket.
fn status(cli: &Cli, socket: Option<&str>) -> ExitCode {
    let report = socket_to_query(cli, socket).and_then(|socket| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("start the async runtime")?
            .block_on(crius::cli::status::query(&socket))
    });
    match report {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crius: {}", crius_common::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// `crius images …`: one request on the admin socket.
fn images(cli: &Cli, socket: Option<&std::path::Path>, command: &ImagesCommand) -> ExitCode {
    let socket = match socket {
        Some(s) => Ok(s.to_path_buf()),
        None => load_config(cli).map(|c| c.state.join(crius::admin::SOCKET_NAME)),
    };
    let done = socket.and_then(|socket| match command {
        ImagesCommand::Import {
            file: Some(file), ..
        } => crius::cli::images::import(&socket, file)
            .map(|summary| print!("{}", crius::cli::images::describe_import(&summary)))
            .with_context(|| format!("import {file}")),
        ImagesCommand::Import {
            from_containerd,
            namespace,
            ..
        } => {
            let containerd = from_containerd
                .clone()
                .unwrap_or_else(|| PathBuf::from(crius::cli::containerd::DEFAULT_SOCKET));
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("start the async runtime")
                .and_then(|rt| {
                    rt.block_on(crius::cli::containerd::migrate(
                        &containerd,
                        namespace,
                        &socket,
                    ))
                })
                .map(|done| {
                    for skipped in &done.skipped {
                        eprintln!("skipped {skipped}");
                    }
                    print!("{}", crius::cli::images::describe_import(&done.summary));
                })
                .with_context(|| {
                    format!(
                        "import from containerd at {} (namespace {namespace})",
                        containerd.display()
                    )
                })
        }
        ImagesCommand::Pulls { watch, interval } => {
            if !(interval.is_finite() && (0.1..=3600.0).contains(interval)) {
                Err(anyhow::anyhow!(
                    "--interval {interval}: must be between 0.1 and 3600 seconds"
                ))
            } else {
                crius::cli::pulls::run(
                    &socket,
                    *watch,
                    std::time::Duration::from_secs_f64(*interval),
                )
            }
        }
        ImagesCommand::Export { images, output } => {
            crius::cli::images::export(&socket, images, output)
                .map(|summary| {
                    eprintln!(
                        "exported {} image{} ({} blobs, {:.1} MB) to {output}",
                        summary.images.len(),
                        if summary.images.len() == 1 { "" } else { "s" },
                        summary.blobs,
                        summary.blob_bytes as f64 / 1e6
                    )
                })
                .context("export")
        }
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crius: {}", crius_common::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

fn socket_to_query(cli: &Cli, socket: Option<&str>) -> anyhow::Result<PathBuf> {
    match socket {
        Some(s) => Ok(PathBuf::from(s.strip_prefix("unix://").unwrap_or(s))),
        None => {
            let config = load_config(cli)?;
            config
                .socket_path()
                .map_err(|m| anyhow::anyhow!("listen {:?}: {m}", config.listen))
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
    crius::heap::single_arena();
    let config = load_config(&cli)?;
    let log = crius::logging::init(&config.log_level, config.log_format)?;

    raise_nofile();
    let socket_path = config
        .socket_path()
        .map_err(|m| anyhow::anyhow!("listen {:?}: {m}", config.listen))?;
    // Two runtimes (`crius::lanes`): the gRPC server and the calls that only read on one whose
    // threads run at a higher priority, the lifecycle calls and what they leave running on
    // another. The writers make blocking syscalls on the worker that runs them (mounts, cgroup
    // and file writes, the database's fsync): more workers than cores keep some free while ten
    // of them are in flight; a worker costs its stack and about 100 KiB resident.
    // TOKIO_WORKER_THREADS, tokio's own setting, still wins for both.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let fixed = std::env::var_os("TOKIO_WORKER_THREADS").is_some();
    let mut reads = tokio::runtime::Builder::new_multi_thread();
    if !fixed {
        reads.worker_threads(cores.clamp(2, 4));
    }
    let runtime = reads
        .enable_all()
        .thread_name("crius")
        .on_thread_start(crius::lanes::raise_this_thread)
        .build()
        .context("start the async runtime")?;
    let mut writes = tokio::runtime::Builder::new_multi_thread();
    if !fixed {
        writes.worker_threads((2 * cores).max(8));
    }
    let writes = writes
        .enable_all()
        .thread_name("crius-w")
        .build()
        .context("start the writers' async runtime")?;
    crius::lanes::set_writes(writes.handle().clone());
    runtime.block_on(async move {
        let signals = StopSignals::install()?;
        // SIGHUP's default action ends the process: caught before the socket exists too.
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("install SIGHUP handler")?;
        // Claim the socket first: a second crius must fail before it touches the database.
        let socket = Socket::claim(&socket_path)?;
        let in_force = config.clone();
        let daemon = Daemon::open(config)?;
        // Recovery, and the watchers, servers and background work start leaves running, go
        // on the writes lane.
        let starting = daemon.clone();
        crius::lanes::spawn_write(async move { starting.start().await })
            .await
            .context("start the daemon")??;
        // What start-up and recovery freed first, then every half minute what bursts free.
        crius::heap::trim_periodically();
        let admin = daemon.config().state.join(crius::admin::SOCKET_NAME);
        {
            // Imports and exports are writers' work.
            let _lane = crius::lanes::enter_writes();
            crius::admin::server::serve(daemon.clone(), &admin)?;
        }
        crius::reload::on_hangup(hangup, log, daemon.clone(), in_force, move || {
            load_config(&cli)
        });
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            root = %daemon.config().root.display(),
            state = %daemon.config().state.display(),
            "crius starting"
        );
        // Once start-up is over, the code and constants only it used stop counting in
        // crius's memory (see text_pages): a few seconds into serving, when the tasks start
        // spawned (image GC, NRI, the server's own set-up) have run too.
        tokio::spawn(async {
            tokio::time::sleep(crius::text_pages::RELEASE_AFTER).await;
            // Not under a call: the code it runs would all fault back in at once, a stall
            // that a call answering just before its client's deadline cannot afford. A node
            // that is never without a call (a long ExecSync, overlapping ones) gets the
            // release anyway after a minute.
            let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
            while crius::service::handlers_running() > 0 && tokio::time::Instant::now() < give_up {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            match crius::text_pages::release() {
                Ok(bytes) => tracing::debug!(bytes, "released the binary's start-up pages"),
                Err(e) => tracing::warn!("release the binary's start-up pages: {e}"),
            }
        });
        let served = server::serve(daemon, socket, signals).await;
        // Like the CRI socket: no socket file left for a crius that is gone.
        if let Err(e) = std::fs::remove_file(&admin) {
            tracing::warn!(socket = %admin.display(), "remove the admin socket: {e}");
        }
        served
    })?;
    tracing::info!("crius stopped");
    Ok(())
}
