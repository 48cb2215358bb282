//! `nri-plugin`: the test NRI plugin of `crius_tests::nri` as a program, for crius to start
//! from `[nri] plugin_path`. crius hands it a connected socket as fd 3 (`NRI_PLUGIN_SOCKET`)
//! and its name and index (`NRI_PLUGIN_NAME`, `NRI_PLUGIN_IDX`); what it does to containers
//! comes from the configuration crius passes in `Configure` (`<index>-<name>.conf` from
//! `[nri] plugin_config_path`, lines as `Behaviour::parse` reads them).

use std::os::fd::FromRawFd;
use std::process::ExitCode;

use crius_tests::nri::{Behaviour, Plugin};

fn main() -> ExitCode {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let (name, index) = (var("NRI_PLUGIN_NAME"), var("NRI_PLUGIN_IDX"));
    let Ok(fd) = var("NRI_PLUGIN_SOCKET").parse::<i32>() else {
        eprintln!("nri-plugin: NRI_PLUGIN_SOCKET is not a file descriptor");
        return ExitCode::FAILURE;
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nri-plugin: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        // SAFETY: crius passes this descriptor for the plugin to own; nothing else uses it.
        let std_stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
        if std_stream.set_nonblocking(true).is_err() {
            return ExitCode::FAILURE;
        }
        let Ok(stream) = tokio::net::UnixStream::from_std(std_stream) else {
            return ExitCode::FAILURE;
        };
        // Runs until crius closes the connection.
        Plugin::serve(stream, &name, &index, Behaviour::default())
            .closed()
            .await;
        ExitCode::SUCCESS
    })
}
