//! Subcommands of the `crius` binary that do not serve: clients of a running crius (`crius
//! status` on the CRI socket, `crius images …` on the admin socket). `crius config default` and `crius config check` stay in `main.rs`, being a print
//! and a call into [`crate::config`].

pub mod containerd;
pub mod images;
pub mod pulls;
pub mod status;

/// A gRPC channel over the unix socket at `socket` (the caller says what failed to connect).
pub(crate) async fn grpc_channel(
    socket: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    // The URI is required by tonic but unused: every connection goes to `path`.
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
}
