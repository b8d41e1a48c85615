//! TLS credentials for tests, made with the openssl command (Debian
//! package `openssl`): a CA with server and client certificates in the
//! directory layout qemu-nbd, nbdkit and libnbd read, and psktool-style
//! key files. Included with `#[path]`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Fails with the Debian package to install if `tool` is missing.
pub fn require_tool(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{tool} not found: install the Debian package {package} (scripts/test.sh does)"
    );
}

/// Runs `openssl ARGS` in `dir`, asserting success.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EXTENSIONS: &str = "\
[server]
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
[client]
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
";

/// A CA and the certificates it signed, in one scratch directory:
/// `server/` (ca-cert.pem, server-cert.pem, server-key.pem: what the
/// server reads) and `client/` (ca-cert.pem, client-cert.pem,
/// client-key.pem: what libnbd's tls-certificates and qemu's
/// tls-creds-x509 read).
pub struct Pki {
    pub root: PathBuf,
}

impl Pki {
    /// Makes a fresh CA named `name` under `parent` (ECDSA P-256 keys,
    /// valid for two days, the server certificate for 127.0.0.1).
    pub fn new(parent: &Path, name: &str) -> Pki {
        require_tool("openssl", "openssl");
        let root = parent.join(name);
        for d in ["", "server", "client"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("ext.cnf"), EXTENSIONS).unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend_from_slice(&ec);
        ca.extend_from_slice(&[
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca-cert.pem",
            "-days",
            "2",
            "-subj",
        ]);
        let subj = format!("/CN={name}");
        ca.push(&subj);
        ca.extend_from_slice(&[
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(&root, &ca);
        for (who, cn) in [("server", "localhost"), ("client", "client")] {
            let key = format!("{who}-key.pem");
            let cert = format!("{who}-cert.pem");
            issue(&root, who, cn, &key, &cert);
            for f in [&key, &cert] {
                std::fs::copy(root.join(f), root.join(who).join(f)).unwrap();
            }
        }
        for who in ["server", "client"] {
            std::fs::copy(root.join("ca-cert.pem"), root.join(who).join("ca-cert.pem")).unwrap();
        }
        Pki { root }
    }

    /// A second client certificate of this CA in `<root>/<name>/`, with
    /// the CA's certificate: a client directory as libnbd reads it.
    pub fn second_client(&self, name: &str) -> PathBuf {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let key = format!("{name}/client-key.pem");
        let cert = format!("{name}/client-cert.pem");
        issue(&self.root, "client", name, &key, &cert);
        std::fs::copy(self.root.join("ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
        dir
    }

    pub fn server_dir(&self) -> PathBuf {
        self.root.join("server")
    }

    pub fn client_dir(&self) -> PathBuf {
        self.root.join("client")
    }

    /// A client directory that trusts this CA but presents `other`'s
    /// client certificate.
    pub fn client_dir_with_cert_of(&self, other: &Pki, parent: &Path, name: &str) -> PathBuf {
        let d = parent.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(self.root.join("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
        for f in ["client-cert.pem", "client-key.pem"] {
            std::fs::copy(other.root.join(f), d.join(f)).unwrap();
        }
        d
    }

    /// A client directory that trusts this CA and has no client
    /// certificate.
    pub fn client_dir_without_cert(&self, parent: &Path, name: &str) -> PathBuf {
        let d = parent.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(self.root.join("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
        d
    }
}

/// Issues a certificate of the CA in `root` with ext.cnf's `extensions`
/// section (`server` or `client`) for `/CN=cn`: a new P-256 key at `key`,
/// the certificate at `cert` (paths relative to `root`).
fn issue(root: &Path, extensions: &str, cn: &str, key: &str, cert: &str) {
    let csr = format!("{}.csr", key.trim_end_matches(".pem"));
    let subj = format!("/CN={cn}");
    openssl(
        root,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key,
            "-out",
            &csr,
            "-subj",
            &subj,
        ],
    );
    openssl(
        root,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-extensions",
            extensions,
        ],
    );
}

/// Writes `dir/keys.psk` (the name qemu's tls-creds-psk reads) holding
/// `user`'s key derived from `seed`; returns its path.
pub fn psk_file(dir: &Path, user: &str, seed: u8) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let key: String = (0..32u8)
        .map(|i| format!("{:02x}", i.wrapping_mul(37).wrapping_add(seed)))
        .collect();
    let path = dir.join("keys.psk");
    std::fs::write(&path, format!("{user}:{key}\n")).unwrap();
    path
}
