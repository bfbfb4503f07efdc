//! A TLS front for a plain-HTTP test server, as a load balancer or ingress
//! stands in front of a real service: it accepts TLS on one address with a
//! given certificate and passes the bytes on to the server's plain address.
//! The VM in a box puts the IMDS emulator's Entra ID endpoint behind one at
//! `https://login.microsoftonline.com`, so workload identity reaches its
//! token endpoint over HTTPS with a certificate the box trusts, as in Azure.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A running TLS front; stops when dropped.
#[derive(Debug)]
pub struct TlsFront {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl TlsFront {
    /// Serves TLS on `bind` with the PEM certificate chain `cert` and key
    /// `key`, passing each connection on to `backend`.
    pub async fn start(
        bind: SocketAddr,
        cert: &Path,
        key: &Path,
        backend: SocketAddr,
    ) -> io::Result<TlsFront> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{what}: {e}"))
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|e| invalid("reading the certificate", &e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("parsing the certificate", &e))?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid("reading the key", &e))?;
        // The provider named, not the process default: a test binary may
        // link more than one.
        let config = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("TLS versions", &e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| invalid("the certificate and key", &e))?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(pass_on(acceptor.clone(), client, backend));
            }
        });
        Ok(TlsFront { addr, task })
    }

    /// Where it accepts TLS.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection: the handshake, then bytes both ways until either side
/// closes. A failed handshake (an untrusting client) just ends it.
async fn pass_on(acceptor: TlsAcceptor, client: TcpStream, backend: SocketAddr) {
    let Ok(mut tls) = acceptor.accept(client).await else {
        return;
    };
    let Ok(mut server) = TcpStream::connect(backend).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
}
