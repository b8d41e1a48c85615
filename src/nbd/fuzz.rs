//! The body of the TLS-PSK keys file fuzz target
//! (fuzz/fuzz_targets/tls_psk_keys.rs), here so tests/fuzz_parsers.rs runs
//! the same code in CI. The file is psktool's `username:hexkey` lines,
//! read by the daemon (running as root) at start and by the NBD client.
//!
//! Input: the file's bytes (invalid UTF-8 replaced, as a caller that read
//! a string would have refused them). [`psk_keys`] asserts that the parser
//! agrees with a strict model of the format (same keys, or both refuse),
//! and that the keys written back as lines parse to the same keys.

use std::collections::HashMap;

use super::tls::PskKeys;

/// The format, strictly: blank lines and `#` comments skipped (after
/// trimming), every other line `username:hexkey` with a username of 1 to
/// 127 bytes without NUL, a key of 1 to 256 bytes in hex digits, each
/// username once, at least one key.
fn model(text: &str) -> Option<HashMap<String, Vec<u8>>> {
    let mut keys = HashMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (user, hex) = line.split_once(':')?;
        if user.is_empty() || user.len() > 127 || user.contains('\0') {
            return None;
        }
        let hex = hex.as_bytes();
        if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 512 {
            return None;
        }
        let mut key = Vec::new();
        for pair in hex.chunks(2) {
            let digit = |c: u8| (c as char).to_digit(16);
            key.push((digit(pair[0])? * 16 + digit(pair[1])?) as u8);
        }
        if keys.insert(user.to_string(), key).is_some() {
            return None;
        }
    }
    (!keys.is_empty()).then_some(keys)
}

fn as_map(k: &PskKeys) -> HashMap<String, Vec<u8>> {
    k.usernames()
        .into_iter()
        .map(|u| (u.to_string(), k.get(u).expect("a listed user").to_vec()))
        .collect()
}

/// Parses a keys file. See the module doc.
pub fn psk_keys(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let parsed = PskKeys::parse(&text);
    let want = model(&text);
    let got = parsed.as_ref().ok().map(as_map);
    assert_eq!(got, want, "parser and model disagree on {text:?}");
    let Ok(keys) = parsed else {
        return;
    };
    let mut file = String::new();
    for u in keys.usernames() {
        let hex: String = keys
            .get(u)
            .unwrap()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        file.push_str(&format!("{u}:{hex}\n"));
    }
    let back = PskKeys::parse(&file).expect("written keys parse");
    assert_eq!(as_map(&back), as_map(&keys), "round trip of {file:?}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_files() {
        super::psk_keys(b"# c\nalice:00ff\n\n bob : 0a0B \n");
        super::psk_keys(b"alice:+f+f\n");
        super::psk_keys(b"a:\xff\xfe\n");
    }
}
