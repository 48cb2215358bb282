//! `crius images import|export|pulls`: clients of the running crius's admin socket
//! ([`crate::admin`], which says why these go through the daemon). Plain blocking code: one
//! connection, one request.

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal as _, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};

use crate::admin::{
    read_line, write_line, ChunkReader, ChunkWriter, ExportSummary, ImportSummary, PullView,
    Request, Response,
};

fn connect(socket: &Path) -> anyhow::Result<UnixStream> {
    UnixStream::connect(socket).with_context(|| {
        format!(
            "connect to crius's admin socket {} (is crius running, and are you root?)",
            socket.display()
        )
    })
}

/// `crius images import FILE|-`: sends the archive (a file, or stdin for `-`) to crius and
/// returns what it imported.
pub fn import(socket: &Path, file: &str) -> anyhow::Result<ImportSummary> {
    let input: Box<dyn Read> = if file == "-" {
        Box::new(io::stdin().lock())
    } else {
        Box::new(File::open(file).with_context(|| format!("open {file}"))?)
    };
    let mut stream = connect(socket)?;
    write_line(&mut stream, &Request::Import).context("send the request")?;
    let mut out = ChunkWriter::new(stream.try_clone().context("admin stream")?);
    // A write refused half-way means crius gave up on the archive: its answer says why.
    let sent =
        copy(input, &mut out, file).and_then(|()| out.finish().map(drop).map_err(Into::into));
    match read_line::<_, Response>(&mut stream) {
        Ok(Response::Imported(summary)) => Ok(summary),
        Ok(Response::Error { message }) => bail!("{message}"),
        Ok(other) => bail!("unexpected answer {other:?}"),
        Err(e) => match sent {
            Err(sent) => Err(sent),
            Ok(()) => Err(e).context("read crius's answer"),
        },
    }
}

fn copy(mut input: impl Read, out: &mut impl Write, file: &str) -> anyhow::Result<()> {
    let mut buf = vec![0u8; crate::admin::MAX_CHUNK];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("read {file}")),
        };
        out.write_all(&buf[..n])
            .context("send the archive to crius")?;
    }
}

/// `crius images export REF... -o FILE|-`: writes the archive crius sends to `output` (through
/// a temp file renamed at the end, so a failed export leaves no file behind).
pub fn export(socket: &Path, images: &[String], output: &str) -> anyhow::Result<ExportSummary> {
    let mut stream = connect(socket)?;
    write_line(
        &mut stream,
        &Request::Export {
            images: images.to_vec(),
        },
    )
    .context("send the request")?;
    if output == "-" {
        let mut stdout = io::stdout().lock();
        if stdout.is_terminal() {
            bail!("refusing to write an archive to a terminal: give -o FILE or redirect stdout");
        }
        return receive(&mut stream, &mut stdout);
    }
    let dest = PathBuf::from(output);
    let name = dest
        .file_name()
        .with_context(|| format!("-o {output}: not a file name"))?
        .to_string_lossy()
        .into_owned();
    let tmp = dest.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    let file = File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let received = receive(&mut stream, &mut out).and_then(|summary| {
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &dest).with_context(|| format!("rename to {output}"))?;
        Ok(summary)
    });
    if received.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    received
}

fn receive(stream: &mut UnixStream, out: &mut impl Write) -> anyhow::Result<ExportSummary> {
    let mut archive = ChunkReader::new(stream.try_clone().context("admin stream")?);
    io::copy(&mut archive, out).context("receive the archive")?;
    out.flush().context("write the archive")?;
    match read_line::<_, Response>(stream).context("read crius's answer")? {
        Response::Exported(summary) => Ok(summary),
        Response::Error { message } => bail!("{message}"),
        other => bail!("unexpected answer {other:?}"),
    }
}

/// The pulls under way, once.
pub fn pulls(socket: &Path) -> anyhow::Result<Vec<PullView>> {
    let mut stream = connect(socket)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .context("admin stream")?;
    write_line(&mut stream, &Request::Pulls).context("send the request")?;
    match read_line::<_, Response>(&mut stream).context("read crius's answer")? {
        Response::Pulls { pulls } => Ok(pulls),
        Response::Error { message } => bail!("{message}"),
        other => bail!("unexpected answer {other:?}"),
    }
}

/// What `crius images import` prints.
pub fn describe_import(summary: &ImportSummary) -> String {
    let mut out = String::new();
    for image in &summary.images {
        let names = if image.repo_tags.is_empty() {
            "(no name)".to_string()
        } else {
            image.repo_tags.join(" ")
        };
        out.push_str(&format!("imported {} {names}\n", image.id));
    }
    for platform in &summary.skipped_platforms {
        out.push_str(&format!("skipped an image for {platform}\n"));
    }
    let n = summary.images.len();
    out.push_str(&format!(
        "{n} image{}, {:.1} MB read, {} layer{} unpacked, in {:.2} s\n",
        if n == 1 { "" } else { "s" },
        summary.archive_bytes as f64 / 1e6,
        summary.layers_unpacked,
        if summary.layers_unpacked == 1 {
            ""
        } else {
            "s"
        },
        summary.seconds
    ));
    out
}
