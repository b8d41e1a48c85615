//! Fixed newstyle handshake and option haggling (NBD proto.md "Handshake").
//!
//! [`Negotiation`] is a pure state machine: option in, reply bytes and an
//! outcome out, so it can be fuzzed without sockets. [`negotiate`] drives it
//! over a connection with bounds on option size and count.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use zerocopy::byteorder::network_endian::U32;
use zerocopy::IntoBytes;

use super::proto::{self, OptionCode};
use super::NbdError;

/// What the server tells clients about its one export.
#[derive(Debug, Clone)]
pub struct ExportInfo {
    /// The configured name; the default export "" is accepted as well.
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    pub transmission_flags: u16,
    pub min_block_bytes: u32,
    pub preferred_block_bytes: u32,
    pub max_block_bytes: u32,
}

impl ExportInfo {
    fn accepts(&self, name: &str) -> bool {
        name.is_empty() || name == self.name
    }
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
    /// Send the replies, then close (NBD_OPT_ABORT).
    Abort,
    /// Send the replies, then enter transmission with these settings.
    Transmission(TransmissionMode),
    /// Close without a reply: the spec leaves no other way (e.g. an
    /// NBD_OPT_EXPORT_NAME that cannot be satisfied).
    Disconnect(&'static str),
}

/// Settings negotiated for the transmission phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransmissionMode {
    pub structured_replies: bool,
}

/// Option-haggling state of one connection.
#[derive(Debug)]
pub struct Negotiation {
    export: ExportInfo,
    no_zeroes: bool,
    structured_replies: bool,
}

impl Negotiation {
    pub fn new(export: ExportInfo, client: proto::ClientFlags) -> Self {
        Negotiation {
            export,
            no_zeroes: client.no_zeroes,
            structured_replies: false,
        }
    }

    /// Answers one option with `data` (already read in full), appending the
    /// reply bytes to `out`.
    pub fn answer(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> OptionOutcome {
        let reply_err = |out: &mut Vec<u8>, reply_type: u32, msg: &str| {
            proto::put_option_reply(out, option, reply_type, msg.as_bytes());
            OptionOutcome::Continue
        };
        match OptionCode::from_wire(option) {
            OptionCode::ExportName => {
                let Ok(name) = proto::parse_string(data, "export name") else {
                    return OptionOutcome::Disconnect("NBD_OPT_EXPORT_NAME with a bad name");
                };
                if !self.export.accepts(&name) {
                    return OptionOutcome::Disconnect("NBD_OPT_EXPORT_NAME of an unknown export");
                }
                let reply = proto::ExportNameReply {
                    size_bytes: self.export.size_bytes.into(),
                    transmission_flags: self.export.transmission_flags.into(),
                };
                out.extend_from_slice(reply.as_bytes());
                if !self.no_zeroes {
                    out.extend_from_slice(&[0u8; proto::EXPORT_NAME_PAD_BYTES]);
                }
                OptionOutcome::Transmission(self.mode())
            }
            OptionCode::Abort => {
                proto::put_option_reply(out, option, proto::REP_ACK, &[]);
                OptionOutcome::Abort
            }
            OptionCode::List => {
                if !data.is_empty() {
                    return reply_err(out, proto::REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
                }
                let name = self.export.name.as_bytes();
                let mut entry = U32::new(name.len() as u32).as_bytes().to_vec();
                entry.extend_from_slice(name);
                proto::put_option_reply(out, option, proto::REP_SERVER, &entry);
                proto::put_option_reply(out, option, proto::REP_ACK, &[]);
                OptionOutcome::Continue
            }
            OptionCode::Info | OptionCode::Go => {
                let req = match proto::parse_info_request(data) {
                    Ok(r) => r,
                    Err(e) => return reply_err(out, proto::REP_ERR_INVALID, &e.to_string()),
                };
                if !self.export.accepts(&req.export_name) {
                    return reply_err(out, proto::REP_ERR_UNKNOWN, "no such export");
                }
                self.put_infos(option, &req.info_types, out);
                proto::put_option_reply(out, option, proto::REP_ACK, &[]);
                if option == proto::OPT_GO {
                    OptionOutcome::Transmission(self.mode())
                } else {
                    OptionOutcome::Continue
                }
            }
            OptionCode::StructuredReply => {
                if !data.is_empty() {
                    return reply_err(
                        out,
                        proto::REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    );
                }
                self.structured_replies = true;
                proto::put_option_reply(out, option, proto::REP_ACK, &[]);
                OptionOutcome::Continue
            }
            OptionCode::StartTls | OptionCode::Other(_) => {
                reply_err(out, proto::REP_ERR_UNSUP, "option not supported")
            }
        }
    }

    fn mode(&self) -> TransmissionMode {
        TransmissionMode {
            structured_replies: self.structured_replies,
        }
    }

    /// NBD_INFO_EXPORT always; NBD_INFO_BLOCK_SIZE always, since this server
    /// has a minimum block size clients must obey; name and description
    /// when asked. Unknown info types are ignored (proto.md NBD_OPT_INFO).
    fn put_infos(&self, option: u32, requested: &[u16], out: &mut Vec<u8>) {
        let e = &self.export;
        let export = proto::InfoExport {
            info_type: proto::INFO_EXPORT.into(),
            size_bytes: e.size_bytes.into(),
            transmission_flags: e.transmission_flags.into(),
        };
        proto::put_option_reply(out, option, proto::REP_INFO, export.as_bytes());
        let block = proto::InfoBlockSize {
            info_type: proto::INFO_BLOCK_SIZE.into(),
            min_block_bytes: e.min_block_bytes.into(),
            preferred_block_bytes: e.preferred_block_bytes.into(),
            max_block_bytes: e.max_block_bytes.into(),
        };
        proto::put_option_reply(out, option, proto::REP_INFO, block.as_bytes());
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

/// Runs the handshake on a fresh connection. `Ok(None)` means the client
/// ended it cleanly (NBD_OPT_ABORT). The caller bounds the time it takes.
pub async fn negotiate<R, W>(
    rd: &mut R,
    wr: &mut W,
    export: &ExportInfo,
    limits: HandshakeLimits,
) -> Result<Option<TransmissionMode>, NbdError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let hello = proto::ServerHello {
        nbd_magic: proto::NBDMAGIC.into(),
        opt_magic: proto::IHAVEOPT.into(),
        handshake_flags: (proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).into(),
    };
    wr.write_all(hello.as_bytes()).await?;
    wr.flush().await?;
    let client_flags = proto::parse_client_flags(rd.read_u32().await?)?;
    let mut neg = Negotiation::new(export.clone(), client_flags);
    let mut options_seen = 0u32;
    let mut out = Vec::new();
    loop {
        let mut header = [0u8; proto::OPTION_HEADER_BYTES];
        rd.read_exact(&mut header).await?;
        let opt = proto::parse_option_header(&header)?;
        options_seen += 1;
        if options_seen > limits.options_max {
            return Err(NbdError::Limit("too many options before transmission"));
        }
        if opt.data_bytes > limits.option_bytes_max {
            return Err(NbdError::Limit("option data too long"));
        }
        let mut data = vec![0u8; opt.data_bytes as usize];
        rd.read_exact(&mut data).await?;
        out.clear();
        let outcome = neg.answer(opt.option, &data, &mut out);
        if let OptionOutcome::Disconnect(why) = outcome {
            return Err(NbdError::Refused(why));
        }
        wr.write_all(&out).await?;
        wr.flush().await?;
        match outcome {
            OptionOutcome::Continue => {}
            OptionOutcome::Abort => return Ok(None),
            OptionOutcome::Transmission(mode) => return Ok(Some(mode)),
            OptionOutcome::Disconnect(_) => unreachable!("handled above"),
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
        let mut n = Negotiation::new(export(), flags);
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
                structured_replies: true
            })
        );
        let r = proto::REP_INFO;
        assert_eq!(reply_types(&out), vec![r, r, r, r, proto::REP_ACK]);
    }

    #[test]
    fn export_name() {
        let mut n = Negotiation::new(export(), proto::ClientFlags { no_zeroes: false });
        let mut out = Vec::new();
        assert!(matches!(
            n.answer(proto::OPT_EXPORT_NAME, b"other", &mut out),
            OptionOutcome::Disconnect(_)
        ));
        let o = n.answer(proto::OPT_EXPORT_NAME, b"", &mut out);
        assert!(matches!(o, OptionOutcome::Transmission(_)));
        assert_eq!(out.len(), 10 + 124);
    }
}
