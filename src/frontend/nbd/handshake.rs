//! Fixed newstyle handshake and option haggling (NBD proto.md "Handshake",
//! "TLS support", "Metadata querying").
//!
//! [`Negotiation`] is a pure state machine: option in, reply bytes and an
//! outcome out, so it can be fuzzed without sockets, the TLS upgrade
//! included (the caller performs it on [`OptionOutcome::StartTls`] and
//! reports it with [`Negotiation::tls_started`]). [`greet`] and [`haggle`]
//! drive it over a stream with bounds on option size and count.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use zerocopy::byteorder::network_endian::U32;
use zerocopy::IntoBytes;

use super::NbdError;
use crate::nbd::proto::{self, OptionCode};

/// What the server tells clients about one of its exports.
#[derive(Debug, Clone)]
pub struct ExportInfo {
    /// The export's name. The default export "" is the first export.
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    pub transmission_flags: u16,
    /// Advertised in NBD_INFO_BLOCK_SIZE; binding only on clients that
    /// asked for it (proto.md "Block size constraints").
    pub min_block_bytes: u32,
    pub preferred_block_bytes: u32,
    pub max_block_bytes: u32,
}

/// Which of `exports` a client's `name` means: the one of that name; the
/// empty name is the first export (the default export, proto.md).
fn find_export(exports: &[ExportInfo], name: &str) -> Option<usize> {
    if name.is_empty() {
        return (!exports.is_empty()).then_some(0);
    }
    exports.iter().position(|e| e.name == name)
}

/// Where a listener stands on TLS (proto.md "Server-side requirements").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPolicy {
    /// NOTLS: no credentials; NBD_OPT_STARTTLS gets NBD_REP_ERR_UNSUP.
    Off,
    /// SELECTIVETLS without TLS-only exports: a client may upgrade, or not.
    Optional,
    /// FORCEDTLS: until TLS is up, every option but NBD_OPT_STARTTLS and
    /// NBD_OPT_ABORT gets NBD_REP_ERR_TLS_REQD (NBD_OPT_EXPORT_NAME, which
    /// cannot be refused with an error, a disconnect).
    Required,
}

/// Limits on option haggling, against clients that never finish it.
#[derive(Debug, Clone, Copy)]
pub struct HandshakeLimits {
    /// Longest option data accepted; longer options end the connection.
    pub option_bytes_max: u32,
    /// Options accepted before the one that enters transmission.
    pub options_max: u32,
}

/// What the connection does after an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionOutcome {
    /// Send the replies and read the next option.
    Continue,
    /// Send the replies (NBD_REP_ACK to NBD_OPT_STARTTLS), then run the
    /// TLS handshake and call [`Negotiation::tls_started`].
    StartTls,
    /// Send the replies, then close (NBD_OPT_ABORT).
    Abort,
    /// Send the replies, then enter transmission with these settings.
    Transmission(TransmissionMode),
    /// Close without a reply: the spec leaves no other way (e.g. an
    /// NBD_OPT_EXPORT_NAME that cannot be satisfied).
    Disconnect(&'static str),
}

/// Context ids handed out by NBD_OPT_SET_META_CONTEXT (fixed: the spec
/// makes them opaque to the client).
pub const CONTEXT_ID_BASE_ALLOCATION: u32 = 1;
pub const CONTEXT_ID_CACHE: u32 = 2;

/// The metadata contexts a connection selected, by id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetaContexts {
    pub base_allocation: Option<u32>,
    pub cache: Option<u32>,
}

impl MetaContexts {
    pub fn is_empty(&self) -> bool {
        self.base_allocation.is_none() && self.cache.is_none()
    }
}

/// Settings negotiated for the transmission phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransmissionMode {
    pub structured_replies: bool,
    /// 512 for a client that asked for block sizes with NBD_OPT_GO (it
    /// must obey the advertised minimum); 1 for one that did not, which
    /// may send byte-granular requests (proto.md "Block size constraints":
    /// the default minimum block size is 1).
    pub min_block_bytes: u32,
    pub contexts: MetaContexts,
    /// The export chosen: an index into the server's exports.
    pub export: usize,
}

/// Option-haggling state of one connection.
#[derive(Debug)]
pub struct Negotiation {
    /// The server's exports; at least one.
    exports: Vec<ExportInfo>,
    no_zeroes: bool,
    tls: TlsPolicy,
    tls_active: bool,
    structured_replies: bool,
    contexts: MetaContexts,
}

/// An error reply to `option`; the haggling goes on.
fn reply_err(out: &mut Vec<u8>, option: u32, reply_type: u32, msg: &str) -> OptionOutcome {
    proto::put_option_reply(out, option, reply_type, msg.as_bytes());
    OptionOutcome::Continue
}

impl Negotiation {
    /// Haggling over `exports` (at least one).
    pub fn new(exports: Vec<ExportInfo>, client: proto::ClientFlags, tls: TlsPolicy) -> Self {
        assert!(!exports.is_empty(), "a server has an export");
        Negotiation {
            exports,
            no_zeroes: client.no_zeroes,
            tls,
            tls_active: false,
            structured_replies: false,
            contexts: MetaContexts::default(),
        }
    }

    /// Records that the TLS handshake after NBD_OPT_STARTTLS succeeded.
    /// proto.md NBD_OPT_STARTTLS: no negotiation state from before it is
    /// kept (structured replies and metadata contexts must be asked again).
    pub fn tls_started(&mut self) {
        assert!(self.tls != TlsPolicy::Off && !self.tls_active);
        self.tls_active = true;
        self.structured_replies = false;
        self.contexts = MetaContexts::default();
    }

    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// Answers one option with `data` (already read in full), appending the
    /// reply bytes to `out`.
    pub fn answer(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> OptionOutcome {
        let code = OptionCode::from_wire(option);
        if let Some(refused) = self.before_tls(code, option, out) {
            return refused;
        }
        match code {
            OptionCode::ExportName => self.answer_export_name(data, out),
            OptionCode::Abort => {
                proto::put_option_reply(out, option, proto::REP_ACK, &[]);
                OptionOutcome::Abort
            }
            OptionCode::StartTls => self.answer_starttls(option, data, out),
            OptionCode::List => self.answer_list(option, data, out),
            OptionCode::Info | OptionCode::Go => self.answer_info_or_go(option, data, out),
            OptionCode::StructuredReply => {
                if !data.is_empty() {
                    return reply_err(
                        out,
                        option,
                        proto::REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    );
                }
                self.structured_replies = true;
                proto::put_option_reply(out, option, proto::REP_ACK, &[]);
                OptionOutcome::Continue
            }
            OptionCode::ListMetaContext | OptionCode::SetMetaContext => {
                self.answer_meta_context(option, data, out)
            }
            OptionCode::Other(_) => {
                reply_err(out, option, proto::REP_ERR_UNSUP, "option not supported")
            }
        }
    }

    /// While TLS is required and not yet running, every option but
    /// STARTTLS and ABORT is refused (EXPORT_NAME, which has no error
    /// reply, by disconnecting).
    fn before_tls(
        &self,
        code: OptionCode,
        option: u32,
        out: &mut Vec<u8>,
    ) -> Option<OptionOutcome> {
        if self.tls != TlsPolicy::Required || self.tls_active {
            return None;
        }
        match code {
            OptionCode::StartTls | OptionCode::Abort => None,
            OptionCode::ExportName => {
                Some(OptionOutcome::Disconnect("NBD_OPT_EXPORT_NAME before TLS"))
            }
            _ => Some(reply_err(
                out,
                option,
                proto::REP_ERR_TLS_REQD,
                "TLS is required: send NBD_OPT_STARTTLS first",
            )),
        }
    }

    /// NBD_OPT_EXPORT_NAME: no error reply exists, so a bad or unknown
    /// name disconnects.
    fn answer_export_name(&mut self, data: &[u8], out: &mut Vec<u8>) -> OptionOutcome {
        let Ok(name) = proto::parse_string(data, "export name") else {
            return OptionOutcome::Disconnect("NBD_OPT_EXPORT_NAME with a bad name");
        };
        let Some(chosen) = find_export(&self.exports, &name) else {
            return OptionOutcome::Disconnect("NBD_OPT_EXPORT_NAME of an unknown export");
        };
        let export = &self.exports[chosen];
        let reply = proto::ExportNameReply {
            size_bytes: export.size_bytes.into(),
            transmission_flags: export.transmission_flags.into(),
        };
        out.extend_from_slice(reply.as_bytes());
        if !self.no_zeroes {
            out.extend_from_slice(&[0u8; proto::EXPORT_NAME_PAD_BYTES]);
        }
        OptionOutcome::Transmission(self.mode(chosen, 1))
    }

    fn answer_starttls(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> OptionOutcome {
        if self.tls == TlsPolicy::Off {
            return reply_err(out, option, proto::REP_ERR_UNSUP, "TLS is not configured");
        }
        if self.tls_active {
            return reply_err(
                out,
                option,
                proto::REP_ERR_INVALID,
                "TLS is already running",
            );
        }
        if !data.is_empty() {
            return reply_err(
                out,
                option,
                proto::REP_ERR_INVALID,
                "NBD_OPT_STARTTLS takes no data",
            );
        }
        proto::put_option_reply(out, option, proto::REP_ACK, &[]);
        OptionOutcome::StartTls
    }

    fn answer_list(&self, option: u32, data: &[u8], out: &mut Vec<u8>) -> OptionOutcome {
        if !data.is_empty() {
            return reply_err(
                out,
                option,
                proto::REP_ERR_INVALID,
                "NBD_OPT_LIST takes no data",
            );
        }
        for export in &self.exports {
            let name = export.name.as_bytes();
            let mut entry = U32::new(name.len() as u32).as_bytes().to_vec();
            entry.extend_from_slice(name);
            proto::put_option_reply(out, option, proto::REP_SERVER, &entry);
        }
        proto::put_option_reply(out, option, proto::REP_ACK, &[]);
        OptionOutcome::Continue
    }

    /// NBD_OPT_INFO and NBD_OPT_GO: the infos asked for, then (GO) the
    /// transmission phase.
    fn answer_info_or_go(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> OptionOutcome {
        let req = match proto::parse_info_request(data) {
            Ok(r) => r,
            Err(e) => return reply_err(out, option, proto::REP_ERR_INVALID, &e.to_string()),
        };
        let Some(chosen) = find_export(&self.exports, &req.export_name) else {
            return reply_err(out, option, proto::REP_ERR_UNKNOWN, "no such export");
        };
        self.put_infos(chosen, option, &req.info_types, out);
        proto::put_option_reply(out, option, proto::REP_ACK, &[]);
        if option != proto::OPT_GO {
            return OptionOutcome::Continue;
        }
        // A client that asks for block sizes with GO must obey them; one
        // that does not gets the default minimum of 1.
        let min = if req.info_types.contains(&proto::INFO_BLOCK_SIZE) {
            self.exports[chosen].min_block_bytes
        } else {
            1
        };
        OptionOutcome::Transmission(self.mode(chosen, min))
    }

    /// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT. Queries:
    /// `base:allocation` and `tiercache:cache` select those contexts; in a
    /// list, `base:` and `tiercache:` are wildcards for their namespace.
    /// Queries of other namespaces are ignored (proto.md: MUST ignore).
    fn answer_meta_context(
        &mut self,
        option: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> OptionOutcome {
        let set = option == proto::OPT_SET_META_CONTEXT;
        if set {
            // proto.md: SET replaces the selection, even when it fails.
            self.contexts = MetaContexts::default();
        }
        let reply_err = |out: &mut Vec<u8>, reply_type: u32, msg: &str| {
            proto::put_option_reply(out, option, reply_type, msg.as_bytes());
            OptionOutcome::Continue
        };
        if !self.structured_replies {
            return reply_err(
                out,
                proto::REP_ERR_INVALID,
                "negotiate NBD_OPT_STRUCTURED_REPLY first",
            );
        }
        let req = match proto::parse_meta_context_request(data) {
            Ok(r) => r,
            Err(e) => return reply_err(out, proto::REP_ERR_INVALID, &e.to_string()),
        };
        if find_export(&self.exports, &req.export_name).is_none() {
            return reply_err(out, proto::REP_ERR_UNKNOWN, "no such export");
        }
        let (mut base, mut cache) = (
            !set && req.queries.is_empty(),
            !set && req.queries.is_empty(),
        );
        for q in &req.queries {
            let Some((namespace, leaf)) = q.split_once(':') else {
                return reply_err(out, proto::REP_ERR_INVALID, "query without a namespace");
            };
            match (namespace, leaf) {
                ("base", "allocation") => base = true,
                ("base", "") if !set => base = true,
                ("tiercache", "cache") => cache = true,
                ("tiercache", "") if !set => cache = true,
                _ => {}
            }
        }
        // Ids in a list are reserved: zero (proto.md).
        let id = |selected| if set { selected } else { 0 };
        if base {
            let n = id(CONTEXT_ID_BASE_ALLOCATION);
            proto::put_meta_context_reply(out, option, n, proto::META_BASE_ALLOCATION);
        }
        if cache {
            let n = id(CONTEXT_ID_CACHE);
            proto::put_meta_context_reply(out, option, n, proto::META_TIERCACHE_CACHE);
        }
        if set {
            self.contexts = MetaContexts {
                base_allocation: base.then_some(CONTEXT_ID_BASE_ALLOCATION),
                cache: cache.then_some(CONTEXT_ID_CACHE),
            };
        }
        proto::put_option_reply(out, option, proto::REP_ACK, &[]);
        OptionOutcome::Continue
    }

    fn mode(&self, export: usize, min_block_bytes: u32) -> TransmissionMode {
        TransmissionMode {
            export,
            structured_replies: self.structured_replies,
            min_block_bytes,
            // Block status needs structured replies; contexts are only
            // selectable with them.
            contexts: self.contexts,
        }
    }

    /// NBD_INFO_EXPORT always; block sizes, name and description when
    /// asked. Block sizes are not sent unasked: a client that did not ask
    /// gets the default constraints (minimum 1), and some clients (libnbd)
    /// would hold themselves to a minimum they were told. Unknown info
    /// types are ignored (proto.md NBD_OPT_INFO).
    fn put_infos(&self, chosen: usize, option: u32, requested: &[u16], out: &mut Vec<u8>) {
        let e = &self.exports[chosen];
        let export = proto::InfoExport {
            info_type: proto::INFO_EXPORT.into(),
            size_bytes: e.size_bytes.into(),
            transmission_flags: e.transmission_flags.into(),
        };
        proto::put_option_reply(out, option, proto::REP_INFO, export.as_bytes());
        if requested.contains(&proto::INFO_BLOCK_SIZE) {
            let block = proto::InfoBlockSize {
                info_type: proto::INFO_BLOCK_SIZE.into(),
                min_block_bytes: e.min_block_bytes.into(),
                preferred_block_bytes: e.preferred_block_bytes.into(),
                max_block_bytes: e.max_block_bytes.into(),
            };
            proto::put_option_reply(out, option, proto::REP_INFO, block.as_bytes());
        }
        if requested.contains(&proto::INFO_NAME) {
            let mut d = proto::INFO_NAME.to_be_bytes().to_vec();
            d.extend_from_slice(e.name.as_bytes());
            proto::put_option_reply(out, option, proto::REP_INFO, &d);
        }
        if requested.contains(&proto::INFO_DESCRIPTION) && !e.description.is_empty() {
            let mut d = proto::INFO_DESCRIPTION.to_be_bytes().to_vec();
            d.extend_from_slice(e.description.as_bytes());
            proto::put_option_reply(out, option, proto::REP_INFO, &d);
        }
    }
}

/// Sends the server greeting and reads the client flags.
pub async fn greet<S>(s: &mut S) -> Result<proto::ClientFlags, NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let hello = proto::ServerHello {
        nbd_magic: proto::NBDMAGIC.into(),
        opt_magic: proto::IHAVEOPT.into(),
        handshake_flags: (proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).into(),
    };
    s.write_all(hello.as_bytes()).await?;
    s.flush().await?;
    Ok(proto::parse_client_flags(s.read_u32().await?)?)
}

/// How option haggling on one stream ended.
#[derive(Debug)]
pub enum Step<T> {
    /// The client sent NBD_OPT_ABORT (acknowledged).
    Abort,
    /// NBD_OPT_STARTTLS was acknowledged: the TLS handshake comes next.
    StartTls,
    /// Transmission, with the slot `admit` gave the client.
    Transmission(TransmissionMode, T),
}

/// What a client that may not enter transmission is told.
const BUSY: &str = "too many clients connected: try again later";

/// Answers options until one ends haggling on this stream. `seen` counts
/// options across the TLS upgrade against `limits.options_max`. Reads are
/// unbuffered, so no byte of a TLS handshake is consumed here. The caller
/// bounds the time it takes.
///
/// A client is let into transmission only with a slot from `admit`, asked
/// before the reply that lets it in: without one, NBD_OPT_GO gets
/// NBD_REP_ERR_POLICY (as nbd-server answers it beyond its
/// max_connections; proto.md: the server errors options "until the client
/// gets the hint") and haggling goes on; NBD_OPT_EXPORT_NAME, which has no
/// error reply, ends the connection (proto.md: "If the server is unwilling
/// to allow the export, it MUST terminate the session").
pub async fn haggle<S, T>(
    s: &mut S,
    neg: &mut Negotiation,
    limits: HandshakeLimits,
    seen: &mut u32,
    admit: &mut impl FnMut() -> Option<T>,
) -> Result<Step<T>, NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut out = Vec::new();
    loop {
        let mut header = [0u8; proto::OPTION_HEADER_BYTES];
        s.read_exact(&mut header).await?;
        let opt = proto::parse_option_header(&header)?;
        *seen += 1;
        if *seen > limits.options_max {
            return Err(NbdError::Limit("too many options before transmission"));
        }
        if opt.data_bytes > limits.option_bytes_max {
            return Err(NbdError::Limit("option data too long"));
        }
        let mut data = vec![0u8; opt.data_bytes as usize];
        s.read_exact(&mut data).await?;
        out.clear();
        let step = match neg.answer(opt.option, &data, &mut out) {
            OptionOutcome::Disconnect(why) => return Err(NbdError::Refused(why)),
            OptionOutcome::Continue => None,
            OptionOutcome::StartTls => Some(Step::StartTls),
            OptionOutcome::Abort => Some(Step::Abort),
            OptionOutcome::Transmission(mode) => match admit() {
                Some(slot) => Some(Step::Transmission(mode, slot)),
                None if opt.option != proto::OPT_GO => {
                    return Err(NbdError::Limit("NBD_OPT_EXPORT_NAME with every slot taken"))
                }
                None => {
                    out.clear();
                    proto::put_option_reply(
                        &mut out,
                        opt.option,
                        proto::REP_ERR_POLICY,
                        BUSY.as_bytes(),
                    );
                    None
                }
            },
        };
        s.write_all(&out).await?;
        s.flush().await?;
        if let Some(step) = step {
            return Ok(step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export() -> ExportInfo {
        ExportInfo {
            name: "disk".into(),
            description: "test".into(),
            size_bytes: 1 << 20,
            transmission_flags: proto::FLAG_HAS_FLAGS,
            min_block_bytes: 512,
            preferred_block_bytes: 4096,
            max_block_bytes: 1 << 25,
        }
    }

    fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        d
    }

    fn reply_types(mut out: &[u8]) -> Vec<u32> {
        let mut v = Vec::new();
        while !out.is_empty() {
            let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
            v.push(u32::from_be_bytes(out[12..16].try_into().unwrap()));
            out = &out[20 + len..];
        }
        v
    }

    #[test]
    fn go_and_errors() {
        let flags = proto::ClientFlags { no_zeroes: true };
        let mut n = Negotiation::new(vec![export()], flags, TlsPolicy::Off);
        let mut out = Vec::new();
        assert_eq!(
            n.answer(proto::OPT_STRUCTURED_REPLY, &[], &mut out),
            OptionOutcome::Continue
        );
        out.clear();
        n.answer(proto::OPT_INFO, &info_data("nope", &[]), &mut out);
        assert_eq!(reply_types(&out), vec![proto::REP_ERR_UNKNOWN]);
        out.clear();
        n.answer(proto::OPT_INFO, &[1, 2, 3], &mut out);
        assert_eq!(reply_types(&out), vec![proto::REP_ERR_INVALID]);
        out.clear();
        n.answer(99, &[], &mut out);
        assert_eq!(reply_types(&out), vec![proto::REP_ERR_UNSUP]);
        out.clear();
        let o = n.answer(proto::OPT_GO, &info_data("disk", &[1, 2, 77]), &mut out);
        assert_eq!(
            o,
            OptionOutcome::Transmission(TransmissionMode {
                structured_replies: true,
                min_block_bytes: 1,
                contexts: MetaContexts::default(),
                export: 0,
            })
        );
        let r = proto::REP_INFO;
        assert_eq!(reply_types(&out), vec![r, r, r, proto::REP_ACK]);
    }

    #[test]
    fn several_exports_by_name_and_the_empty_name_is_the_first() {
        let named = |name: &str, size_bytes| ExportInfo {
            name: name.into(),
            size_bytes,
            ..export()
        };
        let exports = vec![named("vol0", 1 << 20), named("logs", 2 << 20)];
        let flags = proto::ClientFlags { no_zeroes: true };
        let mut n = Negotiation::new(exports, flags, TlsPolicy::Off);
        let mut out = Vec::new();
        n.answer(proto::OPT_LIST, &[], &mut out);
        let r = proto::REP_SERVER;
        assert_eq!(reply_types(&out), vec![r, r, proto::REP_ACK]);
        let size_of = |out: &[u8]| u64::from_be_bytes(out[22..30].try_into().unwrap());
        for (name, size) in [("logs", 2 << 20), ("vol0", 1 << 20), ("", 1 << 20)] {
            out.clear();
            n.answer(proto::OPT_INFO, &info_data(name, &[]), &mut out);
            assert_eq!(reply_types(&out), vec![proto::REP_INFO, proto::REP_ACK]);
            assert_eq!(size_of(&out), size, "{name:?}");
        }
        out.clear();
        n.answer(proto::OPT_INFO, &info_data("disk", &[]), &mut out);
        assert_eq!(reply_types(&out), vec![proto::REP_ERR_UNKNOWN]);
        out.clear();
        let go = n.answer(proto::OPT_GO, &info_data("logs", &[]), &mut out);
        assert!(matches!(go, OptionOutcome::Transmission(m) if m.export == 1));
        let mut n = Negotiation::new(vec![named("a", 1), named("b", 1)], flags, TlsPolicy::Off);
        let go = n.answer(proto::OPT_EXPORT_NAME, b"b", &mut out);
        assert!(matches!(go, OptionOutcome::Transmission(m) if m.export == 1));
    }

    #[test]
    fn export_name() {
        let mut n = Negotiation::new(
            vec![export()],
            proto::ClientFlags { no_zeroes: false },
            TlsPolicy::Off,
        );
        let mut out = Vec::new();
        assert!(matches!(
            n.answer(proto::OPT_EXPORT_NAME, b"other", &mut out),
            OptionOutcome::Disconnect(_)
        ));
        let o = n.answer(proto::OPT_EXPORT_NAME, b"", &mut out);
        assert!(matches!(o, OptionOutcome::Transmission(_)));
        assert_eq!(out.len(), 10 + 124);
    }

    const FLAGS: proto::ClientFlags = proto::ClientFlags { no_zeroes: true };

    #[test]
    fn tls_required_refuses_everything_but_starttls() {
        let mut n = Negotiation::new(vec![export()], FLAGS, TlsPolicy::Required);
        let mut out = Vec::new();
        for opt in [
            proto::OPT_LIST,
            proto::OPT_INFO,
            proto::OPT_GO,
            proto::OPT_STRUCTURED_REPLY,
            proto::OPT_SET_META_CONTEXT,
            99,
        ] {
            out.clear();
            let o = n.answer(opt, &info_data("disk", &[]), &mut out);
            assert_eq!(o, OptionOutcome::Continue);
            assert_eq!(
                reply_types(&out),
                vec![proto::REP_ERR_TLS_REQD],
                "option {opt}"
            );
        }
        out.clear();
        assert!(matches!(
            n.answer(proto::OPT_EXPORT_NAME, b"", &mut out),
            OptionOutcome::Disconnect(_)
        ));
        assert!(out.is_empty(), "no byte of the export before TLS");
        assert_eq!(
            n.answer(proto::OPT_STARTTLS, &[1], &mut out),
            OptionOutcome::Continue
        );
        assert_eq!(reply_types(&out), vec![proto::REP_ERR_INVALID]);
        out.clear();
        assert_eq!(
            n.answer(proto::OPT_STARTTLS, &[], &mut out),
            OptionOutcome::StartTls
        );
        assert_eq!(reply_types(&out), vec![proto::REP_ACK]);
        n.tls_started();
        out.clear();
        n.answer(proto::OPT_STARTTLS, &[], &mut out);
        assert_eq!(reply_types(&out), vec![proto::REP_ERR_INVALID]);
        out.clear();
        let o = n.answer(proto::OPT_GO, &info_data("", &[]), &mut out);
        assert!(matches!(o, OptionOutcome::Transmission(_)));
    }

    #[test]
    fn starttls_policies_and_reset() {
        let mut out = Vec::new();
        let mut off = Negotiation::new(vec![export()], FLAGS, TlsPolicy::Off);
        off.answer(proto::OPT_STARTTLS, &[], &mut out);
        assert_eq!(reply_types(&out), vec![proto::REP_ERR_UNSUP]);
        // Optional: plaintext works; state before STARTTLS is forgotten.
        let mut n = Negotiation::new(vec![export()], FLAGS, TlsPolicy::Optional);
        out.clear();
        n.answer(proto::OPT_STRUCTURED_REPLY, &[], &mut out);
        n.answer(
            proto::OPT_SET_META_CONTEXT,
            &proto::meta_context_request("", &["base:allocation"]),
            &mut out,
        );
        out.clear();
        assert_eq!(
            n.answer(proto::OPT_STARTTLS, &[], &mut out),
            OptionOutcome::StartTls
        );
        n.tls_started();
        out.clear();
        let o = n.answer(
            proto::OPT_GO,
            &info_data("", &[proto::INFO_BLOCK_SIZE]),
            &mut out,
        );
        assert_eq!(
            o,
            OptionOutcome::Transmission(TransmissionMode {
                structured_replies: false,
                min_block_bytes: 512,
                contexts: MetaContexts::default(),
                export: 0,
            })
        );
    }

    #[test]
    fn meta_contexts() {
        let mut n = Negotiation::new(vec![export()], FLAGS, TlsPolicy::Off);
        let mut out = Vec::new();
        let list = proto::meta_context_request("disk", &[]);
        n.answer(proto::OPT_LIST_META_CONTEXT, &list, &mut out);
        assert_eq!(
            reply_types(&out),
            vec![proto::REP_ERR_INVALID],
            "structured replies come first"
        );
        out.clear();
        n.answer(proto::OPT_STRUCTURED_REPLY, &[], &mut out);
        out.clear();
        n.answer(proto::OPT_LIST_META_CONTEXT, &list, &mut out);
        let m = proto::REP_META_CONTEXT;
        assert_eq!(reply_types(&out), vec![m, m, proto::REP_ACK]);
        assert_eq!(&out[24..39], proto::META_BASE_ALLOCATION.as_bytes());
        out.clear();
        let q = proto::meta_context_request("", &["tiercache:", "x-other:thing"]);
        n.answer(proto::OPT_LIST_META_CONTEXT, &q, &mut out);
        assert_eq!(reply_types(&out), vec![m, proto::REP_ACK]);
        out.clear();
        n.answer(
            proto::OPT_SET_META_CONTEXT,
            &proto::meta_context_request("nope", &[]),
            &mut out,
        );
        assert_eq!(reply_types(&out), vec![proto::REP_ERR_UNKNOWN]);
        out.clear();
        n.answer(
            proto::OPT_SET_META_CONTEXT,
            &proto::meta_context_request("", &["nocolon"]),
            &mut out,
        );
        assert_eq!(reply_types(&out), vec![proto::REP_ERR_INVALID]);
        out.clear();
        let q = proto::meta_context_request(
            "disk",
            &["base:", "base:allocation", "tiercache:cache", "qemu:dirty"],
        );
        n.answer(proto::OPT_SET_META_CONTEXT, &q, &mut out);
        assert_eq!(reply_types(&out), vec![m, m, proto::REP_ACK]);
        assert_eq!(&out[20..24], &CONTEXT_ID_BASE_ALLOCATION.to_be_bytes());
        out.clear();
        match n.answer(proto::OPT_GO, &info_data("", &[]), &mut out) {
            OptionOutcome::Transmission(m) => {
                assert_eq!(m.min_block_bytes, 1);
                assert_eq!(m.contexts.base_allocation, Some(CONTEXT_ID_BASE_ALLOCATION));
                assert_eq!(m.contexts.cache, Some(CONTEXT_ID_CACHE));
            }
            other => panic!("{other:?}"),
        }
    }
}
