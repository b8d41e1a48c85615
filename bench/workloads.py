"""What is measured: run sizes per mode, the fio jobs, and the special
tests (re-read, sustained writeback, RAM per cache block).

Every number comes from fio with ioengine=nbd, one job, against the
system's NBD URI. Volume layout (the same for every system):

    [0, ws)               working set: warmed, then hits, 1M and sequential jobs
    [ws, ws + reread)     the re-read test's region (cold until the test)
    [.., .. + cold)       never touched before the cold-read job
"""

import json
import os
import threading
import time
from dataclasses import dataclass

from procs import BenchError, run

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Plan:
    name: str
    runtime_s: int             # each time-based job
    ws_bytes: int              # working set
    reread_bytes: int          # the re-read test reads this five times
    cold_bytes: int            # region for cold 4K reads
    cache_bytes: int           # tiercache cache file; nbdkit cache-max-size
    sustained_s: int
    sustained_cache_bytes: int
    sustained_region_pct: int  # written region, % of the cache capacity
    log_avg_ms: int
    ram_fill_blocks: int
    origin_runtime_s: int      # the origin alone does ~200 IOPS: shorter jobs
    reread_passes: int = 5

    @property
    def volume_bytes(self):
        return self.ws_bytes + self.reread_bytes + self.cold_bytes


PLANS = {
    "smoke": Plan("smoke", runtime_s=1, ws_bytes=16 * MiB, reread_bytes=16 * MiB,
                  cold_bytes=64 * MiB, cache_bytes=64 * MiB, sustained_s=4,
                  sustained_cache_bytes=16 * MiB, sustained_region_pct=80,
                  log_avg_ms=500, ram_fill_blocks=16384, origin_runtime_s=1),
    "quick": Plan("quick", runtime_s=2, ws_bytes=64 * MiB, reread_bytes=64 * MiB,
                  cold_bytes=512 * MiB, cache_bytes=256 * MiB, sustained_s=12,
                  sustained_cache_bytes=64 * MiB, sustained_region_pct=80,
                  log_avg_ms=500, ram_fill_blocks=262144, origin_runtime_s=2),
    "full": Plan("full", runtime_s=10, ws_bytes=256 * MiB, reread_bytes=200 * MiB,
                 cold_bytes=1 * GiB, cache_bytes=1 * GiB, sustained_s=120,
                 sustained_cache_bytes=256 * MiB, sustained_region_pct=80,
                 log_avg_ms=1000, ram_fill_blocks=1 << 20, origin_runtime_s=5),
}


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    rw: str
    bs: str
    iodepth: int
    region: str  # "ws" or "cold"
    # A flush (NBD FLUSH) after every this many writes (fio --fsync); 0: none.
    flush_every: int = 0


# Order matters: reads of the warmed set come before the writes (in
# writearound a write drops the cached copy), the cold job touches its own
# region.
WORKLOADS = [
    Workload("rr4k_hit", "4K randread QD32, warm (hits)", "randread", "4k", 32, "ws"),
    Workload("rr1m", "1M randread QD8, warm", "randread", "1m", 8, "ws"),
    Workload("sr1m", "1M seq read QD8, warm", "read", "1m", 8, "ws"),
    Workload("rw4k", "4K randwrite QD32", "randwrite", "4k", 32, "ws"),
    Workload("rw1m", "1M randwrite QD8", "randwrite", "1m", 8, "ws"),
    Workload("rrw1m", "1M randrw 50/50 QD8", "randrw", "1m", 8, "ws"),
    Workload("sw1m", "1M seq write QD8", "write", "1m", 8, "ws"),
    Workload("rr4k_cold", "4K randread QD32, cold (misses)", "randread", "4k", 32, "cold"),
]


# Run only when named with --workloads: the queue depth of TOOLS.md's Ceph
# numbers.
EXTRA_WORKLOADS = [
    Workload("rr4k_hit_qd16", "4K randread QD16, warm (hits)", "randread", "4k", 16, "ws"),
    Workload("rw4k_qd16", "4K randwrite QD16", "randwrite", "4k", 16, "ws"),
    # What writeback in flush order (tc-ordered, tc-rbd-ordered) is about:
    # a client that flushes, as a file system's journal commits do.
    Workload("rw4k_flush16", "4K randwrite QD32, a flush every 16 writes", "randwrite", "4k", 32,
             "ws", flush_every=16),
    # Writes smaller than a cache block, at any sector (the guest
    # comparison's sub-4K job): over the warmed set, whose blocks are
    # cached, some dirty and some already written back (clean).
    Workload("rw4k_sub", "512 B-3.5 KiB randwrite QD16", "randwrite", "512-3584", 16, "ws"),
]


def region(plan, name):
    if name == "ws":
        return 0, plan.ws_bytes
    if name == "reread":
        return plan.ws_bytes, plan.reread_bytes
    if name == "cold":
        return plan.ws_bytes + plan.reread_bytes, plan.cold_bytes
    raise ValueError(name)


# ---------------------------------------------------------------------------
# fio


@dataclass(frozen=True)
class FioTarget:
    """A system fio reaches with another engine than nbd: its engine
    options and environment (e.g. the rbd engine, which reads the Ceph
    config named by CEPH_CONF)."""
    engine_args: tuple
    env: tuple = ()

    def __str__(self):
        return " ".join(self.engine_args)


def fio(uri, rw, bs, iodepth, offset, size, runtime_s=None, iops_log=None,
        log_avg_ms=1000, timeout_s=900, passes=1, flush_every=0):
    """One fio job (or `passes` identical jobs run one after the other by
    one fio process, saving its start-up); returns, per job, IOPS, MiB/s,
    p50/p99/max completion latency (us), I/Os completed and the job's
    runtime in seconds. A single job's result is returned as is. `uri`:
    an NBD URI (ioengine=nbd) or a FioTarget."""
    env = None
    if isinstance(uri, FioTarget):
        target = list(uri.engine_args)
        env = dict(os.environ, **dict(uri.env))
    else:
        target = ["--ioengine=nbd", f"--uri={uri}"]
    # A range of sizes ("512-3584"): any of them, at any sector.
    sizes = ([f"--bsrange={bs}", "--blockalign=512", "--norandommap"] if "-" in bs
             else [f"--bs={bs}"])
    argv = [
        "fio", *target, f"--rw={rw}",
        *sizes, f"--iodepth={iodepth}", f"--offset={offset}", f"--size={size}",
        "--numjobs=1", "--output-format=json",
    ]
    if runtime_s is not None:
        argv += ["--time_based", f"--runtime={runtime_s}"]
    if rw in ("randrw", "rw"):
        argv += ["--rwmixread=50", "--unified_rw_reporting=mixed"]
    if iops_log is not None:
        argv += [f"--write_iops_log={iops_log}", f"--log_avg_msec={log_avg_ms}"]
    if flush_every:
        argv += [f"--fsync={flush_every}"]
    # Options before the first --name are global; --stonewall makes each
    # job wait for the one before.
    for i in range(passes):
        argv += [f"--name=pass{i + 1}"] + (["--stonewall"] if i else [])
    _, out, _ = run(argv, timeout_s=timeout_s * passes, env=env)
    # The nbd engine prints "fio: connected to NBD server" before the JSON.
    start = out.find("\n{")
    text = out if out.startswith("{") else out[start + 1:] if start >= 0 else ""
    try:
        jobs = json.loads(text)["jobs"]
    except (ValueError, KeyError) as e:
        raise BenchError(f"fio output is not the expected JSON: {out[:400]!r}") from e
    if len(jobs) != passes:
        raise BenchError(f"fio reported {len(jobs)} jobs, expected {passes}")
    results = [_job_result(job, rw, bs, uri) for job in jobs]
    return results[0] if passes == 1 else results


def _job_result(job, rw, bs, uri):
    if job.get("error"):
        raise BenchError(f"fio reported error {job['error']} for {rw} {bs} on {uri}")
    if rw in ("randrw", "rw"):
        d = job["mixed"]
    elif "read" in rw:
        d = job["read"]
    else:
        d = job["write"]
    pct = d["clat_ns"].get("percentile", {})
    return {
        "iops": d["iops"],
        "mib_s": d["bw_bytes"] / MiB,
        "p50_us": pct.get("50.000000", 0) / 1000,
        "p99_us": pct.get("99.000000", 0) / 1000,
        "max_us": d["clat_ns"].get("max", 0) / 1000,
        "ios": d["total_ios"],
        "runtime_s": job["job_runtime"] / 1000,
    }


def machine_cpu():
    """(busy, total) CPU ticks of the whole machine so far (/proc/stat's
    first line: user nice system idle iowait irq softirq steal; the guest
    columns after them are already in user; idle and iowait are not busy)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


class Probe:
    """Server CPU time, the whole machine's CPU time (every process: the
    client, the server, an OSD) and tiercache counters around one
    measurement."""

    def __init__(self, system):
        self.system = system

    def __enter__(self):
        self.c0 = self.system.counters()
        self.cpu0 = self.system.server.cpu_s()
        self.machine0 = machine_cpu()
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.machine1 = machine_cpu()
            self.cpu1 = self.system.server.cpu_s()
            self.c1 = self.system.counters()

    def annotate(self, result):
        ios = result["ios"]
        result["cpu_us_per_io"] = (self.cpu1 - self.cpu0) * 1e6 / ios if ios else None
        # Busy share of all cores, and busy time a request: on a machine
        # whose cores are all busy, IOPS follow the whole machine's CPU a
        # request, not the server's alone.
        busy = self.machine1[0] - self.machine0[0]
        total = self.machine1[1] - self.machine0[1]
        hz = os.sysconf("SC_CLK_TCK")
        result["machine_busy_pct"] = 100.0 * busy / total if total else None
        result["machine_cpu_us_per_io"] = busy * 1e6 / hz / ios if ios else None
        if self.c0 is not None:
            s0, s1 = self.c0["stats"], self.c1["stats"]
            hits = s1["read_hits"] - s0["read_hits"]
            misses = s1["read_misses"] - s0["read_misses"]
            result["read_hit_pct"] = 100.0 * hits / (hits + misses) if hits + misses else None
            result["written_back_blocks"] = s1["blocks_written_back"] - s0["blocks_written_back"]
            result["bypassed_ios"] = s1["bypassed_ios"] - s0["bypassed_ios"]
            result["errors"] = (s1["cache_errors"] + s1["origin_errors"]
                                - s0["cache_errors"] - s0["origin_errors"])
            result["checkpoints"] = s1.get("checkpoints", 0) - s0.get("checkpoints", 0)
            for k in ("origin_writes", "flush_requests", "groups_written_back"):
                result[k] = s1.get(k, 0) - s0.get(k, 0)
        return result


def warm(system, plan):
    """Writes, then reads, the working set with 1M sequential I/O, so every
    cache mode holds it (writeonly caches writes, the others promote reads)."""
    off, size = region(plan, "ws")
    fio(system.uri, "write", "1m", 8, off, size)
    fio(system.uri, "read", "1m", 8, off, size)


def run_workloads(system, plan, log, workloads=WORKLOADS):
    results = {}
    runtime_s = plan.origin_runtime_s if system.key == "origin" else plan.runtime_s
    for w in workloads:
        off, size = region(plan, w.region)
        with Probe(system) as p:
            r = fio(system.uri, w.rw, w.bs, w.iodepth, off, size, runtime_s=runtime_s,
                    flush_every=w.flush_every)
        results[w.key] = p.annotate(r)
        hit = r.get("read_hit_pct")
        log(f"  {w.key:<13} {r['iops']:>10.0f} IOPS {r['mib_s']:>8.1f} MiB/s  "
            f"p50 {r['p50_us']:>9.0f} us  p99 {r['p99_us']:>9.0f} us"
            + (f"  hits {hit:.0f}%" if hit is not None else "")
            + (f"  origin writes {r['origin_writes']:,}" if "origin_writes" in r else ""))
    return results


def reread(system, plan, log):
    """The same region read `reread_passes` times; seconds per pass. One
    fio process runs the passes one after the other (each its own job and
    NBD connection)."""
    off, size = region(plan, "reread")
    with Probe(system) as p:
        passes = fio(system.uri, "read", "1m", 8, off, size, passes=plan.reread_passes)
    total = {"ios": sum(r["ios"] for r in passes)}
    p.annotate(total)
    log("  reread     " + "  ".join(f"{r['runtime_s']:.2f}s" for r in passes)
        + (f"  hits {total['read_hit_pct']:.0f}% over all passes"
           if total.get("read_hit_pct") is not None else ""))
    return {"passes": passes, "total": total}


# ---------------------------------------------------------------------------
# Sustained writeback


def read_iops_log(path):
    """fio's averaged IOPS log: (seconds, IOPS) per interval."""
    series = []
    with open(path) as f:
        for line in f:
            fields = [x.strip() for x in line.split(",")]
            if len(fields) >= 2:
                series.append((int(fields[0]) / 1000.0, float(fields[1])))
    return series


def sustained(system, plan, region_bytes, log_dir, log):
    """4K random writes QD32 over `region_bytes` for `sustained_s`; IOPS
    every `log_avg_ms`, and the cache's dirty share every second if the
    system reports one."""
    prefix = os.path.join(log_dir, f"{system.key}-sustained")
    samples = []
    stop = threading.Event()

    def poll():
        t0 = time.monotonic()
        while not stop.wait(1.0):
            try:
                s = system.counters()
            except BenchError:
                continue
            if s is not None:
                samples.append((time.monotonic() - t0, 100.0 * s["cache_blocks_dirty"]
                                / max(1, s["cache_blocks_total"]),
                                s["stats"]["blocks_written_back"],
                                s["stats"].get("checkpoints", 0)))

    poller = threading.Thread(target=poll, daemon=True)
    with Probe(system) as p:
        poller.start()
        try:
            r = fio(system.uri, "randwrite", "4k", 32, 0, region_bytes,
                    runtime_s=plan.sustained_s, iops_log=prefix, log_avg_ms=plan.log_avg_ms)
        finally:
            stop.set()
            poller.join()
    r = p.annotate(r)
    series = read_iops_log(prefix + "_iops.1.log")
    # The first and last intervals may be partial; leave them out of min.
    inner = [v for _, v in series[1:-1]] or [v for _, v in series]
    r.update({
        "series": series,
        "dirty_pct": samples,
        "min_iops": min(inner) if inner else 0.0,
        "mean_iops": sum(inner) / len(inner) if inner else 0.0,
        "region_bytes": region_bytes,
    })
    log(f"  sustained  mean {r['mean_iops']:.0f} IOPS, min {r['min_iops']:.0f} IOPS"
        + (f", dirty up to {max(x[1] for x in samples):.0f}%" if samples else ""))
    return r


# ---------------------------------------------------------------------------
# RAM per cache block


def settled_rss(proc, samples=5, interval_s=0.25):
    """Median of a few VmRSS readings: allocator trimming and idle I/O
    threads exiting move RSS by a few MiB from one moment to the next."""
    values = []
    for _ in range(samples):
        time.sleep(interval_s)
        values.append(proc.rss_bytes())
    return sorted(values)[len(values) // 2]


def ram_cost(make_tc, plan, work_dir, log):
    """Resident memory of `tiercache serve` per cache block: two caches, a
    small one and one of `ram_fill_blocks` blocks, each filled completely
    (4K sequential writes QD32, writeback mode with background writeback
    and the sequential cutoff off; 1M writes leave megabytes of freed request buffers in the
    allocator's per-thread arenas, which varied by 8 MiB between identical
    runs),
    then the RSS difference per extra cache block. Both servers do the same
    work, so buffers, threads and the binary cancel out; what is left is
    what a block of a full cache costs (tables sized at open plus anything
    that grows as blocks are used)."""
    sizes = {"small": max(4096, plan.ram_fill_blocks // 16), "big": plan.ram_fill_blocks}
    idle = (100, 100, 3600)
    out = {"notes": []}
    for label, blocks in sizes.items():
        d = os.path.join(work_dir, f"ram-{label}")
        os.makedirs(d)
        # Metadata takes room too; the engine reports the real capacity.
        tc = make_tc(f"ram-{label}", blocks * 4096 + blocks * 64 + 8 * MiB, idle)
        total = blocks * 4096 + 64 * MiB
        tc.start(d, total)
        try:
            st = tc.status()
            rss_open = settled_rss(tc.server)
            capacity = st["cache_blocks_total"] * st["block_bytes"]
            t_fill = time.monotonic()
            fio(tc.uri, "write", "4k", 32, 0, capacity // MiB * MiB, timeout_s=3600)
            fill_s = time.monotonic() - t_fill
            # serve gives freed heap back every 5 s (malloc_trim).
            time.sleep(6)
            rss_full = settled_rss(tc.server)
            st = tc.status()
            used = st["cache_blocks_used"]
            out[label] = dict(cache_blocks_total=st["cache_blocks_total"], used=used,
                              rss_open=rss_open, rss_full=rss_full, fill_s=fill_s,
                              metadata_bytes=st.get("metadata_bytes", 0))
            log(f"  RAM {label}: {used:,} of {st['cache_blocks_total']:,} blocks used, "
                f"VmRSS {rss_open / 2**20:.1f} MiB at open, {rss_full / 2**20:.1f} MiB full "
                f"(fill {fill_s:.1f} s); engine metadata {st.get('metadata_bytes', 0) / 2**20:.1f} MiB")
        finally:
            tc.stop()
            out["notes"].extend(tc.notes)
    small, big = out["small"], out["big"]
    extra = big["cache_blocks_total"] - small["cache_blocks_total"]
    if extra <= 0 or big["used"] < big["cache_blocks_total"] * 9 // 10:
        raise BenchError("RAM test: the big cache was not filled")
    out["bytes_per_block"] = (big["rss_full"] - small["rss_full"]) / extra
    out["open_bytes_per_block"] = (big["rss_open"] - small["rss_open"]) / extra
    out["metadata_bytes_per_block"] = big["metadata_bytes"] / big["cache_blocks_total"]
    log(f"  RAM: {out['bytes_per_block']:.1f} B per cache block of a full cache "
        f"({out['open_bytes_per_block']:.1f} B of it resident right after open; the engine "
        f"counts {out['metadata_bytes_per_block']:.1f} B of metadata per block)")
    return out
