//! Raw-socket tests of the NBD server: malformed and hostile input, limits,
//! structured replies, pipelining, and a seeded random mutation test. A
//! second "bystander" client keeps working through every case.

#[path = "common/nbd.rs"]
mod common;
#[path = "common/mutation.rs"]
mod mutation;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{check_healthy, RawClient, TestServer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::nbd::proto;

const SIZE: u64 = 8 << 20;

/// A client connected through every case; checks it still gets answers.
struct Bystander {
    c: RawClient,
    round: u64,
}

impl Bystander {
    fn new(server: &TestServer) -> Self {
        let mut c = server.client();
        c.handshake(false);
        Bystander { c, round: 0 }
    }

    fn check(&mut self) {
        self.round += 1;
        let offset = (SIZE / 2) + self.round * 4096;
        let data = vec![self.round as u8; 4096];
        assert_eq!(self.c.write(self.round * 2, offset, &data), 0);
        let (e, back) = self.c.read(self.round * 2 + 1, offset, 4096);
        assert_eq!((e, back), (0, data), "bystander round {}", self.round);
    }
}

#[test]
fn malformed_handshakes_disconnect() {
    let server = TestServer::start(SIZE, TestServer::test_config());
    let mut by = Bystander::new(&server);

    // Client without fixed newstyle, and with unknown client flags.
    for flags in [0u32, 2, 4, 0xffff_ffff] {
        let mut c = server.client();
        c.read_hello();
        c.s.write_all(&flags.to_be_bytes()).unwrap();
        c.expect_closed();
        by.check();
    }
    // Option with a bad magic.
    let mut c = server.client();
    c.read_hello();
    c.s.write_all(&1u32.to_be_bytes()).unwrap();
    c.s.write_all(&[0x55; 16]).unwrap();
    c.expect_closed();
    by.check();
    // Option data beyond the limit (64 KiB): hard disconnect.
    let mut c = server.client();
    c.read_hello();
    c.s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut h = proto::IHAVEOPT.to_be_bytes().to_vec();
    h.extend_from_slice(&proto::OPT_GO.to_be_bytes());
    h.extend_from_slice(&(1u32 << 20).to_be_bytes());
    c.s.write_all(&h).unwrap();
    c.expect_closed();
    by.check();
    // Too many options.
    let mut c = server.client();
    c.read_hello();
    c.s.write_all(&3u32.to_be_bytes()).unwrap();
    for _ in 0..32 {
        c.send_option(proto::OPT_LIST, &[]);
        assert_eq!(c.read_option_reply().1, proto::REP_SERVER);
        assert_eq!(c.read_option_reply().1, proto::REP_ACK);
    }
    c.send_option(proto::OPT_LIST, &[]);
    c.expect_closed();
    by.check();
    // NBD_OPT_EXPORT_NAME of an unknown export: the only answer is a close.
    let mut c = server.client();
    c.read_hello();
    c.s.write_all(&3u32.to_be_bytes()).unwrap();
    c.send_option(proto::OPT_EXPORT_NAME, b"no-such-export");
    c.expect_closed();
    // A client that vanishes mid-option.
    let mut c = server.client();
    c.read_hello();
    c.s.write_all(&3u32.to_be_bytes()).unwrap();
    c.s.write_all(&proto::IHAVEOPT.to_be_bytes()[..5]).unwrap();
    drop(c);
    by.check();
    check_healthy(&server);
}

#[test]
fn option_replies() {
    let mut config = TestServer::test_config();
    config.export_name = "disk0".into();
    let server = TestServer::start(SIZE, config);
    let mut c = server.client();
    c.read_hello();
    c.s.write_all(&1u32.to_be_bytes()).unwrap(); // no NO_ZEROES
    c.send_option(proto::OPT_LIST, &[]);
    let (_, t, d) = c.read_option_reply();
    assert_eq!(t, proto::REP_SERVER);
    assert_eq!(&d[4..], b"disk0");
    assert_eq!(c.read_option_reply().1, proto::REP_ACK);
    c.send_option(proto::OPT_LIST, b"x");
    assert_eq!(c.read_option_reply().1, proto::REP_ERR_INVALID);
    c.send_option(99, b"whatever");
    assert_eq!(
        c.read_option_reply(),
        (99, proto::REP_ERR_UNSUP, b"option not supported".to_vec())
    );
    c.send_option(proto::OPT_STARTTLS, &[]);
    assert_eq!(c.read_option_reply().1, proto::REP_ERR_UNSUP);
    c.send_option(proto::OPT_INFO, &RawClient::info_data("nope", &[]));
    assert_eq!(c.read_option_reply().1, proto::REP_ERR_UNKNOWN);
    c.send_option(proto::OPT_GO, &[0, 0, 0, 9, 1]);
    assert_eq!(c.read_option_reply().1, proto::REP_ERR_INVALID);
    c.send_option(
        proto::OPT_INFO,
        &RawClient::info_data(
            "disk0",
            &[
                proto::INFO_NAME,
                proto::INFO_DESCRIPTION,
                proto::INFO_BLOCK_SIZE,
            ],
        ),
    );
    let mut infos = Vec::new();
    loop {
        let (opt, t, d) = c.read_option_reply();
        assert_eq!(opt, proto::OPT_INFO);
        if t == proto::REP_ACK {
            break;
        }
        assert_eq!(t, proto::REP_INFO);
        infos.push(d);
    }
    let export = infos
        .iter()
        .find(|d| d[..2] == [0, 0])
        .expect("INFO_EXPORT");
    assert_eq!(u64::from_be_bytes(export[2..10].try_into().unwrap()), SIZE);
    let block = infos
        .iter()
        .find(|d| d[..2] == [0, 3])
        .expect("INFO_BLOCK_SIZE");
    assert_eq!(block[2..], [0, 0, 2, 0, 0, 0, 16, 0, 0, 16, 0, 0]);
    assert!(infos.iter().any(|d| d[..] == b"\0\x01disk0"[..]));
    // NBD_OPT_EXPORT_NAME without NO_ZEROES: size, flags, 124 zeroes.
    c.send_option(proto::OPT_EXPORT_NAME, b"disk0");
    let r = c.read_n(10 + 124);
    assert_eq!(u64::from_be_bytes(r[..8].try_into().unwrap()), SIZE);
    assert!(r[10..].iter().all(|&b| b == 0));
    assert_eq!(c.write(1, 0, &[9u8; 512]), 0);
    // NBD_OPT_ABORT is acknowledged.
    let mut a = server.client();
    a.read_hello();
    a.s.write_all(&3u32.to_be_bytes()).unwrap();
    a.send_option(proto::OPT_ABORT, &[]);
    assert_eq!(a.read_option_reply().1, proto::REP_ACK);
    a.expect_closed();
}

#[test]
fn stuck_handshake_times_out() {
    let mut config = TestServer::test_config();
    config.handshake_timeout = Duration::from_millis(300);
    let server = TestServer::start(SIZE, config);
    let mut c = server.client();
    c.read_hello();
    let t = Instant::now();
    c.expect_closed();
    assert!(t.elapsed() < Duration::from_secs(5));
    check_healthy(&server);
}

/// Sends NBD_OPT_GO; returns the final reply's type and its data.
fn go(c: &mut RawClient) -> (u32, Vec<u8>) {
    c.send_option(proto::OPT_GO, &RawClient::info_data("", &[]));
    loop {
        let (opt, t, d) = c.read_option_reply();
        assert_eq!(opt, proto::OPT_GO);
        if t != proto::REP_INFO {
            return (t, d);
        }
    }
}

#[test]
fn handshakes_and_served_clients_have_their_own_slots() {
    let mut config = TestServer::test_config();
    config.max_connections = 1;
    config.max_handshakes = 2;
    let server = TestServer::start(SIZE, config);
    // Two handshakes under way, though one client may be served: a
    // handshake takes no transmission slot.
    let mut a = server.client();
    a.read_hello();
    a.s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut b = server.client();
    b.read_hello();
    b.s.write_all(&3u32.to_be_bytes()).unwrap();
    // A third connection finds the handshake slots taken: closed at once.
    let mut c = server.client();
    c.expect_closed();
    // The first to ask enters transmission; the second is told why not
    // (NBD_REP_ERR_POLICY, as nbd-server) and may go on haggling.
    assert_eq!(go(&mut a).0, proto::REP_ACK);
    let (t, msg) = go(&mut b);
    assert_eq!(t, proto::REP_ERR_POLICY);
    assert!(String::from_utf8_lossy(&msg).contains("too many clients"));
    // NBD_OPT_EXPORT_NAME has no error reply: the connection is closed.
    let mut d = server.client();
    d.read_hello();
    d.s.write_all(&3u32.to_be_bytes()).unwrap();
    d.send_option(proto::OPT_EXPORT_NAME, b"");
    d.expect_closed();
    // Once the served client leaves, the waiting one gets in.
    a.send_request(proto::CMD_DISC, 0, 1, 0, 0);
    a.expect_closed();
    let t0 = Instant::now();
    while go(&mut b).0 != proto::REP_ACK {
        assert!(t0.elapsed() < Duration::from_secs(5), "slot never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (e, _) = b.read(7, 0, 4096);
    assert_eq!(e, 0);
}

/// True once the server has closed its end, even with its data unread.
fn peer_closed(s: &std::os::unix::net::UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd, valid for the call, which does not wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0
}

#[test]
fn a_reply_read_a_byte_at_a_time_is_cut_off_at_the_transfer_timeout() {
    let mut config = TestServer::test_config();
    config.transfer_timeout = Duration::from_secs(1);
    config.stall_timeout = Duration::from_secs(60);
    let server = TestServer::start(SIZE, config);
    let mut c = server.client();
    c.handshake(false);
    c.send_request(proto::CMD_READ, 0, 1, 0, 1 << 20);
    // A byte every 5 ms: progress, so the stall timer never fires.
    let t = Instant::now();
    let mut got = 0;
    while !peer_closed(&c.s) {
        let mut b = [0u8; 1];
        got += c.s.read(&mut b).unwrap();
        assert!(t.elapsed() < Duration::from_secs(10), "still open");
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
    assert!(got < 1 << 20, "the whole reply was read: {got} bytes");
    check_healthy(&server);
}

#[test]
fn bad_requests() {
    use proto::*;
    let server = TestServer::start(SIZE, TestServer::test_config());
    let mut by = Bystander::new(&server);
    let mut c = server.client();
    let (size, flags) = c.handshake(false);
    assert_eq!(size, SIZE);
    let want = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_FAST_ZERO
        | FLAG_SEND_CACHE
        | FLAG_CAN_MULTI_CONN;
    assert_eq!(flags, want);

    let mut expect = |c: &mut RawClient, cmd, fl, off, len, payload: &[u8], errno| {
        c.send_request(cmd, fl, 77, off, len);
        c.s.write_all(payload).unwrap();
        assert_eq!(
            c.read_simple_reply(),
            (77, errno),
            "cmd {cmd} flags {fl:#x} at {off}+{len}"
        );
        by.check();
    };
    expect(&mut c, 42, 0, 0, 512, &[], EINVAL);
    expect(&mut c, CMD_BLOCK_STATUS, 0, 0, 512, &[], EINVAL);
    expect(&mut c, CMD_READ, CMD_FLAG_DF, 0, 512, &[], EINVAL);
    expect(&mut c, CMD_READ, 1 << 9, 0, 512, &[], EINVAL);
    // An unknown flag on a write: the payload is consumed, framing kept.
    expect(&mut c, CMD_WRITE, 1 << 12, 0, 1024, &[1; 1024], EINVAL);
    expect(&mut c, CMD_READ, 0, SIZE, 512, &[], EINVAL);
    expect(&mut c, CMD_READ, 0, SIZE - 512, 1024, &[], EINVAL);
    expect(&mut c, CMD_READ, 0, u64::MAX - 511, 1024, &[], EINVAL);
    expect(&mut c, CMD_CACHE, 0, SIZE, 512, &[], EINVAL);
    expect(&mut c, CMD_WRITE, 0, SIZE, 512, &[2; 512], ENOSPC);
    expect(&mut c, CMD_WRITE_ZEROES, 0, SIZE - 512, 1024, &[], ENOSPC);
    expect(&mut c, CMD_READ, 0, 1, 512, &[], EINVAL);
    expect(&mut c, CMD_READ, 0, 0, 100, &[], EINVAL);
    expect(&mut c, CMD_WRITE, 0, 512, 100, &[3; 100], EINVAL);
    expect(&mut c, CMD_TRIM, 0, 100, 512, &[], EINVAL);
    expect(&mut c, CMD_READ, 0, 0, 2 << 20, &[], EINVAL);
    expect(
        &mut c,
        CMD_WRITE_ZEROES,
        CMD_FLAG_FAST_ZERO,
        0,
        512,
        &[],
        ENOTSUP,
    );
    // Zero-length requests are valid no-ops; FUA is accepted everywhere.
    expect(&mut c, CMD_READ, 0, 4096, 0, &[], 0);
    expect(&mut c, CMD_WRITE, 0, 4096, 0, &[], 0);
    expect(&mut c, CMD_READ, CMD_FLAG_FUA, 0, 512, &[], 0);
    c.read_n(512);
    expect(&mut c, CMD_FLUSH, 0, 0, 0, &[], 0);
    expect(&mut c, CMD_TRIM, CMD_FLAG_FUA, 0, 4096, &[], 0);
    expect(&mut c, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 4096, &[], 0);
    expect(&mut c, CMD_CACHE, 0, 0, 1 << 20, &[], 0);
    // The connection still works after all that.
    assert_eq!(c.write(5, 0, &[4; 4096]), 0);
    assert_eq!(c.read(6, 0, 4096), (0, vec![4; 4096]));

    // Bad request magic: disconnect.
    let mut b = server.client();
    b.handshake(false);
    let mut r = RawClient::request_bytes(CMD_READ, 0, 1, 0, 512);
    r[0] ^= 0xff;
    b.s.write_all(&r).unwrap();
    b.expect_closed();
    by.check();
    // Oversized write payload: disconnect (its payload is not consumed).
    let mut b = server.client();
    b.handshake(false);
    b.send_request(CMD_WRITE, 0, 1, 0, 2 << 20);
    b.expect_closed();
    by.check();
    // A client vanishing mid-write payload.
    let mut b = server.client();
    b.handshake(false);
    b.send_request(CMD_WRITE, 0, 1, 0, 64 << 10);
    b.s.write_all(&[5; 1000]).unwrap();
    drop(b);
    by.check();
    // A client vanishing with requests in flight.
    let mut b = server.client();
    b.handshake(false);
    for i in 0..16 {
        b.send_request(CMD_READ, 0, i, 0, 1 << 20);
    }
    drop(b);
    by.check();
    // Half a header, then EOF.
    let mut b = server.client();
    b.handshake(false);
    b.s.write_all(&r[..10]).unwrap();
    b.s.shutdown(std::net::Shutdown::Write).unwrap();
    b.expect_closed();
    by.check();
    // DISC: in-flight requests are answered before the close.
    let mut b = server.client();
    b.handshake(false);
    b.send_request(CMD_WRITE, 0, 9, 0, 4096);
    b.s.write_all(&[6; 4096]).unwrap();
    b.send_request(CMD_DISC, 0, 10, 0, 0);
    assert_eq!(b.read_simple_reply(), (9, 0));
    b.expect_closed();
    check_healthy(&server);
}

#[test]
fn read_only_export() {
    let mut config = TestServer::test_config();
    config.read_only = true;
    let server = TestServer::start(SIZE, config);
    let mut c = server.client();
    let (_, flags) = c.handshake(false);
    assert_ne!(flags & proto::FLAG_READ_ONLY, 0);
    assert_eq!(c.write(1, 0, &[1; 4096]), proto::EPERM);
    for cmd in [proto::CMD_TRIM, proto::CMD_WRITE_ZEROES] {
        c.send_request(cmd, 0, 2, 0, 4096);
        assert_eq!(c.read_simple_reply(), (2, proto::EPERM));
    }
    assert_eq!(c.read(3, 0, 4096), (0, vec![0; 4096]));
}

#[test]
fn structured_replies() {
    use proto::*;
    let server = TestServer::start(SIZE, TestServer::test_config());
    let mut c = server.client();
    c.handshake(true);
    c.send_request(CMD_WRITE, CMD_FLAG_FUA, 1, 4096, 4096);
    c.s.write_all(&[0xab; 4096]).unwrap();
    assert_eq!(c.read_reply_any().payload, vec![0; 4]);

    c.send_request(CMD_READ, 0, 2, 4096, 4096);
    let ch = c.read_reply_any();
    assert_eq!(
        (ch.flags, ch.reply_type, ch.cookie),
        (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 2)
    );
    assert_eq!(
        u64::from_be_bytes(ch.payload[..8].try_into().unwrap()),
        4096
    );
    assert!(ch.payload[8..].iter().all(|&b| b == 0xab) && ch.payload.len() == 8 + 4096);

    c.send_request(CMD_READ, 0, 3, SIZE, 512);
    let ch = c.read_reply_any();
    assert_eq!(
        (ch.flags, ch.reply_type, ch.cookie),
        (REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 3)
    );
    assert_eq!(
        u32::from_be_bytes(ch.payload[..4].try_into().unwrap()),
        EINVAL
    );
    let msg_len = u16::from_be_bytes(ch.payload[4..6].try_into().unwrap()) as usize;
    assert_eq!(ch.payload.len(), 6 + msg_len);

    c.send_request(CMD_READ, 0, 4, 0, 0);
    let ch = c.read_reply_any();
    assert_eq!(
        (ch.flags, ch.reply_type, ch.cookie),
        (REPLY_FLAG_DONE, REPLY_TYPE_NONE, 4)
    );
    assert!(ch.payload.is_empty());
}

#[test]
fn pipelined_requests() {
    let server = TestServer::start(SIZE, TestServer::test_config());
    let mut c = server.client();
    c.handshake(false);
    // More requests than the in-flight limit (16), without reading replies.
    let n = 200u64;
    let mut batch = Vec::new();
    for i in 0..n {
        batch.extend(RawClient::request_bytes(
            proto::CMD_WRITE,
            0,
            i,
            i * 4096,
            4096,
        ));
        batch.extend(vec![i as u8; 4096]);
    }
    let mut w = c.s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&batch).unwrap());
    let mut seen = vec![false; n as usize];
    for _ in 0..n {
        let (cookie, e) = c.read_simple_reply();
        assert_eq!(e, 0);
        assert!(!std::mem::replace(&mut seen[cookie as usize], true));
    }
    writer.join().unwrap();
    for i in 0..n {
        c.send_request(proto::CMD_READ, 0, i, i * 4096, 4096);
    }
    let mut got = 0;
    while got < n {
        let (cookie, e) = c.read_simple_reply();
        assert_eq!(e, 0);
        assert_eq!(c.read_n(4096), vec![cookie as u8; 4096]);
        got += 1;
    }
}

/// A plausible client byte stream: handshake, options, requests.
fn random_stream(rng: &mut ChaCha8Rng) -> Vec<u8> {
    use proto::*;
    let mut s = Vec::new();
    s.extend_from_slice(&3u32.to_be_bytes());
    let opt = |s: &mut Vec<u8>, code: u32, data: &[u8]| {
        s.extend_from_slice(&IHAVEOPT.to_be_bytes());
        s.extend_from_slice(&code.to_be_bytes());
        s.extend_from_slice(&(data.len() as u32).to_be_bytes());
        s.extend_from_slice(data);
    };
    for _ in 0..rng.gen_range(0..4) {
        match rng.gen_range(0..5) {
            0 => opt(&mut s, OPT_STRUCTURED_REPLY, &[]),
            1 => opt(&mut s, OPT_LIST, &[]),
            2 => opt(&mut s, OPT_INFO, &RawClient::info_data("", &[3, 1, 2])),
            3 => opt(&mut s, rng.gen_range(0..20), &[0u8; 8]),
            _ => opt(&mut s, OPT_INFO, &RawClient::info_data("x", &[])),
        }
    }
    if rng.gen_bool(0.8) {
        opt(&mut s, OPT_GO, &RawClient::info_data("", &[3]));
    } else {
        opt(&mut s, OPT_EXPORT_NAME, b"");
    }
    for cookie in 0..rng.gen_range(0..24u64) {
        let cmd = rng.gen_range(0..9u16);
        let flags = if rng.gen_bool(0.8) {
            0
        } else {
            rng.gen_range(0..64u16)
        };
        let offset = rng.gen_range(0..SIZE / 512 + 4) * 512;
        let len = rng.gen_range(0..64u32) * 512;
        s.extend(RawClient::request_bytes(cmd, flags, cookie, offset, len));
        if cmd == CMD_WRITE {
            s.extend((0..len).map(|_| rng.gen::<u8>()));
        }
    }
    if rng.gen_bool(0.5) {
        s.extend(RawClient::request_bytes(CMD_DISC, 0, 999, 0, 0));
    }
    s
}

fn mutate(rng: &mut ChaCha8Rng, s: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(0..5) {
        if s.is_empty() {
            return;
        }
        let at = rng.gen_range(0..s.len());
        match rng.gen_range(0..6) {
            0 => s[at] ^= 1 << rng.gen_range(0..8),
            1 => s[at] = rng.gen(),
            2 => s.truncate(at),
            3 => {
                let n = rng.gen_range(1..16);
                let junk: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                s.splice(at..at, junk);
            }
            4 => {
                let end = (at + rng.gen_range(1..64)).min(s.len());
                s.drain(at..end);
            }
            _ => {
                // Big-endian length or offset fields: set a high byte.
                s[at] = 0xff;
            }
        }
    }
}

#[test]
fn random_mutated_streams() {
    let seed = mutation::seed("NBD_FUZZ_SEED");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let server = TestServer::start(SIZE, TestServer::test_config());
    let mut by = Bystander::new(&server);
    let cases = 300u32;
    for case in 0..cases {
        let mut stream = random_stream(&mut rng);
        mutate(&mut rng, &mut stream);
        let mut c = server.client();
        let mut r = c.s.try_clone().unwrap();
        // Drain replies on another thread so a full socket never stalls us.
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match r.read(&mut buf) {
                    Ok(0) => return Ok(()),
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        });
        let _ = c.s.write_all(&stream);
        let _ = c.s.shutdown(std::net::Shutdown::Write);
        let ended = reader.join().unwrap();
        assert!(
            ended.is_ok(),
            "seed {seed} case {case}: connection did not end: {ended:?}"
        );
        if case.is_multiple_of(25) {
            by.check();
        }
        common::assert_no_server_panic();
    }
    by.check();
    check_healthy(&server);
}
