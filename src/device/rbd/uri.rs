//! `rbd://POOL/IMAGE[?conf=PATH&id=NAME]`: which image of which cluster,
//! as whom. Parsed here only; nothing is opened.

use crate::device::nbd::percent_decode;

/// Ceph's default client name (`client.admin`), as the `rbd` tool's.
const DEFAULT_ID: &str = "admin";

/// A parsed `rbd://` URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdUri {
    pub pool: String,
    pub image: String,
    /// The Ceph config file; `None`: librados' own search (CEPH_CONF,
    /// /etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf).
    pub conf: Option<String>,
    /// The client name without `client.` (cephx user).
    pub id: String,
}

impl RbdUri {
    /// Parses `rbd://POOL/IMAGE` with optional `conf=PATH` and `id=NAME`
    /// query parameters (percent-encoded where needed). The error is a
    /// reason suitable for `DeviceError::Open`.
    pub fn parse(uri: &str) -> Result<RbdUri, String> {
        let rest = uri
            .strip_prefix("rbd://")
            .ok_or_else(|| "not an rbd:// URI".to_string())?;
        if rest.contains('#') {
            return Err("fragments ('#') are not allowed in an rbd:// URI".into());
        }
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let (pool, image) = path
            .split_once('/')
            .ok_or_else(|| "expected rbd://POOL/IMAGE".to_string())?;
        let pool = percent_decode(pool).map_err(|e| format!("pool name: {e}"))?;
        let image = percent_decode(image).map_err(|e| format!("image name: {e}"))?;
        if pool.is_empty() || image.is_empty() {
            return Err("expected rbd://POOL/IMAGE (pool and image must not be empty)".into());
        }
        if image.contains('/') || image.contains('@') {
            return Err(format!(
                "image '{image}': namespaces and snapshots are not supported (rbd://POOL/IMAGE)"
            ));
        }
        let mut parsed = RbdUri {
            pool,
            image,
            conf: None,
            id: DEFAULT_ID.to_string(),
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("query parameter '{pair}' has no value"))?;
            let value = percent_decode(value)?;
            if value.is_empty() {
                return Err(format!("query parameter '{key}' is empty"));
            }
            match key {
                "conf" => parsed.conf = Some(value),
                "id" => {
                    parsed.id = value.strip_prefix("client.").unwrap_or(&value).into();
                    // `client.` alone, or written twice with nothing after
                    // (`client.client.`), names no user either.
                    if parsed.id.is_empty() || parsed.id == "client." {
                        return Err("query parameter 'id' names no user (id=NAME)".into());
                    }
                }
                _ => {
                    return Err(format!(
                        "unknown query parameter '{key}' (rbd:// takes conf=PATH and id=NAME)"
                    ))
                }
            }
        }
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_image_and_defaults() {
        let u = RbdUri::parse("rbd://tc/img").unwrap();
        assert_eq!(
            u,
            RbdUri {
                pool: "tc".into(),
                image: "img".into(),
                conf: None,
                id: "admin".into()
            }
        );
    }

    #[test]
    fn query_parameters() {
        let u = RbdUri::parse("rbd://p/i?conf=/tmp/a%20b/ceph.conf&id=client.tc").unwrap();
        assert_eq!(u.conf.as_deref(), Some("/tmp/a b/ceph.conf"));
        assert_eq!(u.id, "tc");
    }

    #[test]
    fn bad_uris_are_refused_with_a_reason() {
        for (uri, says) in [
            ("rbd://pool", "rbd://POOL/IMAGE"),
            ("rbd:///img", "must not be empty"),
            ("rbd://pool/", "must not be empty"),
            ("rbd://pool/ns/img", "namespaces"),
            ("rbd://pool/img@snap", "snapshots"),
            ("rbd://pool/img?user=x", "unknown query parameter 'user'"),
            ("rbd://pool/img?conf", "has no value"),
            ("rbd://pool/img?conf=", "is empty"),
            // An empty client name (an invariant of the device_uris fuzz body).
            ("rbd://pool/img?id=client.", "names no user"),
            ("rbd://pool/img?id=client.client.", "names no user"),
            ("rbd://pool/img#x", "fragments"),
            ("rbd://po%zzol/img", "percent escape"),
            ("rbd://pool/i%00mg", "NUL"),
            ("nbd://pool/img", "not an rbd:// URI"),
        ] {
            let err = RbdUri::parse(uri).unwrap_err();
            assert!(err.contains(says), "{uri}: {err}");
        }
    }
}
