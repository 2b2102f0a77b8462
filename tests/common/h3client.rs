//! An HTTP/3 client on quinn and h3, for load: many requests on a few connections, each a
//! stream. The tests' second HTTP/3 peer beside aioquic (`tests/http3/client.py`), and the load
//! generator of `bench/h3load.rs` (which includes this file). Self-contained: it names nothing
//! of the harness.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One QUIC connection speaking HTTP/3, shared by as many concurrent requests as its streams
/// allow.
#[derive(Clone)]
pub struct H3Client {
    send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    /// Kept for the connection's life: dropping the endpoint closes it.
    _endpoint: quinn::Endpoint,
    authority: String,
}

impl H3Client {
    /// Connects to `addr`, naming `server_name` (SNI, and the requests' authority) and trusting
    /// only `ca`.
    pub async fn connect(
        addr: SocketAddr,
        server_name: &str,
        ca: CertificateDer<'static>,
    ) -> Result<H3Client, BoxError> {
        H3Client::connect_as(addr, server_name, ca, None).await
    }

    /// As [`H3Client::connect`], presenting `identity` (a chain and its key) when the server
    /// asks for a client certificate.
    pub async fn connect_as(
        addr: SocketAddr,
        server_name: &str,
        ca: CertificateDer<'static>,
        identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Result<H3Client, BoxError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca)?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots);
        let mut tls = match identity {
            Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
            None => builder.with_no_client_auth(),
        };
        tls.alpn_protocols = vec![b"h3".to_vec()];
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
        let bind: SocketAddr = match addr {
            SocketAddr::V4(_) => "0.0.0.0:0".parse()?,
            SocketAddr::V6(_) => "[::]:0".parse()?,
        };
        let mut endpoint = quinn::Endpoint::client(bind)?;
        endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
        let connection = endpoint.connect(addr, server_name)?.await?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(connection)).await?;
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(H3Client {
            send,
            _endpoint: endpoint,
            authority: format!("{server_name}:{}", addr.port()),
        })
    }

    /// GETs `path` with `headers`, reading the whole body: the answer's status.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Result<u16, BoxError> {
        let mut request = http::Request::get(format!("https://{}{path}", self.authority));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut send = self.send.clone();
        let mut stream = send.send_request(request.body(())?).await?;
        stream.finish().await?;
        let response = stream.recv_response().await?;
        while let Some(mut chunk) = stream.recv_data().await? {
            chunk.advance(chunk.remaining());
        }
        Ok(response.status().as_u16())
    }
}
