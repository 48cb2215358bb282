//! The streaming server over TLS: with `enable_tls` crius makes a self-signed certificate at
//! start and answers `https://` URLs; with `tls_cert_file`/`tls_key_file` it presents the
//! operator's certificate. An exec session runs over each, as crictl and kubelet's stream proxy
//! run it (TLS without verification). Networks 39 and 50.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::common::Env;
use crius_api::v1::*;
use crius_tests::streaming::{exit_code_of, Client};

/// Exec of `echo over-tls; exit 3` in container `c`.
fn exec(c: &str) -> ExecRequest {
    ExecRequest {
        container_id: c.into(),
        cmd: vec!["sh".into(), "-c".into(), "echo over-tls; exit 3".into()],
        stdout: true,
        stderr: true,
        ..Default::default()
    }
}

/// Runs `echo over-tls; exit 3` in a fresh container over `env`'s streaming server; answers
/// the certificate the server presented.
async fn exec_over_tls(env: &mut Env) -> Vec<u8> {
    env.pull(&env.image.clone()).await;
    let pod_config = env.pod_config("tls", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("box", &["sleep", "1000"]),
        )
        .await;
    let url = env.exec_url(exec(&c)).await;
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    // A plain-HTTP client gets no session on the TLS port.
    let plain = url.replacen("https://", "http://", 1);
    assert!(Client::connect(&plain, &["v4.channel.k8s.io"])
        .await
        .is_err());

    let url = env.exec_url(exec(&c)).await;
    let mut client = Client::connect(&url, &["v4.channel.k8s.io"]).await.unwrap();
    let s = client.open_command(false, true, true, false).await.unwrap();
    let status = client
        .wait_status(&s, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(client.received(s.stdout.unwrap()).data, b"over-tls\n");
    assert_eq!(exit_code_of(&status), Some(3), "{status}");
    let cert = client.peer_certificate.clone().unwrap();
    env.stop(&c, 0).await;
    env.remove(&c).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    cert
}

/// `der` as a PEM block with `label` (RFC 7468).
fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_tls_with_a_self_signed_certificate() {
    let mut env = Env::with_config("[stream]\nenable_tls = true\n").await;
    let cert = exec_over_tls(&mut env).await;
    assert!(!cert.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_tls_with_the_operators_certificate() {
    let dir = crius_tests::TestDir::new("stream-tls-cert").unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert_file, key_file) = (dir.join("stream.crt"), dir.join("stream.key"));
    std::fs::write(&cert_file, pem("CERTIFICATE", made.cert.der())).unwrap();
    std::fs::write(
        &key_file,
        pem("PRIVATE KEY", &made.signing_key.serialize_der()),
    )
    .unwrap();
    let mut env = Env::with_config(&format!(
        "[stream]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
        cert_file.display(),
        key_file.display()
    ))
    .await;
    let presented = exec_over_tls(&mut env).await;
    assert_eq!(presented, made.cert.der().to_vec());
}
