"""Trace replay in the benchmark harness: `bench/run --trace SPEC`.

One trace, replayed with fio's read_iolog at a fixed iodepth over NBD
against each system of bench/run, each started fresh with an empty cache
and its own emulated HDD (which logs every request it receives, so the
requests that reached the origin are counted, not estimated). Beside the
replays: the trace's statistics, the compulsory-miss bound and the
offline policy simulation. See docs/trace.md.
"""

import os
import shutil
import time

import analyze
import iolog
import sim
import readers
import tracetool
from procs import BenchError
from procs import run as run_cmd

MiB = 1 << 20
DEFAULT_SIZES = "1.5x,0.25x"
CACHE_KINDS = ["nbdkit-cache", "tc-writeback", "tc-writethrough", "tc-writearound", "tc-writeonly",
               "tc-ordered", "tc-inplace"]
DEFAULT_SYSTEMS = ["origin"] + CACHE_KINDS[:-2]
# Scaled-down generated traces for --quick and --smoke (bench/run's modes).
SCALE = {"quick": 0.25, "smoke": 0.025}


def count_origin_requests(path):
    """(reads, writes, other) requests in an nbdkit log filter file. The
    filter writes "connection=N Read id=M offset=... count=..." when a
    request arrives and "...Read id=M return=..." when it completes."""
    reads = writes = other = 0
    if not path or not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        for line in f:
            p = line.split(" ", 4)
            if len(p) < 4 or not p[2].startswith("connection=") or p[3].startswith("..."):
                continue
            op = p[3]
            if op == "Read":
                reads += 1
            elif op == "Write":
                writes += 1
            elif op in ("Flush", "Trim", "Zero", "Cache"):
                other += 1
    return reads, writes, other


def load_trace(spec, mode, limit=None):
    """(requests, description): generated traces shrink with --quick and
    --smoke (fewer requests, the footprint in proportion); files are cut to
    their first requests."""
    scale = SCALE.get(mode)
    sets = []
    if scale and (spec in tracetool.GEN_SPECS or spec.startswith("gen:")):
        preset = tracetool.GEN_SPECS.get(spec) or spec.split(":", 1)[1]
        p = tracetool.gen_params(preset)
        sets = [f"requests={max(200, int(p.requests * scale))}",
                f"footprint_mib={p.footprint_mib * scale}",
                f"hot_mib={max(1.0, p.hot_mib * scale)}"]
        if p.scan_every:
            sets += [f"scan_every={max(50, int(p.scan_every * scale))}",
                     f"scan_mib={p.scan_mib * scale}", f"scan_region_mib={p.scan_region_mib * scale}"]
    cut = None
    if scale and limit is None and not sets and not spec.startswith("gen"):
        limit = cut = int(20_000 * scale)
    reqs, desc = tracetool.load(spec, limit=limit, sets=sets)
    if sets:
        desc += f" (scaled to {scale:g} for this {mode} run)"
    elif cut:
        desc += f" (its first {cut:,} requests for this {mode} run)"
    elif limit:
        desc += f" (its first {limit:,} requests)"
    return reqs, desc


def plan(args, mode, log):
    """Loads and analyses the trace; writes the iolog. Returns the plan dict."""
    reqs, desc = load_trace(args.trace, mode, args.trace_limit)
    reqs, volume_bytes, notes = tracetool.prepare(reqs)
    st = analyze.stats(reqs)
    log(f"trace: {desc}")
    for n in notes:
        log(f"  {n}")
    for line in analyze.format_stats(st).splitlines():
        log(f"  {line}")
    fracs = sim.parse_fractions(args.trace_cache_sizes)
    return {"requests": reqs, "description": desc, "notes": notes, "volume_bytes": volume_bytes,
            "stats": st, "fractions": fracs}


def simulate(p, log):
    t0 = time.monotonic()
    fr = sorted(set(sim.DEFAULT_FRACTIONS) | set(p["fractions"]))
    res = sim.run(p["requests"], fr, log=log)
    log(f"policy simulation: {time.monotonic() - t0:.0f} s")
    return res


def cache_bytes_for(p, fraction):
    """A cache of `fraction` of the block footprint, in whole MiB."""
    st = p["stats"]
    want = fraction * st["footprint_blocks"] * st["block_bytes"]
    return max(8 * MiB, int((want + MiB - 1) // MiB) * MiB)


def replay_one(system, p, iolog_path, n_requests, counts, iodepth, timing, work_dir, settle, log,
               policy=None, admission=None, syncs=0):
    d = os.path.join(work_dir, system.key.replace("/", "_"))
    os.makedirs(d)
    system.log_origin_requests = True
    settle()
    row = {"system": system.key, "describe": system.describe}
    try:
        system.start(d, p["volume_bytes"])
        if policy:
            # The cache is empty: switching now is the same as creating with it.
            run_cmd(system._tc("set-policy", policy, "--name", system.name))
        if admission:
            run_cmd(system._tc("set-admission", *admission, "--name", system.name))
        if hasattr(system, "status"):
            st = system.status()
            row["cache_capacity_bytes"] = st["cache_blocks_total"] * st["block_bytes"]
            row["policy"] = st.get("policy")
            row["stats_before"] = st["stats"]
        argv = ["fio", "--name=replay", "--ioengine=nbd", f"--uri={system.uri}",
                "--output-format=json", *iolog.fio_args(iolog_path, n_requests, iodepth, timing)]
        # Generous: the origin alone takes requests x 5 ms.
        timeout = 120 + 4 * n_requests * 0.006
        t0 = time.monotonic()
        _, out, _ = run_cmd(argv, timeout_s=timeout)
        row["wall_s"] = time.monotonic() - t0
        job = tracetool.parse_fio_json(out)["jobs"][0]
        row["replay_s"] = job["job_runtime"] / 1000
        row["read_p99_ms"] = job["read"]["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1e6
        row["write_p99_ms"] = job["write"]["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1e6
        try:
            iolog.check_replay(job, counts, syncs)
            row["complete"] = True
        except ValueError as e:
            row["complete"] = False
            system.notes.append(f"replay incomplete: {e}")
        oc = count_origin_requests(getattr(getattr(system, "hdd", None), "request_log", None))
        if oc:
            row["origin_reads"], row["origin_writes"], row["origin_other"] = oc
        if hasattr(system, "status"):
            st = system.status()
            row["stats_after"] = st["stats"]
            row["dirty_blocks_end"] = st.get("cache_blocks_dirty")
            if st.get("flush_groups"):
                row["shadow_peak"] = st["flush_groups"]["shadow_peak"]
    finally:
        system.stop()
        row["notes"] = list(system.notes)
        shutil.rmtree(d, ignore_errors=True)
    o = (f"  origin requests {row.get('origin_reads', 0) + row.get('origin_writes', 0):,} "
         f"(reads {row.get('origin_reads', 0):,}, writes {row.get('origin_writes', 0):,})")
    log(f"  {system.key}: {row.get('replay_s', float('nan')):.1f} s" + o)
    return row


def run(args, mode, make_system, systems, work_dir, out_dir, settle, log):
    """The whole trace run. `make_system(key, cache_bytes)` builds a system
    of bench/systems.py; `settle()` is bench.py's quiet-disk step. Bad
    input or arguments raise BenchError (one line, no traceback)."""
    try:
        p = plan(args, mode, log)
    except (readers.TraceError, tracetool.ToolError, ValueError, OSError) as e:
        raise BenchError(f"trace: {e}") from None
    iolog_path = os.path.join(out_dir, "trace.iolog")
    flush_every = getattr(args, "trace_flush_every", 0) or 0
    n = iolog.write_iolog(p["requests"], iolog_path, timing=args.trace_timing,
                          flush_every=flush_every)
    counts = iolog.read_iolog_counts(iolog_path)
    syncs = iolog.read_iolog_syncs(iolog_path)
    st = p["stats"]
    result = {
        "spec": args.trace, "description": p["description"], "notes": p["notes"],
        "volume_bytes": p["volume_bytes"], "iodepth": args.trace_iodepth,
        "timing": args.trace_timing, "iolog": iolog_path,
        "flush_every": flush_every, "flushes": syncs, "writes": counts[1],
        "stats": st, "fractions": list(p["fractions"]), "replays": [],
    }
    if not args.trace_no_sim:
        log("policy simulation (offline, 4 KiB blocks):")
        result["simulation"] = simulate(p, log)
    log(f"replay: {n:,} requests at QD{args.trace_iodepth}, "
        f"{'trace timing' if args.trace_timing else 'as fast as possible'}"
        + (f", a flush after every {flush_every} writes ({syncs:,})" if flush_every else ""))
    # (system, cache fraction, tiercache policy): the peers without a
    # cache first, then each cache size.
    order = [(k, None, None) for k in ("origin", "qemu-nbd") if k in systems]
    tc_policies = [x for x in (args.trace_policies or "").split(",") if x] or [None]
    for f in p["fractions"]:
        for key in systems:
            if key in CACHE_KINDS:
                for pol in (tc_policies if key.startswith("tc-") else [None]):
                    order.append((key, f, pol))
    for key, f, pol in order:
        cache_bytes = cache_bytes_for(p, f) if f is not None else None
        system = make_system(key, cache_bytes)
        if f is not None:
            system.key = f"{key}@{f:g}x" + (f"/{pol}" if pol else "")
        adm = args.trace_admission.split() if args.trace_admission and key.startswith("tc-") else None
        row = replay_one(system, p, iolog_path, n, counts, args.trace_iodepth, args.trace_timing,
                         work_dir, settle, log, policy=pol, admission=adm, syncs=syncs)
        row["admission"] = " ".join(adm) if adm else None
        row["kind"], row["fraction"], row["cache_bytes"] = key, f, cache_bytes
        result["replays"].append(row)
    return result


# ---------------------------------------------------------------------------
# Report


def _ratio(a, b):
    return a / b if a is not None and b else None


def _x(v):
    return "n/a" if v is None else f"{v:.2f}×"


def markdown(tr):
    st = tr["stats"]
    mib = MiB
    origin = next((r for r in tr["replays"] if r["system"] == "origin"), None)
    origin_s = origin.get("replay_s") if origin else None
    lines = [f"### Trace replay: {tr['description']}", ""]
    for n in tr["notes"]:
        lines.append(f"- {n}")
    lines += [
        f"- {st['requests']:,} requests, {st['write_pct']:.1f}% writes, mean {st['mean_kib']:.1f} KiB; "
        f"footprint {st['footprint_bytes'] / mib:.1f} MiB ({st['footprint_blocks']:,} blocks of 4 KiB); "
        f"volume {tr['volume_bytes'] / mib:.0f} MiB",
        f"- writes: {st['writes_512_not_4k_pct']:.1f}% 512-aligned but not 4K-aligned, "
        f"{st['writes_sub4k_pct']:.1f}% under 4 KiB",
        (f"- written data: {st['written_bytes_distinct'] / mib:.1f} MiB in {st['written_extents']:,} "
         f"contiguous extents: the fewest origin writes that persist it (merged up to 32 MiB), what a "
         f"writeback cache smaller than the written data must send at least"
         if "written_extents" in st else "- written data: n/a"),
        f"- **compulsory-miss bound: {st['bound_s']:.1f} s** ({st['compulsory_reads']:,} reads touch a "
        f"never-touched sector × {st['origin_ms']:g} ms); with every write at the origin too "
        f"(writethrough, writearound): {st['wt_floor_s']:.1f} s; every request at the origin: "
        f"{st['origin_alone_s']:.0f} s",
        f"- origin busy: origin requests × the origin's time per request when alone, over the "
        f"replay time (about 100% means the origin was the bottleneck throughout)",
        f"- replay: fio read_iolog, ioengine=nbd, QD{tr['iodepth']}, "
        f"{'trace timing' if tr['timing'] else 'replay_no_stall (as fast as possible)'}"
        + (f", a flush (NBD FLUSH) after every {tr['flush_every']} writes ({tr['flushes']:,})"
           if tr.get("flush_every") else "")
        + "; each system starts empty on a fresh emulated HDD (5 ms per request, one at a time)",
        "",
        "| system | cache | replay | × origin alone | × bound | origin requests (reads + writes) | "
        "origin busy | read p99 | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    # The origin's time per request, measured when it ran alone: "busy" is
    # the share of a replay the origin spent serving what reached it.
    per_req_s = origin_s / (origin["origin_reads"] + origin["origin_writes"]) \
        if origin_s and origin.get("origin_reads") is not None else None
    for r in tr["replays"]:
        cache = "—"
        if r.get("cache_bytes"):
            cache = f"{r['fraction']:g}× ({r['cache_bytes'] / mib:.0f} MiB"
            if r.get("cache_capacity_bytes"):
                cache += f", holds {r['cache_capacity_bytes'] / (st['footprint_blocks'] * 4096):.2f}×"
            cache += ")"
        s = r.get("replay_s")
        oreq = "n/a"
        if "origin_reads" in r:
            oreq = f"{r['origin_reads'] + r['origin_writes']:,} ({r['origin_reads']:,} + {r['origin_writes']:,})"
        notes = list(r.get("notes", []))
        if r.get("stats_before") and r.get("stats_after"):
            b, a = r["stats_before"], r["stats_after"]
            d = {k: a.get(k, 0) - b.get(k, 0) for k in a if isinstance(a.get(k), int)}
            hits, miss = d.get("read_hits", 0), d.get("read_misses", 0)
            notes.append(f"engine: origin reads {d.get('origin_reads', 0):,}, writes "
                         f"{d.get('origin_writes', 0):,}; read hits "
                         f"{100 * hits / max(1, hits + miss):.0f}% of {hits + miss:,} blocks")
        if r.get("origin_other"):
            notes.append(f"origin flushes and trims {r['origin_other']:,}")
        if tr.get("writes") and "origin_writes" in r:
            notes.append(f"origin writes per 1000 writes {1000 * r['origin_writes'] / tr['writes']:.0f}")
        if r.get("stats_after", {}).get("groups_written_back"):
            notes.append(f"groups written back {r['stats_after']['groups_written_back']:,}")
        if r.get("shadow_peak") is not None:
            notes.append(f"older versions kept (peak) {r['shadow_peak']:,}")
        if r.get("complete") is False:
            notes.insert(0, "INCOMPLETE")
        if r.get("policy"):
            notes.insert(0, f"policy {r['policy']}"
                         + (f", set-admission {r['admission']}" if r.get("admission") else ""))
        busy = "n/a"
        if per_req_s and s and "origin_reads" in r:
            busy = f"{100 * (r['origin_reads'] + r['origin_writes']) * per_req_s / s:.0f}%"
        lines.append(
            f"| {r['system']} | {cache} | {'n/a' if s is None else f'{s:.1f} s'} | "
            f"{_x(_ratio(s, origin_s))} | {_x(_ratio(s, st['bound_s']))} | {oreq} | {busy} | "
            f"{r.get('read_p99_ms', 0):.0f} ms | {'; '.join(notes)} |")
    if "simulation" in tr:
        lines += ["", sim.markdown(tr["simulation"], title="Replacement policies on this trace (offline)")]
    return "\n".join(lines)


if __name__ == "__main__":
    # Re-renders the trace section of a run's results.json.
    import json
    import sys

    with open(sys.argv[1]) as f:
        print(markdown(json.load(f)["trace"]))
