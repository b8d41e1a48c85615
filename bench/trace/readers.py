"""Block trace readers: SNIA / MSR Cambridge CSV and blkparse text.

Both give a `Trace`: requests in trace order as `Req(t_us, write, offset,
length)` tuples (time in microseconds from the first request, offsets and
lengths in bytes), plus what was skipped and why. A line that cannot be
parsed raises `TraceError` naming the file and line; nothing else escapes
as a traceback.

MSR Cambridge (SNIA IOTTA "MSR Cambridge Traces"), one request per line:

    Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime
    128166372003061629,hm,0,Write,3387047936,8192,1131

Timestamp is a Windows FILETIME (100 ns units), Type is Read or Write,
Offset and Size are bytes. A header line naming the columns is accepted.

blkparse, default output format, one event per line:

    8,0    1        1     0.000000000  1234  Q  WS 123456 + 8 [jbd2/sda1-8]

Only one event kind is taken (Q, queued, by default: what the file system
asked for, before the elevator merged or split it). Sectors are 512 bytes.
RWBS: D (discard) is skipped, W is a write, R a read; a request with
neither (N, a pure flush F or FN) carries no data and is skipped; a
leading F (preflush) or trailing F (FUA) on a write is dropped and counted.
Lines that are not events (blkparse's summary, plug/unplug and message
lines) are skipped.
"""

import gzip
import io
import re
from collections import namedtuple

SECTOR_BYTES = 512
# 100 ns FILETIME ticks per microsecond.
_FILETIME_PER_US = 10

Req = namedtuple("Req", "t_us write offset length")


class TraceError(Exception):
    """Bad input: the message names the file and line."""


class Trace:
    """Requests in trace order, and counts of what the reader skipped."""

    def __init__(self, requests, source, fmt, skipped=None, notes=None):
        self.requests = requests
        self.source = source
        self.format = fmt
        self.skipped = skipped or {}
        self.notes = notes or []

    def __len__(self):
        return len(self.requests)


def _open_text(path):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, "r", encoding="utf-8", errors="replace")


def _int(field, what, path, lineno):
    try:
        v = int(field.strip())
    except ValueError:
        raise TraceError(f"{path}:{lineno}: {what} is not an integer: {field.strip()!r}") from None
    if v < 0:
        raise TraceError(f"{path}:{lineno}: {what} is negative: {v}")
    return v


def _pick_device(seen, wanted, path, what):
    """The device to keep: `wanted` if given, else the only one present."""
    if wanted is not None:
        return wanted
    if len(seen) > 1:
        names = ", ".join(sorted(seen)[:8])
        raise TraceError(f"{path}: the trace holds several {what}s ({names}); choose one with --device")
    return next(iter(seen)) if seen else None


def read_msr(path, device=None, limit=None):
    """MSR Cambridge / SNIA CSV. `device` is "HOST/DISK" (e.g. "hm/0");
    without it the file must hold one disk. `limit` keeps the first N
    requests of that disk."""
    rows = []
    seen = set()
    skipped = {}
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split(",")
            if lineno == 1 and fields[0].strip().lower() == "timestamp":
                continue  # header
            if len(fields) != 7:
                raise TraceError(
                    f"{path}:{lineno}: expected 7 comma-separated fields "
                    f"(Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime), got {len(fields)}")
            ts = _int(fields[0], "Timestamp", path, lineno)
            disk = f"{fields[1].strip()}/{_int(fields[2], 'DiskNumber', path, lineno)}"
            kind = fields[3].strip().lower()
            if kind not in ("read", "write"):
                raise TraceError(f"{path}:{lineno}: Type must be Read or Write, got {fields[3].strip()!r}")
            offset = _int(fields[4], "Offset", path, lineno)
            size = _int(fields[5], "Size", path, lineno)
            _int(fields[6], "ResponseTime", path, lineno)
            if device is not None and disk != device:
                continue
            seen.add(disk)
            if size == 0:
                skipped["zero-length"] = skipped.get("zero-length", 0) + 1
                continue
            rows.append((ts, kind == "write", offset, size))
            if limit is not None and len(rows) >= limit and device is not None:
                break
    chosen = _pick_device(seen, device, path, "disk")
    if device is None and limit is not None:
        rows = rows[:limit]
    if not rows:
        raise TraceError(f"{path}: no requests" + (f" for disk {chosen}" if chosen else ""))
    return Trace(_to_requests(rows, _FILETIME_PER_US), path, "msr", skipped,
                 [f"disk {chosen}"] if chosen else [])


def _to_requests(rows, ticks_per_us):
    """(ticks, write, offset, length) rows -> Req list with time from the
    first request, in microseconds. Rows stay in file order: MSR files are
    sorted by time, and a replay keeps the order it is given."""
    t0 = min(r[0] for r in rows)
    return [Req((r[0] - t0) / ticks_per_us, r[1], r[2], r[3]) for r in rows]


# blkparse default format:
# "%D %2c %8s %5T.%9t %5p %2a %3d " then action-specific text; for a request
# with data: "SECTOR + NSECTORS [PROCESS]".
_BLK_EVENT = re.compile(
    r"^\s*(?P<dev>\d+,\d+)\s+(?P<cpu>\d+)\s+(?P<seq>\d+)\s+(?P<time>\d+\.\d+)\s+"
    r"(?P<pid>\d+)\s+(?P<action>[A-Za-z]+)\s+(?P<rwbs>[A-Z]+)\s*(?P<rest>.*)$")
_BLK_EXTENT = re.compile(r"^(?P<sector>\d+)\s*\+\s*(?P<count>\d+)")


def classify_rwbs(rwbs):
    """'read', 'write', 'discard' or 'nodata' (flush or none), and whether a
    flush or FUA flag was dropped from a data request."""
    if "D" in rwbs:
        return "discard", False
    body = rwbs[1:] if rwbs.startswith("F") else rwbs
    if "W" in body:
        return "write", "F" in rwbs
    if "R" in body:
        return "read", "F" in rwbs
    return "nodata", False


def read_blkparse(path, event="Q", device=None, limit=None):
    """blkparse text (default format). `event` is the action letter to keep
    (Q queued, D issued to the driver, C completed); `device` is "MAJ,MIN"."""
    rows = []
    seen = set()
    skipped = {}
    flags_dropped = 0
    events_seen = 0

    def skip(why):
        skipped[why] = skipped.get(why, 0) + 1

    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            m = _BLK_EVENT.match(line)
            if not m:
                # Summary sections, blank lines, and lines blkparse prints
                # for other record kinds: not events.
                if line.strip():
                    skip("not an event line")
                continue
            events_seen += 1
            if m["action"] != event:
                continue
            dev = m["dev"]
            if device is not None and dev != device:
                continue
            seen.add(dev)
            kind, dropped = classify_rwbs(m["rwbs"])
            if kind == "discard":
                skip("discard")
                continue
            ext = _BLK_EXTENT.match(m["rest"])
            if kind == "nodata":
                skip("flush or no data")
                continue
            if not ext:
                raise TraceError(
                    f"{path}:{lineno}: {event} event with RWBS {m['rwbs']} has no 'SECTOR + COUNT': "
                    f"{line.strip()[:120]!r}")
            count = int(ext["count"])
            if count == 0:
                skip("zero-length")
                continue
            flags_dropped += dropped
            t_us = float(m["time"]) * 1e6
            rows.append((t_us, kind == "write", int(ext["sector"]) * SECTOR_BYTES,
                         count * SECTOR_BYTES))
            if limit is not None and len(rows) >= limit and device is not None:
                break
    if events_seen == 0:
        raise TraceError(f"{path}: no blkparse event lines (expected e.g. "
                         f"'8,0 1 1 0.000000000 1234 Q W 123456 + 8 [proc]')")
    chosen = _pick_device(seen, device, path, "device")
    if device is None and limit is not None:
        rows = rows[:limit]
    if not rows:
        raise TraceError(f"{path}: no {event} events with data" + (f" for {chosen}" if chosen else ""))
    notes = [f"device {chosen}, {event} events"]
    if flags_dropped:
        notes.append(f"{flags_dropped} preflush/FUA flags on data requests dropped")
    return Trace(_to_requests(rows, 1.0), path, "blkparse", skipped, notes)


def sniff_format(path):
    """'msr' or 'blkparse', from the first non-empty line."""
    with _open_text(path) as f:
        for line in f:
            s = line.strip()
            if not s:
                continue
            if s.count(",") == 6:
                return "msr"
            if _BLK_EVENT.match(line):
                return "blkparse"
            raise TraceError(f"{path}:1: neither MSR CSV (7 comma-separated fields) nor blkparse "
                             f"text: {s[:80]!r}")
    raise TraceError(f"{path}: empty file")


def read_trace(path, fmt=None, **kw):
    try:
        fmt = fmt or sniff_format(path)
        if fmt == "msr":
            return read_msr(path, **{k: v for k, v in kw.items() if k in ("device", "limit")})
        if fmt == "blkparse":
            return read_blkparse(path, **kw)
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not text: {e}") from None
    raise TraceError(f"unknown trace format {fmt!r} (msr or blkparse)")
