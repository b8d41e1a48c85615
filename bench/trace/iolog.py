"""Trace -> fio iolog, for replay with fio's `read_iolog` over `ioengine=nbd`.

Folding. A trace's offsets can span a disk far larger than the volume the
benchmark creates (MSR volumes are up to hundreds of GiB, of which a few
GiB are touched). `fold` maps the trace onto a small volume without
changing its cache behaviour: the touched 1 MiB chunks, in offset order,
are packed next to each other. Offsets inside a chunk are kept, so are
alignment, sequential runs and every reuse. If the packed trace is still
larger than a volume size the caller insists on, chunks wrap modulo the
volume (that merges unrelated data; the report says so).

fio quirks this module works around (fio 3.33, Debian 12; see docs/trace.md):

1. When the log runs out, fio marks the job done and its final reap
   returns at once (`td_io_getevents` returns 0 once `td->done` is set):
   the last requests still in flight at iodepth > 1 are abandoned. They
   count in `total_ios` but not in `io_bytes`, the runtime ends early, and
   the NBD connection is closed under them (nbdkit logs "write reply:
   Broken pipe"; nbdkit 1.32 sometimes aborts with "raw_send_socket:
   Assertion `sock >= 0' failed"). Fix: `--number_ios=N` with N the
   number of requests; fio then stops issuing before it asks the empty
   log for more and waits for every request in flight.
2. A trailing `close` action closes the file with requests in flight, with
   the same effect: the iolog here never closes the file.
3. Version 3 timestamps are microseconds, and fio skips the delay before
   an entry when the previous timestamp is 0 (`delay_since_ttime` treats
   0 as "no previous entry"): timestamps here start at 1.
4. Requests beyond the export's end fail the job with ENOSPC (error 28):
   the volume must hold the folded trace.
5. fio's nbd engine asserts requests of at most 64 MiB, tiercache serves
   at most 32 MiB: larger trace requests are split.
"""

import os

from readers import Req

FOLD_CHUNK_BYTES = 1 << 20
# tiercache's NBD server limit (max_request_bytes): larger requests are split.
MAX_REQUEST_BYTES = 32 << 20
IOLOG_FILE = "nbd"


def extent_bytes(requests):
    return max((r.offset + r.length for r in requests), default=0)


def fold(requests, volume_bytes=None, chunk_bytes=FOLD_CHUNK_BYTES):
    """(requests, volume_bytes, notes): the trace packed onto the touched
    chunks; `volume_bytes` defaults to the packed size."""
    notes = []
    chunks = set()
    for r in requests:
        first = r.offset // chunk_bytes
        last = (r.offset + r.length - 1) // chunk_bytes
        chunks.update(range(first, last + 1))
    order = sorted(chunks)
    dense = order and order[-1] == len(order) - 1
    if dense:
        packed = requests
    else:
        rank = {c: i for i, c in enumerate(order)}
        packed = []
        for r in requests:
            c = r.offset // chunk_bytes
            new = rank[c] * chunk_bytes + r.offset % chunk_bytes
            packed.append(Req(r.t_us, r.write, new, r.length))
        notes.append(f"offsets packed onto the {len(order)} touched {chunk_bytes >> 20} MiB chunks "
                     f"(trace extent {extent_bytes(requests) / 2**30:.2f} GiB)")
    need = len(order) * chunk_bytes
    if volume_bytes is None:
        return packed, need, notes
    if need <= volume_bytes:
        return packed, volume_bytes, notes
    wrapped = []
    for r in packed:
        off = r.offset % volume_bytes
        if off + r.length > volume_bytes:
            off = max(0, volume_bytes - r.length) // 512 * 512
        wrapped.append(Req(r.t_us, r.write, off, r.length))
    notes.append(f"packed trace ({need >> 20} MiB) wrapped modulo the {volume_bytes >> 20} MiB volume: "
                 f"unrelated data now shares blocks")
    return wrapped, volume_bytes, notes


def split_large(requests, max_bytes=MAX_REQUEST_BYTES):
    """(requests, number split): requests over `max_bytes` become several."""
    out = []
    split = 0
    for r in requests:
        if r.length <= max_bytes:
            out.append(r)
            continue
        split += 1
        off, left = r.offset, r.length
        while left > 0:
            n = min(left, max_bytes)
            out.append(Req(r.t_us, r.write, off, n))
            off += n
            left -= n
    return out, split


def write_iolog(requests, path, timing=False, flush_every=0):
    """Writes a version 2 iolog (no timing) or a version 3 one (timing kept:
    microsecond timestamps, starting at 1); with `flush_every` N > 0, a
    `sync` entry (fio's nbd engine sends NBD FLUSH) after every N writes.
    Returns the number of read and write entries, which is what
    `--number_ios` must be (fio does not count syncs there)."""
    if flush_every < 0:
        raise ValueError(f"flush_every must be 0 (never) or more, not {flush_every}")
    writes = 0
    with open(path, "w") as f:
        if timing:
            f.write("fio version 3 iolog\n")
            f.write(f"1 {IOLOG_FILE} add\n1 {IOLOG_FILE} open\n")
        else:
            f.write("fio version 2 iolog\n")
            f.write(f"{IOLOG_FILE} add\n{IOLOG_FILE} open\n")
        for r in requests:
            t = f"{int(r.t_us) + 1} " if timing else ""
            f.write(f"{t}{IOLOG_FILE} {'write' if r.write else 'read'} {r.offset} {r.length}\n")
            writes += r.write
            if r.write and flush_every and writes % flush_every == 0:
                f.write(f"{t}{IOLOG_FILE} sync 0 0\n")
        # No trailing "close": see quirk 2 above.
    return len(requests)


def read_iolog_counts(path):
    """(reads, writes, read bytes, write bytes) of an iolog, to check a replay."""
    reads = writes = rbytes = wbytes = 0
    with open(path) as f:
        header = f.readline().strip()
        if header not in ("fio version 2 iolog", "fio version 3 iolog"):
            raise ValueError(f"{path}: not a fio version 2 or 3 iolog")
        io_fields = 5 if header.endswith("3 iolog") else 4
        for line in f:
            p = line.split()
            if len(p) != io_fields:
                continue
            act, length = p[-3], int(p[-1])
            if act == "read":
                reads += 1
                rbytes += length
            elif act == "write":
                writes += 1
                wbytes += length
    return reads, writes, rbytes, wbytes


def read_iolog_syncs(path):
    """The `sync` entries (flushes) of an iolog."""
    with open(path) as f:
        return sum(1 for line in f if line.split()[-3:-2] == ["sync"])


def fio_args(iolog_path, n_requests, iodepth=16, timing=False):
    """fio options (after --ioengine=nbd --uri=...) that replay the iolog
    to its end and wait for every request (quirk 1)."""
    args = [f"--read_iolog={os.path.abspath(iolog_path)}", f"--number_ios={n_requests}",
            f"--iodepth={iodepth}"]
    if not timing:
        args.append("--replay_no_stall=1")
    return args


def check_replay(job, counts, syncs=0):
    """Raises ValueError unless fio's job result (its JSON `jobs[0]`) did
    every request of the iolog with every byte, and its `syncs` flushes."""
    reads, writes, rbytes, wbytes = counts
    got = (job["read"]["total_ios"], job["write"]["total_ios"],
           job["read"]["io_bytes"], job["write"]["io_bytes"])
    want = (reads, writes, rbytes, wbytes)
    if job.get("error"):
        raise ValueError(f"fio job error {job['error']}")
    if got != want:
        raise ValueError(f"replay incomplete: fio did reads/writes {got[0]}/{got[1]} with "
                         f"{got[2]}/{got[3]} bytes, the iolog has {want[0]}/{want[1]} with "
                         f"{want[2]}/{want[3]} bytes")
    done_syncs = job.get("sync", {}).get("total_ios", 0)
    if done_syncs != syncs:
        raise ValueError(f"replay incomplete: fio sent {done_syncs} flushes, the iolog has {syncs}")
