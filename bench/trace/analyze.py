"""What a trace asks of a cache: request statistics, the compulsory-miss
bound, and the block access sequence the policy simulator runs on.

The compulsory-miss bound. Walk the trace in order, remembering every
512-byte sector any request (read or write) has touched. A read that
touches at least one sector not yet touched needs data only the origin
has, whatever the cache does: it costs at least one origin request. The
origin serves one request at a time, `origin_ms` each (the emulated HDD:
5 ms), so no cache can replay the trace faster than

    bound_s = compulsory_reads x origin_ms / 1000.

It assumes a cache that is larger than the footprint, absorbs every write
(writeback or writeonly), keeps partial blocks (sector granularity) and
sends each compulsory read to the origin once. Modes that must send
writes to the origin (writethrough, writearound) have a higher floor:
`(compulsory_reads + writes) x origin_ms`, reported as `wt_floor_s`.
"""

import re
from array import array

SECTOR = 512


def block_range(offset, length, block_bytes):
    return offset // block_bytes, (offset + length - 1) // block_bytes


def stats(requests, origin_ms=5.0, block_bytes=4096):
    """Request, footprint, alignment and bound figures of a trace."""
    n = len(requests)
    if n == 0:
        raise ValueError("empty trace")
    extent = max(r.offset + r.length for r in requests)
    seen = bytearray((extent + SECTOR - 1) // SECTOR)
    written = bytearray(len(seen))
    blocks = set()
    reads = writes = 0
    rbytes = wbytes = 0
    compulsory = 0
    w512 = w4k = wsub4k = 0
    r512 = 0
    sizes = []
    for r in requests:
        first = r.offset // SECTOR
        last = (r.offset + r.length + SECTOR - 1) // SECTOR
        if r.write:
            writes += 1
            wbytes += r.length
            a512 = r.offset % SECTOR == 0 and r.length % SECTOR == 0
            w512 += a512
            w4k += r.offset % 4096 == 0 and r.length % 4096 == 0
            wsub4k += r.length < 4096
        else:
            reads += 1
            rbytes += r.length
            r512 += r.offset % SECTOR == 0 and r.length % SECTOR == 0
            if 0 in seen[first:last]:
                compulsory += 1
        seen[first:last] = b"\x01" * (last - first)
        if r.write:
            written[first:last] = b"\x01" * (last - first)
        b0, b1 = block_range(r.offset, r.length, block_bytes)
        blocks.update(range(b0, b1 + 1))
        sizes.append(r.length)
    sizes.sort()
    touched_sectors = seen.count(1)
    # Written data as maximal contiguous extents: the fewest origin writes
    # that can persist all of it (with writes merged up to 32 MiB).
    written_extents = sum(-(-len(m.group()) // (32 * 1024 * 1024 // SECTOR))
                          for m in re.finditer(rb"\x01+", bytes(written)))
    span_s = (requests[-1].t_us - requests[0].t_us) / 1e6
    return {
        "requests": n,
        "reads": reads,
        "writes": writes,
        "write_pct": 100.0 * writes / n,
        "read_bytes": rbytes,
        "write_bytes": wbytes,
        "mean_kib": (rbytes + wbytes) / n / 1024,
        "median_kib": sizes[n // 2] / 1024,
        "max_kib": sizes[-1] / 1024,
        "footprint_bytes": touched_sectors * SECTOR,
        "footprint_blocks": len(blocks),
        "block_bytes": block_bytes,
        "extent_bytes": extent,
        "writes_512_aligned_pct": 100.0 * w512 / writes if writes else 0.0,
        "writes_4k_aligned_pct": 100.0 * w4k / writes if writes else 0.0,
        "writes_512_not_4k_pct": 100.0 * (w512 - w4k) / writes if writes else 0.0,
        "writes_sub4k_pct": 100.0 * wsub4k / writes if writes else 0.0,
        "reads_512_aligned_pct": 100.0 * r512 / reads if reads else 0.0,
        "written_bytes_distinct": written.count(1) * SECTOR,
        "written_extents": written_extents,
        "compulsory_reads": compulsory,
        "origin_ms": origin_ms,
        "bound_s": compulsory * origin_ms / 1000,
        "wt_floor_s": (compulsory + writes) * origin_ms / 1000,
        "origin_alone_s": n * origin_ms / 1000,
        "span_s": span_s,
    }


def block_sequence(requests, block_bytes=4096):
    """The block accesses of the trace, in order: (blocks, writes, request
    index of each access). A request touches every block it overlaps."""
    blocks = array("q")
    writes = bytearray()
    req_of = array("l")
    for i, r in enumerate(requests):
        b0, b1 = block_range(r.offset, r.length, block_bytes)
        k = b1 - b0 + 1
        blocks.extend(range(b0, b1 + 1))
        writes.extend(b"\x01" * k if r.write else b"\x00" * k)
        req_of.extend([i] * k)
    return blocks, writes, req_of


def format_stats(st):
    mib = 1 << 20
    lines = [
        f"requests {st['requests']:,}: {st['reads']:,} reads, {st['writes']:,} writes "
        f"({st['write_pct']:.1f}% writes); mean {st['mean_kib']:.1f} KiB, median "
        f"{st['median_kib']:.1f} KiB, max {st['max_kib']:.0f} KiB",
        f"footprint {st['footprint_bytes'] / mib:.1f} MiB ({st['footprint_blocks']:,} blocks of "
        f"{st['block_bytes'] // 1024} KiB); read {st['read_bytes'] / mib:.1f} MiB, written "
        f"{st['write_bytes'] / mib:.1f} MiB",
        f"writes: {st['writes_512_aligned_pct']:.1f}% 512-aligned, {st['writes_4k_aligned_pct']:.1f}% "
        f"4K-aligned, {st['writes_512_not_4k_pct']:.1f}% 512-aligned but not 4K-aligned, "
        f"{st['writes_sub4k_pct']:.1f}% under 4 KiB",
        f"written data: {st['written_bytes_distinct'] / mib:.1f} MiB in {st['written_extents']:,} "
        f"contiguous extents (the fewest origin writes that persist it, merged up to 32 MiB)",
        f"compulsory-miss bound: {st['compulsory_reads']:,} reads touch a never-touched sector "
        f"x {st['origin_ms']:g} ms = {st['bound_s']:.1f} s (origin alone, one request at a time: "
        f"{st['origin_alone_s']:.0f} s; with every write at the origin too: {st['wt_floor_s']:.1f} s)",
    ]
    return "\n".join(lines)
