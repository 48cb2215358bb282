//! Debian's tinyproxy in the foreground on 127.0.0.1 (a free port), logging each request it
//! relays: `GET http://…` for a forward-proxy request, `CONNECT host:port` for a tunnel. Killed
//! and reaped on drop.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::process::{kill_and_reap, spawn_logged};
use crate::{free_port, Error, Result, TestDir};

const TINYPROXY: &str = "/usr/bin/tinyproxy";

/// A running tinyproxy.
#[derive(Debug)]
pub struct TinyProxy {
    port: u16,
    log: PathBuf,
    child: Option<Child>,
    _dir: TestDir,
}

impl TinyProxy {
    /// Starts it and waits until it accepts connections.
    pub fn start() -> Result<TinyProxy> {
        if !std::path::Path::new(TINYPROXY).exists() {
            return Err(Error::MissingProgram {
                program: TINYPROXY,
                package: "tinyproxy",
            });
        }
        let dir = TestDir::new("tinyproxy")?;
        let port = free_port()?;
        let conf = dir.join("tinyproxy.conf");
        // No ConnectPort line: CONNECT to any port.
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 30\nMaxClients 50\nAllow 127.0.0.1\n\
                 LogLevel Connect\nDisableViaHeader Yes\n"
            ),
        )
        .map_err(|source| Error::io("write tinyproxy config", &conf, source))?;
        let log = dir.join("tinyproxy.log");
        let mut command = Command::new(TINYPROXY);
        command.arg("-d").arg("-c").arg(&conf);
        let child = spawn_logged(command, "tinyproxy", &log)?;
        let proxy = TinyProxy {
            port,
            log,
            child: Some(child),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(Error::io(
                    "tinyproxy did not listen in 10 s",
                    &proxy.log,
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(proxy)
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The requests it relayed, as logged (`GET http://… HTTP/1.1`, `CONNECT host:port …`).
    pub fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once("): ").map(|(_, r)| r.to_string()))
            .filter(|r| r.starts_with("GET ") || r.starts_with("CONNECT "))
            .collect()
    }
}

impl Drop for TinyProxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Err(err) = kill_and_reap(&mut child, "tinyproxy") {
                eprintln!("crius-tests: stop tinyproxy: {err}");
            }
        }
    }
}
