"""A minimal kernel NBD client for the guest tests: connects /dev/nbdN to a
Unix-socket NBD server over the kernel's generic-netlink NBD interface with
a dead-connection timeout, and can later hand the device a new connection
(NBD_CMD_RECONFIGURE). With that, a `tiercache serve` killed with -9 and
restarted takes over the device's queued requests, and the filesystem on it
sees no error. nbd-client 3.24 sets no dead-connection timeout and cannot
reconfigure, hence this tool.

    python3 nbd_netlink.py connect SOCK INDEX DEAD_TIMEOUT_S
    python3 nbd_netlink.py reconfigure SOCK INDEX
    python3 nbd_netlink.py disconnect INDEX

Handshake: NBD proto.md, fixed newstyle, NBD_OPT_GO for the default export.
Netlink attributes: include/uapi/linux/nbd-netlink.h.
"""
import os
import socket
import struct
import sys

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3E889045565A9
NBD_FLAG_FIXED_NEWSTYLE = 1
NBD_FLAG_C_FIXED_NEWSTYLE = 1
NBD_FLAG_C_NO_ZEROES = 2
NBD_OPT_GO = 7
NBD_REP_ACK = 1
NBD_REP_INFO = 3
NBD_INFO_EXPORT = 0

# Generic netlink.
NETLINK_GENERIC = 16
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NLA_F_NESTED = 0x8000

# nbd-netlink.h
NBD_CMD_CONNECT = 1
NBD_CMD_DISCONNECT = 2
NBD_CMD_RECONFIGURE = 3
NBD_ATTR_INDEX = 1
NBD_ATTR_SIZE_BYTES = 2
NBD_ATTR_BLOCK_SIZE_BYTES = 3
NBD_ATTR_TIMEOUT = 4
NBD_ATTR_SERVER_FLAGS = 5
NBD_ATTR_SOCKETS = 7
NBD_ATTR_DEAD_CONN_TIMEOUT = 8
NBD_SOCK_ITEM = 1
NBD_SOCK_FD = 1

# A request on a dead connection is requeued when it times out (then it
# waits up to the dead-connection timeout for a new one): kept short so
# that the requests in flight when the server died are resent soon.
REQUEST_TIMEOUT_S = 10


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("server closed the connection during the handshake")
        buf += chunk
    return buf


def handshake(path):
    """Connects and negotiates; returns (socket, size_bytes, transmission flags)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    magic, opt_magic, hflags = struct.unpack(">QQH", recv_exact(s, 18))
    if magic != NBDMAGIC or opt_magic != IHAVEOPT or not hflags & NBD_FLAG_FIXED_NEWSTYLE:
        raise OSError("not a fixed-newstyle NBD server")
    s.sendall(struct.pack(">I", NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES))
    name = b""
    data = struct.pack(">I", len(name)) + name + struct.pack(">H", 0)
    s.sendall(struct.pack(">QII", IHAVEOPT, NBD_OPT_GO, len(data)) + data)
    size = flags = None
    while True:
        magic, opt, rtype, rlen = struct.unpack(">QIII", recv_exact(s, 20))
        payload = recv_exact(s, rlen)
        if magic != REPLY_MAGIC or opt != NBD_OPT_GO:
            raise OSError("bad option reply")
        if rtype == NBD_REP_INFO and struct.unpack(">H", payload[:2])[0] == NBD_INFO_EXPORT:
            _, size, flags = struct.unpack(">HQH", payload[:12])
        elif rtype == NBD_REP_ACK:
            break
        elif rtype & 0x80000000:
            raise OSError(f"NBD_OPT_GO refused: reply type {rtype:#x} {payload!r}")
    if size is None:
        raise OSError("no NBD_INFO_EXPORT in the reply")
    return s, size, flags


def nla(atype, payload):
    n = 4 + len(payload)
    return struct.pack("=HH", n, atype) + payload + b"\0" * ((4 - n % 4) % 4)


def genl_request(nl, family, cmd, attrs):
    body = struct.pack("=BBH", cmd, 1, 0) + attrs
    msg = struct.pack("=IHHII", 16 + len(body), family, NLM_F_REQUEST | NLM_F_ACK, 1, os.getpid()) + body
    nl.send(msg)
    reply = nl.recv(65536)
    off = 0
    while off < len(reply):
        length, mtype = struct.unpack("=IH", reply[off:off + 6])
        if mtype == NLMSG_ERROR:
            err = struct.unpack("=i", reply[off + 16:off + 20])[0]
            if err:
                raise OSError(-err, os.strerror(-err))
            return reply
        if mtype == family or mtype == GENL_ID_CTRL:
            return reply[off:off + length]
        off += (length + 3) & ~3
    return reply


def nbd_family(nl):
    reply = genl_request(nl, GENL_ID_CTRL, CTRL_CMD_GETFAMILY, nla(CTRL_ATTR_FAMILY_NAME, b"nbd\0"))
    off = 20
    while off + 4 <= len(reply):
        alen, atype = struct.unpack("=HH", reply[off:off + 4])
        if atype == CTRL_ATTR_FAMILY_ID:
            return struct.unpack("=H", reply[off + 4:off + 6])[0]
        off += (alen + 3) & ~3
    raise OSError("no nbd generic netlink family (is the nbd module loaded?)")


def sockets_attr(fd):
    return nla(NBD_ATTR_SOCKETS | NLA_F_NESTED,
               nla(NBD_SOCK_ITEM | NLA_F_NESTED, nla(NBD_SOCK_FD, struct.pack("=I", fd))))


def main():
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
    nl.bind((0, 0))
    family = nbd_family(nl)
    cmd = sys.argv[1]
    if cmd == "connect":
        path, index, dead_s = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        s, size, flags = handshake(path)
        attrs = (nla(NBD_ATTR_INDEX, struct.pack("=I", index))
                 + nla(NBD_ATTR_SIZE_BYTES, struct.pack("=Q", size))
                 + nla(NBD_ATTR_BLOCK_SIZE_BYTES, struct.pack("=Q", 4096))
                 + nla(NBD_ATTR_TIMEOUT, struct.pack("=Q", REQUEST_TIMEOUT_S))
                 + nla(NBD_ATTR_SERVER_FLAGS, struct.pack("=Q", flags))
                 + nla(NBD_ATTR_DEAD_CONN_TIMEOUT, struct.pack("=Q", dead_s))
                 + sockets_attr(s.fileno()))
        genl_request(nl, family, NBD_CMD_CONNECT, attrs)
    elif cmd == "reconfigure":
        path, index = sys.argv[2], int(sys.argv[3])
        s, _, _ = handshake(path)
        attrs = nla(NBD_ATTR_INDEX, struct.pack("=I", index)) + sockets_attr(s.fileno())
        genl_request(nl, family, NBD_CMD_RECONFIGURE, attrs)
    elif cmd == "disconnect":
        genl_request(nl, family, NBD_CMD_DISCONNECT, nla(NBD_ATTR_INDEX, struct.pack("=I", int(sys.argv[2]))))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
