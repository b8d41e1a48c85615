"""Entry point behind bench/run: starts each system, runs the workloads,
writes results.json, results.md and the plots. See docs/benchmarks.md."""

import argparse
import datetime
import json
import os
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "trace"))

import replay  # noqa: E402  (bench/trace/replay.py)
import report  # noqa: E402
import workloads as wl  # noqa: E402
from procs import BenchError, run, stop_all  # noqa: E402
from systems import (CephCluster, NbdkitCache, Origin, QemuRaw, RbdDirect, RbdFio,  # noqa: E402
                     RbdNbd, RbdQemu, Tiercache)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["writeback", "writethrough", "writearound", "writeonly"]
# tc-inplace: writeback with the in-place placement (create --placement
# in-place), the default before 2026-11-26; the tc-MODE systems take
# create's default, the log placement (new data down in order through 1 MiB
# segments).
# tc-set: writeback on a cache set of two devices, each the size of the
# others' one cache device, every slot mirrored (--mirror-share 100).
DEFAULT_SYSTEMS = (["origin", "qemu-nbd", "nbdkit-cache"] + [f"tc-{m}" for m in MODES]
                   + ["tc-set", "tc-inplace"])
# On a single-node Ceph cluster (docs/ceph.md), only when asked for with
# --systems: the RBD image alone (fio's rbd engine; qemu-nbd's rbd driver)
# and tiercache writeback in front of it (through qemu-nbd; through its own
# librbd client); the -pt ones in passthrough, every request to the image
# through tiercache's origin device: the two ways of reaching it compared.
# tc-rbd-ordered: tc-rbd-native with writeback in flush order.
CEPH_SYSTEMS = ["rbd-fio", "rbd", "tc-rbd", "tc-rbd-native", "tc-rbd-pt", "tc-rbd-native-pt",
                "tc-rbd-ordered"]
# Only when asked for with --systems: tc-ordered, tc-writeback with
# writeback in flush order (create --writeback-order flush), its cost.
EXTRA_SYSTEMS = ["tc-ordered"]
ALL_SYSTEMS = DEFAULT_SYSTEMS + EXTRA_SYSTEMS + CEPH_SYSTEMS
# Writeback in flush order (systems.Tiercache creates the others with
# address order).
FLUSH_ORDER = ["--writeback-order", "flush"]
# Systems that take turns in the head-to-head rounds when asked for.
PAIRED_EXTRAS = ["tc-set", "tc-inplace"]
# Writeback never starts (high watermark 100 %, an hour's age: runs are far
# shorter): the "idle" reference. Newer tiercache caps the age at 32767 s.
WRITEBACK_IDLE = (100, 100, 3600)
# A request slower than this through a cache is reported as a stall. The
# slowest honest case is a 4K request queued at QD32 behind the origin's
# 5 ms per request (~0.2-0.5 s).
STALL_US = 1.5e6


def log(msg):
    print(msg, flush=True)


def parse_args():
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="short runs, small sizes (< 5 min)")
    g.add_argument("--smoke", action="store_true",
                   help="every system and test for ~1 s: checks that the harness works")
    p.add_argument("--out", help="results directory (default target/bench/<mode>-<time>)")
    p.add_argument("--work-dir", help="scratch directory on the disk under test "
                   "(default target/bench-work); removed afterwards")
    p.add_argument("--keep-work", action="store_true", help="keep the scratch directory")
    p.add_argument("--systems", help=f"comma-separated subset of: {','.join(ALL_SYSTEMS)} "
                   f"(default: all but {','.join(EXTRA_SYSTEMS + CEPH_SYSTEMS)})")
    p.add_argument("--workloads", help="comma-separated jobs, in the default order (default: "
                   + ",".join(w.key for w in wl.WORKLOADS) + "; also: "
                   + ",".join(w.key for w in wl.EXTRA_WORKLOADS) + ")")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: "
                   "workloads,reread,paired,sustained,drain,ram")
    p.add_argument("--tiercache", default=os.path.join(REPO, "target/release/tiercache"),
                   help="tiercache binary")
    p.add_argument("--no-build", action="store_true", help="(bench/run) do not cargo build")
    p.add_argument("--tc-writeback", metavar="HIGH,LOW,AGE",
                   help="background writeback of every tiercache system in the jobs: high and "
                   "low watermarks (%%) and age (s), e.g. 25,10,1 to have it under way during "
                   "10 s jobs (default: tiercache's)")
    t = p.add_argument_group("trace replay (instead of the workloads; docs/trace.md)")
    t.add_argument("--trace", metavar="SPEC", help="replay a block trace: FILE (MSR CSV or "
                   "blkparse text), gen (generated, like the issue's VM trace) or gen-scans; "
                   "--quick and --smoke shrink generated traces")
    t.add_argument("--trace-cache-sizes", default=replay.DEFAULT_SIZES, metavar="F,F",
                   help="cache sizes as multiples of the footprint (default %(default)s)")
    t.add_argument("--trace-iodepth", type=int, default=16, metavar="N")
    t.add_argument("--trace-timing", action="store_true", help="keep the trace's timing")
    t.add_argument("--trace-flush-every", type=int, default=0, metavar="N",
                   help="send a flush (NBD FLUSH) after every N writes (traces carry none; "
                   "default 0: never)")
    t.add_argument("--trace-limit", type=int, metavar="N", help="first N requests of a file")
    t.add_argument("--trace-no-sim", action="store_true", help="skip the policy simulation")
    t.add_argument("--trace-policies", metavar="P,P", help="replay tiercache once per replacement "
                   "policy (tiercache set-policy on the empty cache; default: its default policy)")
    t.add_argument("--trace-admission", metavar="ARGS", help="tiercache set-admission options for "
                   "the replays, e.g. \"--sequential-cutoff 0 --promote-after 1\" (admit everything)")
    return p.parse_args()


def check_work_dir(path):
    """O_DIRECT needs a real disk filesystem: tmpfs would silently turn the
    cache file into page-cache I/O."""
    _, out, _ = run(["findmnt", "-n", "-o", "FSTYPE", "--target", path])
    fs = out.strip()
    if fs in ("tmpfs", "ramfs", "overlayfs"):
        raise BenchError(f"work dir {path} is on {fs}; pass --work-dir on the disk under test")
    return fs


def machine_info(work_dir, fs):
    def first(cmd):
        try:
            return run(cmd, check=False)[1].strip()
        except BenchError:
            return "?"

    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    src = first(["findmnt", "-n", "-o", "SOURCE", "--target", work_dir])
    disk = os.path.basename(src)
    rot = "?"
    try:
        with open(f"/sys/block/{disk}/queue/rotational") as f:
            rot = f.read().strip()
    except OSError:
        pass
    size = first(["lsblk", "-dn", "-o", "SIZE", src]) if src.startswith("/dev/") else "?"
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host_cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30), 1),
        "kernel": os.uname().release,
        "disk": f"{src} ({size}, /sys/block/{disk}/queue/rotational = {rot}), {fs}",
        "fio": first(["fio", "--version"]),
        "nbdkit": first(["nbdkit", "--version"]),
        "qemu_nbd": first(["qemu-nbd", "--version"]).splitlines()[0],
        "ceph": first(["sh", "-c", "ceph --version 2>/dev/null || echo none"]),
        "tiercache_commit": first(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]),
        "loadavg_start": open("/proc/loadavg").read().split()[:3],
    }


def make_system(key, plan, binary, ceph=None):
    if key == "rbd-fio":
        return RbdFio(ceph)
    if key == "rbd":
        return RbdQemu(ceph)
    if key in ("tc-rbd", "tc-rbd-pt"):
        return Tiercache(binary, "passthrough" if key.endswith("-pt") else "writeback",
                         plan.cache_bytes, key=key,
                         origin=lambda d, size: RbdNbd(ceph, key, d, size),
                         origin_describe="the RBD image through qemu-nbd's rbd driver (as `rbd`)")
    if key in ("tc-rbd-native", "tc-rbd-native-pt", "tc-rbd-ordered"):
        ordered = key == "tc-rbd-ordered"
        return Tiercache(binary, "passthrough" if key.endswith("-pt") else "writeback",
                         plan.cache_bytes, key=key,
                         origin=lambda d, size: RbdDirect(ceph, key, size),
                         origin_describe="the RBD image through librbd in tiercache (rbd://)"
                         + (", writeback in flush order" if ordered else ""),
                         extra_create=FLUSH_ORDER if ordered else ())
    if key == "origin":
        return Origin()
    if key == "qemu-nbd":
        return QemuRaw()
    if key == "nbdkit-cache":
        return NbdkitCache(plan.cache_bytes)
    if key == "tc-ordered":
        return ordered_system(binary, plan.cache_bytes)
    if key.startswith("tc-") and key[3:] in MODES:
        return Tiercache(binary, key[3:], plan.cache_bytes)
    if key == "tc-set":
        # Every slot mirrored: the same dirty capacity and watermarks as
        # tc-writeback's one device, so the comparison measures the second
        # copy and where hits are read from, not a smaller dirty space.
        return Tiercache(binary, "writeback", plan.cache_bytes, key="tc-set", caches=2,
                         extra_create=["--mirror-share", "100"])
    if key == "tc-inplace":
        return inplace_system(binary, plan.cache_bytes)
    raise BenchError(f"unknown system '{key}' (known: {', '.join(ALL_SYSTEMS)})")


def inplace_system(binary, cache_bytes):
    """tc-inplace: tiercache writeback with the in-place placement."""
    t = Tiercache(binary, "writeback", cache_bytes, key="tc-inplace",
                  extra_create=["--placement", "in-place"])
    t.describe += ", in-place placement (--placement in-place)"
    return t


def ordered_system(binary, cache_bytes):
    """tc-ordered: tiercache writeback over the emulated HDD, writeback in
    flush order."""
    t = Tiercache(binary, "writeback", cache_bytes, key="tc-ordered", extra_create=FLUSH_ORDER)
    t.describe += ", writeback in flush order (--writeback-order flush)"
    return t


class Phases:
    """Wall time per phase, for the progress log: `phase("warm")` ends one."""

    def __init__(self):
        self.t = time.monotonic()
        self.done = []

    def __call__(self, name):
        now = time.monotonic()
        self.done.append(f"{name} {now - self.t:.1f}")
        self.t = now

    def __str__(self):
        return ", ".join(self.done)


def meminfo_kib(*keys):
    vals = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            vals[k] = int(v.split()[0])
    return sum(vals.get(k, 0) for k in keys)


def settle(max_wait_s=60):
    """Starts each system on a quiet disk and an empty page cache: the one
    before may leave dirty pages (nbdkit's cache filter writes its cache
    file through the page cache) whose writeback would slow the next
    system's jobs, and cached origin pages would speed them. Syncs, drops
    clean pages (as root), and waits until little is dirty or in
    writeback. Returns whether the page cache was dropped."""
    t0 = time.monotonic()
    os.sync()
    dropped = False
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        dropped = True
    except OSError:
        pass
    while meminfo_kib("Dirty", "Writeback") > 16 * 1024 and time.monotonic() - t0 < max_wait_s:
        time.sleep(0.5)
    time.sleep(1)
    return dropped


def bench_system(system, plan, work_dir, skip, results, workloads):
    d = os.path.join(work_dir, system.key)
    os.makedirs(d)
    log(f"{system.key}: {system.describe}")
    phase = Phases()
    if not settle():
        system.notes.append("page cache not dropped before this system (not root)")
    phase("settle")
    try:
        system.start(d, plan.volume_bytes)
        phase("start")
        entry = results["systems"].setdefault(system.key, {"describe": system.describe})
        entry["o_direct"] = system.direct
        if "workloads" not in skip:
            wl.warm(system, plan)
            phase("warm")
            entry["workloads"] = wl.run_workloads(system, plan, log, workloads)
            phase("jobs")
            if system.key != "origin":
                for wkey, r in entry["workloads"].items():
                    if r["max_us"] > STALL_US:
                        system.notes.append(
                            f"stall: a request of job {wkey} took {r['max_us'] / 1e6:.1f} s "
                            f"(p99 {r['p99_us'] / 1e3:.0f} ms)")
        if "reread" not in skip:
            entry["reread"] = wl.reread(system, plan, log)
            phase("reread")
    finally:
        system.stop()
        phase("stop")
        entry_notes = results["systems"].setdefault(system.key, {}).setdefault("notes", [])
        entry_notes.extend(n for n in system.notes if n not in entry_notes)
        shutil.rmtree(d, ignore_errors=True)
    log(f"  (seconds: {phase})")


PAIRED_WORKLOADS = ("rr4k_hit", "rw4k")


def bench_paired(plan, binary, work_dir, rounds, extras=()):
    """The two jobs whose targets compare tiercache with qemu-nbd, run head to
    head: both servers up at once, each warmed as in the main jobs, then
    `rounds` rounds in which the two take turns (the order alternates from
    round to round). Systems measured minutes apart in the main table see
    different host load; on this VM the raw device's own 4K IOPS varied by
    ±30% from one run to the next, which the median of interleaved runs
    cancels. `extras`: more systems that take turns too: tc-set (two
    mirrored cache files), for the targets of two devices against one;
    tc-inplace (the in-place placement), against the log default."""
    pair = [make_system("qemu-nbd", plan, binary), make_system("tc-writeback", plan, binary)]
    pair += [make_system(key, plan, binary) for key in extras]
    titles = {w.key: w for w in wl.WORKLOADS}
    out = {"rounds": rounds, "iops": {w: {s.key: [] for s in pair} for w in PAIRED_WORKLOADS}}
    log(f"head to head: {' and '.join(s.key for s in pair)}, {rounds} rounds")
    settle()
    try:
        for s in pair:
            d = os.path.join(work_dir, f"paired-{s.key}")
            os.makedirs(d)
            s.start(d, plan.volume_bytes)
            wl.warm(s, plan)
        for r in range(rounds):
            order = pair[r % len(pair):] + pair[:r % len(pair)]
            if r % 2 == 1:
                order = order[::-1]
            for wkey in PAIRED_WORKLOADS:
                w = titles[wkey]
                off, size = wl.region(plan, w.region)
                for s in order:
                    res = wl.fio(s.uri, w.rw, w.bs, w.iodepth, off, size, runtime_s=plan.runtime_s)
                    out["iops"][wkey][s.key].append(res["iops"])
            log(f"  round {r + 1}: " + "  ".join(
                f"{wkey} " + " / ".join(f"{s.key} {out['iops'][wkey][s.key][-1]:.0f}" for s in pair)
                for wkey in PAIRED_WORKLOADS))
    finally:
        for s in pair:
            s.stop()
            out.setdefault("notes", []).extend(s.notes)
            shutil.rmtree(s.dir or "", ignore_errors=True)
    return out


def bench_sustained(plan, binary, work_dir, systems, results):
    """tiercache writeback with background writeback running (default
    watermarks) and idle (never starts), and nbdkit's cache filter, on
    one cache size and one written region."""
    out = results.setdefault("sustained", {})
    runs = []
    if "tc-writeback" in systems:
        runs.append(Tiercache(binary, "writeback", plan.sustained_cache_bytes))
        runs.append(Tiercache(binary, "writeback", plan.sustained_cache_bytes,
                              key="tc-writeback-idle", writeback=WRITEBACK_IDLE))
    if "nbdkit-cache" in systems:
        runs.append(NbdkitCache(plan.sustained_cache_bytes))
    region_bytes = None
    for system in runs:
        key = system.key
        d = os.path.join(work_dir, f"sustained-{key}")
        os.makedirs(d)
        log(f"sustained writeback: {key}")
        settle()
        try:
            system.start(d, plan.volume_bytes)
            if region_bytes is None:
                if isinstance(system, Tiercache):
                    st = system.status()
                    capacity = st["cache_blocks_total"] * st["block_bytes"]
                else:
                    capacity = plan.sustained_cache_bytes
                region_bytes = capacity * plan.sustained_region_pct // 100 // (1 << 20) * (1 << 20)
            r = wl.sustained(system, plan, region_bytes, results["out_dir"], log)
            if isinstance(system, Tiercache):
                r["writeback"] = system.status()["writeback"]
            out[key] = r
        finally:
            system.stop()
            out.setdefault(key, {}).setdefault("notes", []).extend(system.notes)
            shutil.rmtree(d, ignore_errors=True)


# Writeback beside the foreground (issue 34): bench/drain-latency.sh's fixed
# load of 4K read hits and writes, idle, during `tiercache flush` and during
# watermark writeback. Per plan: (name, SECS, RATE, DIRTY, ROUNDS, env).
DRAIN_RUNS = {
    "smoke": [("emulated HDD", 1, 200, 1000, 1, {})],
    "quick": [("emulated HDD", 5, 500, 2000, 1, {})],
    "full": [("emulated HDD", 15, 500, 6000, 3, {}),
             ("busy cache device (1 ms a request, 8 at once)", 15, 500, 6000, 3,
              {"CACHE_DELAY_MS": "1", "CACHE_THREADS": "8"}),
             ("slow origin (20 ms a request)", 15, 500, 2000, 3, {"DELAY_MS": "20"})],
}


def bench_drain(plan, binary, results):
    """Read-hit and write latency at a fixed rate with no writeback and
    while the cache drains (bench/drain-latency.sh, one run per variant)."""
    out = results.setdefault("drain", [])
    for name, secs, rate, dirty, rounds, env in DRAIN_RUNS[plan.name]:
        log(f"writeback beside the foreground: {name}")
        settle()
        t = time.monotonic()
        json_out = os.path.join(results["out_dir"], f"drain-{len(out)}.json")
        cmd = [os.path.join(REPO, "bench/drain-latency.sh"), str(secs), str(rate), str(dirty)]
        _, stdout, _ = run(cmd, env=dict(os.environ, TIERCACHE_BIN=binary, ROUNDS=str(rounds),
                                         JSON_OUT=json_out, **env),
                           timeout_s=rounds * (3 * secs + 1200))
        with open(os.path.join(results["out_dir"], f"drain-{len(out)}.log"), "w") as f:
            f.write(stdout)
        with open(json_out) as f:
            r = json.load(f)
        r["name"] = name
        r["command"] = " ".join([f"{k}={v}" for k, v in env.items()]
                                + [f"ROUNDS={rounds}", "bench/drain-latency.sh",
                                   str(secs), str(rate), str(dirty)])
        out.append(r)
        log(f"  ({time.monotonic() - t:.0f} s)")


def bench_trace(args, plan, binary, work_dir, out_dir, systems):
    """`--trace`: the trace replayed against each system (bench/trace/replay.py)."""

    def make(key, cache_bytes):
        if key == "nbdkit-cache":
            return NbdkitCache(cache_bytes)
        if key == "tc-ordered":
            return ordered_system(binary, cache_bytes)
        if key == "tc-inplace":
            return inplace_system(binary, cache_bytes)
        if key.startswith("tc-"):
            return Tiercache(binary, key[3:], cache_bytes)
        return make_system(key, plan, binary)

    return replay.run(args, plan.name, make, systems, work_dir, out_dir, settle, log)


def write_trace_report(results, out_dir):
    m = results["machine"]
    md = "\n".join([
        f"## Trace replay: {results['plan']['name']} run, {m['date']}", "",
        f"- command: `{results['command']}` ({results['elapsed_s']:.0f} s)",
        f"- machine: {m['host_cores']} cores ({m['cpu']}), kernel {m['kernel']}; load average "
        f"{' '.join(m['loadavg_start'])} at start, {' '.join(m.get('loadavg_end', []))} at end",
        f"- disk: {m['disk']}",
        f"- tools: {m['fio']}, {m['nbdkit']}; tiercache {m['tiercache_commit']}", "",
        replay.markdown(results["trace"]), ""])
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(md)
    return md


def interrupted(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    args = parse_args()
    plan = wl.PLANS["smoke" if args.smoke else "quick" if args.quick else "full"]
    skip = set(filter(None, args.skip.split(",")))
    systems = args.systems.split(",") if args.systems else DEFAULT_SYSTEMS
    workloads = wl.WORKLOADS
    if args.workloads:
        keys = args.workloads.split(",")
        # Each extra job right after the default one it varies.
        known = []
        for w in wl.WORKLOADS:
            known += [w] + [x for x in wl.EXTRA_WORKLOADS if x.key.startswith(w.key + "_")]
        unknown = [k for k in keys if k not in {w.key for w in known}]
        if unknown:
            raise BenchError(f"unknown workload(s) {', '.join(unknown)} (known: "
                             f"{', '.join(w.key for w in known)})")
        workloads = [w for w in known if w.key in keys]
    if args.trace and not args.systems:
        systems = replay.DEFAULT_SYSTEMS
    tc_writeback = None
    if args.tc_writeback:
        try:
            tc_writeback = tuple(int(x) for x in args.tc_writeback.split(","))
        except ValueError:
            tc_writeback = ()
        if len(tc_writeback) != 3:
            raise BenchError(f"--tc-writeback wants HIGH,LOW,AGE (three integers), not "
                             f"'{args.tc_writeback}'")
    for s in systems:
        if s not in ALL_SYSTEMS:
            raise BenchError(f"unknown system '{s}' (known: {', '.join(ALL_SYSTEMS)})")
    if any(s.startswith("tc-") for s in systems) and not os.access(args.tiercache, os.X_OK):
        raise BenchError(f"no tiercache binary at {args.tiercache}; run cargo build --release")
    binary = os.path.abspath(args.tiercache)

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = os.path.abspath(args.out or os.path.join(REPO, "target/bench", f"{plan.name}-{stamp}"))
    work_dir = os.path.abspath(args.work_dir or os.path.join(REPO, "target/bench-work"))
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(os.path.join(work_dir, "ceph")):
        # A cluster left by a killed run: its daemons go by their PID files.
        CephCluster(os.path.join(work_dir, "ceph")).stop(force=True)
    if os.path.exists(work_dir):
        shutil.rmtree(work_dir)
    os.makedirs(work_dir)
    fs = check_work_dir(work_dir)

    # SIGTERM/SIGHUP end the run like Ctrl-C: servers are stopped by PID.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)

    t0 = time.monotonic()
    results = {
        "plan": plan.__dict__ | {"volume_bytes": plan.volume_bytes},
        "command": "bench/run " + " ".join(sys.argv[1:]),
        "machine": machine_info(work_dir, fs),
        "out_dir": out_dir,
        "systems": {},
        "workload_titles": {w.key: w.title for w in workloads},
    }
    log(f"bench: {plan.name} run, results in {out_dir}, scratch in {work_dir} ({fs})")
    # One cluster for every Ceph system, its BlueStore file on the disk under test.
    ceph = CephCluster(os.path.join(work_dir, "ceph"))
    try:
        if any(s in CEPH_SYSTEMS for s in systems):
            log("ceph: starting a single-node cluster (scripts/ceph-up.sh)")
            ceph.start()
            log(f"  (up in {ceph.start_s:.0f} s)")
            results["ceph_up_s"] = ceph.start_s
        if args.trace:
            results["trace"] = bench_trace(args, plan, binary, work_dir, out_dir, systems)
            systems = []
        for key in systems:
            system = make_system(key, plan, binary, ceph)
            if tc_writeback and isinstance(system, Tiercache):
                system.writeback = tc_writeback
                system.describe += ", writeback high/low/age " + args.tc_writeback
            bench_system(system, plan, work_dir, skip, results, workloads)
        if "paired" not in skip and {"qemu-nbd", "tc-writeback"} <= set(systems):
            results["paired"] = bench_paired(plan, binary, work_dir,
                                             rounds=3 if plan.name == "full" else 1,
                                             extras=[k for k in PAIRED_EXTRAS if k in systems])
        if "sustained" not in skip:
            bench_sustained(plan, binary, work_dir, systems, results)
        if "drain" not in skip and "tc-writeback" in systems:
            bench_drain(plan, binary, results)
        if "ram" not in skip and "tc-writeback" in systems:
            log("RAM per cache block: tiercache writeback")
            settle()
            t_ram = time.monotonic()
            results["ram"] = wl.ram_cost(
                # The fill is sequential: no cutoff, so it fills the cache.
                lambda key, cache_bytes, wb: Tiercache(binary, "writeback", cache_bytes, key=key,
                                                       writeback=wb, cache_written=False,
                                                       extra_create=["--sequential-cutoff", "0"]),
                plan, work_dir, log)
            log(f"  ({time.monotonic() - t_ram:.0f} s)")
    finally:
        stop_all()
        try:
            ceph.stop()
        except BenchError as e:
            log(f"ceph: {e}")
        if not args.keep_work:
            shutil.rmtree(work_dir, ignore_errors=True)
    results["elapsed_s"] = time.monotonic() - t0
    results["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = report.write(results, out_dir) if not args.trace else write_trace_report(results, out_dir)
    log("")
    log(md)
    log(f"bench: done in {results['elapsed_s']:.0f} s; results in {out_dir}")


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        stop_all()
        print(f"bench: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        stop_all()
        print("bench: interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
