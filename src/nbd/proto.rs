//! NBD wire format: every constant and every byte layout of the protocol, and
//! the total parsers from untrusted bytes to typed values. Nothing else in
//! the server touches raw offsets. Reference: NBD `doc/proto.md`.
//!
//! All integers on the wire are big-endian. Every parser here returns a value
//! or a [`ProtoError`] for any input; none panics.

use zerocopy::byteorder::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

// ---- Magics (proto.md "Newstyle negotiation", "Transmission") ----

/// ASCII `NBDMAGIC`, first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// ASCII `IHAVEOPT`: the newstyle magic and the prefix of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply (fixed newstyle).
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---- Handshake flags (server, 16 bits) and client flags (32 bits) ----

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---- Transmission flags (16 bits, sent with the export size) ----

pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---- Options ----

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

/// An option code as the client sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionCode {
    ExportName,
    Abort,
    List,
    StartTls,
    Info,
    Go,
    StructuredReply,
    ListMetaContext,
    SetMetaContext,
    /// Known to the protocol or not, but not implemented here.
    Other(u32),
}

impl OptionCode {
    pub fn from_wire(v: u32) -> Self {
        match v {
            OPT_EXPORT_NAME => Self::ExportName,
            OPT_ABORT => Self::Abort,
            OPT_LIST => Self::List,
            OPT_STARTTLS => Self::StartTls,
            OPT_INFO => Self::Info,
            OPT_GO => Self::Go,
            OPT_STRUCTURED_REPLY => Self::StructuredReply,
            OPT_LIST_META_CONTEXT => Self::ListMetaContext,
            OPT_SET_META_CONTEXT => Self::SetMetaContext,
            other => Self::Other(other),
        }
    }
}

// ---- Option reply types ----

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_PLATFORM: u32 = REP_ERR | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_ERR | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;

/// True for the reply types that end an option with an error.
pub fn is_error_reply(reply_type: u32) -> bool {
    reply_type & REP_ERR != 0
}

// ---- NBD_REP_INFO types ----

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---- Commands and command flags ----

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// A command type as the client sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    /// Any other value, including commands this server does not implement.
    Unknown(u16),
}

impl Command {
    pub fn from_wire(v: u16) -> Self {
        match v {
            CMD_READ => Self::Read,
            CMD_WRITE => Self::Write,
            CMD_DISC => Self::Disc,
            CMD_FLUSH => Self::Flush,
            CMD_TRIM => Self::Trim,
            CMD_CACHE => Self::Cache,
            CMD_WRITE_ZEROES => Self::WriteZeroes,
            CMD_BLOCK_STATUS => Self::BlockStatus,
            other => Self::Unknown(other),
        }
    }
}

// ---- Structured reply chunks ----

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

// ---- Metadata contexts (proto.md "Metadata querying") ----

/// The one context the protocol defines.
pub const META_BASE_ALLOCATION: &str = "base:allocation";
/// This server's context: which sectors are in the cache, and which of
/// those are dirty (not yet on the origin). The namespace is not
/// registered with the NBD project.
pub const META_TIERCACHE_CACHE: &str = "tiercache:cache";
/// base:allocation flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;
/// tiercache:cache flags: the range is held by the cache device; of that,
/// the range is dirty (written to the cache, not yet to the origin).
pub const STATE_CACHED: u32 = 1 << 0;
pub const STATE_DIRTY: u32 = 1 << 1;

// ---- Error numbers (proto.md "Error values"; not the host's errno) ----

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Longest string (export name, message) the protocol allows (proto.md
/// "Conventions": MUST be no longer than 4096 bytes).
pub const STRING_BYTES_MAX: usize = 4096;

/// Bytes of zero padding after NBD_OPT_EXPORT_NAME's reply, unless the
/// client set NBD_FLAG_C_NO_ZEROES.
pub const EXPORT_NAME_PAD_BYTES: usize = 124;

// ---- Byte layouts ----

/// S: the first message of the newstyle handshake.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ServerHello {
    pub nbd_magic: U64,
    pub opt_magic: U64,
    pub handshake_flags: U16,
}

/// C: the header of every option during option haggling.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct OptionHeader {
    pub magic: U64,
    pub option: U32,
    pub length: U32,
}

/// S: the header of every option reply; `length` bytes of data follow.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct OptionReplyHeader {
    pub magic: U64,
    pub option: U32,
    pub reply_type: U32,
    pub length: U32,
}

/// S: the reply to NBD_OPT_EXPORT_NAME (before the optional 124 zeroes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ExportNameReply {
    pub size_bytes: U64,
    pub transmission_flags: U16,
}

/// NBD_REP_INFO payload of type NBD_INFO_EXPORT.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct InfoExport {
    pub info_type: U16,
    pub size_bytes: U64,
    pub transmission_flags: U16,
}

/// NBD_REP_INFO payload of type NBD_INFO_BLOCK_SIZE.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct InfoBlockSize {
    pub info_type: U16,
    pub min_block_bytes: U32,
    pub preferred_block_bytes: U32,
    pub max_block_bytes: U32,
}

/// C: the header of every transmission request.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RequestHeader {
    pub magic: U32,
    pub flags: U16,
    pub command: U16,
    pub cookie: U64,
    pub offset: U64,
    pub length: U32,
}

/// S: a simple reply; read data follows for a successful NBD_CMD_READ.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SimpleReplyHeader {
    pub magic: U32,
    pub error: U32,
    pub cookie: U64,
}

/// S: the header of a structured reply chunk; `length` payload bytes follow.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ChunkHeader {
    pub magic: U32,
    pub flags: U16,
    pub reply_type: U16,
    pub cookie: U64,
    pub length: U32,
}

/// Payload prefix of NBD_REPLY_TYPE_OFFSET_DATA; the data follows.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct OffsetDataPrefix {
    pub offset: U64,
}

/// Payload prefix of NBD_REPLY_TYPE_ERROR; a message of `message_length`
/// bytes follows.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ErrorChunkPrefix {
    pub error: U32,
    pub message_length: U16,
}

/// One extent of an NBD_REPLY_TYPE_BLOCK_STATUS chunk.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BlockDescriptor {
    pub length: U32,
    pub status: U32,
}

const _: () = assert!(size_of::<ServerHello>() == 18);
const _: () = assert!(size_of::<BlockDescriptor>() == 8);
const _: () = assert!(size_of::<OptionHeader>() == 16);
const _: () = assert!(size_of::<OptionReplyHeader>() == 20);
const _: () = assert!(size_of::<ExportNameReply>() == 10);
const _: () = assert!(size_of::<InfoExport>() == 12);
const _: () = assert!(size_of::<InfoBlockSize>() == 14);
const _: () = assert!(size_of::<RequestHeader>() == 28);
const _: () = assert!(size_of::<SimpleReplyHeader>() == 16);
const _: () = assert!(size_of::<ChunkHeader>() == 20);
const _: () = assert!(size_of::<OffsetDataPrefix>() == 8);
const _: () = assert!(size_of::<ErrorChunkPrefix>() == 6);

pub const OPTION_HEADER_BYTES: usize = size_of::<OptionHeader>();
pub const REQUEST_HEADER_BYTES: usize = size_of::<RequestHeader>();

// ---- Parsing ----

/// Why bytes from a client are not a valid protocol message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// Fewer bytes than the fixed-size message needs.
    #[error("message truncated: need {need} bytes, got {got}")]
    Truncated { need: usize, got: usize },
    /// A magic number is wrong: the stream is not NBD or lost its framing.
    #[error("bad magic {found:#x}")]
    BadMagic { found: u64 },
    /// The client flags contain bits the server did not offer.
    #[error("unknown client flags {flags:#x}")]
    UnknownClientFlags { flags: u32 },
    /// The client did not set NBD_FLAG_C_FIXED_NEWSTYLE.
    #[error("client does not speak fixed newstyle (flags {flags:#x})")]
    NotFixedNewstyle { flags: u32 },
    /// A length field disagrees with the message size.
    #[error("bad length in {what}")]
    BadLength { what: &'static str },
    /// A string is not UTF-8, contains NUL or is longer than 4096 bytes.
    #[error("bad string in {what}")]
    BadString { what: &'static str },
}

/// The client flags a fixed-newstyle server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFlags {
    pub no_zeroes: bool,
}

/// Parses the client flags. NBD proto.md: the server MUST drop the
/// connection on an unknown flag; this server also requires fixed newstyle.
pub fn parse_client_flags(flags: u32) -> Result<ClientFlags, ProtoError> {
    if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(ProtoError::UnknownClientFlags { flags });
    }
    if flags & FLAG_C_FIXED_NEWSTYLE == 0 {
        return Err(ProtoError::NotFixedNewstyle { flags });
    }
    Ok(ClientFlags {
        no_zeroes: flags & FLAG_C_NO_ZEROES != 0,
    })
}

/// A parsed option header: the option and the length of its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionRequest {
    /// The raw option code, echoed in replies.
    pub option: u32,
    pub data_bytes: u32,
}

impl OptionRequest {
    pub fn code(&self) -> OptionCode {
        OptionCode::from_wire(self.option)
    }
}

pub fn parse_option_header(bytes: &[u8]) -> Result<OptionRequest, ProtoError> {
    let (h, _) = OptionHeader::read_from_prefix(bytes).map_err(|_| ProtoError::Truncated {
        need: OPTION_HEADER_BYTES,
        got: bytes.len(),
    })?;
    if h.magic.get() != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            found: h.magic.get(),
        });
    }
    Ok(OptionRequest {
        option: h.option.get(),
        data_bytes: h.length.get(),
    })
}

/// Validates a protocol string: UTF-8, no NUL, at most 4096 bytes.
pub fn parse_string(bytes: &[u8], what: &'static str) -> Result<String, ProtoError> {
    if bytes.len() > STRING_BYTES_MAX || bytes.contains(&0) {
        return Err(ProtoError::BadString { what });
    }
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| ProtoError::BadString { what })
}

/// The data of NBD_OPT_INFO and NBD_OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub export_name: String,
    /// The NBD_INFO_* types the client asked for, in its order.
    pub info_types: Vec<u16>,
}

/// Parses `u32 name length, name, u16 count, count x u16 info type`; the
/// lengths must account for every byte exactly.
pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, ProtoError> {
    let bad = ProtoError::BadLength {
        what: "NBD_OPT_INFO/GO",
    };
    let (name_len, rest) = U32::read_from_prefix(data).map_err(|_| bad.clone())?;
    let name_len = name_len.get() as usize;
    if rest.len() < name_len {
        return Err(bad);
    }
    let (name, rest) = rest.split_at(name_len);
    let export_name = parse_string(name, "export name")?;
    let (count, rest) = U16::read_from_prefix(rest).map_err(|_| bad.clone())?;
    if rest.len() != usize::from(count.get()) * 2 {
        return Err(bad);
    }
    let info_types = rest
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Ok(InfoRequest {
        export_name,
        info_types,
    })
}

/// The data of NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export_name: String,
    pub queries: Vec<String>,
}

/// What `parse_meta_context_request` reads, as a client sends it (for
/// tests and fuzz seeds: the server only parses).
#[cfg(any(test, feature = "testing"))]
pub fn meta_context_request(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// Parses `u32 name length, name, u32 count, count x (u32 length, query)`;
/// the lengths must account for every byte exactly. The count is checked
/// against the bytes present before anything is allocated for it.
pub fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest, ProtoError> {
    let bad = ProtoError::BadLength {
        what: "NBD_OPT_LIST/SET_META_CONTEXT",
    };
    let take_string = |rest: &[u8], what| -> Result<(String, usize), ProtoError> {
        let (len, tail) = U32::read_from_prefix(rest).map_err(|_| bad.clone())?;
        let len = len.get() as usize;
        if tail.len() < len {
            return Err(bad.clone());
        }
        Ok((parse_string(&tail[..len], what)?, 4 + len))
    };
    let (export_name, used) = take_string(data, "export name")?;
    let rest = &data[used..];
    let (count, mut rest) = U32::read_from_prefix(rest).map_err(|_| bad.clone())?;
    let count = count.get() as usize;
    // Every query takes at least its 4-byte length.
    if count > rest.len() / 4 {
        return Err(bad);
    }
    let mut queries = Vec::with_capacity(count);
    for _ in 0..count {
        let (q, used) = take_string(rest, "metadata context query")?;
        queries.push(q);
        rest = &rest[used..];
    }
    if !rest.is_empty() {
        return Err(bad);
    }
    Ok(MetaContextRequest {
        export_name,
        queries,
    })
}

/// Appends an NBD_REP_META_CONTEXT reply naming one context.
pub fn put_meta_context_reply(out: &mut Vec<u8>, option: u32, context_id: u32, name: &str) {
    let mut d = context_id.to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    put_option_reply(out, option, REP_META_CONTEXT, &d);
}

/// A parsed request header. The command and flags are not yet validated
/// against the export (see `transmission::check_request`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: Command,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

pub fn parse_request(bytes: &[u8]) -> Result<Request, ProtoError> {
    let (h, _) = RequestHeader::read_from_prefix(bytes).map_err(|_| ProtoError::Truncated {
        need: REQUEST_HEADER_BYTES,
        got: bytes.len(),
    })?;
    if h.magic.get() != REQUEST_MAGIC {
        return Err(ProtoError::BadMagic {
            found: u64::from(h.magic.get()),
        });
    }
    Ok(Request {
        flags: h.flags.get(),
        command: Command::from_wire(h.command.get()),
        cookie: h.cookie.get(),
        offset: h.offset.get(),
        length: h.length.get(),
    })
}

// ---- Encoding (server to client) ----

/// Appends one option reply with `data` to `out`.
pub fn put_option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, data: &[u8]) {
    // Option data is bounded by the server's own limits, far below 4 GiB.
    let length = u32::try_from(data.len()).expect("option reply data fits u32");
    let h = OptionReplyHeader {
        magic: OPTION_REPLY_MAGIC.into(),
        option: option.into(),
        reply_type: reply_type.into(),
        length: length.into(),
    };
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
}

pub fn put_simple_reply(out: &mut Vec<u8>, cookie: u64, error: u32) {
    let h = SimpleReplyHeader {
        magic: SIMPLE_REPLY_MAGIC.into(),
        error: error.into(),
        cookie: cookie.into(),
    };
    out.extend_from_slice(h.as_bytes());
}

pub fn put_chunk_header(out: &mut Vec<u8>, cookie: u64, flags: u16, reply_type: u16, length: u32) {
    let h = ChunkHeader {
        magic: STRUCTURED_REPLY_MAGIC.into(),
        flags: flags.into(),
        reply_type: reply_type.into(),
        cookie: cookie.into(),
        length: length.into(),
    };
    out.extend_from_slice(h.as_bytes());
}

/// Appends the header and offset prefix of an OFFSET_DATA chunk (with DONE)
/// that carries `data_bytes` bytes; the caller sends the data after it.
pub fn put_offset_data_head(out: &mut Vec<u8>, cookie: u64, offset: u64, data_bytes: u32) {
    let prefix = size_of::<OffsetDataPrefix>() as u32;
    put_chunk_header(
        out,
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_DATA,
        data_bytes.saturating_add(prefix),
    );
    out.extend_from_slice(
        OffsetDataPrefix {
            offset: offset.into(),
        }
        .as_bytes(),
    );
}

/// Appends an ERROR chunk with DONE; the message is cut to 4096 bytes at a
/// character boundary.
pub fn put_error_chunk(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    let mut end = message.len().min(STRING_BYTES_MAX);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let message = &message.as_bytes()[..end];
    let prefix = ErrorChunkPrefix {
        error: error.into(),
        message_length: (message.len() as u16).into(),
    };
    let length = (size_of::<ErrorChunkPrefix>() + message.len()) as u32;
    put_chunk_header(out, cookie, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, length);
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(message);
}

/// Descriptors in one NBD_REPLY_TYPE_BLOCK_STATUS chunk at most; a longer
/// answer is cut short (proto.md allows a server to describe less than
/// the requested range, never nothing).
pub const BLOCK_STATUS_EXTENTS_MAX: usize = 1024;

/// Appends one NBD_REPLY_TYPE_BLOCK_STATUS chunk for `context_id`.
/// `extents` are (length, status) pairs; the caller guarantees one to
/// [`BLOCK_STATUS_EXTENTS_MAX`] of them, none of length zero.
pub fn put_block_status_chunk(
    out: &mut Vec<u8>,
    cookie: u64,
    done: bool,
    context_id: u32,
    extents: &[(u32, u32)],
) {
    assert!(!extents.is_empty() && extents.len() <= BLOCK_STATUS_EXTENTS_MAX);
    let length = (4 + extents.len() * size_of::<BlockDescriptor>()) as u32;
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    put_chunk_header(out, cookie, flags, REPLY_TYPE_BLOCK_STATUS, length);
    out.extend_from_slice(&context_id.to_be_bytes());
    for &(length, status) in extents {
        debug_assert!(length > 0);
        let d = BlockDescriptor {
            length: length.into(),
            status: status.into(),
        };
        out.extend_from_slice(d.as_bytes());
    }
}

/// Parses the payload of an NBD_REPLY_TYPE_BLOCK_STATUS chunk (the client
/// side of [`put_block_status_chunk`]): the context id and the extents.
pub fn parse_block_status_payload(payload: &[u8]) -> Result<(u32, Vec<(u32, u32)>), ProtoError> {
    let bad = ProtoError::BadLength {
        what: "NBD_REPLY_TYPE_BLOCK_STATUS",
    };
    let (id, rest) = U32::read_from_prefix(payload).map_err(|_| bad.clone())?;
    let descriptors = <[BlockDescriptor]>::ref_from_bytes(rest).map_err(|_| bad.clone())?;
    if descriptors.is_empty() || descriptors.iter().any(|d| d.length.get() == 0) {
        return Err(bad);
    }
    let extents = descriptors
        .iter()
        .map(|d| (d.length.get(), d.status.get()))
        .collect();
    Ok((id.get(), extents))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_bytes(magic: u32, flags: u16, cmd: u16, offset: u64, len: u32) -> Vec<u8> {
        RequestHeader {
            magic: magic.into(),
            flags: flags.into(),
            command: cmd.into(),
            cookie: 7.into(),
            offset: offset.into(),
            length: len.into(),
        }
        .as_bytes()
        .to_vec()
    }

    #[test]
    fn request_round_trip() {
        let b = request_bytes(REQUEST_MAGIC, CMD_FLAG_FUA, CMD_WRITE, 4096, 512);
        let r = parse_request(&b).unwrap();
        assert_eq!(r.command, Command::Write);
        assert_eq!((r.flags, r.cookie, r.offset, r.length), (1, 7, 4096, 512));
        assert!(matches!(
            parse_request(&request_bytes(1, 0, 0, 0, 0)),
            Err(ProtoError::BadMagic { found: 1 })
        ));
        assert!(matches!(
            parse_request(&b[..27]),
            Err(ProtoError::Truncated { need: 28, got: 27 })
        ));
        let u = request_bytes(REQUEST_MAGIC, 0, 99, 0, 0);
        assert_eq!(parse_request(&u).unwrap().command, Command::Unknown(99));
    }

    #[test]
    fn client_flags() {
        assert_eq!(parse_client_flags(3), Ok(ClientFlags { no_zeroes: true }));
        assert_eq!(parse_client_flags(1), Ok(ClientFlags { no_zeroes: false }));
        assert!(parse_client_flags(0).is_err());
        assert!(parse_client_flags(2).is_err());
        assert!(parse_client_flags(5).is_err());
    }

    #[test]
    fn info_request() {
        let mut d = vec![0, 0, 0, 3];
        d.extend_from_slice(b"abc");
        d.extend_from_slice(&[0, 2, 0, 3, 0, 1]);
        let r = parse_info_request(&d).unwrap();
        assert_eq!(r.export_name, "abc");
        assert_eq!(r.info_types, vec![3, 1]);
        for cut in 0..d.len() {
            assert!(parse_info_request(&d[..cut]).is_err());
        }
        d.push(0);
        assert!(parse_info_request(&d).is_err());
        assert!(parse_info_request(&[0xff, 0xff, 0xff, 0xff, 0, 0]).is_err());
        assert!(parse_info_request(&[0, 0, 0, 1, 0, 0, 0]).is_err());
    }

    #[test]
    fn meta_context_requests_parse() {
        let d = meta_context_request("disk", &["base:allocation", "tiercache:"]);
        let r = parse_meta_context_request(&d).unwrap();
        assert_eq!(r.export_name, "disk");
        assert_eq!(r.queries, vec!["base:allocation", "tiercache:"]);
        for cut in 0..d.len() {
            assert!(parse_meta_context_request(&d[..cut]).is_err(), "cut {cut}");
        }
        let mut long = d.clone();
        long.push(0);
        assert!(parse_meta_context_request(&long).is_err());
        // A count far beyond the bytes present allocates nothing.
        assert!(parse_meta_context_request(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]).is_err());
        let r = parse_meta_context_request(&meta_context_request("", &[])).unwrap();
        assert!(r.queries.is_empty());
    }

    #[test]
    fn block_status_round_trip() {
        let mut out = Vec::new();
        put_block_status_chunk(&mut out, 9, true, 2, &[(512, 3), (4096, 0)]);
        assert_eq!(out.len(), 20 + 4 + 16);
        assert_eq!(u16::from_be_bytes([out[4], out[5]]), REPLY_FLAG_DONE);
        assert_eq!(
            u16::from_be_bytes([out[6], out[7]]),
            REPLY_TYPE_BLOCK_STATUS
        );
        let (id, ext) = parse_block_status_payload(&out[20..]).unwrap();
        assert_eq!((id, ext), (2, vec![(512, 3), (4096, 0)]));
        assert!(parse_block_status_payload(&out[20..27]).is_err());
        assert!(parse_block_status_payload(&[0, 0, 0, 1]).is_err());
        assert!(parse_block_status_payload(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]).is_err());
    }

    #[test]
    fn error_chunk_cuts_long_messages() {
        let mut out = Vec::new();
        let msg = "é".repeat(3000);
        put_error_chunk(&mut out, 1, EIO, &msg);
        assert_eq!(out.len(), 20 + 6 + 4096);
    }
}
