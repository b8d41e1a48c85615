//! `tiercache serve`: exports a cached volume over NBD (Unix socket by
//! default, TCP on request) or as /dev/ublkbN, in the foreground, with a
//! control socket for the other commands. SIGINT/SIGTERM shut down cleanly:
//! in-flight requests finish, metadata is committed and the cache is marked
//! clean. This file turns flags into a `tiercache::daemon::DaemonConfig`;
//! the daemon itself is `tiercache::daemon::run`.
//!
//! Network safety: TLS on the TCP listener (`--tls-certificates` or
//! `--tls-psk`; required by default once credentials are given), and a
//! TCP listener on anything but loopback without required TLS is refused
//! unless `--insecure` says the operator means it. Beyond loopback, X.509
//! also asks clients for certificates unless `--tls-verify-peer=off`: a
//! server certificate alone lets any client that completes an anonymous
//! handshake read and write the volume. The Unix socket is for local
//! clients (mode 0600) and stays plaintext.

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use tiercache::daemon::{DaemonConfig, EngineSource, TcpListen, UblkSettings};
use tiercache::device::parse_size;
use tiercache::engine::policy::PolicyKind;
use tiercache::engine::{CreateOptions, Mode};
use tiercache::frontend::nbd::ServerConfig;
use tiercache::nbd::{ServerCredentials, TlsAcceptor};

use super::exit::{classed, fail};
use super::registry::Registry;
use super::units::parse_block_size;
use super::NameArg;

/// A build without the ublk front end hides its options from `--help`
/// (`--ublk` still parses, and is refused naming the feature).
const NO_UBLK: bool = !cfg!(feature = "ublk");

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// NBD Unix socket to listen on (default: <state-dir>/<name>.nbd).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// A cache set may start without members that cannot be opened. Only
    /// when you know the missing ones hold nothing newer (a member that
    /// failed while serving is recorded as failed and needs no flag).
    #[arg(long)]
    degraded: bool,
    /// The origin is the same device, grown (lvextend, a longer file, rbd
    /// resize): take its new size. Without it an origin of another size is
    /// refused, since some devices are told apart by size alone.
    #[arg(long)]
    origin_grew: bool,
    /// Also listen on TCP: on loopback port 10809 when given alone, or at
    /// the address named (e.g. 0.0.0.0:10809 to serve the network).
    #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:10809")]
    pub(super) tcp: Option<String>,
    /// Export name announced to clients ("" is always accepted).
    #[arg(long, default_value = "")]
    export_name: String,
    /// Refuse writes.
    #[arg(long)]
    read_only: bool,
    /// Serve an unregistered, volatile cache: origin path (needs --ram-cache).
    #[arg(long, requires = "ram_cache")]
    origin: Option<String>,
    /// Size of a RAM cache created for this run only (e.g. 1G).
    #[arg(long, requires = "origin")]
    ram_cache: Option<String>,
    /// Mode of the RAM cache.
    #[arg(long, default_value = "writethrough")]
    mode: String,
    /// Block size of the RAM cache.
    #[arg(long, default_value = "4096")]
    block_size: String,
    /// Accept losing dirty data on exit (writeback on a RAM cache).
    #[arg(long)]
    allow_data_loss: bool,
    /// Threads that serve NBD requests. Cache hits, and in writeback and
    /// writeonly the writes that need only the cache, run on them directly (one device I/O each, no hand-off to another
    /// thread), so this is also how many of those can be in flight at the
    /// cache device; everything else goes to a separate blocking pool.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    io_threads: u16,
    /// Serve the volume as the kernel block device /dev/ublkbN (ublk)
    /// instead of over NBD (built with `--features ublk`). If /dev/ublkcN is left by a daemon that died,
    /// it is taken over (user recovery): its requests are reissued here.
    #[arg(long, hide = NO_UBLK)]
    ublk: bool,
    /// The ublk device number N; a cache of several volumes gets one
    /// device per volume, /dev/ublkb<N+v> for volume v.
    #[arg(long, default_value_t = 0, requires = "ublk", hide = NO_UBLK)]
    ublk_id: i32,
    /// ublk queues (one thread each).
    #[arg(long, default_value_t = 2, requires = "ublk", value_parser = clap::value_parser!(u16).range(1..=64), hide = NO_UBLK)]
    ublk_queues: u16,
    /// Requests each ublk queue takes at once.
    #[arg(long, default_value_t = 64, requires = "ublk", value_parser = clap::value_parser!(u16).range(1..=4096), hide = NO_UBLK)]
    ublk_queue_depth: u16,
    /// Complete each ublk write only once it is durable, as if FUA (a
    /// commit per write, shared by writes that complete together). Not
    /// needed against a daemon that dies: the crash log keeps every write
    /// it acknowledged. By default the device has a volatile write cache,
    /// as a disk does: the kernel sends FLUSH where the filesystem needs it.
    #[arg(long, requires = "ublk", hide = NO_UBLK)]
    ublk_durable_writes: bool,
    /// TLS on the TCP listener: off, on (clients choose) or require (every
    /// option but STARTTLS is refused until TLS is up). Default: require
    /// when credentials are given, else off.
    #[arg(long, value_enum)]
    tls: Option<TlsMode>,
    /// X.509 credentials: a directory with ca-cert.pem, server-cert.pem and
    /// server-key.pem (the layout qemu-nbd and nbdkit read).
    #[arg(long, value_name = "DIR", conflicts_with = "tls_psk")]
    tls_certificates: Option<PathBuf>,
    /// Pre-shared keys: a psktool keys file (lines `username:hexkey`).
    #[arg(long, value_name = "FILE")]
    tls_psk: Option<PathBuf>,
    /// With --tls-certificates: clients must present a certificate signed
    /// by ca-cert.pem (and not revoked by ca-crl.pem, when the directory
    /// has one). Default: on when --tcp binds beyond loopback (0.0.0.0, a
    /// LAN address), off on loopback; =off turns it off explicitly, and
    /// then any client that completes a TLS handshake may use the volume.
    #[arg(
        long,
        value_enum,
        value_name = "on|off",
        num_args = 0..=1,
        default_missing_value = "on",
        requires = "tls_certificates"
    )]
    tls_verify_peer: Option<OnOff>,
    /// Allow --tcp on a non-loopback address without --tls=require: the
    /// volume is then readable and writable by anyone who can reach it.
    #[arg(long)]
    insecure: bool,
    /// Clients served at once on each listener (the Unix socket and the
    /// TCP address have their own); a client beyond it is refused when it
    /// asks to enter transmission.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    max_connections: u32,
    /// Handshakes under way at once on each listener; connections beyond
    /// it are closed at once. A handshake holds no served client's slot.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    max_handshakes: u32,
    /// Largest read or write one request may carry (multiple of 512).
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    max_request_size: u64,
    /// Memory for one connection's requests in flight (payloads and read
    /// data); a client with this much in flight is not read from.
    #[arg(long, default_value = "128M", value_parser = parse_bytes)]
    conn_buffer: u64,
    /// The same bound over all connections together.
    #[arg(long, default_value = "512M", value_parser = parse_bytes)]
    total_buffer: u64,
    /// Seconds a client has to finish the handshake (TLS included).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    handshake_timeout: u64,
    /// Seconds a reply write or write payload may make no progress before
    /// the connection is closed (clients that stop reading).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    stall_timeout: u64,
    /// Seconds an NBD origin's request may wait for its reply before the
    /// origin is taken to have stopped answering: the connection is
    /// dropped (its requests fail), the origin is unreachable until a
    /// reconnect succeeds, writeback waits, and cached I/O goes on. In
    /// writeback and writeonly a client's FLUSH does not wait for the
    /// origin at all; in writethrough it fails after this long.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    origin_timeout: u64,
    /// Seconds one write payload, or one reply, may take on the socket in
    /// total before the connection is closed, however it progresses
    /// (clients that trickle a byte now and then).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    transfer_timeout: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics (loopback port 9617
    /// when given alone).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:9617")]
    metrics: Option<String>,
    /// Serve the live dashboard (read only) at http://ADDR/ (loopback port
    /// 9618 when given alone); it serves /metrics too.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:9618")]
    http: Option<String>,
}

/// `--tls-verify-peer` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

/// `--tls` values (nbdkit's names).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    Off,
    On,
    Require,
}

fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    parse_size(s).ok_or_else(|| format!("'{s}' is not a size (examples: 4096, 64K, 32M, 1G)"))
}

/// The TLS acceptor and whether it is required, from the flags; checks that
/// a network listener is not left open in plaintext by accident.
fn tls_setup(a: &Args) -> Result<Option<(TlsAcceptor, bool)>> {
    let creds = match (&a.tls_certificates, &a.tls_psk) {
        (Some(dir), None) => Some(ServerCredentials::Certificates {
            dir: dir.clone(),
            verify_peer: verify_peer(a, dir)?,
        }),
        (None, Some(file)) => Some(ServerCredentials::Psk { file: file.clone() }),
        (None, None) => None,
        (Some(_), Some(_)) => unreachable!("clap: conflicting flags"),
    };
    let mode = a.tls.unwrap_or(if creds.is_some() {
        TlsMode::Require
    } else {
        TlsMode::Off
    });
    if let Some(addr) = &a.tcp {
        if mode != TlsMode::Require && !a.insecure && !is_loopback(addr)? {
            fail!(
                Usage,
                "--tcp {addr} serves the network without TLS: give --tls-certificates DIR or \
                 --tls-psk FILE (TLS is then required), or --insecure to serve plaintext anyway"
            );
        }
    }
    let acceptor = match (mode, creds) {
        (TlsMode::Off, _) => return Ok(None),
        (_, None) => fail!(
            Usage,
            "--tls={mode:?} needs --tls-certificates DIR or --tls-psk FILE"
        ),
        (_, Some(c)) => TlsAcceptor::new(&c).context("loading the TLS credentials")?,
    };
    Ok(Some((acceptor, mode == TlsMode::Require)))
}

/// Whether X.509 clients must present certificates: as asked, else
/// beyond loopback only (the bind address decides: 0.0.0.0 is beyond).
fn verify_peer(a: &Args, dir: &std::path::Path) -> Result<bool> {
    let beyond_loopback = match &a.tcp {
        Some(addr) => !is_loopback(addr)?,
        None => false,
    };
    let verify = match a.tls_verify_peer {
        Some(v) => v == OnOff::On,
        None => beyond_loopback,
    };
    if !verify && dir.join("ca-crl.pem").exists() {
        log::warn!(
            "{}: not used: client certificates are not verified (--tls-verify-peer=on uses it)",
            dir.join("ca-crl.pem").display()
        );
    }
    Ok(verify)
}

/// The resource bounds from the flags, checked.
fn server_limits(a: &Args) -> Result<ServerConfig> {
    let to_u32 = |v: u64, flag: &str| {
        u32::try_from(v).map_err(|_| classed!(Usage, "{flag} {v} is above 4 GiB"))
    };
    let max_request_bytes = to_u32(a.max_request_size, "--max-request-size")?;
    if max_request_bytes < 512 || max_request_bytes % 512 != 0 {
        fail!(
            Usage,
            "--max-request-size must be a non-zero multiple of 512"
        );
    }
    let per_conn = to_u32(a.conn_buffer, "--conn-buffer")?;
    if per_conn < max_request_bytes {
        fail!(Usage, "--conn-buffer must be at least --max-request-size");
    }
    if a.total_buffer < u64::from(per_conn) {
        fail!(Usage, "--total-buffer must be at least --conn-buffer");
    }
    Ok(ServerConfig {
        max_request_bytes,
        max_buffered_bytes_per_conn: per_conn,
        max_buffered_bytes_total: a.total_buffer,
        max_connections: a.max_connections as usize,
        max_handshakes: a.max_handshakes as usize,
        handshake_timeout: Duration::from_secs(a.handshake_timeout),
        stall_timeout: Duration::from_secs(a.stall_timeout),
        transfer_timeout: Duration::from_secs(a.transfer_timeout),
        ..ServerConfig::default()
    })
}

/// True if every address `addr` resolves to is a loopback address.
fn is_loopback(addr: &str) -> Result<bool> {
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .with_context(|| format!("--tcp {addr}: not an address"))?
        .collect();
    Ok(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()))
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    // Before anything is opened: a refused configuration changes nothing.
    let tls = tls_setup(a)?;
    let limits = server_limits(a)?;
    tiercache::device::set_origin_timeout(Duration::from_secs(a.origin_timeout));
    let source = if let (Some(origin), Some(size)) = (&a.origin, &a.ram_cache) {
        let mode = Mode::parse(&a.mode).with_context(|| format!("unknown mode '{}'", a.mode))?;
        EngineSource::Volatile {
            name: a.name.name.clone(),
            origin: origin.clone(),
            ram_size: size.clone(),
            options: CreateOptions {
                mode,
                block_bytes: parse_block_size(&a.block_size)?,
                policy: PolicyKind::default(),
                allow_data_loss: a.allow_data_loss,
                ..Default::default()
            },
        }
    } else {
        EngineSource::Registered {
            name: a.name.name.clone(),
            degraded: a.degraded,
            origin_grew: a.origin_grew,
        }
    };
    let config = DaemonConfig {
        source,
        nbd_socket: a.socket.clone(),
        tcp: a.tcp.as_ref().map(|addr| TcpListen {
            addr: addr.clone(),
            tls,
        }),
        nbd: ServerConfig {
            export_name: a.export_name.clone(),
            read_only: a.read_only,
            ..limits
        },
        ublk: a.ublk.then_some(UblkSettings {
            dev_id: a.ublk_id,
            nr_queues: a.ublk_queues,
            queue_depth: a.ublk_queue_depth,
            durable_writes: a.ublk_durable_writes,
        }),
        io_threads: a.io_threads,
        metrics: a.metrics.clone(),
        http: a.http.clone(),
        // Services beside the front end (engine + shutdown signal) go here.
        services: Vec::new(),
    };
    abort_on_panic();
    tiercache::daemon::run(reg, config)?;
    Ok(())
}

/// A panic is a bug. In a daemon, a thread that dies holding a client's
/// request leaves that client waiting (the kernel's NBD client for its
/// 30 s timeout, then EIO and a stuck filesystem): the guest test met this.
/// The whole process stops instead, at once; its clients see the
/// connection close, and the next start recovers every acknowledged write
/// from the journal and the crash log.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!(
            "tiercache: a thread panicked (a bug): stopping the daemon; the next start \
             recovers from the journal and the crash log"
        );
        std::process::abort();
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["tiercache", "serve"];
        v.extend_from_slice(extra);
        let cli = super::super::Cli::try_parse_from(v).unwrap();
        match cli.command {
            super::super::Command::Serve(a) => a,
            _ => panic!("not serve"),
        }
    }

    fn refusal(extra: &[&str]) -> String {
        format!("{:#}", tls_setup(&args(extra)).unwrap_err())
    }

    #[test]
    fn plaintext_beyond_loopback_needs_insecure() {
        for addr in ["0.0.0.0:10809", "[::]:10809", "192.0.2.1:10809"] {
            let e = refusal(&["--tcp", addr]);
            assert!(e.contains("without TLS") && e.contains("--insecure"), "{e}");
            let e = refusal(&["--tcp", addr, "--tls", "on", "--tls-psk", "/nonexistent"]);
            assert!(e.contains("without TLS"), "optional TLS is not enough: {e}");
            assert!(tls_setup(&args(&["--tcp", addr, "--insecure"]))
                .unwrap()
                .is_none());
        }
        for addr in ["127.0.0.1:10809", "[::1]:10809", "localhost:10809"] {
            assert!(
                tls_setup(&args(&["--tcp", addr])).unwrap().is_none(),
                "{addr}"
            );
        }
        assert!(tls_setup(&args(&["--tcp"])).unwrap().is_none());
        // Required TLS passes the check (and then needs readable credentials).
        let e = refusal(&["--tcp", "0.0.0.0:1", "--tls-psk", "/nonexistent/keys.psk"]);
        assert!(
            e.contains("TLS credentials") && e.contains("/nonexistent/keys.psk"),
            "{e}"
        );
    }

    #[test]
    fn tls_flags_are_checked() {
        let e = refusal(&["--tls", "require"]);
        assert!(
            e.contains("needs --tls-certificates DIR or --tls-psk FILE"),
            "{e}"
        );
        let e = refusal(&["--tls-certificates", "/nonexistent"]);
        assert!(e.contains("server-cert.pem"), "{e}");
        assert!(tls_setup(&args(&["--tls", "off", "--tls-psk", "/x"]))
            .unwrap()
            .is_none());
        let cli = super::super::Cli::try_parse_from(["tiercache", "serve", "--tls-verify-peer"]);
        assert!(cli.is_err(), "--tls-verify-peer without certificates");
        let cli = super::super::Cli::try_parse_from([
            "tiercache",
            "serve",
            "--tls-psk",
            "/a",
            "--tls-certificates",
            "/b",
        ]);
        assert!(cli.is_err(), "both kinds of credentials");
    }

    /// Beyond loopback, X.509 asks for client certificates unless told
    /// not to; on loopback it does not unless asked.
    #[test]
    fn client_certificates_are_required_beyond_loopback() {
        let dir = std::path::Path::new("/nonexistent");
        let verify = |extra: &[&str]| {
            let mut v = vec!["--tls-certificates", "/nonexistent"];
            v.extend_from_slice(extra);
            verify_peer(&args(&v), dir).unwrap()
        };
        assert!(verify(&["--tcp", "0.0.0.0:10809"]));
        assert!(verify(&["--tcp", "[::]:10809"]));
        assert!(verify(&["--tcp", "192.0.2.1:10809"]));
        assert!(!verify(&[
            "--tcp",
            "0.0.0.0:10809",
            "--tls-verify-peer=off"
        ]));
        assert!(!verify(&[
            "--tcp",
            "0.0.0.0:10809",
            "--tls-verify-peer",
            "off"
        ]));
        assert!(!verify(&["--tcp", "127.0.0.1:10809"]));
        assert!(!verify(&["--tcp"]));
        assert!(!verify(&[]));
        assert!(verify(&["--tcp", "127.0.0.1:10809", "--tls-verify-peer"]));
        assert!(verify(&[
            "--tcp",
            "127.0.0.1:10809",
            "--tls-verify-peer=on"
        ]));
    }

    #[test]
    fn limits_are_checked() {
        let lim = |extra: &[&str]| server_limits(&args(extra));
        let c = lim(&[]).unwrap();
        assert_eq!(c.max_request_bytes, 64 << 20);
        assert_eq!(c.max_buffered_bytes_per_conn, 128 << 20);
        assert_eq!(c.max_buffered_bytes_total, 512 << 20);
        assert_eq!((c.max_connections, c.max_handshakes), (64, 64));
        assert_eq!(c.transfer_timeout, Duration::from_secs(120));
        let c = lim(&["--max-handshakes", "3", "--transfer-timeout", "2"]).unwrap();
        assert_eq!(c.max_handshakes, 3);
        assert_eq!(c.transfer_timeout, Duration::from_secs(2));
        let cli =
            super::super::Cli::try_parse_from(["tiercache", "serve", "--transfer-timeout", "0"]);
        assert!(cli.is_err(), "a transfer timeout of 0");
        assert!(lim(&["--max-request-size", "1000"]).is_err());
        assert!(lim(&["--conn-buffer", "1M"]).is_err());
        assert!(lim(&["--total-buffer", "64M"]).is_err());
        assert!(lim(&["--max-request-size", "8G"]).is_err());
        let c = lim(&[
            "--max-request-size",
            "1M",
            "--conn-buffer",
            "2M",
            "--total-buffer",
            "4M",
        ])
        .unwrap();
        assert_eq!(
            (c.max_request_bytes, c.max_buffered_bytes_total),
            (1 << 20, 4 << 20)
        );
    }
}
