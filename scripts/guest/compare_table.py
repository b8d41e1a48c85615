"""Turns the rows that compare.sh writes (tab-separated: system, workload,
IOPS, origin reads and writes during the run, the same with writeback,
client I/Os, hit counters before and after the run) into the markdown
table of docs/benchmarks.md. Runs in the guest under the host's python3."""
import re
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
    by_wl = {}
    for r in rows:
        by_wl.setdefault(r[1], []).append(r)
    print(f"I/Os per run (randwrite, readhit, subwrite): {ios}, over the first {span_mib} MiB of a "
          "512 MiB origin (dm-delay, 5 ms) cached on 128 MiB; x tc = IOPS / tiercache's IOPS in the same run.")
    print()
    print("| workload | system | IOPS | x tc | origin reads / writes in the run | "
          "per 1000 client I/Os | origin reads / writes incl. writeback | per 1000 client I/Os | "
          "hits in the run (as the system counts them) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for wl, rs in by_wl.items():
        tc = next((float(r[2]) for r in rs if r[0] == "tc"), None)
        for r in rs:
            sysname, _, iops, rd, wr, rdw, wrw, ios, h0, h1 = r
            iops_f = float(iops)
            ratio = f"{iops_f / tc:.2f}" if tc else "-"
            per_k = (int(rd) + int(wr)) * 1000 / max(int(ios), 1)
            per_k_wb = (int(rdw) + int(wrw)) * 1000 / max(int(ios), 1)
            hits = "-" if h1 == "-" else delta(h0, h1)
            print(f"| {WORKLOADS.get(wl, wl)} | {NAMES.get(sysname, sysname)} | {iops_f:.0f} | {ratio} | "
                  f"{rd} / {wr} | {per_k:.0f} | {rdw} / {wrw} | {per_k_wb:.0f} | {hits} |")
    against(by_wl)


def against(by_wl):
    """tiercache over ublk (tcu) as a fraction of each other system's IOPS
    in the same run: the ublk ceilings, the kernel caches, the origin."""
    cols = [c for c in AGAINST if any(r[0] == c for rs in by_wl.values() for r in rs)]
    if not cols or not any(r[0] == "tcu" for rs in by_wl.values() for r in rs):
        return
    print()
    print("tiercache over ublk / each system's IOPS, same run:")
    print()
    print("| workload | tiercache over ublk, IOPS | " + " | ".join(f"/ {NAMES[c]}" for c in cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for wl, rs in by_wl.items():
        iops = {r[0]: float(r[2]) for r in rs}
        if "tcu" not in iops:
            continue
        cells = [f"{iops['tcu'] / iops[c]:.2f}" if iops.get(c) else "-" for c in cols]
        print(f"| {WORKLOADS.get(wl, wl)} | {iops['tcu']:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
