//! `critest-images`: builds stand-ins for the images critest 1.36 pulls, from Debian's static
//! busybox, and pushes them to a local registry under the same repository paths and tags, so
//! crius can pull them through a registry mirror on a machine without internet.
//!
//! ```text
//! cargo run -p crius-tests --bin critest-images -- --registry 127.0.0.1:5000
//!     [--shell-busybox /tmp/crius-busybox/bin/busybox]
//! ```
//!
//! What each image must contain and why is written down in `critest-config/README.md`. In short:
//! every image starts from one busybox layer whose applets are hard links (as in the real
//! busybox image, so masking `/bin/ls` masks only `ls`); the web servers are busybox `httpd`
//! behind small scripts that behave the way the specs look at nginx and Apache httpd.
//!
//! `--shell-busybox` takes a busybox built without `FEATURE_SH_STANDALONE` (Debian's dynamic
//! `busybox` package) and installs it as `/bin/sh` with the shared libraries `ldd` names, so `sh`
//! runs commands from `$PATH` like the real image does. Without it `/bin/sh` is the static busybox,
//! which runs applets in-process and ignores masked files (one spec then fails, see the README).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::rc::Rc;

use crius_tests::images::{host_arch, OCI_CONFIG, OCI_LAYER_GZIP, OCI_MANIFEST};
use crius_tests::registry::RegistryClient;
use crius_tests::sha256_digest;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const STATIC_BUSYBOX: &str = "/bin/busybox";
/// Fixed timestamps so the same inputs always give the same digests.
const CREATED: &str = "2023-11-14T22:13:20Z";
const MTIME: u64 = 1_700_000_000;
const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The registries critest pulls from, with the origin each `hosts.toml` names: `--hosts-dir`
/// sends all of them to the local registry.
const MIRRORED_HOSTS: &[(&str, &str)] = &[
    ("registry.k8s.io", "https://registry.k8s.io"),
    ("k8s.gcr.io", "https://k8s.gcr.io"),
    ("gcr.io", "https://gcr.io"),
];

const E2E: &str = "e2e-test-images";
const CRI_TOOLS: &str = "k8s-staging-cri-tools";

#[derive(Debug, thiserror::Error)]
enum ToolError {
    #[error("{0}\n\n{USAGE}")]
    Usage(String),
    #[error("{what}: {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} {arg}: {detail}")]
    Program {
        program: String,
        arg: String,
        detail: String,
    },
    #[error("push {reference}")]
    Push {
        reference: String,
        #[source]
        source: crius_tests::Error,
    },
    #[error("registry at {url} does not answer GET /v2/ with 200")]
    Registry {
        url: String,
        #[source]
        source: Option<crius_tests::Error>,
    },
}

type Result<T> = std::result::Result<T, ToolError>;

const USAGE: &str =
    "usage: critest-images --registry HOST:PORT [--hosts-dir DIR] [--shell-busybox PATH]

  --registry HOST:PORT    the local registry to push to (plain HTTP), e.g. 127.0.0.1:5000
  --hosts-dir DIR         also write DIR/<host>/hosts.toml for registry.k8s.io, k8s.gcr.io and
                          gcr.io with the local registry as their mirror (crius's
                          [registry] config_path)
  --shell-busybox PATH    a busybox without FEATURE_SH_STANDALONE to install as /bin/sh
                          (e.g. bin/busybox of Debian's busybox .deb), with its libraries";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let mut message = err.to_string();
            let mut source = std::error::Error::source(&err);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("critest-images: {message}");
            ExitCode::FAILURE
        }
    }
}

struct Args {
    registry: String,
    hosts_dir: Option<PathBuf>,
    shell_busybox: Option<PathBuf>,
}

fn parse_args() -> Result<Args> {
    let mut registry = None;
    let mut shell_busybox = None;
    let mut hosts_dir = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| ToolError::Usage(format!("{name} needs a value")))
        };
        match arg.as_str() {
            "--registry" => registry = Some(value("--registry")?),
            "--hosts-dir" => hosts_dir = Some(PathBuf::from(value("--hosts-dir")?)),
            "--shell-busybox" => shell_busybox = Some(PathBuf::from(value("--shell-busybox")?)),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(ToolError::Usage(format!("unknown argument {other}"))),
        }
    }
    let registry = registry.ok_or_else(|| ToolError::Usage("--registry is required".into()))?;
    Ok(Args {
        registry,
        hosts_dir,
        shell_busybox,
    })
}

fn run() -> Result<()> {
    let args = parse_args()?;
    let url = format!("http://{}", args.registry);
    let client = RegistryClient::new(&url, None);
    match client.get("/v2/") {
        Ok(response) if response.status == 200 => {}
        Ok(_) => return Err(ToolError::Registry { url, source: None }),
        Err(source) => {
            return Err(ToolError::Registry {
                url,
                source: Some(source),
            })
        }
    }

    let images = build_all(args.shell_busybox.as_deref())?;
    for image in &images {
        let digest = push(&client, image).map_err(|source| ToolError::Push {
            reference: format!("{}/{}", args.registry, image.repository),
            source,
        })?;
        for tag in &image.tags {
            println!("{}/{}:{tag} {digest}", args.registry, image.repository);
        }
    }
    if let Some(dir) = &args.hosts_dir {
        write_hosts(dir, &args.registry)?;
    }
    Ok(())
}

/// Writes `<dir>/<host>/hosts.toml` for every mirrored registry, the local one as its mirror.
fn write_hosts(dir: &Path, registry: &str) -> Result<()> {
    for (host, origin) in MIRRORED_HOSTS {
        let host_dir = dir.join(host);
        let io = |what| {
            let path = host_dir.clone();
            move |source| ToolError::Io { what, path, source }
        };
        std::fs::create_dir_all(&host_dir).map_err(io("create hosts dir"))?;
        let text = format!(
            "# written by critest-images: pull {host} images from the local registry\n\
             server = \"{origin}\"\n\n\
             [host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
        std::fs::write(host_dir.join("hosts.toml"), text).map_err(io("write hosts.toml"))?;
        println!("wrote {}", host_dir.join("hosts.toml").display());
    }
    Ok(())
}

/// A gzip layer and the two digests that name it.
struct Layer {
    blob: Vec<u8>,
    digest: String,
    diff_id: String,
}

/// One image config pushed under one repository with one or more tags.
struct Image {
    repository: String,
    tags: Vec<&'static str>,
    layers: Vec<Rc<Layer>>,
    config: Value,
}

fn build_all(shell_busybox: Option<&Path>) -> Result<Vec<Image>> {
    let base = Rc::new(base_layer(shell_busybox)?);
    let mut images = Vec::new();
    let mut add = |repository: String, tags: Vec<&'static str>, extra: Vec<Layer>, config| {
        let mut layers = vec![base.clone()];
        layers.extend(extra.into_iter().map(Rc::new));
        images.push(Image {
            repository,
            tags,
            layers,
            config,
        });
    };

    // The default test container image: busybox with Cmd ["sh"].
    add(
        format!("{E2E}/busybox"),
        vec!["1.29-2"],
        vec![],
        busybox_config(),
    );

    // Web servers: busybox httpd dressed as nginx (ports 80 and, for host network, 12003) and
    // as Apache httpd.
    add(
        format!("{E2E}/nginx"),
        vec!["1.14-2"],
        vec![nginx_layer()?],
        nginx_config(80),
    );
    add(
        format!("{CRI_TOOLS}/hostnet-nginx-{}", host_arch()),
        vec!["latest"],
        vec![nginx_layer()?],
        nginx_config(12003),
    );
    add(
        format!("{E2E}/httpd"),
        vec!["2.4.39-4"],
        vec![httpd_layer()?],
        httpd_config(),
    );

    // A setuid-root helper that reports the effective uid it gets.
    add(
        format!("{E2E}/nonewprivs"),
        vec!["1.3"],
        vec![nonewprivs_layer()?],
        nonewprivs_config(),
    );

    // The same image under two registries (the mirror maps both hosts to this one repository).
    add(
        "pause".into(),
        vec!["3.9"],
        vec![pause_layer()?],
        pause_config(),
    );

    // Images whose config names a user; only ImageStatus looks at them.
    for (name, user) in [
        ("test-image-user-uid", "1002"),
        ("test-image-user-username", "www-data"),
        ("test-image-user-uid-group", "1003:1004"),
        ("test-image-user-username-group", "www-data:1004"),
    ] {
        let mut config = busybox_config();
        config["User"] = json!(user);
        add(
            format!("{CRI_TOOLS}/{name}"),
            vec!["latest"],
            vec![],
            config,
        );
    }

    let mut config = busybox_config();
    config["User"] = json!("1000");
    add(
        format!("{CRI_TOOLS}/test-image-predefined-group"),
        vec!["latest"],
        vec![predefined_group_layer()?],
        config,
    );

    // Distinct images (each adds an empty file named after itself), as cri-tools builds them.
    for name in [
        "test-image-1",
        "test-image-2",
        "test-image-3",
        "test-image-latest",
    ] {
        add(
            format!("{CRI_TOOLS}/{name}"),
            vec!["latest"],
            vec![marker_layer(name)?],
            busybox_config(),
        );
    }
    // test-image-tag:test and :all are two different images.
    for tag in ["test", "all"] {
        add(
            format!("{CRI_TOOLS}/test-image-tag"),
            vec![tag],
            vec![marker_layer(tag)?],
            busybox_config(),
        );
    }
    // test-image-tags:1, :2 and :3 are one image.
    add(
        format!("{CRI_TOOLS}/test-image-tags"),
        vec!["1", "2", "3"],
        vec![marker_layer("same-image")?],
        busybox_config(),
    );
    Ok(images)
}

fn push(client: &RegistryClient, image: &Image) -> crius_tests::Result<String> {
    let mut descriptors = Vec::new();
    for layer in &image.layers {
        client.push_blob(&image.repository, &layer.blob)?;
        descriptors.push(json!({
            "mediaType": OCI_LAYER_GZIP,
            "digest": layer.digest,
            "size": layer.blob.len(),
        }));
    }
    let history: Vec<Value> = image
        .layers
        .iter()
        .enumerate()
        .map(
            |(i, _)| json!({"created": CREATED, "created_by": format!("critest-images layer {i}")}),
        )
        .collect();
    let config = to_json(&json!({
        "created": CREATED,
        "architecture": host_arch(),
        "os": "linux",
        "config": image.config,
        "rootfs": {
            "type": "layers",
            "diff_ids": image.layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>(),
        },
        "history": history,
    }));
    let config_digest = client.push_blob(&image.repository, &config)?;
    let manifest = to_json(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config.len()},
        "layers": descriptors,
    }));
    let mut digest = sha256_digest(&manifest);
    for tag in &image.tags {
        digest = client.push_manifest(&image.repository, tag, OCI_MANIFEST, &manifest)?;
    }
    Ok(digest)
}

fn to_json(value: &Value) -> Vec<u8> {
    // A `Value` with string keys always serialises.
    serde_json::to_vec(value).unwrap_or_default()
}

fn busybox_config() -> Value {
    json!({ "Env": [PATH_ENV], "Cmd": ["sh"] })
}

// ---- busybox rootfs --------------------------------------------------------------------------

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
";

const GROUP: &str = "root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
wheel:x:10:root
www-data:x:33:
users:x:100:
nogroup:x:65534:
";

/// `ipcs -m` for images whose busybox lacks the applet (Debian's has none): the System V shared
/// memory segments of the caller's IPC namespace, read from `/proc/sysvipc/shm`.
const IPCS: &str = r#"#!/bin/sh
# Stand-in for ipcs (this busybox has no ipcs applet): prints the System V shared memory
# segments of the caller's IPC namespace from /proc/sysvipc/shm, whatever the options.
echo
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch"
tail -n +2 /proc/sysvipc/shm | while read -r key shmid perms size cpid lpid nattch uid rest; do
  echo "$key $shmid $uid $perms $size $nattch"
done
"#;

/// `pgrep PATTERN` for images whose busybox lacks the applet (Debian's has none): the pid of
/// every process whose name matches the extended regular expression, status 1 when none does.
const PGREP: &str = r#"#!/bin/sh
# Stand-in for pgrep (this busybox has no pgrep applet): prints the pid of every process whose
# name matches the extended regular expression $1; exits 1 when none does.
found=1
for dir in /proc/[0-9]*; do
  name=$(cat "$dir/comm" 2>/dev/null) || continue
  if echo "$name" | grep -Eq -- "$1"; then
    echo "${dir#/proc/}"
    found=0
  fi
done
exit $found
"#;

/// Commands the specs run that Debian's busybox has no applet for, as small scripts.
const STAND_INS: &[(&str, &str)] = &[("ipcs", IPCS), ("pgrep", PGREP)];

/// The busybox layer every image starts from.
fn base_layer(shell_busybox: Option<&Path>) -> Result<Layer> {
    let binary = read(
        STATIC_BUSYBOX,
        "read Debian's static busybox (package busybox-static)",
    )?;
    let applets = applets(STATIC_BUSYBOX)?;

    let mut tar = LayerTar::new();
    for dir in [
        "/bin",
        "/dev",
        "/etc",
        "/home",
        "/proc",
        "/sys",
        "/usr",
        "/usr/bin",
        "/usr/sbin",
        "/usr/local",
        "/usr/local/bin",
        "/var",
        "/var/www",
    ] {
        tar.dir(dir, 0o755)?;
    }
    tar.dir("/root", 0o700)?;
    tar.dir("/tmp", 0o1777)?;
    tar.file(STATIC_BUSYBOX, 0o755, &binary)?;

    let replace_shell = shell_busybox.is_some();
    for applet in &applets {
        if replace_shell && (applet == "sh" || applet == "ash") {
            continue;
        }
        tar.hardlink(&format!("/bin/{applet}"), STATIC_BUSYBOX)?;
    }
    for (name, script) in STAND_INS {
        if !applets.iter().any(|a| a == name) {
            tar.file(&format!("/bin/{name}"), 0o755, script.as_bytes())?;
        }
    }
    if let Some(shell) = shell_busybox {
        let what = "read the shell busybox";
        tar.file("/bin/sh", 0o755, &read(shell, what)?)?;
        tar.hardlink("/bin/ash", "/bin/sh")?;
        for library in shared_libraries(shell)? {
            let what = "read a library of the shell busybox";
            let content = read(&library, what)?;
            tar.file(&library.to_string_lossy(), 0o755, &content)?;
        }
    }

    tar.file("/etc/passwd", 0o644, PASSWD.as_bytes())?;
    tar.file("/etc/group", 0o644, GROUP.as_bytes())?;
    tar.finish()
}

fn read(path: impl AsRef<Path>, what: &'static str) -> Result<Vec<u8>> {
    let path = path.as_ref();
    std::fs::read(path).map_err(|source| ToolError::Io {
        what,
        path: path.to_owned(),
        source,
    })
}

/// The applet names `busybox --list` prints, sorted.
fn applets(busybox: &str) -> Result<Vec<String>> {
    let output = run_program(busybox, "--list")?;
    let mut names: Vec<String> = output
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty() && !name.contains('/') && *name != "busybox")
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// The absolute paths `ldd` lists for a dynamic binary (libraries and the loader).
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let output = run_program("ldd", &binary.to_string_lossy())?;
    let mut paths = Vec::new();
    for line in output.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let candidate = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = candidate.filter(|p| p.starts_with('/')) {
            paths.push(PathBuf::from(path));
        }
    }
    if paths.is_empty() {
        return Err(ToolError::Program {
            program: "ldd".into(),
            arg: binary.display().to_string(),
            detail: "no libraries listed: --shell-busybox wants a dynamic busybox".into(),
        });
    }
    Ok(paths)
}

fn run_program(program: &str, arg: &str) -> Result<String> {
    let failed = |detail: String| ToolError::Program {
        program: program.to_owned(),
        arg: arg.to_owned(),
        detail,
    };
    let output = Command::new(program)
        .arg(arg)
        .output()
        .map_err(|err| failed(err.to_string()))?;
    if !output.status.success() {
        return Err(failed(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

// ---- nginx and httpd stand-ins ----------------------------------------------------------------

const NGINX_TITLE: &str = "nginx: master process nginx -g daemon off;";

/// The nginx main process: writes its pid where nginx does, serves the welcome page with busybox
/// httpd on the port given as `$1`, and stops on TERM, INT or QUIT.
const NGINX_SCRIPT: &str = r#"# Stand-in for nginx (critest-images): busybox httpd serves /usr/share/nginx/html.
echo "nginx: serving /usr/share/nginx/html on port $1 (busybox httpd)"
echo $$ > /var/run/nginx.pid
httpd -f -p "$1" -h /usr/share/nginx/html &
child=$!
trap 'kill $child 2>/dev/null; rm -f /var/run/nginx.pid; exit 0' TERM INT QUIT
wait $child
"#;

const NGINX_INDEX: &str = "<!DOCTYPE html>
<html>
<head><title>Welcome to nginx!</title></head>
<body>
<h1>Welcome to nginx!</h1>
<p>Served by busybox httpd standing in for nginx in crius's critest images.</p>
</body>
</html>
";

fn nginx_layer() -> Result<Layer> {
    let binary = read(
        STATIC_BUSYBOX,
        "read Debian's static busybox (package busybox-static)",
    )?;
    let mut tar = LayerTar::new();
    // A copy, not a link into the base layer: the kernel names the process after this file
    // (comm "nginx"), which is what `pidof nginx` finds.
    tar.file("/usr/sbin/nginx", 0o755, &binary)?;
    tar.file("/etc/nginx/nginx.sh", 0o644, NGINX_SCRIPT.as_bytes())?;
    tar.file(
        "/usr/share/nginx/html/index.html",
        0o644,
        NGINX_INDEX.as_bytes(),
    )?;
    tar.dir("/var/run", 0o755)?;
    tar.dir("/var/log/nginx", 0o755)?;
    tar.finish()
}

fn nginx_config(port: u16) -> Value {
    // `exec -a` gives the process nginx's title as argv[0] (so /proc/1/cmdline says "master
    // process"); its last path element "sh" makes busybox run its shell on the script.
    let start = format!("exec -a '{NGINX_TITLE}/sh' /usr/sbin/nginx /etc/nginx/nginx.sh {port}");
    json!({
        "Env": [PATH_ENV],
        "Entrypoint": ["/bin/sh", "-c", start],
        "ExposedPorts": { format!("{port}/tcp"): {} },
        "StopSignal": "SIGQUIT",
    })
}

const HTTPD_SCRIPT: &str = r#"#!/bin/sh
# Stand-in for Apache httpd (critest-images): busybox httpd serves /usr/local/apache2/htdocs.
echo "httpd: serving /usr/local/apache2/htdocs on port 80 (busybox httpd)"
httpd -f -p 80 -h /usr/local/apache2/htdocs &
child=$!
trap 'kill $child 2>/dev/null; exit 0' TERM INT WINCH
wait $child
"#;

fn httpd_layer() -> Result<Layer> {
    let mut tar = LayerTar::new();
    tar.file(
        "/usr/local/bin/httpd-foreground",
        0o755,
        HTTPD_SCRIPT.as_bytes(),
    )?;
    tar.file(
        "/usr/local/apache2/htdocs/index.html",
        0o644,
        b"<html><body><h1>It works!</h1></body></html>\n",
    )?;
    tar.finish()
}

fn httpd_config() -> Value {
    json!({
        "Env": [PATH_ENV],
        "Cmd": ["httpd-foreground"],
        "WorkingDir": "/usr/local/apache2",
        "ExposedPorts": { "80/tcp": {} },
    })
}

// ---- the other images -------------------------------------------------------------------------

/// busybox keeps root only for applets `/etc/busybox.conf` marks setuid (it drops privileges for
/// `id` otherwise).
const BUSYBOX_CONF: &str = "[SUID]\nid = ssx root.root\n";

fn nonewprivs_layer() -> Result<Layer> {
    let binary = read(
        STATIC_BUSYBOX,
        "read Debian's static busybox (package busybox-static)",
    )?;
    let mut tar = LayerTar::new();
    tar.dir("/nnp", 0o755)?;
    tar.file_owned("/nnp/id", 0o4755, 0, 0, &binary)?;
    tar.file("/etc/busybox.conf", 0o644, BUSYBOX_CONF.as_bytes())?;
    tar.finish()
}

fn nonewprivs_config() -> Value {
    // With no_new_privs the setuid bit is ignored and busybox then refuses to run `id` at all
    // (it cannot take the uid its config asks for; that holds for every busybox `id` in this
    // image): the effective uid the shell really has is then read from /proc.
    json!({
        "Env": [PATH_ENV],
        "Entrypoint": [
            "/bin/sh",
            "-c",
            "echo \"Effective uid: $(/nnp/id -u 2>/dev/null || awk '/^Uid:/ {print $3}' /proc/self/status)\"",
        ],
    })
}

const PAUSE_SCRIPT: &str = r#"#!/bin/sh
# Stand-in for the pause image (critest-images): sleeps until TERM or INT.
trap 'exit 0' TERM INT
while :; do
  sleep 3600 &
  wait $!
done
"#;

fn pause_layer() -> Result<Layer> {
    let mut tar = LayerTar::new();
    tar.file("/pause", 0o755, PAUSE_SCRIPT.as_bytes())?;
    tar.finish()
}

fn pause_config() -> Value {
    json!({ "Env": [PATH_ENV], "Entrypoint": ["/pause"] })
}

/// What `adduser -u 1000 -D default-user; addgroup -g 50000 group-defined-in-image;
/// addgroup default-user group-defined-in-image` leaves in a busybox image.
fn predefined_group_layer() -> Result<Layer> {
    let mut tar = LayerTar::new();
    tar.dir("/etc", 0o755)?;
    let passwd =
        format!("{PASSWD}default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n");
    let group =
        format!("{GROUP}default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n");
    tar.file("/etc/passwd", 0o644, passwd.as_bytes())?;
    tar.file("/etc/group", 0o644, group.as_bytes())?;
    tar.dir("/home", 0o755)?;
    tar.dir_owned("/home/default-user", 0o755, 1000, 1000)?;
    tar.finish()
}

/// An empty file `/<name>` (cri-tools' image-test Dockerfile adds one per image).
fn marker_layer(name: &str) -> Result<Layer> {
    let mut tar = LayerTar::new();
    tar.file(&format!("/{name}"), 0o644, b"")?;
    tar.finish()
}

// ---- deterministic tar layers -----------------------------------------------------------------

/// Collects entries with fixed owners and mtimes; paths are given absolute and stored relative.
/// Parent directories that were not added explicitly are added (0755) before their first entry.
struct LayerTar {
    builder: tar::Builder<Vec<u8>>,
    dirs: BTreeSet<String>,
}

impl LayerTar {
    fn new() -> LayerTar {
        let mut builder = tar::Builder::new(Vec::new());
        builder.mode(tar::HeaderMode::Deterministic);
        LayerTar {
            builder,
            dirs: BTreeSet::new(),
        }
    }

    fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.dir_owned(path, mode, 0, 0)
    }

    fn dir_owned(&mut self, path: &str, mode: u32, uid: u64, gid: u64) -> Result<()> {
        if self.dirs.contains(path) {
            return Ok(());
        }
        self.parents(path)?;
        self.dirs.insert(path.to_owned());
        let mut header = header(tar::EntryType::Directory, mode, uid, gid, 0);
        self.builder
            .append_data(&mut header, relative(path), std::io::empty())
            .map_err(|source| tar_error(path, source))
    }

    fn file(&mut self, path: &str, mode: u32, content: &[u8]) -> Result<()> {
        self.file_owned(path, mode, 0, 0, content)
    }

    fn file_owned(
        &mut self,
        path: &str,
        mode: u32,
        uid: u64,
        gid: u64,
        content: &[u8],
    ) -> Result<()> {
        self.parents(path)?;
        let mut header = header(
            tar::EntryType::Regular,
            mode,
            uid,
            gid,
            content.len() as u64,
        );
        self.builder
            .append_data(&mut header, relative(path), content)
            .map_err(|source| tar_error(path, source))
    }

    /// A hard link to `target`, an earlier entry of this layer.
    fn hardlink(&mut self, path: &str, target: &str) -> Result<()> {
        self.parents(path)?;
        let mut header = header(tar::EntryType::Link, 0o755, 0, 0, 0);
        self.builder
            .append_link(&mut header, relative(path), relative(target))
            .map_err(|source| tar_error(path, source))
    }

    fn parents(&mut self, path: &str) -> Result<()> {
        if let Some((parent, _)) = path.rsplit_once('/') {
            if !parent.is_empty() && !self.dirs.contains(parent) {
                self.dir(parent, 0o755)?;
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Layer> {
        let tar = self
            .builder
            .into_inner()
            .map_err(|source| tar_error("(end of archive)", source))?;
        let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&tar)
            .map_err(|source| tar_error("(gzip)", source))?;
        let blob = gz.finish().map_err(|source| tar_error("(gzip)", source))?;
        Ok(Layer {
            digest: sha256_digest(&blob),
            diff_id,
            blob,
        })
    }
}

fn tar_error(path: &str, source: std::io::Error) -> ToolError {
    ToolError::Io {
        what: "build layer entry",
        path: PathBuf::from(path),
        source,
    }
}

fn header(kind: tar::EntryType, mode: u32, uid: u64, gid: u64, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_mtime(MTIME);
    header.set_size(size);
    header
}

fn relative(path: &str) -> &str {
    path.trim_start_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn entries(layer: &Layer) -> Vec<(String, tar::EntryType, u32, String)> {
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(&layer.blob[..])
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(layer.diff_id, sha256_digest(&tar));
        let mut archive = tar::Archive::new(&tar[..]);
        archive
            .entries()
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                let link = entry
                    .link_name()
                    .unwrap()
                    .map(|l| l.display().to_string())
                    .unwrap_or_default();
                (
                    entry.path().unwrap().display().to_string(),
                    entry.header().entry_type(),
                    entry.header().mode().unwrap(),
                    link,
                )
            })
            .collect()
    }

    #[test]
    fn applets_are_hard_links_and_parents_come_first() {
        if !Path::new(STATIC_BUSYBOX).exists() {
            return;
        }
        let layer = base_layer(None).unwrap();
        let entries = entries(&layer);
        let ls = entries.iter().find(|e| e.0 == "bin/ls").unwrap();
        assert_eq!((ls.1, ls.3.as_str()), (tar::EntryType::Link, "bin/busybox"));
        let tmp = entries.iter().find(|e| e.0 == "tmp").unwrap();
        assert_eq!(tmp.2, 0o1777);
        assert!(entries
            .iter()
            .any(|e| e.0 == "bin/ipcs" || e.0 == "bin/busybox"));
    }

    #[test]
    fn same_tags_share_one_image_and_distinct_images_differ() {
        if !Path::new(STATIC_BUSYBOX).exists() {
            return;
        }
        let images = build_all(None).unwrap();
        let tags = images
            .iter()
            .find(|i| i.repository.ends_with("/test-image-tags"))
            .unwrap();
        assert_eq!(tags.tags, vec!["1", "2", "3"]);
        let tag_images: Vec<&Image> = images
            .iter()
            .filter(|i| i.repository.ends_with("/test-image-tag"))
            .collect();
        assert_eq!(tag_images.len(), 2);
        assert_ne!(
            tag_images[0].layers[1].digest,
            tag_images[1].layers[1].digest
        );
        let nnp = nonewprivs_layer().unwrap();
        let id = entries(&nnp).into_iter().find(|e| e.0 == "nnp/id").unwrap();
        assert_eq!(id.2, 0o4755);
    }

    #[test]
    fn ldd_output_is_parsed_into_paths() {
        if !Path::new(STATIC_BUSYBOX).exists() {
            return;
        }
        // The static busybox has no libraries: the tool must refuse it as a shell busybox.
        assert!(shared_libraries(Path::new(STATIC_BUSYBOX)).is_err());
    }
}
