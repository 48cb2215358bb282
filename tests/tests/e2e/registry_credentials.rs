//! Registry credentials in PullImage are checked before crius opens any connection: a NUL, CR
//! or LF in a field (which would cut or split an HTTP header) is `InvalidArgument` naming the
//! field, quoting at most a short excerpt of a user name or address and nothing of a secret.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::common::{assert_status, Env};
use crius_api::v1::*;
use tonic::Code;

#[tokio::test]
async fn line_breaks_or_nul_in_credentials_are_refused_before_any_connection() {
    let env = Env::new().await;
    // A "registry" that must never see a connection: the kernel completes a TCP handshake into
    // its backlog, so any attempt shows up as an accepted socket below.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let image = format!(
        "127.0.0.1:{}/crius/creds:v1",
        listener.local_addr().unwrap().port()
    );
    let huge_user = format!("{}\0", "u".repeat(1 << 20));
    let cases: [(&str, &str); 7] = [
        ("username", &huge_user),
        ("password", "s3cr3t\r\nX-Injected: yes"),
        ("auth", "dXNlcjpwYXNz\n"),
        ("server_address", "127.0.0.1\0evil"),
        ("identity_token", "id-s3cr3t\0"),
        ("registry_token", "reg-s3cr3t\nHost: elsewhere"),
        ("password", "s3cr3t\0"),
    ];
    for (field, value) in cases {
        let mut auth = AuthConfig {
            username: "user".into(),
            password: "pass".into(),
            ..Default::default()
        };
        match field {
            "username" => auth.username = value.into(),
            "password" => auth.password = value.into(),
            "auth" => auth.auth = value.into(),
            "server_address" => auth.server_address = value.into(),
            "identity_token" => auth.identity_token = value.into(),
            _ => auth.registry_token = value.into(),
        }
        let mut req = tonic::Request::new(PullImageRequest {
            image: Some(ImageSpec {
                image: image.clone(),
                ..Default::default()
            }),
            auth: Some(auth),
            ..Default::default()
        });
        req.set_timeout(Duration::from_secs(10));
        let result = env.crius.image().pull_image(req).await;
        let len = result.as_ref().err().map_or(0, |s| s.message().len());
        let message = result.as_ref().err().map(|s| s.message().to_string());
        assert_status(result, Code::InvalidArgument, &[&format!("auth.{field}")]);
        assert!(len < 1024, "{field}: status message of {len} bytes");
        let message = message.unwrap_or_default();
        assert!(!message.contains("s3cr3t"), "a secret is quoted: {message}");
    }
    listener.set_nonblocking(true).unwrap();
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("crius connected to the registry: {other:?}"),
    }
}

/// `[registry] auth_file`: a pull whose request carries no credentials uses the file's entry
/// for the registry's host; an entry for another host is never sent (the pull is then
/// Unauthenticated); credentials in the request win over the file. The file is read at each
/// pull. Network 99.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_from_the_auth_file_go_to_their_host_only() {
    use base64::Engine as _;
    use crius_tests::images::{self, TestImage};
    use crius_tests::registry::{Registry, PASSWORD, USERNAME};

    let private = Registry::start_with_auth().unwrap();
    let image = images::push(&private, TestImage::Busybox)
        .unwrap()
        .reference;
    let dir = crius_tests::TestDir::new("auth-file").unwrap();
    let file = dir.join("auth.json");
    let write = |host: &str| {
        let auth =
            base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"));
        std::fs::write(
            &file,
            format!(r#"{{"auths": {{"{host}": {{"auth": "{auth}"}}}}}}"#),
        )
        .unwrap();
    };
    // Appended to the [registry] table, which the fixture's config ends with.
    let env = Env::with_config(&format!("auth_file = \"{}\"\n", file.display())).await;
    let pull = |auth: Option<AuthConfig>| {
        let mut images = env.crius.image();
        let image = image.clone();
        async move {
            images
                .pull_image(PullImageRequest {
                    image: Some(ImageSpec {
                        image,
                        ..Default::default()
                    }),
                    auth,
                    sandbox_config: None,
                })
                .await
        }
    };
    let remove = || {
        let mut images = env.crius.image();
        let image = image.clone();
        async move {
            images
                .remove_image(RemoveImageRequest {
                    image: Some(ImageSpec {
                        image,
                        ..Default::default()
                    }),
                })
                .await
                .unwrap();
        }
    };

    write("127.0.0.1:1");
    let refused = pull(None).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    write(&private.host_port());
    pull(None).await.unwrap();
    remove().await;

    // The request's credentials win: wrong ones are rejected although the file has good ones.
    let wrong = AuthConfig {
        username: USERNAME.into(),
        password: "wrong".into(),
        ..Default::default()
    };
    let rejected = pull(Some(wrong)).await.unwrap_err();
    assert_eq!(rejected.code(), Code::Unauthenticated, "{rejected:?}");
}
