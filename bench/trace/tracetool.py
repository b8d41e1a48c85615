"""Trace tool: generate, describe, simulate and convert block traces.

    /usr/bin/python3 bench/trace/tracetool.py gen [--preset default|scans] [--seed N] [--set K=V ...] -o t.csv
    /usr/bin/python3 bench/trace/tracetool.py info TRACE [--sim] [--sizes 0.125,0.25,0.5,1,2]
    /usr/bin/python3 bench/trace/tracetool.py iolog TRACE -o t.iolog [--timing] [--volume SIZE]
    /usr/bin/python3 bench/trace/tracetool.py check t.iolog [--iodepth 16]

TRACE is a file (MSR CSV or blkparse text, optionally .gz; the format is
sniffed, or given with --format) or `gen` / `gen-scans` for the
generator's presets. See docs/trace.md.
"""

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import analyze  # noqa: E402
import gen  # noqa: E402
import iolog  # noqa: E402
import readers  # noqa: E402
import sim  # noqa: E402
from procs import BenchError, Proc, run, wait_for_socket  # noqa: E402  (bench/procs.py)

GEN_SPECS = {"gen": "default", "gen-default": "default", "gen-scans": "scans"}


class ToolError(Exception):
    """A bad argument or input: one line, no traceback."""


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise ToolError(f"bad size {text!r} (e.g. 4G, 512M)") from None


def gen_params(preset, seed=None, sets=()):
    overrides = {}
    fields = {f.name: f for f in dataclasses.fields(gen.GenParams)}
    for kv in sets:
        if "=" not in kv:
            raise ToolError(f"--set wants KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        if k not in fields:
            raise ToolError(f"unknown generator parameter {k!r} (known: {', '.join(fields)})")
        default = getattr(gen.GenParams(), k)
        try:
            if isinstance(default, tuple):
                overrides[k] = tuple(int(x) for x in v.split(","))
            else:
                overrides[k] = type(default)(v)
        except ValueError:
            raise ToolError(f"bad value for {k}: {v!r}") from None
    if seed is not None:
        overrides["seed"] = seed
    try:
        return gen.params_for(preset, **overrides)
    except ValueError as e:
        raise ToolError(str(e)) from None


def load(spec, fmt=None, device=None, event="Q", limit=None, seed=None, sets=()):
    """(requests, description) for a file or a generator spec."""
    if spec in GEN_SPECS or spec.startswith("gen:"):
        preset = GEN_SPECS.get(spec) or spec.split(":", 1)[1]
        p = gen_params(preset, seed, sets)
        reqs = gen.generate(p)
        return reqs, f"generated: preset {preset}, {p.describe()}"
    if sets or seed is not None:
        raise ToolError("--seed and --set apply to generated traces only")
    kw = {"device": device, "limit": limit}
    if (fmt or readers.sniff_format(spec)) == "blkparse":
        kw["event"] = event
    t = readers.read_trace(spec, fmt, **kw)
    desc = f"{os.path.basename(spec)} ({t.format}; {'; '.join(t.notes)})"
    if t.skipped:
        desc += "; skipped: " + ", ".join(f"{v:,} {k}" for k, v in sorted(t.skipped.items()))
    return t.requests, desc


def prepare(requests, volume_bytes=None):
    """Fold onto a volume and split oversized requests: (requests,
    volume_bytes, notes). The analysis and the replay both use the result."""
    reqs, vol, notes = iolog.fold(requests, volume_bytes)
    reqs, n_split = iolog.split_large(reqs)
    if n_split:
        notes.append(f"{n_split} requests over {iolog.MAX_REQUEST_BYTES >> 20} MiB split")
    return reqs, vol, notes


def check_iolog(path, volume_bytes=None, iodepth=16, timing=False):
    """Replays `path` against `nbdkit memory` and checks that fio did every
    request with every byte. Returns fio's job result."""
    counts = iolog.read_iolog_counts(path)
    n = counts[0] + counts[1]
    if volume_bytes is None:
        volume_bytes = _iolog_extent(path)
    for tool in ("fio", "nbdkit"):
        if shutil.which(tool) is None:
            raise ToolError(f"{tool} not found: apt-get install {tool}")
    d = tempfile.mkdtemp(prefix="trace-check-")
    sock = os.path.join(d, "mem.sock")
    server = Proc("nbdkit memory", ["nbdkit", "-f", "-U", sock, "--exit-with-parent", "memory",
                                    str(volume_bytes)], os.path.join(d, "nbdkit.log"))
    try:
        wait_for_socket(sock, server)
        argv = ["fio", "--name=check", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}",
                "--output-format=json", *iolog.fio_args(path, n, iodepth, timing)]
        _, out, _ = run(argv, timeout_s=600)
        job = parse_fio_json(out)["jobs"][0]
        iolog.check_replay(job, counts, iolog.read_iolog_syncs(path))
        return job
    finally:
        server.stop()
        shutil.rmtree(d, ignore_errors=True)


def _iolog_extent(path):
    end = 0
    with open(path) as f:
        f.readline()
        for line in f:
            p = line.split()
            if len(p) >= 4 and p[-3] in ("read", "write"):
                end = max(end, int(p[-2]) + int(p[-1]))
    return max(1 << 20, (end + (1 << 20) - 1) >> 20 << 20)


def parse_fio_json(out):
    """fio's nbd engine prints "fio: connected to NBD server" before the JSON."""
    start = out.find("{")
    try:
        return json.loads(out[start:]) if start >= 0 else json.loads(out)
    except ValueError:
        raise ToolError(f"fio output is not JSON: {out[:300]!r}") from None


def cmd_gen(a):
    p = gen_params(a.preset, a.seed, a.set)
    reqs = gen.generate(p)
    gen.write_msr(reqs, a.out)
    print(f"{a.out}: {len(reqs):,} requests, preset {a.preset}, {p.describe()}")
    print(analyze.format_stats(analyze.stats(reqs)))


def cmd_info(a):
    reqs, desc = load(a.trace, a.format, a.device, a.event, a.limit, a.seed, a.set)
    reqs, vol, notes = prepare(reqs)
    print(f"trace: {desc}")
    for n in notes:
        print(f"  {n}")
    print(analyze.format_stats(analyze.stats(reqs, origin_ms=a.origin_ms)))
    if a.sim:
        res = sim.run(reqs, sim.parse_fractions(a.sizes),
                      a.policies.split(",") if a.policies else sim.DEFAULT_POLICIES,
                      log=lambda m: print(m, file=sys.stderr))
        print()
        print(sim.markdown(res))


def cmd_iolog(a):
    reqs, desc = load(a.trace, a.format, a.device, a.event, a.limit, a.seed, a.set)
    reqs, vol, notes = prepare(reqs, parse_size(a.volume) if a.volume else None)
    if a.flush_every < 0:
        raise ToolError(f"--flush-every must be 0 or more, not {a.flush_every}")
    n = iolog.write_iolog(reqs, a.out, timing=a.timing, flush_every=a.flush_every)
    print(f"{a.out}: {n:,} requests from {desc}; volume {vol:,} bytes ({vol / 2**20:.0f} MiB)")
    for note in notes:
        print(f"  {note}")
    print("replay: fio --name=replay --ioengine=nbd --uri=nbd+unix:///?socket=SOCK "
          + " ".join(iolog.fio_args(a.out, n, a.iodepth, a.timing)))


def cmd_check(a):
    job = check_iolog(a.iolog, parse_size(a.volume) if a.volume else None, a.iodepth, a.timing)
    print(f"{a.iolog}: replayed completely: {job['read']['total_ios']:,} reads, "
          f"{job['write']['total_ios']:,} writes in {job['job_runtime'] / 1000:.2f} s")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tracetool", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def trace_args(p):
        p.add_argument("trace", help="file (MSR CSV or blkparse text), gen or gen-scans")
        p.add_argument("--format", choices=["msr", "blkparse"], help="default: sniffed")
        p.add_argument("--device", help="MSR: HOST/DISK (e.g. hm/0); blkparse: MAJ,MIN")
        p.add_argument("--event", default="Q", help="blkparse event kind to take (default Q)")
        p.add_argument("--limit", type=int, help="first N requests only")
        p.add_argument("--seed", type=int, help="generator seed")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="generator parameter (docs/trace.md)")

    p = sub.add_parser("gen", help="write a generated trace as MSR CSV")
    p.add_argument("--preset", default="default", choices=sorted(gen.PRESETS))
    p.add_argument("--seed", type=int)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("-o", "--out", required=True)
    p.set_defaults(fn=cmd_gen)

    p = sub.add_parser("info", help="statistics, the compulsory-miss bound, policy simulation")
    trace_args(p)
    p.add_argument("--origin-ms", type=float, default=5.0, help="origin latency per request")
    p.add_argument("--sim", action="store_true", help="simulate the replacement policies")
    p.add_argument("--sizes", default=",".join(f"{f:g}" for f in sim.DEFAULT_FRACTIONS),
                   help="cache sizes as multiples of the footprint")
    p.add_argument("--policies", help=f"comma-separated subset of {','.join(sim.DEFAULT_POLICIES)}")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("iolog", help="convert to a fio iolog")
    trace_args(p)
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--timing", action="store_true",
                   help="keep the trace's timing (iolog v3); default: as fast as possible")
    p.add_argument("--volume", help="volume size to fold into (default: the packed trace)")
    p.add_argument("--iodepth", type=int, default=16)
    p.add_argument("--flush-every", type=int, default=0, metavar="N",
                   help="a flush after every N writes (default 0: none; traces carry none)")
    p.set_defaults(fn=cmd_iolog)

    p = sub.add_parser("check", help="replay an iolog against nbdkit memory and verify it completes")
    p.add_argument("iolog")
    p.add_argument("--volume", help="export size (default: the iolog's extent)")
    p.add_argument("--iodepth", type=int, default=16)
    p.add_argument("--timing", action="store_true")
    p.set_defaults(fn=cmd_check)

    a = ap.parse_args(argv)
    try:
        a.fn(a)
    except (ToolError, BenchError, readers.TraceError, ValueError, OSError) as e:
        print(f"tracetool: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
