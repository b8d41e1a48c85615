//! URIs (NBD URI spec, NetworkBlockDevice/nbd doc/uri.md): `nbd://`,
//! `nbd+unix://`, `nbds://`, `nbds+unix://`, with libnbd's query names.

use super::*;

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddress {
    Tcp { host: String, port: u16 },
    Unix { socket: PathBuf },
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub address: NbdAddress,
    /// Export name, percent-decoded; empty means the server's default export.
    pub export: String,
    /// TLS credentials (`nbds://`, `nbds+unix://`); `None` is plaintext.
    pub tls: Option<ClientCredentials>,
}

impl NbdUri {
    /// Parses `nbd://host[:port]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`
    /// and their TLS forms `nbds://` and `nbds+unix://`. The error is a
    /// reason suitable for `DeviceError::Open`.
    pub fn parse(uri: &str) -> Result<NbdUri, String> {
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| "not a URI (expected nbd:// or nbd+unix://)".to_string())?;
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path_query) = rest.split_at(authority_end);
        let (path, query) = match path_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_query, None),
        };
        if path_query.contains('#') {
            return Err("fragments ('#') are not allowed in an NBD URI".into());
        }
        let export = percent_decode(path.strip_prefix('/').unwrap_or(path))
            .map_err(|e| format!("export name: {e}"))?;
        let scheme = scheme.to_ascii_lowercase();
        let (tls, unix) = match scheme.as_str() {
            "nbd" => (false, false),
            "nbd+unix" => (false, true),
            "nbds" => (true, false),
            "nbds+unix" => (true, true),
            s if s.starts_with("nbd") => {
                return Err(format!(
                    "transport '{s}://' is not supported (use nbd://, nbd+unix://, nbds:// or nbds+unix://)"
                ))
            }
            s => return Err(format!("scheme '{s}' is not an NBD scheme")),
        };
        let mut q = parse_query(query, unix, tls)?;
        let (user, authority) = match authority.rsplit_once('@') {
            Some((u, a)) if tls => (Some(percent_decode(u)?), a),
            Some(_) => {
                return Err("user names in NBD URIs are only for TLS (nbds://USER@host)".into())
            }
            None => (None, authority),
        };
        let address = if unix {
            if !authority.is_empty() {
                return Err(format!(
                    "{scheme}:// takes no host (found '{authority}'); \
                     write {scheme}:///EXPORT?socket=/path.sock"
                ));
            }
            NbdAddress::Unix {
                socket: q
                    .socket
                    .take()
                    .ok_or("nbd+unix:// needs '?socket=/absolute/path.sock'")?,
            }
        } else {
            let (host, port) = parse_host(authority)?;
            NbdAddress::Tcp { host, port }
        };
        let tls = if tls {
            Some(tls_credentials(q, user)?)
        } else {
            None
        };
        Ok(NbdUri {
            address,
            export,
            tls,
        })
    }

    /// The canonical spelling of the export's address: lowercase host,
    /// explicit port, canonical percent-encoding. Two URIs naming the same
    /// export normalize equally. TLS is left out: it is how the export is
    /// reached, not which export it is (the cache's origin identity must not
    /// change when TLS is turned on).
    pub fn normalized(&self) -> String {
        let export = percent_encode(&self.export);
        match &self.address {
            NbdAddress::Tcp { host, port } if host.contains(':') => {
                format!("nbd://[{host}]:{port}/{export}")
            }
            NbdAddress::Tcp { host, port } => format!("nbd://{host}:{port}/{export}"),
            NbdAddress::Unix { socket } => format!(
                "nbd+unix:///{export}?socket={}",
                percent_encode(&socket.to_string_lossy())
            ),
        }
    }
}

/// Splits `host[:port]` or `[v6]:port`.
pub(super) fn parse_host(authority: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("unterminated '[' in host '{authority}'"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("junk after ']' in host '{authority}'"))?,
            ),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("nbd:// needs a host, e.g. nbd://127.0.0.1/EXPORT".into());
    }
    // Brackets hold an IPv6 address, and only there (RFC 3986 3.2.2): a
    // host "[x" read from "[[x]" normalized to "nbd://[x:10809/", which
    // does not parse (found by fuzz/fuzz_targets/device_uris.rs).
    let bracketed = authority.starts_with('[');
    if host.contains(['[', ']'])
        || host.chars().any(|c| c.is_control() || c.is_whitespace())
        || bracketed != host.contains(':')
    {
        return Err(format!(
            "'{}' is not a host name or a bracketed IPv6 address",
            host.escape_debug()
        ));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 => n,
            _ => return Err(format!("'{p}' is not a TCP port (1-65535)")),
        },
    };
    Ok((host.to_ascii_lowercase(), port))
}

/// The query parameters we accept (libnbd's names).
#[derive(Default)]
pub(super) struct Query {
    pub(super) socket: Option<PathBuf>,
    pub(super) tls_certificates: Option<PathBuf>,
    pub(super) tls_psk_file: Option<PathBuf>,
    pub(super) tls_username: Option<String>,
}

/// Parses `socket=PATH` (Unix transports) and, with TLS,
/// `tls-certificates=DIR`, `tls-psk-file=FILE` and `tls-username=USER`.
/// Paths must be absolute: the URI is stored and used from elsewhere.
pub(super) fn parse_query(query: Option<&str>, unix: bool, tls: bool) -> Result<Query, String> {
    let mut q = Query::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value).map_err(|e| format!("{key}: {e}"))?;
        let path = |what: &str| -> Result<PathBuf, String> {
            if !value.starts_with('/') {
                return Err(format!("{what} path '{value}' is not absolute"));
            }
            Ok(PathBuf::from(&value))
        };
        let slot_taken = match key {
            "socket" if unix => q.socket.replace(path("socket")?).is_some(),
            "tls-certificates" if tls => q
                .tls_certificates
                .replace(path("tls-certificates")?)
                .is_some(),
            "tls-psk-file" if tls => q.tls_psk_file.replace(path("tls-psk-file")?).is_some(),
            "tls-username" if tls => q.tls_username.replace(value.clone()).is_some(),
            other => return Err(format!("query parameter '{other}' is not supported here")),
        };
        if slot_taken {
            return Err(format!("'{key}' given twice"));
        }
    }
    Ok(q)
}

/// The TLS credentials an `nbds` URI names.
pub(super) fn tls_credentials(q: Query, user: Option<String>) -> Result<ClientCredentials, String> {
    match (q.tls_certificates, q.tls_psk_file) {
        (Some(dir), None) => Ok(ClientCredentials::Certificates { dir }),
        (None, Some(file)) => {
            let username =
                match (user, q.tls_username) {
                    (Some(u), None) | (None, Some(u)) if !u.is_empty() => u,
                    (Some(_), Some(_)) => return Err("user name given twice".into()),
                    _ => return Err(
                        "tls-psk-file needs a user name: nbds://USER@host/... or tls-username=USER"
                            .into(),
                    ),
                };
            Ok(ClientCredentials::Psk { file, username })
        }
        (Some(_), Some(_)) => Err("give tls-certificates or tls-psk-file, not both".into()),
        (None, None) => {
            Err("TLS (nbds://) needs '?tls-certificates=/DIR' or '?tls-psk-file=/FILE'".into())
        }
    }
}

pub(in crate::device) fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let out = String::from_utf8(out).map_err(|_| format!("'{s}' does not decode to UTF-8"))?;
    if out.contains('\0') {
        return Err(format!("'{s}' decodes to a NUL character"));
    }
    Ok(out)
}

/// Encodes everything except RFC 3986 unreserved characters and '/'.
pub(super) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// 64-bit FNV-1a: stable across runs and builds, unlike std's `DefaultHasher`.
pub(super) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(export: &str, socket: &str) -> NbdUri {
        NbdUri {
            address: NbdAddress::Unix {
                socket: PathBuf::from(socket),
            },
            export: export.into(),
            tls: None,
        }
    }

    fn tcp(host: &str, port: u16, export: &str) -> NbdUri {
        NbdUri {
            address: NbdAddress::Tcp {
                host: host.into(),
                port,
            },
            export: export.into(),
            tls: None,
        }
    }

    #[test]
    fn tls_uris_parse() {
        let p = |s| NbdUri::parse(s).unwrap();
        let u = p("nbds://alice@h:7/e?tls-psk-file=/k/keys.psk");
        assert_eq!(u.address, tcp("h", 7, "").address);
        assert_eq!(u.export, "e");
        assert_eq!(
            u.tls,
            Some(ClientCredentials::Psk {
                file: "/k/keys.psk".into(),
                username: "alice".into()
            })
        );
        let u = p("nbds://h/?tls-certificates=/pki");
        assert_eq!(
            u.tls,
            Some(ClientCredentials::Certificates { dir: "/pki".into() })
        );
        let u = p("nbds+unix:///x?socket=/s&tls-psk-file=/k&tls-username=bob");
        assert_eq!(u.address, unix("", "/s").address);
        assert!(
            matches!(u.tls, Some(ClientCredentials::Psk { ref username, .. }) if username == "bob")
        );
        // TLS does not change which export it is.
        assert_eq!(u.normalized(), "nbd+unix:///x?socket=/s");
        assert_eq!(
            p("nbds://h/?tls-certificates=/p").normalized(),
            "nbd://h:10809/"
        );
    }

    #[test]
    fn unix_uris_parse() {
        let p = |s| NbdUri::parse(s).unwrap();
        assert_eq!(
            p("nbd+unix:///?socket=/tmp/a.sock"),
            unix("", "/tmp/a.sock")
        );
        assert_eq!(p("nbd+unix://?socket=/tmp/a.sock"), unix("", "/tmp/a.sock"));
        assert_eq!(
            p("nbd+unix:///disk?socket=/tmp/a.sock"),
            unix("disk", "/tmp/a.sock")
        );
        assert_eq!(
            p("nbd+unix:///my%20disk%2Fx?socket=/tmp/s%20p.sock"),
            unix("my disk/x", "/tmp/s p.sock")
        );
        assert_eq!(p("NBD+UNIX:///a/b?socket=/s"), unix("a/b", "/s"));
    }

    #[test]
    fn tcp_uris_parse() {
        let p = |s| NbdUri::parse(s).unwrap();
        assert_eq!(p("nbd://localhost"), tcp("localhost", DEFAULT_PORT, ""));
        assert_eq!(
            p("nbd://Host.Example/"),
            tcp("host.example", DEFAULT_PORT, "")
        );
        assert_eq!(
            p("nbd://127.0.0.1:10900/exp"),
            tcp("127.0.0.1", 10900, "exp")
        );
        assert_eq!(p("nbd://[::1]:7/e%C3%A9"), tcp("::1", 7, "eé"));
        assert_eq!(p("nbd://[::1]/"), tcp("::1", DEFAULT_PORT, ""));
    }

    #[test]
    fn bad_uris_are_explained() {
        let cases = [
            ("/dev/sda", "not a URI"),
            ("http://x/", "not an NBD scheme"),
            ("nbds://x/", "TLS"),
            ("nbd+vsock:///", "not supported"),
            ("nbd://", "needs a host"),
            ("nbd://:10809/", "needs a host"),
            ("nbd://h:0/", "not a TCP port"),
            ("nbd://h:99999/", "not a TCP port"),
            ("nbd://h:x/", "not a TCP port"),
            ("nbd://[::1/", "unterminated"),
            ("nbd://[[x]/", "not a host name"),
            ("nbd://[abc]/", "not a host name"),
            ("nbd://a b/", "not a host name"),
            ("nbd://u@h/", "user names"),
            ("nbd://h/?socket=/x", "not supported"),
            ("nbd://h/a%zz", "bad percent escape"),
            ("nbd://h/a%ff", "UTF-8"),
            ("nbd://h/a%00", "NUL"),
            ("nbd://h/a#frag", "fragments"),
            ("nbd+unix:///", "needs '?socket="),
            ("nbd+unix:///?socket=rel.sock", "not absolute"),
            ("nbd+unix://host/?socket=/s", "takes no host"),
            ("nbd+unix:///?socket=/a&socket=/b", "twice"),
            ("nbd+unix:///?socket=/a&tls=on", "'tls' is not supported"),
            ("nbd://h/?tls-psk-file=/k", "not supported"),
            ("nbds://h/?tls-psk-file=/k", "needs a user name"),
            ("nbds://h/?tls-psk-file=k", "not absolute"),
            ("nbds://a@h/?tls-psk-file=/k&tls-username=b", "twice"),
            ("nbds://h/?tls-psk-file=/k&tls-certificates=/d", "not both"),
            ("nbds+unix:///?tls-certificates=/d", "needs '?socket="),
        ];
        for (uri, want) in cases {
            let err = NbdUri::parse(uri).expect_err(uri);
            assert!(err.contains(want), "{uri}: '{err}' lacks '{want}'");
        }
    }

    #[test]
    fn normalization_is_canonical() {
        let n = |s: &str| NbdUri::parse(s).unwrap().normalized();
        assert_eq!(n("nbd://HOST/x"), "nbd://host:10809/x");
        assert_eq!(n("nbd://host:10809/x"), "nbd://host:10809/x");
        assert_eq!(n("nbd://[::1]/x"), "nbd://[::1]:10809/x");
        assert_eq!(n("nbd+unix://?socket=/s"), "nbd+unix:///?socket=/s");
        assert_eq!(n("nbd+unix:///a%62?socket=/s"), "nbd+unix:///ab?socket=/s");
        assert_eq!(
            n("nbd+unix:///a%20b?socket=/s"),
            "nbd+unix:///a%20b?socket=/s"
        );
        // Normalizing is idempotent.
        for s in ["nbd://h/a%20b", "nbd+unix:///%C3%A9?socket=/x%26y"] {
            assert_eq!(n(&n(s)), n(s));
        }
    }

    #[test]
    fn identity_hash_is_stable() {
        // FNV-1a test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
