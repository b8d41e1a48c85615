"""A generator of VM-like block traces: deterministic for a seed.

The model (every knob is a field of `GenParams`; docs/trace.md has the
table):

- The guest's file system does 4 KiB-aligned I/O inside a partition that
  starts at sector 63 (the old DOS layout): on the disk every such request
  is 512-byte aligned but not 4 KiB aligned, which is what the VM trace
  behind this generator showed.
- Small metadata I/O (journal, inode tables, logs): `small_pct` of the
  requests, in a hot region of `hot_mib`, 512 B to 3.5 KiB (sub-4K) or
  4 KiB, mostly writes, the 4 KiB item picked by a Zipf law (`zipf_alpha`)
  over a fixed random order of the region's items.
- Data I/O in sequential streams (files written or read): a stream is a
  run of requests of one size (`data_sizes_kib`), geometric length with
  mean `stream_mean_requests`; `streams` of them are open at once and
  their requests interleave. A new stream either touches fresh data (the
  next unused stretch of the data region) or revisits an earlier stream's
  data (picked by a Zipf law over recency, `reuse_alpha`). Fresh data is
  handed out at the pace of the trace, so the data region is used up by
  98% of the data requests. The data region is `footprint_mib` minus what
  the small I/O touches (computed first), so the footprint is
  `footprint_mib` (scans come on top).
- Directions: small I/O is written with `small_write_pct`; revisits are
  reads with `reuse_read_pct`; each fresh stream takes the direction that
  steers the whole trace towards `write_pct`. Reads of fresh data are the
  compulsory misses.
- Scans (`scan_every` > 0): every `scan_every` requests, a sequential read
  of `scan_mib` in `scan_request_kib` requests, moving through a scan
  region of `scan_region_mib` (wrapping): a backup or virus scan, read
  once per pass, that a cache should not keep.

Output: `Req` tuples (readers.Req), written as MSR CSV by `write_msr` so
the replay reads generated traces through the same reader as real ones.
"""

import dataclasses
import random
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate

from readers import Req

KiB = 1024
MiB = 1 << 20
SECTOR = 512
FS_BLOCK = 4096
# 2007-01-01 as FILETIME, so the CSV looks like an MSR trace.
_FILETIME_BASE = 128_121_984_000_000_000


@dataclass(frozen=True)
class GenParams:
    requests: int = 20_000
    seed: int = 1
    footprint_mib: float = 630.0
    write_pct: float = 79.0
    partition_offset_sectors: int = 63
    # Small metadata I/O.
    hot_mib: float = 24.0
    small_pct: float = 45.0
    small_write_pct: float = 90.0
    small_sub4k_pct: float = 70.0
    zipf_alpha: float = 1.0
    # Data streams.
    data_sizes_kib: tuple = (4, 8, 16, 32, 64, 128)
    data_size_weights: tuple = (10, 10, 10, 15, 20, 35)
    stream_mean_requests: float = 8.0
    streams: int = 4
    reuse_alpha: float = 1.0
    reuse_read_pct: float = 90.0
    # Scans.
    scan_every: int = 0
    scan_mib: float = 0.0
    scan_request_kib: int = 256
    scan_region_mib: float = 0.0
    # Arrival: mean gap between requests (exponential), for the timestamps.
    mean_gap_us: float = 2_000.0

    def describe(self):
        diff = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}
        return ", ".join(f"{k}={v}" for k, v in diff.items()) or "defaults"


PRESETS = {
    # Mimics the VM trace of the issue: ~20,000 requests, ~79% writes,
    # mean ~36 KiB, footprint ~630 MiB, writes 512-aligned, not 4K-aligned.
    "default": GenParams(),
    # A reused working set with periodic scans: what a scan-resistant
    # policy is for. The working set (hot region and files, 64 MiB) fits in
    # a quarter of the footprint (64 MiB + the 448 MiB scan region = 512
    # MiB; a quarter is 128 MiB); each scan pass reads 128 MiB once, enough
    # to flush an LRU cache of that quarter.
    "scans": GenParams(
        requests=20_000, footprint_mib=64.0, hot_mib=16.0, small_pct=50.0,
        write_pct=50.0, small_write_pct=50.0, reuse_read_pct=80.0,
        stream_mean_requests=6.0, reuse_alpha=0.6,
        scan_every=1_600, scan_mib=128.0, scan_request_kib=256, scan_region_mib=448.0),
}


class Zipf:
    """P(rank k) proportional to 1 / k**alpha, k = 1..n; sample() gives k-1."""

    def __init__(self, n, alpha):
        self.n = n
        self.cdf = list(accumulate(1.0 / (k ** alpha) for k in range(1, n + 1)))

    def sample(self, rng):
        return min(bisect_left(self.cdf, rng.random() * self.cdf[-1]), self.n - 1)


@dataclass
class _Stream:
    start: int
    size: int
    left: int
    write: bool
    pos: int = field(default=0)


def generate(p=None):
    """The trace of `p` (default: the default preset) as a list of Req."""
    p = p or GenParams()
    # One generator per concern, all from the seed: the plan (which kind of
    # request comes next), the small I/O, the data streams, the timestamps.
    rng_plan = random.Random(f"{p.seed}/plan")
    rng_small = random.Random(f"{p.seed}/small")
    rng = random.Random(f"{p.seed}/data")
    rng_time = random.Random(f"{p.seed}/time")
    part = p.partition_offset_sectors * SECTOR
    hot_bytes = max(FS_BLOCK, int(p.hot_mib * MiB) // FS_BLOCK * FS_BLOCK)
    scan_req = p.scan_request_kib * KiB
    scan_region = int(p.scan_region_mib * MiB) // scan_req * scan_req

    # 1. The plan: "scan", "small" or "data" for each request.
    plan = []
    since_scan = 0
    while len(plan) < p.requests:
        if p.scan_every and since_scan >= p.scan_every:
            since_scan = 0
            plan.extend(["scan"] * min(int(p.scan_mib * MiB) // scan_req, p.requests - len(plan)))
            continue
        since_scan += 1
        plan.append("small" if rng_plan.random() < p.small_pct / 100 else "data")

    # 2. The small I/O, and the part of the footprint it takes.
    hot_items = hot_bytes // FS_BLOCK
    hot_zipf = Zipf(hot_items, p.zipf_alpha)
    # Popular items are scattered over the region, not packed at its start.
    hot_order = list(range(hot_items))
    rng_small.shuffle(hot_order)
    small = []
    hot_seen = bytearray(hot_bytes // SECTOR + 8)
    for _ in range(plan.count("small")):
        item = hot_order[hot_zipf.sample(rng_small)]
        if rng_small.random() < p.small_sub4k_pct / 100:
            sectors = rng_small.randint(1, 7)
            offset = item * FS_BLOCK + rng_small.randint(0, 8 - sectors) * SECTOR
        else:
            sectors = FS_BLOCK // SECTOR
            offset = item * FS_BLOCK
        small.append((rng_small.random() < p.small_write_pct / 100, offset, sectors * SECTOR))
        hot_seen[offset // SECTOR:offset // SECTOR + sectors] = b"\x01" * sectors
    hot_footprint = hot_seen.count(1) * SECTOR

    # 3. The data region: what the footprint leaves after the hot region.
    data_base = hot_bytes
    data_bytes = max(FS_BLOCK, int(p.footprint_mib * MiB - hot_footprint) // FS_BLOCK * FS_BLOCK)
    scan_base = data_base + data_bytes
    n_data = plan.count("data")
    sizes = [k * KiB for k in p.data_sizes_kib]
    size_cdf = list(accumulate(p.data_size_weights))

    extents = []          # (start, length) of earlier streams, oldest first
    allocated = 0
    data_done = 0
    open_streams = []
    zipf_by_n = {}
    out = []
    writes = 0
    t_us = 0.0
    scan_pos = 0
    small_next = 0

    def new_stream():
        nonlocal allocated
        size = sizes[bisect_left(size_cdf, rng.random() * size_cdf[-1])]
        n = 1 + int(rng.expovariate(1.0 / max(1e-9, p.stream_mean_requests - 1)))
        # Fresh data is handed out ahead of the trace's progress, so the
        # data region is used up by 98% of the data requests.
        due = data_bytes * min(1.0, data_done / (0.98 * max(1, n_data)))
        if allocated + FS_BLOCK <= data_bytes and (allocated <= due or not extents):
            length = min(n * size, data_bytes - allocated)
            size = min(size, length)
            start = data_base + allocated
            allocated += length
            extents.append((start, length))
            n = max(1, length // size)
            # Fresh data takes the direction that steers the trace, with
            # what open streams will still issue, towards `write_pct`.
            pending = sum(s.left for s in open_streams)
            pending_w = sum(s.left for s in open_streams if s.write)
            write = (writes + pending_w) * 100 < p.write_pct * (len(out) + pending + n / 2)
            return _Stream(start, size, n, write)
        # Revisit: a Zipf law over recency picks an earlier stream's data.
        z = zipf_by_n.get(len(extents))
        if z is None:
            z = zipf_by_n[len(extents)] = Zipf(len(extents), p.reuse_alpha)
        start, length = extents[len(extents) - 1 - z.sample(rng)]
        size = min(size, length)
        n = min(n, max(1, length // size))
        return _Stream(start, size, n, rng.random() >= p.reuse_read_pct / 100)

    for kind in plan:
        if kind == "scan":
            if scan_pos + scan_req > scan_region:
                scan_pos = 0
            write, offset, length = False, scan_base + scan_pos, scan_req
            scan_pos += scan_req
        elif kind == "small":
            write, offset, length = small[small_next]
            small_next += 1
        else:
            while len(open_streams) < p.streams:
                open_streams.append(new_stream())
            s = open_streams[rng.randrange(len(open_streams))]
            write, offset, length = s.write, s.start + s.pos, s.size
            s.pos += s.size
            s.left -= 1
            data_done += 1
            if s.left <= 0:
                open_streams.remove(s)
        writes += write
        t_us += rng_time.expovariate(1.0 / p.mean_gap_us)
        out.append(Req(t_us, write, part + offset, length))
    return out


def write_msr(requests, path, hostname="gen", disk=0):
    """MSR Cambridge CSV (Timestamp in FILETIME units; ResponseTime 0)."""
    with open(path, "w") as f:
        for r in requests:
            ts = _FILETIME_BASE + int(r.t_us * 10)
            f.write(f"{ts},{hostname},{disk},{'Write' if r.write else 'Read'},"
                    f"{r.offset},{r.length},0\n")


def params_for(preset="default", **overrides):
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    return dataclasses.replace(PRESETS[preset], **overrides)
