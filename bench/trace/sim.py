"""Policy simulation over a trace: every policy of policies.py at cache
sizes relative to the footprint, with misses, miss ratios, the ratio to
Belady's MIN, and the read requests that would go to the origin.

Blocks are `block_bytes` (4 KiB) and a request touches every block it
overlaps. Reads and writes are both accesses and both insert on a miss (a
writeback cache allocates on write). "Read requests missed" counts the
read requests with at least one missed block: each costs at least one
origin request, which is what the replay's time is made of. "Origin
fetches" counts the runs of missed blocks inside read requests: a cache
that fetches only what is missing (tiercache does, one origin request per
contiguous stretch) sends that many, so a policy that leaves holes in
cached files costs more origin requests than its block misses say. At block
granularity a read of never-written sectors inside a block written before
is a hit, so this can be below the compulsory-miss bound's count (which is
sector-granular).
"""

import time

import analyze
import policies

DEFAULT_FRACTIONS = (0.125, 0.25, 0.5, 1.0, 2.0)
DEFAULT_POLICIES = tuple(policies.POLICIES)
OPT = "opt"


def parse_fractions(text):
    """"0.125,0.25,1x,2" -> (0.125, 0.25, 1.0, 2.0)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            v = float(part.rstrip("x"))
        except ValueError:
            raise ValueError(f"bad cache size {part!r}: give multiples of the footprint, "
                             f"e.g. 0.25 or 1.5x") from None
        if v <= 0:
            raise ValueError(f"bad cache size {part!r}: must be positive")
        out.append(v)
    return tuple(out)


def run(requests, fractions=DEFAULT_FRACTIONS, names=DEFAULT_POLICIES, block_bytes=4096,
        log=None):
    """{"fractions": [...], "rows": {policy: [per fraction {...}]}, ...}"""
    blocks, writes, req_of = analyze.block_sequence(requests, block_bytes)
    seq = blocks.tolist()
    footprint_blocks = len(set(seq))
    n = len(seq)
    read_idx = [i for i in range(n) if not writes[i]]
    out = {"accesses": n, "footprint_blocks": footprint_blocks, "block_bytes": block_bytes,
           "read_accesses": len(read_idx), "fractions": list(fractions),
           "capacities": [max(1, round(f * footprint_blocks)) for f in fractions],
           "policies": list(names), "rows": {}, "seconds": {}}
    for name in names:
        t0 = time.monotonic()
        row = []
        for cap in out["capacities"]:
            hits = policies.simulate(name, cap, seq)
            misses = n - sum(hits)
            missed_reads = set()
            stretches = 0
            prev = -2
            for i in read_idx:
                if not hits[i]:
                    missed_reads.add(req_of[i])
                    # A new stretch unless the access before is a miss of
                    # the same request.
                    if not (prev == i - 1 and req_of[prev] == req_of[i]):
                        stretches += 1
                    prev = i
            row.append({"misses": misses, "miss_ratio": misses / n,
                        "read_requests_missed": len(missed_reads),
                        "origin_read_fetches": stretches})
        out["rows"][name] = row
        out["seconds"][name] = time.monotonic() - t0
        if log:
            log(f"  simulated {name} in {out['seconds'][name]:.1f} s")
    if OPT in out["rows"]:
        for name, row in out["rows"].items():
            for cell, opt in zip(row, out["rows"][OPT]):
                cell["x_opt"] = cell["misses"] / opt["misses"] if opt["misses"] else None
    return out


def best_at(result, fraction, key="misses", exclude=("opt", "opt-bypass")):
    """(policy, value) with the fewest `key` at `fraction`, offline optima left out."""
    i = result["fractions"].index(fraction)
    cands = [(row[i][key], name) for name, row in result["rows"].items() if name not in exclude]
    value, name = min(cands)
    return name, value


def _frac_label(f):
    return {0.125: "1/8", 0.25: "1/4", 0.5: "1/2"}.get(f, f"{f:g}")


def markdown(result, title="Policy simulation"):
    """Two tables: block miss ratio with the ratio to OPT, and read requests
    missed; then which policy wins at a quarter of the footprint."""
    fr = result["fractions"]
    kib = result["block_bytes"] // 1024
    head = "| policy | " + " | ".join(
        f"{_frac_label(f)}× ({c:,} blocks)" for f, c in zip(fr, result["capacities"])) + " |"
    sep = "|---|" + "---|" * len(fr)
    lines = [f"**{title}**: {result['accesses']:,} accesses of {kib} KiB blocks "
             f"({result['read_accesses']:,} reads), footprint {result['footprint_blocks']:,} blocks; "
             f"cache sizes as multiples of the footprint.", "",
             "Block misses, miss ratio and misses / OPT:", "", head, sep]
    for name, row in result["rows"].items():
        cells = []
        for c in row:
            x = f", {c['x_opt']:.3f}× OPT" if c.get("x_opt") is not None else ""
            cells.append(f"{c['misses']:,} ({100 * c['miss_ratio']:.1f}%{x})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lru = result["rows"].get("lru")
    for key, what in (("read_requests_missed", "Read requests with a missed block (each costs at "
                       "least one origin request), and / LRU:"),
                      ("origin_read_fetches", "Origin fetches: runs of missed blocks inside read "
                       "requests (one origin request each when only what is missing is fetched), "
                       "and / LRU:")):
        if not all(key in c for row in result["rows"].values() for c in row):
            continue
        lines += ["", what, "", head, sep]
        for name, row in result["rows"].items():
            cells = []
            for i, c in enumerate(row):
                rel = ""
                if lru and lru[i][key]:
                    rel = f" ({c[key] / lru[i][key]:.2f}×)"
                cells.append(f"{c[key]:,}{rel}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if 0.25 in fr:
        i = fr.index(0.25)
        name, m = best_at(result, 0.25)
        rname, rm = best_at(result, 0.25, key="read_requests_missed")
        opt = result["rows"].get(OPT, [None] * len(fr))[i]
        lines += ["", f"At 1/4 of the footprint: fewest block misses **{name}** ({m:,}"
                  + (f", {m / opt['misses']:.3f}× OPT" if opt else "") + f"); fewest read requests "
                  f"missed **{rname}** ({rm:,})."]
        for cand in ("s3fifo", "s3fifo-tc"):
            if cand in result["rows"] and lru:
                c = result["rows"][cand][i]
                lines.append(f"{cand} at 1/4: {c['misses'] / lru[i]['misses']:.3f}× LRU's block misses, "
                             f"{c['read_requests_missed'] / max(1, lru[i]['read_requests_missed']):.3f}× "
                             f"LRU's read requests missed"
                             + (f", {c['x_opt']:.3f}× OPT's block misses." if c.get("x_opt") else "."))
    return "\n".join(lines)
