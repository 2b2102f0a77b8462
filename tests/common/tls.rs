//! Test certificates: a fresh self-signed one per test (rcgen), with its PEM files on disk.

use super::*;
use crate::common::config::Config;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A fresh self-signed certificate for `localhost` and 127.0.0.1, its PEM files on disk.
pub struct SelfSigned {
    pub cert_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: PrivatePkcs8KeyDer<'static>,
    pub cert_file: TempFile,
    pub key_file: TempFile,
}

impl SelfSigned {
    pub fn new() -> SelfSigned {
        let certified = rcgen::generate_simple_self_signed(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ])
        .expect("generate a self-signed certificate");
        let cert_pem = certified.cert.pem();
        let key_pem = certified.signing_key.serialize_pem();
        SelfSigned {
            cert_der: certified.cert.der().clone(),
            key_der: PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()),
            cert_file: TempFile::new(&cert_pem),
            key_file: TempFile::new(&key_pem),
            cert_pem,
        }
    }

    /// `config` with the `tls:` section that makes floodgate serve this certificate.
    pub fn served(&self, config: Config) -> Config {
        config.set("tls", "cert", &yaml_path(&self.cert_file)).set(
            "tls",
            "key",
            &yaml_path(&self.key_file),
        )
    }

    /// A rustls server config serving this certificate (HTTP/1.1 only, no ALPN).
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("default TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![self.cert_der.clone()],
            PrivateKeyDer::Pkcs8(self.key_der.clone_key()),
        )
        .expect("server config");
        Arc::new(config)
    }

    /// An HTTPS client that trusts only this certificate and sends `localhost` to `addr`.
    pub fn client(&self, addr: SocketAddr, http1_only: bool) -> reqwest::Client {
        let cert = reqwest::Certificate::from_pem(self.cert_pem.as_bytes()).expect("PEM cert");
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([cert])
            .resolve("localhost", addr);
        if http1_only {
            builder = builder.http1_only();
        }
        builder.build().expect("build HTTPS client")
    }
}

/// A temp file's path as a YAML scalar.
pub fn yaml_path(file: &TempFile) -> String {
    format!("{:?}", file.path().display().to_string())
}

/// A test certificate authority (rcgen) that signs server and client certificates.
pub struct TestCa {
    pub cert_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub cert_file: TempFile,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A certificate signed by a [`TestCa`], with its key; PEM files on disk.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_file: TempFile,
    pub key_file: TempFile,
    pub cert_der: CertificateDer<'static>,
    pub key_der: PrivatePkcs8KeyDer<'static>,
}

impl Leaf {
    /// The chain (leaf, then its CA) and key as rustls takes them (the quinn client's identity).
    pub fn chain_and_key(
        &self,
        ca: &TestCa,
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let chain = vec![self.cert_der.clone(), ca.cert_der.clone()];
        (chain, PrivateKeyDer::Pkcs8(self.key_der.clone_key()))
    }

    /// The chain (leaf, then its CA) and key as reqwest's client identity.
    pub fn identity(&self, ca: &TestCa) -> reqwest::Identity {
        let pem = format!("{}{}{}", self.key_pem, self.cert_pem, ca.cert_pem);
        reqwest::Identity::from_pem(pem.as_bytes()).expect("client identity")
    }
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        let cert_pem = cert.pem();
        TestCa {
            cert_file: TempFile::new(&cert_pem),
            cert_der: cert.der().clone(),
            cert_pem,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A server certificate for `names` (DNS names; an address becomes an IP SAN).
    pub fn server(&self, names: &[&str]) -> Leaf {
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("server params");
        self.sign(params, rcgen::ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate whose subject's CN is `common_name` and whose SANs are `sans`.
    pub fn client(&self, common_name: &str, sans: Vec<rcgen::SanType>) -> Leaf {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.subject_alt_names = sans;
        self.sign(params, rcgen::ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn sign(
        &self,
        mut params: rcgen::CertificateParams,
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> Leaf {
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        Leaf {
            cert_file: TempFile::new(&cert_pem),
            key_file: TempFile::new(&key_pem),
            cert_der: cert.der().clone(),
            key_der: PrivatePkcs8KeyDer::from(key.serialize_der()),
            cert_pem,
            key_pem,
        }
    }
}
