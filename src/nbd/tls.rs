//! TLS for NBD (proto.md "TLS support"): the server's acceptor and the
//! origin client's connector, built from the files qemu-nbd and nbdkit
//! read.
//!
//! - X.509 certificates, a directory holding `ca-cert.pem`,
//!   `server-cert.pem` and `server-key.pem`, and optionally `ca-crl.pem`
//!   (revoked client certificates, checked when the server verifies its
//!   peers, as qemu-nbd does); the client side: `ca-cert.pem`, and
//!   `client-cert.pem` with `client-key.pem` when the server verifies its
//!   peers. Served with rustls (ring provider), TLS 1.2 and 1.3.
//! - Pre-shared keys, the file `psktool` writes and nbdkit `--tls-psk`
//!   reads: one `username:hexkey` per line. rustls has no TLS-PSK in its
//!   API (rustls issue #174; the one pull request, #2524, was closed
//!   unmerged), and BoringSSL refuses external TLS 1.3 PSKs by design, so
//!   PSK runs on OpenSSL (the `openssl` crate, Debian's libssl3) with its
//!   PSK callbacks, which GnuTLS clients (libnbd, qemu) interoperate with
//!   in TLS 1.3 (psk_dhe_ke, SHA-256) and in TLS 1.2 (DHE-PSK, PSK).
//!
//! Both stacks hand back the same boxed async stream, so the handshake and
//! transmission code never knows which one is underneath.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use openssl::ssl::{
    Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslVerifyMode, SslVersion,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};

/// A byte stream of either transport, plain or encrypted.
pub trait AsyncStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncStream for T {}
pub type BoxStream = Box<dyn AsyncStream>;

/// Errors setting up or running TLS.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A credentials file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A credentials file does not hold what it should.
    #[error("{}: {why}", path.display())]
    Invalid { path: PathBuf, why: String },
    /// rustls refused the configuration (e.g. a key that does not match
    /// the certificate).
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// OpenSSL refused the configuration.
    #[error("OpenSSL: {0}")]
    OpenSsl(#[from] openssl::error::ErrorStack),
    /// The TLS handshake with the peer failed (wrong key, unknown CA,
    /// plaintext where TLS was expected, ...).
    #[error("TLS handshake: {0}")]
    Handshake(String),
}

// ---------------------------------------------------------------------------
// Pre-shared keys.

/// Longest key accepted (OpenSSL's PSK_MAX_PSK_LEN is 512 bytes).
const PSK_BYTES_MAX: usize = 256;
/// Longest username (an identity must fit OpenSSL's 128-byte buffer with
/// its NUL).
const PSK_USERNAME_BYTES_MAX: usize = 127;

/// A psktool keys file: username to key. Debug output omits the keys.
#[derive(Clone)]
pub struct PskKeys {
    keys: HashMap<String, Vec<u8>>,
}

impl std::fmt::Debug for PskKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PskKeys")
            .field("users", &self.usernames())
            .finish()
    }
}

impl PskKeys {
    /// Parses `username:hexkey` lines; blank lines and `#` comments are
    /// skipped. The error names the line.
    pub fn parse(text: &str) -> Result<PskKeys, String> {
        let mut keys = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let n = i + 1;
            let (user, hex) = line
                .split_once(':')
                .ok_or_else(|| format!("line {n}: expected username:hexkey"))?;
            if user.is_empty() || user.len() > PSK_USERNAME_BYTES_MAX || user.contains('\0') {
                return Err(format!(
                    "line {n}: username must be 1 to {PSK_USERNAME_BYTES_MAX} bytes"
                ));
            }
            let key = decode_hex(hex).ok_or_else(|| format!("line {n}: key is not hex"))?;
            if key.is_empty() || key.len() > PSK_BYTES_MAX {
                return Err(format!("line {n}: key must be 1 to {PSK_BYTES_MAX} bytes"));
            }
            if keys.insert(user.to_string(), key).is_some() {
                return Err(format!("line {n}: username '{user}' given twice"));
            }
        }
        if keys.is_empty() {
            return Err("no keys".into());
        }
        Ok(PskKeys { keys })
    }

    pub fn load(path: &Path) -> Result<PskKeys, TlsError> {
        let text = std::fs::read_to_string(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })?;
        PskKeys::parse(&text).map_err(|why| TlsError::Invalid {
            path: path.to_owned(),
            why,
        })
    }

    pub fn get(&self, username: &str) -> Option<&[u8]> {
        self.keys.get(username).map(Vec::as_slice)
    }

    /// The usernames, sorted.
    pub fn usernames(&self) -> Vec<&str> {
        let mut users: Vec<&str> = self.keys.keys().map(String::as_str).collect();
        users.sort_unstable();
        users
    }
}

/// Hex digits only: `from_str_radix` alone also takes a sign, so "+f+f"
/// was the key 0f0f (where fuzz/fuzz_targets/tls_psk_keys.rs and its
/// strict model disagreed).
fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// TLS 1.2 suites offered with PSK (TLS 1.3 needs none: its PSK mode works
/// with every TLS 1.3 suite of SHA-256). Ephemeral (EC)DHE first, so a
/// leaked key does not expose recorded sessions.
const PSK_TLS12_CIPHERS: &str = "ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES256-GCM-SHA384:\
DHE-PSK-AES128-GCM-SHA256:DHE-PSK-CHACHA20-POLY1305:PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256";

fn psk_context(server: bool) -> Result<SslContextBuilder, TlsError> {
    let method = if server {
        SslMethod::tls_server()
    } else {
        SslMethod::tls_client()
    };
    let mut b = SslContextBuilder::new(method)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    b.set_cipher_list(PSK_TLS12_CIPHERS)?;
    // AES-128-GCM first, and the server's order wins: GnuTLS clients list
    // ChaCha20 first, which costs more than AES with AES-NI. (A PSK from
    // the legacy callback has SHA-256: no AES-256/SHA-384 suite with it.)
    b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256")?;
    b.set_options(SslOptions::CIPHER_SERVER_PREFERENCE);
    b.set_verify(SslVerifyMode::NONE);
    // Read whole socket buffers, not a record header then its body: two
    // syscalls per 28-byte request record otherwise.
    b.set_read_ahead(true);
    Ok(b)
}

// ---------------------------------------------------------------------------
// Certificates.

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let invalid = |why: String| TlsError::Invalid {
        path: path.to_owned(),
        why,
    };
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid("no certificate in the file".into()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_error(path, e))
}

fn pem_error(path: &Path, e: rustls::pki_types::pem::Error) -> TlsError {
    match e {
        rustls::pki_types::pem::Error::Io(source) => TlsError::Read {
            path: path.to_owned(),
            source,
        },
        other => TlsError::Invalid {
            path: path.to_owned(),
            why: format!("bad PEM: {other}"),
        },
    }
}

fn roots(path: &Path) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let mut store = rustls::RootCertStore::empty();
    for c in read_certs(path)? {
        store.add(c).map_err(|e| TlsError::Invalid {
            path: path.to_owned(),
            why: format!("unusable CA certificate: {e}"),
        })?;
    }
    Ok(Arc::new(store))
}

/// ring's suites with AES-128-GCM first: the cheapest AEAD with AES-NI
/// (10 rounds against AES-256's 14), for peers that offer it.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| {
        let name = format!("{:?}", s.suite());
        (!name.contains("AES_128_GCM"), !name.starts_with("TLS13"))
    });
    Arc::new(p)
}

// ---------------------------------------------------------------------------
// Server side.

/// What the server proves itself with.
#[derive(Debug, Clone)]
pub enum ServerCredentials {
    /// `dir` holds ca-cert.pem, server-cert.pem and server-key.pem; with
    /// `verify_peer`, clients must present a certificate signed by the CA
    /// and not revoked by `dir/ca-crl.pem` if that file exists.
    Certificates { dir: PathBuf, verify_peer: bool },
    /// A psktool keys file; any user in it may connect.
    Psk { file: PathBuf },
}

/// Upgrades accepted connections to TLS.
#[derive(Clone)]
pub struct TlsAcceptor {
    inner: AcceptorInner,
    /// How clients are authenticated, for the start-up line.
    clients: String,
}

#[derive(Clone)]
enum AcceptorInner {
    Rustls(tokio_rustls::TlsAcceptor),
    Psk(SslContext),
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

/// Revoked certificates from a PEM file of CRLs (`ca-crl.pem`).
fn read_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let crls: Vec<_> = CertificateRevocationListDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Invalid {
            path: path.to_owned(),
            why: format!("bad PEM: {e}"),
        })?;
    if crls.is_empty() {
        return Err(TlsError::Invalid {
            path: path.to_owned(),
            why: "no certificate revocation list (X509 CRL) in the file".into(),
        });
    }
    Ok(crls)
}

/// Checks client certificates against `dir/ca-cert.pem`, and against
/// `dir/ca-crl.pem` when it exists (as qemu-nbd and nbdkit do); returns
/// the verifier and what it checks, for the start-up line. With a CRL, a
/// certificate whose status the CRL cannot tell (another issuer) is
/// refused, rustls's default.
fn client_verifier(
    dir: &Path,
) -> Result<(Arc<dyn rustls::server::danger::ClientCertVerifier>, String), TlsError> {
    let ca = dir.join("ca-cert.pem");
    let crl = dir.join("ca-crl.pem");
    let mut builder =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(&ca)?, provider());
    let mut what = "client certificates verified against ca-cert.pem".to_string();
    let has_crl = crl.exists();
    if has_crl {
        let crls = read_crls(&crl)?;
        what = format!("{what}, {} CRL(s) from ca-crl.pem", crls.len());
        builder = builder.with_crls(crls);
    }
    let verifier = builder.build().map_err(|e| TlsError::Invalid {
        path: if has_crl { crl } else { ca },
        why: format!("client verifier: {e}"),
    })?;
    Ok((verifier, what))
}

/// The rustls acceptor of X.509 credentials in `dir`, and how it
/// authenticates clients.
fn certificate_acceptor(
    dir: &Path,
    verify_peer: bool,
) -> Result<(AcceptorInner, String), TlsError> {
    let chain = read_certs(&dir.join("server-cert.pem"))?;
    let key = read_key(&dir.join("server-key.pem"))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let (builder, clients) = if verify_peer {
        let (verifier, what) = client_verifier(dir)?;
        (builder.with_client_cert_verifier(verifier), what)
    } else {
        let what = "no client certificates asked for".to_string();
        (builder.with_no_client_auth(), what)
    };
    let mut config = builder.with_single_cert(chain, key)?;
    // No resumption: every connection authenticates afresh.
    config.send_tls13_tickets = 0;
    config.ignore_client_order = true;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    Ok((AcceptorInner::Rustls(acceptor), clients))
}

impl TlsAcceptor {
    /// Reads and checks the credentials now, so a bad file fails at start.
    pub fn new(creds: &ServerCredentials) -> Result<TlsAcceptor, TlsError> {
        let (inner, clients) = match creds {
            ServerCredentials::Certificates { dir, verify_peer } => {
                certificate_acceptor(dir, *verify_peer)?
            }
            ServerCredentials::Psk { file } => {
                let keys = Arc::new(PskKeys::load(file)?);
                let mut b = psk_context(true)?;
                b.set_num_tickets(0)?;
                b.set_psk_server_callback(move |_ssl, identity, psk| {
                    let user = identity.and_then(|i| std::str::from_utf8(i).ok());
                    // An unknown user gets length 0: the handshake fails.
                    match user.and_then(|u| keys.get(u)) {
                        Some(key) if key.len() <= psk.len() => {
                            psk[..key.len()].copy_from_slice(key);
                            Ok(key.len())
                        }
                        _ => Ok(0),
                    }
                });
                (
                    AcceptorInner::Psk(b.build()),
                    "clients known by their key".into(),
                )
            }
        };
        Ok(TlsAcceptor { inner, clients })
    }

    /// How clients are authenticated, e.g. "client certificates verified
    /// against ca-cert.pem, 1 CRL(s) from ca-crl.pem".
    pub fn clients(&self) -> &str {
        &self.clients
    }

    /// "X.509" or "PSK", for logs.
    pub fn kind(&self) -> &'static str {
        match self.inner {
            AcceptorInner::Rustls(_) => "X.509",
            AcceptorInner::Psk(_) => "PSK",
        }
    }

    /// Runs the server side of the TLS handshake on `s`. Returns the
    /// stream and what was negotiated (version and cipher suite, for logs).
    pub async fn accept<S>(&self, s: S) -> Result<(BoxStream, String), TlsError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match &self.inner {
            AcceptorInner::Rustls(a) => {
                let t = a
                    .accept(s)
                    .await
                    .map_err(|e| TlsError::Handshake(e.to_string()))?;
                let c = t.get_ref().1;
                let what = format!(
                    "X.509, {:?}, {:?}",
                    c.protocol_version(),
                    c.negotiated_cipher_suite().map(|s| s.suite())
                );
                Ok((Box::new(t), what))
            }
            AcceptorInner::Psk(ctx) => {
                let mut t = tokio_openssl::SslStream::new(Ssl::new(ctx)?, s)?;
                Pin::new(&mut t)
                    .accept()
                    .await
                    .map_err(|e| TlsError::Handshake(e.to_string()))?;
                let ssl = t.ssl();
                let what = format!(
                    "PSK, {}, {}",
                    ssl.version_str(),
                    ssl.current_cipher().map_or("?", |c| c.name())
                );
                Ok((Box::new(t), what))
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Client side (the NBD origin device).

/// What the client authenticates the server (and itself) with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCredentials {
    /// `dir` holds ca-cert.pem (the server must present a certificate it
    /// signed, for the host name or IP address connected to) and, if the
    /// server asks for one, client-cert.pem with client-key.pem.
    Certificates { dir: PathBuf },
    /// `username`'s key from a psktool keys file.
    Psk { file: PathBuf, username: String },
}

/// Upgrades a connection to TLS as a client.
#[derive(Clone)]
pub struct TlsConnector {
    inner: ConnectorInner,
}

#[derive(Clone)]
enum ConnectorInner {
    Rustls(tokio_rustls::TlsConnector),
    Psk(SslContext),
}

impl TlsConnector {
    pub fn new(creds: &ClientCredentials) -> Result<TlsConnector, TlsError> {
        let inner = match creds {
            ClientCredentials::Certificates { dir } => {
                let builder = rustls::ClientConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(roots(&dir.join("ca-cert.pem"))?);
                let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
                let config = if cert.exists() {
                    builder.with_client_auth_cert(read_certs(&cert)?, read_key(&key)?)?
                } else {
                    builder.with_no_client_auth()
                };
                ConnectorInner::Rustls(tokio_rustls::TlsConnector::from(Arc::new(config)))
            }
            ClientCredentials::Psk { file, username } => {
                let keys = PskKeys::load(file)?;
                let key = keys
                    .get(username)
                    .ok_or_else(|| TlsError::Invalid {
                        path: file.clone(),
                        why: format!("no key for user '{username}'"),
                    })?
                    .to_vec();
                let user = username.clone().into_bytes();
                let mut b = psk_context(false)?;
                b.set_psk_client_callback(move |_ssl, _hint, identity, psk| {
                    // The identity is a NUL-terminated string.
                    if user.len() >= identity.len() || key.len() > psk.len() {
                        return Ok(0);
                    }
                    identity[..user.len()].copy_from_slice(&user);
                    identity[user.len()] = 0;
                    psk[..key.len()].copy_from_slice(&key);
                    Ok(key.len())
                });
                ConnectorInner::Psk(b.build())
            }
        };
        Ok(TlsConnector { inner })
    }

    /// Runs the client side of the TLS handshake on `s`; `server_name` is
    /// the host name or IP address the certificate must be issued for.
    pub async fn connect<S>(&self, server_name: &str, s: S) -> Result<BoxStream, TlsError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match &self.inner {
            ConnectorInner::Rustls(c) => {
                let name = ServerName::try_from(server_name.to_string()).map_err(|e| {
                    TlsError::Handshake(format!("server name '{server_name}': {e}"))
                })?;
                let t = c
                    .connect(name, s)
                    .await
                    .map_err(|e| TlsError::Handshake(e.to_string()))?;
                Ok(Box::new(t))
            }
            ConnectorInner::Psk(ctx) => {
                let mut t = tokio_openssl::SslStream::new(Ssl::new(ctx)?, s)?;
                Pin::new(&mut t)
                    .connect()
                    .await
                    .map_err(|e| TlsError::Handshake(e.to_string()))?;
                Ok(Box::new(t))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_files() {
        let k = PskKeys::parse("# keys\nalice:00ff10\n\nbob:0102\n").unwrap();
        assert_eq!(k.get("alice"), Some(&[0x00, 0xff, 0x10][..]));
        assert_eq!(k.get("bob"), Some(&[1, 2][..]));
        assert_eq!(k.get("carol"), None);
        assert!(!format!("{k:?}").contains("ff10"), "keys leak into logs");
        for (bad, why) in [
            ("", "no keys"),
            ("alice", "username:hexkey"),
            (":00", "username"),
            ("alice:0", "not hex"),
            ("alice:zz", "not hex"),
            ("alice:+f+f", "not hex"),
            ("alice:", "1 to"),
            ("alice:00\nalice:01", "twice"),
        ] {
            let e = PskKeys::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
