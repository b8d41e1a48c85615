"""Turns the rows that compare.sh writes (tab-separated: system, workload,
IOPS, origin reads and writes during the run, the same with writeback,
client I/Os, hit counters before and after the run, the round of
TC_COMPARE_ROUNDS) into the markdown table of docs/benchmarks.md. With
more than one round, ratios are taken within a round and the second table
gives their median. Runs in the guest under the host's python3."""
import re
import statistics
import sys

NAMES = {
    "origin": "origin alone (dm-delay)",
    "wc": "dm-writecache",
    "bc": "bcache",
    "dc": "dm-cache (smq)",
    "tc": "tiercache writeback",
    "tcu": "tiercache writeback over ublk",
    "nbd": "NBD ceiling (nbdkit file, no cache)",
    "unull": "ublk ceiling (libublk null, no disk)",
    "uloop": "ublk hit ceiling (libublk loop on the cache disk)",
}
# The second table: tiercache over ublk against these, in the same run.
AGAINST = ["unull", "uloop", "dc", "wc", "bc", "origin"]
WORKLOADS = {
    "randwrite": "4K random writes, QD32",
    "readhit": "4K random reads after warm-up, QD32",
    "subwrite": "512 B-3.5 KiB random writes (512-aligned), QD16",
}


def delta(before, after):
    """The hit counters of the measured run: every number in `after` less
    the one at the same place in `before` (the strings share a template)."""
    b = [int(n) for n in re.findall(r"\d+", before)]
    it = iter(b)
    if len(b) != len(re.findall(r"\d+", after)):
        return after
    return re.sub(r"\d+", lambda m: str(int(m.group()) - next(it)), after)


def main():
    rows_path, ios, span_mib = sys.argv[1:4]
    rows = [l.rstrip("\n").split("\t") for l in open(rows_path) if l.strip()]
    # Rows of one round only (older runs) have no round column.
    rows = [r + ["1"] if len(r) == 10 else r for r in rows]
    rounds = len({r[10] for r in rows})
    by_wl = {}
    for r in rows:
        by_wl.setdefault(r[1], []).append(r)
    print(f"I/Os per run (randwrite, readhit, subwrite): {ios}, over the first {span_mib} MiB of a "
          "512 MiB origin (dm-delay, 5 ms) cached on 128 MiB; x tc = IOPS / tiercache's IOPS in the same "
          + ("round." if rounds > 1 else "run."))
    print()
    print("| workload | system | IOPS | x tc | origin reads / writes in the run | "
          "per 1000 client I/Os | origin reads / writes incl. writeback | per 1000 client I/Os | "
          "hits in the run (as the system counts them) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for wl, rs in by_wl.items():
        for r in rs:
            sysname, _, iops, rd, wr, rdw, wrw, ios, h0, h1, rnd = r
            tc = next((float(t[2]) for t in rs if t[0] == "tc" and t[10] == rnd), None)
            iops_f = float(iops)
            ratio = f"{iops_f / tc:.2f}" if tc else "-"
            per_k = (int(rd) + int(wr)) * 1000 / max(int(ios), 1)
            per_k_wb = (int(rdw) + int(wrw)) * 1000 / max(int(ios), 1)
            hits = "-" if h1 == "-" else delta(h0, h1)
            title = WORKLOADS.get(wl, wl) + (f" (round {rnd})" if rounds > 1 else "")
            print(f"| {title} | {NAMES.get(sysname, sysname)} | {iops_f:.0f} | {ratio} | "
                  f"{rd} / {wr} | {per_k:.0f} | {rdw} / {wrw} | {per_k_wb:.0f} | {hits} |")
    against(by_wl, rounds)


def against(by_wl, rounds):
    """tiercache over ublk (tcu) as a fraction of each other system's IOPS
    in the same run (round): the ublk ceilings, the kernel caches, the
    origin; over several rounds the median of the rounds' ratios, and each
    round's."""
    cols = [c for c in AGAINST if any(r[0] == c for rs in by_wl.values() for r in rs)]
    if not cols or not any(r[0] == "tcu" for rs in by_wl.values() for r in rs):
        return
    print()
    if rounds > 1:
        print(f"tiercache over ublk / each system's IOPS, the median of {rounds} rounds' ratios "
              "(each round's in brackets, in order):")
    else:
        print("tiercache over ublk / each system's IOPS, same run:")
    print()
    print("| workload | tiercache over ublk, IOPS | " + " | ".join(f"/ {NAMES[c]}" for c in cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for wl, rs in by_wl.items():
        by_round = {}
        for r in rs:
            by_round.setdefault(r[10], {})[r[0]] = float(r[2])
        tcu = [iops["tcu"] for iops in by_round.values() if "tcu" in iops]
        if not tcu:
            continue
        cells = []
        for c in cols:
            ratios = [iops["tcu"] / iops[c] for iops in by_round.values() if iops.get(c) and "tcu" in iops]
            cell = f"{statistics.median(ratios):.2f}" if ratios else "-"
            if rounds > 1 and ratios:
                cell += " (" + ", ".join(f"{x:.2f}" for x in ratios) + ")"
            cells.append(cell)
        print(f"| {WORKLOADS.get(wl, wl)} | {statistics.median(tcu):.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
