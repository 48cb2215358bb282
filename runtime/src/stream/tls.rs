//! TLS for the streaming server: the operator's certificate and key (`[stream] tls_cert_file`,
//! `tls_key_file`, PEM), or with `enable_tls` and no files a self-signed certificate made at
//! start for the listening address and `localhost`, as containerd's `enable_tls_streaming`
//! does. The URLs crius answers are then `https://`.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::StreamConfig;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("[stream] {key} {path}: {reason}")]
    File {
        key: &'static str,
        path: String,
        reason: String,
    },
    #[error("make a self-signed certificate: {0}")]
    SelfSigned(String),
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The acceptor `config` asks for, or `None` for plain HTTP. `ip` is the address listened on
/// (named in a self-signed certificate).
pub fn acceptor(config: &StreamConfig, ip: IpAddr) -> Result<Option<TlsAcceptor>, TlsError> {
    if !config.tls() {
        return Ok(None);
    }
    let (chain, key) = if config.tls_cert_file.as_os_str().is_empty() {
        self_signed(ip)?
    } else {
        (
            read_chain(&config.tls_cert_file)?,
            read_key(&config.tls_key_file)?,
        )
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    // The stream protocols upgrade an HTTP/1.1 request.
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(TlsAcceptor::from(Arc::new(server))))
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |reason: String| TlsError::File {
        key: "tls_cert_file",
        path: path.display().to_string(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if chain.is_empty() {
        return Err(err("no PEM certificate in it".into()));
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        key: "tls_key_file",
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

type Pair = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn self_signed(ip: IpAddr) -> Result<Pair, TlsError> {
    let mut names = vec!["localhost".to_string(), ip.to_string()];
    if ip.is_unspecified() {
        names.truncate(1);
    }
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| TlsError::SelfSigned(e.to_string()))?;
    let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
    Ok((vec![made.cert.der().clone()], PrivateKeyDer::Pkcs8(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_unless_asked_and_self_signed_without_files() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let mut config = StreamConfig::default();
        assert!(acceptor(&config, ip).unwrap().is_none());
        config.enable_tls = true;
        assert!(acceptor(&config, ip).unwrap().is_some());
    }

    #[test]
    fn files_that_are_not_pem_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("cert.pem");
        std::fs::write(&bad, "not a certificate").unwrap();
        let config = StreamConfig {
            tls_cert_file: bad.clone(),
            tls_key_file: bad,
            ..StreamConfig::default()
        };
        let Err(err) = acceptor(&config, "127.0.0.1".parse().unwrap()) else {
            panic!("a file that is not PEM was taken");
        };
        assert!(err.to_string().contains("tls_cert_file"), "{err}");
    }
}
