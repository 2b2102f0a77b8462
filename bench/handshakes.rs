//! Full TLS handshakes against a server with one certificate or many, for
//! `scripts/bench-handshake.sh`.
//!
//!     handshakes gen DIR N
//!         writes DIR/ca.pem and, for i in 0..N, DIR/cert$i.pem + DIR/key$i.pem (ECDSA P-256,
//!         signed by the CA): certificate i serves n$i.example.test, the last one `localhost`.
//!     handshakes run ADDR NAME CA_PEM CONCURRENCY LIMIT
//!         CONCURRENCY workers, each in a loop: connect to ADDR (loopback), a full TLS 1.3
//!         handshake naming NAME (SNI; X25519, no session resumption: every handshake does the
//!         key exchange and the signature), the chain verified against CA_PEM for NAME (so the
//!         server chose NAME's certificate), one `GET /` with `Connection: close`, read to
//!         the end. LIMIT is a count of handshakes (`500`) or a duration (`10s`).
//!
//! Prints `RESULT handshakes=N seconds=S per_second=R ok=A errors=E` (`ok`: a 200 came back).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("gen") if args.len() == 3 => generate(&args[1], args[2].parse()?),
        Some("run") if args.len() == 6 => {
            let addr: SocketAddr = args[1].parse()?;
            if !addr.ip().is_loopback() {
                return Err("ADDR must be a loopback address".into());
            }
            let limit = match args[5].strip_suffix('s') {
                Some(secs) => Limit::For(Duration::from_secs_f64(secs.parse()?)),
                None => Limit::Count(args[5].parse()?),
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(run(addr, &args[2], &args[3], args[4].parse()?, limit))
        }
        _ => Err(
            "usage: handshakes gen DIR N | run ADDR NAME CA_PEM CONCURRENCY COUNT|SECONDSs".into(),
        ),
    }
}

fn generate(dir: &str, n: usize) -> Result<(), BoxError> {
    let dir = std::path::Path::new(dir);
    std::fs::create_dir_all(dir)?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    (params.distinguished_name).push(rcgen::DnType::CommonName, "handshake bench CA");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let key = rcgen::KeyPair::generate()?;
    let ca = params.self_signed(&key)?;
    std::fs::write(dir.join("ca.pem"), ca.pem())?;
    let issuer = rcgen::Issuer::new(params, key);
    for i in 0..n {
        let name = match i + 1 == n {
            true => "localhost".to_string(),
            false => format!("n{i}.example.test"),
        };
        let mut leaf = rcgen::CertificateParams::new(vec![name])?;
        leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        leaf.use_authority_key_identifier_extension = true;
        let key = rcgen::KeyPair::generate()?;
        let cert = leaf.signed_by(&key, &issuer)?;
        std::fs::write(dir.join(format!("cert{i}.pem")), cert.pem())?;
        std::fs::write(dir.join(format!("key{i}.pem")), key.serialize_pem())?;
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Limit {
    Count(u64),
    For(Duration),
}

async fn run(
    addr: SocketAddr,
    name: &str,
    ca_pem: &str,
    concurrency: usize,
    limit: Limit,
) -> Result<(), BoxError> {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca_pem)?;
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        let cert: CertificateDer<'static> = cert?;
        roots.add(cert)?;
    }
    // One key exchange group, the one both servers measured offer (nginx on OpenSSL 3.0 has no
    // post-quantum hybrid): each handshake does the same X25519 and ECDSA work on either.
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519];
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.resumption = rustls::client::Resumption::disabled();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let server_name = ServerName::try_from(name.to_string())?;
    let request = format!("GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");

    let (started, ok, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let begun = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (connector, server_name, request) =
            (connector.clone(), server_name.clone(), request.clone());
        let (started, ok, errors) = (started.clone(), ok.clone(), errors.clone());
        workers.push(tokio::spawn(async move {
            loop {
                match limit {
                    Limit::Count(n) if started.fetch_add(1, Ordering::Relaxed) >= n => break,
                    Limit::For(d) if begun.elapsed() >= d => break,
                    _ => {}
                }
                match one(addr, &connector, server_name.clone(), &request).await {
                    Ok(true) => ok.fetch_add(1, Ordering::Relaxed),
                    Ok(false) | Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for worker in workers {
        worker.await?;
    }
    let seconds = begun.elapsed().as_secs_f64();
    let (ok, errors) = (ok.load(Ordering::Relaxed), errors.load(Ordering::Relaxed));
    let done = ok + errors;
    println!(
        "RESULT handshakes={done} seconds={seconds:.3} per_second={:.1} ok={ok} errors={errors}",
        done as f64 / seconds
    );
    Ok(())
}

/// One connection: a handshake, one request, its whole answer. True when it was a 200.
async fn one(
    addr: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    name: ServerName<'static>,
    request: &str,
) -> Result<bool, BoxError> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let mut tls = connector.connect(name, tcp).await?;
    tls.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    // A server may close without close_notify after `Connection: close`: what was read counts.
    let _ = tls.read_to_end(&mut answer).await;
    Ok(answer.starts_with(b"HTTP/1.1 200"))
}
