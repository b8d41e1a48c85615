"""results.json -> results.md (tables, ratios, targets) and PNG plots."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PEERS = ["origin", "qemu-nbd", "nbdkit-cache"]
TC = ["tc-writeback", "tc-writethrough", "tc-writearound", "tc-writeonly"]
# On the Ceph cluster (docs/ceph.md): the RBD image alone, two ways, and
# tiercache in front of it.
RBD_PEERS = ["rbd-fio", "rbd"]
RBD_TC = ["tc-rbd", "tc-rbd-native", "tc-rbd-pt", "tc-rbd-native-pt"]
RBD_RATIOS = [("tc-rbd", "rbd"), ("tc-rbd-native", "rbd"), ("tc-rbd-native", "tc-rbd"),
              ("tc-rbd", "rbd-fio"), ("tc-rbd-native", "rbd-fio"), ("rbd", "rbd-fio"),
              ("tc-rbd-native-pt", "tc-rbd-pt"), ("tc-rbd-pt", "rbd"),
              ("tc-rbd-native-pt", "rbd-fio")]


def fmt_num(v, digits=0):
    if v is None:
        return "n/a"
    return f"{v:,.{digits}f}"


def drain_p99_ratio(r, phase, kind):
    """A drain run's p99 of `kind` (hits, writes) in `phase` over idle's."""
    ph = r["phases"]
    return ratio(ph[phase][kind][1], ph["idle"][kind][1])


def fmt_machine(r):
    """The whole machine's CPU a request, with its busy share of all cores."""
    us, pct = r.get("machine_cpu_us_per_io"), r.get("machine_busy_pct")
    if us is None or pct is None:
        return "n/a"
    return f"{us:,.1f} ({pct:.0f}%)"


def fmt_lat(us):
    if us is None:
        return "n/a"
    if us >= 10_000:
        return f"{us / 1000:,.0f} ms"
    if us >= 1000:
        return f"{us / 1000:.1f} ms"
    return f"{us:.0f} µs"


def fmt_ratio(v):
    if v is None:
        return "n/a"
    return f"{v:.2f}×" if v < 100 else f"{v:,.0f}×"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def iops(results, system, workload):
    try:
        return results["systems"][system]["workloads"][workload]["iops"]
    except KeyError:
        return None


def median(v):
    v = sorted(v)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def paired_ratio(results, workload, a="tc-writeback", b="qemu-nbd"):
    """a / b (default tc-writeback / qemu-nbd), medians of the head-to-head
    rounds."""
    runs = results.get("paired", {}).get("iops", {}).get(workload)
    if not runs or not runs.get(a) or not runs.get(b):
        return None
    return ratio(median(runs.get(a, [])), median(runs.get(b, [])))


def vs_qemu(results, workload):
    """(label, ratio): head to head where that ran, else the main table's."""
    r = paired_ratio(results, workload)
    if r is not None:
        return "head to head", r
    return "main table", ratio(iops(results, "tc-writeback", workload),
                               iops(results, "qemu-nbd", workload))


def targets(results):
    """(name, value, threshold) for each target in issue 4; a negative
    threshold is an upper bound."""
    rows = []
    wb_w = iops(results, "tc-writeback", "rw4k")
    how, r = vs_qemu(results, "rw4k")
    rows.append((f"4K randwrite QD32, writeback ≥ 1.0× qemu-nbd ({how})", r, 1.0))
    rows.append(("4K randwrite QD32, writeback ≥ 300× origin",
                 ratio(wb_w, iops(results, "origin", "rw4k")), 300.0))
    how, r = vs_qemu(results, "rr4k_hit")
    rows.append((f"4K randread hits QD32, writeback ≥ 1.0× qemu-nbd ({how})", r, 1.0))
    rr = results["systems"].get("tc-writeback", {}).get("reread", {}).get("passes")
    rows.append(("re-read, writeback: pass 2 speed ≥ 0.9× pass 5",
                 ratio(rr[4]["runtime_s"], rr[1]["runtime_s"]) if rr and len(rr) >= 5 else None, 0.9))
    sus = results.get("sustained", {})
    busy, idle = sus.get("tc-writeback", {}), sus.get("tc-writeback-idle", {})
    rows.append(("sustained writeback: min foreground IOPS ≥ 0.8× idle mean",
                 ratio(busy.get("min_iops"), idle.get("mean_iops")), 0.8))
    ram = results.get("ram", {}).get("bytes_per_block")
    rows.append(("RAM per cache block ≤ 24 B", ram, -24.0))
    for r in results.get("drain", []):
        worst = max((drain_p99_ratio(r, p, k) or 0)
                    for p in ("flush", "watermark") for k in ("hits", "writes"))
        finished = all(d["finished"] for d in r["drain"].values())
        rows.append((f"writeback beside the foreground, {r['name']}: worst p99 during a drain "
                     f"≤ 1.5× idle{'' if finished else ' (a drain did not finish)'}",
                     worst if finished else None, -1.5))
    if paired_ratio(results, "rw4k", "tc-set", "tc-writeback") is not None:
        rows.append(("cache set of two: 4K randwrite ≥ 0.85× one device (head to head)",
                     paired_ratio(results, "rw4k", "tc-set", "tc-writeback"), 0.85))
        rows.append(("cache set of two: 4K read hits ≥ 1.0× one device (head to head)",
                     paired_ratio(results, "rr4k_hit", "tc-set", "tc-writeback"), 1.0))
    if paired_ratio(results, "rw4k", "tc-writeback", "tc-inplace") is not None:
        rows.append(("log placement: 4K randwrite ≥ 0.95× in place (head to head)",
                     paired_ratio(results, "rw4k", "tc-writeback", "tc-inplace"), 0.95))
        rows.append(("log placement: 4K read hits ≥ 0.95× in place (head to head)",
                     paired_ratio(results, "rr4k_hit", "tc-writeback", "tc-inplace"), 0.95))
    return rows


def write(results, out_dir):
    plots = make_plots(results, out_dir)
    md = render(results, plots)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(md)
    return md


def render(results, plots):
    m = results["machine"]
    plan = results["plan"]
    titles = results["workload_titles"]
    systems = results["systems"]
    L = []
    L.append(f"## Benchmark: {plan['name']} run, {m['date']}")
    L.append("")
    L.append(f"- command: `{results['command']}` ({results['elapsed_s']:.0f} s)")
    L.append(f"- machine: {m['host_cores']} cores ({m['cpu']}), {m['memory_gib']} GiB RAM, "
             f"kernel {m['kernel']}; load average {' '.join(m['loadavg_start'])} at start, "
             f"{' '.join(m.get('loadavg_end', []))} at end")
    L.append(f"- disk: {m['disk']}")
    L.append(f"- tools: {m['fio']}, {m['nbdkit']}, {m['qemu_nbd']}; tiercache {m['tiercache_commit']}")
    L.append(f"- sizes: working set {plan['ws_bytes'] >> 20} MiB, re-read {plan['reread_bytes'] >> 20} MiB, "
             f"cold region {plan['cold_bytes'] >> 20} MiB, cache {plan['cache_bytes'] >> 20} MiB "
             f"(tiercache cache file; nbdkit cache-max-size), {plan['runtime_s']} s per job "
             f"({plan['origin_runtime_s']} s on the origin alone)")
    if "ceph" in m and any(k in systems for k in RBD_PEERS + RBD_TC):
        L.append(f"- Ceph: {m['ceph']}, single node (scripts/ceph-up.sh: mon, mgr, one OSD on a "
                 f"file-backed BlueStore on the same disk, pool size 1), up in "
                 f"{results.get('ceph_up_s', 0):.0f} s")
    L.append("- client: fio ioengine=nbd, one job, over a Unix socket, for every system "
             "(rbd-fio: fio's rbd engine instead). "
             "Latencies are fio completion latencies. CPU/IO is the server process's "
             "utime+stime (/proc/PID/stat) over the job divided by I/Os completed; "
             "the origin's nbdkit is not counted for the caches.")
    L.append("- tiercache opens its cache file with O_DIRECT (no page-cache help), as qemu-nbd "
             "--cache=none does; nbdkit's cache filter keeps its cache in a temporary file "
             "through the page cache.")
    L.append("")
    L.append("### Systems")
    L.append("")
    for key, e in systems.items():
        direct = {True: " (fast device open with O_DIRECT: checked in /proc/PID/fdinfo)",
                  False: " (**fast device NOT open with O_DIRECT**, per /proc/PID/fdinfo)",
                  None: ""}[e.get("o_direct")]
        L.append(f"- **{key}**: {e.get('describe', '')}{direct}")
    L.append("")

    # Main table.
    L.append("### Results")
    L.append("")
    L.append("| workload | system | IOPS | MiB/s | p50 | p99 | CPU µs/IO | machine CPU µs/IO (busy) | read hits |")
    L.append("|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for wkey, title in titles.items():
        for skey, e in systems.items():
            r = e.get("workloads", {}).get(wkey)
            if r is None:
                continue
            hit = r.get("read_hit_pct")
            L.append(f"| {title} | {skey} | {fmt_num(r['iops'])} | {fmt_num(r['mib_s'], 1)} | "
                     f"{fmt_lat(r['p50_us'])} | {fmt_lat(r['p99_us'])} | "
                     f"{fmt_num(r.get('cpu_us_per_io'), 1)} | {fmt_machine(r)} | "
                     f"{'' if hit is None else f'{hit:.0f}%'} |")
    L.append("")

    # Ratios.
    tcs = [s for s in TC if s in systems]
    for peer in PEERS:
        if peer not in systems or not tcs:
            continue
        L.append(f"### tiercache / {peer} (IOPS)")
        L.append("")
        L.append("| workload | " + " | ".join(tcs) + " |")
        L.append("|---|" + "--:|" * len(tcs))
        for wkey, title in titles.items():
            cells = [fmt_ratio(ratio(iops(results, t, wkey), iops(results, peer, wkey))) for t in tcs]
            L.append(f"| {title} | " + " | ".join(cells) + " |")
        L.append("")

    # The RBD image alone and tiercache in front of it.
    rbd_pairs = [(a, b) for a, b in RBD_RATIOS if a in systems and b in systems]
    if rbd_pairs:
        L.append("### On Ceph: ratios of IOPS")
        L.append("")
        L.append("| workload | " + " | ".join(f"{a} / {b}" for a, b in rbd_pairs) + " |")
        L.append("|---|" + "--:|" * len(rbd_pairs))
        for wkey, title in titles.items():
            cells = [fmt_ratio(ratio(iops(results, a, wkey), iops(results, b, wkey)))
                     for a, b in rbd_pairs]
            if any(c != "n/a" for c in cells):
                L.append(f"| {title} | " + " | ".join(cells) + " |")
        L.append("")

    # Re-read.
    rr_rows = [(k, e["reread"]["passes"], e["reread"]["total"].get("read_hit_pct"))
               for k, e in systems.items() if e.get("reread")]
    if rr_rows:
        n = len(rr_rows[0][1])
        L.append(f"### Re-read: the same {plan['reread_bytes'] >> 20} MiB read {n} times "
                 "(1M sequential, QD8), seconds per pass")
        L.append("")
        L.append("| system | " + " | ".join(f"pass {i + 1}" for i in range(n))
                 + " | pass 2 speed / pass 5 | read hits, all passes |")
        L.append("|---|" + "--:|" * (n + 2))
        for k, passes, hits in rr_rows:
            cells = [f"{p['runtime_s']:.2f}" for p in passes]
            r25 = ratio(passes[4]["runtime_s"], passes[1]["runtime_s"]) if n >= 5 else None
            L.append(f"| {k} | " + " | ".join(cells) + f" | {fmt_ratio(r25)} | "
                     f"{'' if hits is None else f'{hits:.0f}%'} |")
        L.append("")

    paired = results.get("paired")
    if paired and paired.get("iops"):
        # The other systems that took turns, as the results recorded them.
        extras = []
        for runs in paired["iops"].values():
            extras += [k for k, v in runs.items()
                       if v and k not in ("qemu-nbd", "tc-writeback", *extras)]
        who = ", ".join(["qemu-nbd", "tc-writeback"] + extras)
        L.append(f"### Head to head: {who}, {paired['rounds']} rounds")
        L.append("")
        L.append("All servers up at once, each warmed like the main jobs; in each round they "
                 "run the job in turn, the order alternating from round to round, so all "
                 "see the same host load. The targets against qemu-nbd use the medians.")
        L.append("")
        L.append("| workload | qemu-nbd IOPS, per round | tc-writeback IOPS, per round "
                 "| median ratio |" + "".join(f" {k} IOPS, per round | {k} / tc-writeback |"
                                              for k in extras))
        L.append("|---|--:|--:|--:|" + "--:|--:|" * len(extras))
        for wkey, runs in paired["iops"].items():
            q, t = runs.get("qemu-nbd", []), runs.get("tc-writeback", [])
            row = (f"| {titles.get(wkey, wkey)} | {', '.join(fmt_num(x) for x in q)} | "
                   f"{', '.join(fmt_num(x) for x in t)} | "
                   f"{fmt_ratio(paired_ratio(results, wkey))} |")
            for k in extras:
                row += (f" {', '.join(fmt_num(x) for x in runs.get(k, []))} | "
                        f"{fmt_ratio(paired_ratio(results, wkey, k, 'tc-writeback'))} |")
            L.append(row)
        L.append("")

    # Sustained.
    sus = results.get("sustained", {})
    if sus:
        idle = sus.get("tc-writeback-idle", {}).get("mean_iops")
        L.append(f"### Sustained writeback: 4K randwrite QD32 for {plan['sustained_s']} s")
        L.append("")
        any_r = next(iter(sus.values()))
        L.append(f"Cache of {plan['sustained_cache_bytes'] >> 20} MiB; the written region is "
                 f"{plan['sustained_region_pct']}% of tiercache's cache capacity "
                 f"({any_r.get('region_bytes', 0) >> 20} MiB), so with the default watermarks "
                 "(start at 50% dirty, stop at 25%) writeback runs for most of the run while "
                 "the workload still fits the cache. `tc-writeback-idle` is the same cache with "
                 "writeback never starting (high watermark 100%, age 1 hour). Min leaves out the "
                 f"first and last {plan['log_avg_ms']} ms interval.")
        L.append("")
        L.append("`min / own mean`: how far a run's 1-second intervals dip below its own "
                 "mean; for the idle run that is the workload and the host alone, the noise "
                 "floor of this measurement.")
        L.append("")
        L.append("| run | mean IOPS | min IOPS | min / idle mean | min / own mean | max dirty "
                 "| blocks written back | checkpoints | max latency |")
        L.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
        for k, r in sus.items():
            if "mean_iops" not in r:
                continue
            dirty = max((x[1] for x in r.get("dirty_pct", [])), default=None)
            L.append(f"| {k} | {fmt_num(r['mean_iops'])} | {fmt_num(r['min_iops'])} | "
                     f"{fmt_ratio(ratio(r['min_iops'], idle))} | "
                     f"{fmt_ratio(ratio(r['min_iops'], r['mean_iops']))} | "
                     f"{'' if dirty is None else f'{dirty:.0f}%'} | "
                     f"{fmt_num(r.get('written_back_blocks'))} | {fmt_num(r.get('checkpoints'))} | "
                     f"{fmt_lat(r.get('max_us'))} |")
        L.append("")

    drain = results.get("drain", [])
    if drain:
        L.append("### Writeback beside the foreground: latency at a fixed rate while the cache drains")
        L.append("")
        L.append("bench/drain-latency.sh: tiercache writeback (cache a file in /dev/shm unless "
                 "said) over nbdkit's memory plugin behind the delay and noparallel filters "
                 "(one request at a time); fio ioengine=nbd, 4K read hits and 4K writes at a "
                 "fixed rate, QD4 each: idle, during `tiercache flush` of the dirty blocks, and "
                 "during background writeback above the high watermark. Target: p99 at most "
                 "1.5× idle, the drain finishing. Medians of the rounds.")
        L.append("")
        for r in drain:
            L.append(f"{r['name']}: {r['rate_iops']} hits/s + {r['rate_iops']} writes/s, "
                     f"{r['dirty_blocks']} random dirty blocks, {r['rounds']} round(s) of "
                     f"{r['secs']} s phases (`{r['command']}`)")
            L.append("")
            L.append("| phase | hit p50 | hit p99 | write p50 | write p99 | hit p99 / idle "
                     "| write p99 / idle | drain took |")
            L.append("|---|--:|--:|--:|--:|--:|--:|--:|")
            for phase in ("idle", "flush", "watermark"):
                h, w = r["phases"][phase]["hits"], r["phases"][phase]["writes"]
                d = r["drain"].get(phase)
                took = "" if d is None else ("unfinished" if d["secs"] is None else
                                             f"{d['secs']:.1f} s" + ("" if d["finished"]
                                                                     else " (not every round)"))
                L.append(f"| {phase} | {fmt_lat(h[0])} | {fmt_lat(h[1])} | {fmt_lat(w[0])} | "
                         f"{fmt_lat(w[1])} | {fmt_ratio(drain_p99_ratio(r, phase, 'hits'))} | "
                         f"{fmt_ratio(drain_p99_ratio(r, phase, 'writes'))} | {took} |")
            L.append("")

    ram = results.get("ram")
    if ram:
        L.append("### RAM per cache block (tiercache serve, writeback, 4 KiB blocks)")
        L.append("")
        sm, bg = ram["small"], ram["big"]
        L.append("Two caches filled completely with 4K sequential writes QD32 (background "
                 "writeback off), RSS measured 6 s later (serve trims the heap every 5 s):")
        L.append("")
        L.append("| cache | blocks | used | VmRSS at open | VmRSS full | engine metadata (status) |")
        L.append("|---|--:|--:|--:|--:|--:|")
        for name, r in (("small", sm), ("big", bg)):
            L.append(f"| {name} | {r['cache_blocks_total']:,} | {r['used']:,} | "
                     f"{r['rss_open'] / 2**20:.1f} MiB | {r['rss_full'] / 2**20:.1f} MiB | "
                     f"{r.get('metadata_bytes', 0) / 2**20:.1f} MiB |")
        L.append("")
        L.append(f"- per cache block of a full cache (difference of the full RSS per extra "
                 f"block): **{ram['bytes_per_block']:.1f} B** "
                 f"({ram['bytes_per_block'] * 1e6 / 2**20:.1f} MiB per million blocks); "
                 f"{ram['open_bytes_per_block']:.1f} B of it is resident right after open; "
                 f"the engine's own count of its metadata heap: "
                 f"{ram.get('metadata_bytes_per_block', 0):.1f} B per block")
        L.append("")

    # Targets.
    L.append("### Targets (issue 4)")
    L.append("")
    L.append("| target | measured | result |")
    L.append("|---|--:|---|")
    for name, value, threshold in targets(results):
        if value is None:
            L.append(f"| {name} | n/a | not measured |")
            continue
        if threshold < 0:  # an upper bound
            ok = value <= -threshold
            # The bound's unit is the name's: "≤ 24 B", "≤ 1.5× idle".
            shown = f"{value:.2f}×" if "×" in name.split("≤")[-1] else f"{value:.1f} B"
        else:
            ok = value >= threshold
            # Three decimals near 1, so 0.998 does not print as a failing 1.00.
            shown = f"{value:.3f}×" if value < 10 else fmt_ratio(value)
        L.append(f"| {name} | {shown} | {'PASS' if ok else 'MISS'} |")
    L.append("")

    # The same note from several systems is shown once, with their names.
    notes = {}
    for k, e in (list(systems.items()) + [(f"sustained {k}", e) for k, e in sus.items()]
                 + [("ram", results.get("ram", {}))]):
        for n in e.get("notes", []):
            who = notes.setdefault(n, [])
            if k not in who:
                who.append(k)
    if notes:
        L.append("### Notes from the run")
        L.append("")
        for n, who in notes.items():
            L.append(f"- {', '.join(who)}: {n}")
        L.append("")

    if plots:
        L.append("### Plots")
        L.append("")
        for title, name in plots:
            L.append(f"![{title}]({name})")
        L.append("")
    return "\n".join(L)


def make_plots(results, out_dir):
    plots = []
    systems = results["systems"]

    sus = results.get("sustained", {})
    if sus:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for k, r in sus.items():
            if r.get("series"):
                ax.plot([t for t, _ in r["series"]], [v for _, v in r["series"]], label=k)
        ax.set_xlabel("seconds")
        ax.set_ylabel("foreground IOPS (4K randwrite QD32)")
        ax.set_ylim(bottom=0)
        dirty = sus.get("tc-writeback", {}).get("dirty_pct")
        if dirty:
            ax2 = ax.twinx()
            ax2.plot([x[0] for x in dirty], [x[1] for x in dirty], "k:", label="tc-writeback dirty %")
            ax2.set_ylabel("dirty % of cache (dotted)")
            ax2.set_ylim(0, 100)
        ax.legend(loc="lower left")
        ax.set_title("Sustained writeback: foreground IOPS over time")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "sustained.png"), dpi=100)
        plt.close(fig)
        plots.append(("sustained writeback", "sustained.png"))

    wkeys = [("rw4k", "4K randwrite"), ("rr4k_hit", "4K randread hits"), ("rr4k_cold", "4K randread cold")]
    names = [k for k, e in systems.items() if e.get("workloads")]
    if names:
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / len(names)
        for i, k in enumerate(names):
            vals = [iops(results, k, w) or 0 for w, _ in wkeys]
            ax.bar([x + i * width for x in range(len(wkeys))], vals, width, label=k)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(wkeys))])
        ax.set_xticklabels([t for _, t in wkeys])
        ax.set_yscale("log")
        ax.set_ylabel("IOPS (log scale)")
        ax.set_title("4K workloads by system (QD32)")
        ax.legend(fontsize=8, ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "iops_4k.png"), dpi=100)
        plt.close(fig)
        plots.append(("4K IOPS by system", "iops_4k.png"))

    rr = [(k, e["reread"]["passes"]) for k, e in systems.items() if e.get("reread")]
    if rr:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        n = len(rr[0][1])
        width = 0.8 / len(rr)
        for i, (k, passes) in enumerate(rr):
            ax.bar([x + i * width for x in range(n)], [p["runtime_s"] for p in passes], width, label=k)
        ax.set_xticks([x + width * (len(rr) - 1) / 2 for x in range(n)])
        ax.set_xticklabels([f"pass {i + 1}" for i in range(n)])
        ax.set_yscale("log")
        ax.set_ylabel("seconds per pass (log scale)")
        ax.set_title(f"Re-read: the same {results['plan']['reread_bytes'] >> 20} MiB, pass by pass")
        ax.legend(fontsize=8, ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "reread.png"), dpi=100)
        plt.close(fig)
        plots.append(("re-read passes", "reread.png"))
    return plots
