//! The operation a helper runs, and its command line: what the shim asks and the helper parses,
//! in one place, so the command line is written and read by the same code (and stays usable by
//! hand).

use std::ffi::OsString;
use std::path::PathBuf;

/// One libcontainer operation for a helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperCall {
    /// The state root: libcontainer's (`<shim state>/runc`), or the OCI runtime's `--root`.
    pub root: PathBuf,
    /// The container.
    pub id: String,
    pub op: HelperOp,
    /// Run the operation with this OCI runtime's command line instead of libcontainer.
    pub runtime: Option<OciCommand>,
}

/// An OCI runtime's executable and the global flags it gets before every operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciCommand {
    pub binary: PathBuf,
    pub options: Vec<String>,
}

/// The operations a helper runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperOp {
    /// Create the container from `bundle`; with `console_dir`, on a terminal whose master is
    /// received on a socket in that directory and reported back.
    Create {
        bundle: PathBuf,
        console_dir: Option<PathBuf>,
    },
    /// Let a created container's init run (hooks and the unusual cases; see
    /// [`crate::libct_state`]).
    Start,
    /// Signal every process of the container's cgroup.
    Kill { signal: i32 },
    /// Remove the container's cgroup and libcontainer state.
    Delete,
    /// Run the OCI process in `process` (a JSON file) in the running container.
    /// `cgroup_mounts`: the mount points of the cgroup hierarchies the container is in, as
    /// the shim found them once; empty, the helper reads the host's mount table itself.
    Exec {
        process: PathBuf,
        cgroup_mounts: Vec<PathBuf>,
    },
    /// Wait until the container's process exits and report its exit code (OCI runtimes whose
    /// containers share the sandbox's pid, as gVisor's do: `<rt> wait`).
    Wait,
    /// Dump the running container's processes with CRIU into `image_path` (CRIU's logs in
    /// `work_path`), leaving them running. Run by crius itself, not by the shim: it makes no
    /// process the shim must reap.
    Checkpoint {
        image_path: PathBuf,
        work_path: PathBuf,
    },
    /// Make the container from `bundle` by restoring the CRIU images in `image_path` instead
    /// of running its process; the restored processes are left stopped (SIGSTOP) until the
    /// start, which continues them. OCI runtimes only: libcontainer 0.7 has no restore.
    Restore {
        bundle: PathBuf,
        image_path: PathBuf,
        work_path: PathBuf,
        console_dir: Option<PathBuf>,
        /// The criu binary, when not `criu` in `$PATH`.
        criu: Option<PathBuf>,
    },
}

impl HelperOp {
    /// The operation's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Create { .. } => "create",
            Self::Start => "start",
            Self::Kill { .. } => "kill",
            Self::Delete => "delete",
            Self::Exec { .. } => "exec",
            Self::Wait => "wait",
            Self::Checkpoint { .. } => "checkpoint",
            Self::Restore { .. } => "restore",
        }
    }

    /// Append the operation's own arguments (those after the common ones) to `args`.
    fn push_args(&self, args: &mut Vec<OsString>) {
        match self {
            Self::Create {
                bundle,
                console_dir,
            } => {
                args.push("--bundle".into());
                args.push(bundle.clone().into());
                if let Some(dir) = console_dir {
                    args.push("--console-dir".into());
                    args.push(dir.clone().into());
                }
            }
            Self::Kill { signal } => {
                args.push("--signal".into());
                args.push(signal.to_string().into());
            }
            Self::Exec {
                process,
                cgroup_mounts,
            } => {
                args.push("--process".into());
                args.push(process.clone().into());
                for mount in cgroup_mounts {
                    args.push("--cgroup-mount".into());
                    args.push(mount.clone().into());
                }
            }
            Self::Checkpoint {
                image_path,
                work_path,
            } => {
                args.push("--image-path".into());
                args.push(image_path.clone().into());
                args.push("--work-path".into());
                args.push(work_path.clone().into());
            }
            Self::Restore {
                bundle,
                image_path,
                work_path,
                console_dir,
                criu,
            } => {
                if let Some(criu) = criu {
                    args.push("--criu".into());
                    args.push(criu.clone().into());
                }
                args.push("--bundle".into());
                args.push(bundle.clone().into());
                args.push("--image-path".into());
                args.push(image_path.clone().into());
                args.push("--work-path".into());
                args.push(work_path.clone().into());
                if let Some(dir) = console_dir {
                    args.push("--console-dir".into());
                    args.push(dir.clone().into());
                }
            }
            Self::Start | Self::Delete | Self::Wait => {}
        }
    }
}

impl HelperCall {
    /// The helper's command line: `<op> --root <root> --id <id> [--runtime <binary>
    /// [--runtime-option <flag>]...] [op arguments]`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            self.op.name().into(),
            "--root".into(),
            self.root.clone().into(),
            "--id".into(),
            self.id.clone().into(),
        ];
        if let Some(rt) = &self.runtime {
            args.push("--runtime".into());
            args.push(rt.binary.clone().into());
            for o in &rt.options {
                args.push("--runtime-option".into());
                args.push(o.into());
            }
        }
        self.op.push_args(&mut args);
        args
    }

    /// Read a command line written by [`Self::to_args`] (or typed by hand), without the
    /// program name.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Self, String> {
        let mut it = args.into_iter();
        let op = it.next().ok_or("missing operation")?;
        let mut flags = Flags::read(it)?;
        let (Some(root), Some(id)) = (flags.root.take(), flags.id.take()) else {
            return Err("--root and --id are required".to_owned());
        };
        if id.is_empty() {
            return Err("--id is empty".to_owned());
        }
        let runtime = match flags.runtime.take() {
            Some(binary) => Some(OciCommand {
                binary,
                options: std::mem::take(&mut flags.options),
            }),
            None if !flags.options.is_empty() => {
                return Err("--runtime-option needs --runtime".to_owned())
            }
            None => None,
        };
        let op = flags.into_op(&op.to_string_lossy())?;
        Ok(Self {
            root,
            id,
            op,
            runtime,
        })
    }
}

/// The flags of a helper's command line as read, before they are checked against its
/// operation.
#[derive(Default)]
struct Flags {
    root: Option<PathBuf>,
    id: Option<String>,
    bundle: Option<PathBuf>,
    console_dir: Option<PathBuf>,
    process: Option<PathBuf>,
    cgroup_mounts: Vec<PathBuf>,
    signal: Option<i32>,
    image_path: Option<PathBuf>,
    work_path: Option<PathBuf>,
    criu: Option<PathBuf>,
    /// `--runtime`; the last one given wins.
    runtime: Option<PathBuf>,
    options: Vec<String>,
}

impl Flags {
    /// Every `--flag value` pair of `it`; unknown flags and flags without a value are errors.
    fn read(mut it: impl Iterator<Item = OsString>) -> Result<Self, String> {
        let mut flags = Self::default();
        while let Some(flag) = it.next() {
            let flag = flag.to_string_lossy().into_owned();
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--root" => flags.root = Some(PathBuf::from(value)),
                "--id" => {
                    flags.id = Some(
                        value
                            .into_string()
                            .map_err(|v| format!("--id: not UTF-8: {}", v.to_string_lossy()))?,
                    )
                }
                "--bundle" => flags.bundle = Some(PathBuf::from(value)),
                "--console-dir" => flags.console_dir = Some(PathBuf::from(value)),
                "--process" => flags.process = Some(PathBuf::from(value)),
                "--cgroup-mount" => flags.cgroup_mounts.push(PathBuf::from(value)),
                "--image-path" => flags.image_path = Some(PathBuf::from(value)),
                "--work-path" => flags.work_path = Some(PathBuf::from(value)),
                "--criu" => flags.criu = Some(PathBuf::from(value)),
                "--runtime" => flags.runtime = Some(PathBuf::from(value)),
                "--runtime-option" => flags.options.push(value.to_string_lossy().into_owned()),
                "--signal" => {
                    let text = value.to_string_lossy();
                    flags.signal = Some(
                        text.parse::<i32>()
                            .map_err(|e| format!("--signal {text:?}: {e}"))?,
                    )
                }
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(flags)
    }

    /// The operation named `op`, with the flags it needs.
    fn into_op(self, op: &str) -> Result<HelperOp, String> {
        Ok(match op {
            "create" => HelperOp::Create {
                bundle: self.bundle.ok_or("create needs --bundle")?,
                console_dir: self.console_dir,
            },
            "start" => HelperOp::Start,
            "kill" => HelperOp::Kill {
                signal: self.signal.ok_or("kill needs --signal")?,
            },
            "delete" => HelperOp::Delete,
            "wait" => HelperOp::Wait,
            "exec" => HelperOp::Exec {
                process: self.process.ok_or("exec needs --process")?,
                cgroup_mounts: self.cgroup_mounts,
            },
            "checkpoint" => HelperOp::Checkpoint {
                image_path: self.image_path.ok_or("checkpoint needs --image-path")?,
                work_path: self.work_path.ok_or("checkpoint needs --work-path")?,
            },
            "restore" => HelperOp::Restore {
                bundle: self.bundle.ok_or("restore needs --bundle")?,
                image_path: self.image_path.ok_or("restore needs --image-path")?,
                work_path: self.work_path.ok_or("restore needs --work-path")?,
                console_dir: self.console_dir,
                criu: self.criu,
            },
            other => return Err(format!("unknown operation {other}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(op: HelperOp) {
        let runtimes = [
            None,
            Some(OciCommand {
                binary: PathBuf::from("/usr/bin/runsc"),
                options: vec!["--platform=ptrace".to_owned(), "--debug".to_owned()],
            }),
        ];
        for runtime in runtimes {
            let call = HelperCall {
                root: PathBuf::from("/run/crius/shims/p/runc"),
                id: "c-1".to_owned(),
                op: op.clone(),
                runtime,
            };
            let args = call.to_args();
            assert_eq!(
                HelperCall::parse(args.clone()),
                Ok(call.clone()),
                "{args:?}"
            );
        }
    }

    #[test]
    fn every_operation_round_trips_through_the_command_line() {
        round_trip(HelperOp::Create {
            bundle: PathBuf::from("/b"),
            console_dir: None,
        });
        round_trip(HelperOp::Create {
            bundle: PathBuf::from("/b"),
            console_dir: Some(PathBuf::from("/c d")),
        });
        round_trip(HelperOp::Start);
        round_trip(HelperOp::Kill { signal: 15 });
        round_trip(HelperOp::Wait);
        round_trip(HelperOp::Delete);
        round_trip(HelperOp::Exec {
            process: PathBuf::from("/e/1.json"),
            cgroup_mounts: Vec::new(),
        });
        round_trip(HelperOp::Exec {
            process: PathBuf::from("/e/1.json"),
            cgroup_mounts: vec![
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                PathBuf::from("/sys/fs/cgroup/memory"),
            ],
        });
        round_trip(HelperOp::Checkpoint {
            image_path: PathBuf::from("/c/checkpoint"),
            work_path: PathBuf::from("/c/work"),
        });
        round_trip(HelperOp::Restore {
            bundle: PathBuf::from("/b"),
            image_path: PathBuf::from("/c/checkpoint"),
            work_path: PathBuf::from("/c/work"),
            console_dir: Some(PathBuf::from("/c d")),
            criu: Some(PathBuf::from("/opt/criu/bin/criu")),
        });
    }

    #[test]
    fn a_hand_written_command_line_is_checked() {
        let parse = |line: &str| HelperCall::parse(line.split(' ').map(OsString::from));
        assert!(parse("delete --root /r --id c").is_ok());
        assert!(parse("kill --root /r --id c")
            .unwrap_err()
            .contains("--signal"));
        assert!(parse("create --root /r --id c")
            .unwrap_err()
            .contains("--bundle"));
        assert!(parse("start --id c").unwrap_err().contains("--root"));
        assert!(parse("frob --root /r --id c")
            .unwrap_err()
            .contains("unknown operation"));
        assert!(parse("kill --root /r --id c --signal x").is_err());
        assert!(parse("checkpoint --root /r --id c --image-path /i")
            .unwrap_err()
            .contains("--work-path"));
        assert!(parse("start --root /r --id c --runtime-option --debug")
            .unwrap_err()
            .contains("--runtime"));
    }
}
