"""Tests of the trace tools: readers, iolog, generator, bound, policies.

    /usr/bin/python3 -m unittest discover -s bench/trace -p 'test_*.py'

The policy tests check hand-computed sequences (the textbook Belady
example, Belady's FIFO anomaly, small SIEVE / ARC / S3-FIFO / 2Q cases),
compare each policy with a slow list-based implementation written
independently below on seeded random sequences, check OPT against an
exhaustive search, and check properties every policy must have. The iolog
replay test needs fio and nbdkit (scripts/test.sh installs them).
"""

import gzip
import os
import random
import shutil
import sys
import tempfile
import unittest
from functools import lru_cache

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import analyze  # noqa: E402
import gen  # noqa: E402
import iolog  # noqa: E402
import policies  # noqa: E402
import readers  # noqa: E402
import sim  # noqa: E402
import tracetool  # noqa: E402
from readers import Req  # noqa: E402


class TempDir(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="trace-test-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path


# ---------------------------------------------------------------------------
# Readers

MSR = """\
128166372003061629,hm,0,Write,3387047936,8192,1131
128166372003237453,hm,0,Read,3387047936,4096,9000
128166372013237453,hm,0,Write,512,3584,100
"""


class MsrTest(TempDir):
    def test_parses_fields_and_filetime(self):
        t = readers.read_msr(self.write("a.csv", MSR))
        self.assertEqual(len(t), 3)
        self.assertEqual(t.requests[0], Req(0.0, True, 3387047936, 8192))
        r = t.requests[1]
        self.assertFalse(r.write)
        self.assertAlmostEqual(r.t_us, (128166372003237453 - 128166372003061629) / 10)
        self.assertEqual(t.requests[2].length, 3584)
        self.assertAlmostEqual(t.requests[2].t_us, 1_017_582.4)

    def test_header_and_gzip(self):
        path = os.path.join(self.dir, "a.csv.gz")
        with gzip.open(path, "wt") as f:
            f.write("Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n" + MSR)
        self.assertEqual(len(readers.read_trace(path)), 3)

    def test_bad_lines_name_the_line(self):
        cases = {
            "128166372003061629,hm,0,Write,3387047936,8192\n": "7 comma-separated",
            "128166372003061629,hm,0,Erase,0,8192,1\n": "Type must be Read or Write",
            "128166372003061629,hm,0,Read,12x,8192,1\n": "Offset is not an integer",
            "128166372003061629,hm,0,Read,0,-1,1\n": "Size is negative",
        }
        for line, why in cases.items():
            path = self.write("bad.csv", MSR + line)
            with self.assertRaises(readers.TraceError) as cm:
                readers.read_msr(path)
            self.assertIn("bad.csv:4:", str(cm.exception))
            self.assertIn(why, str(cm.exception))

    def test_several_disks_need_a_choice(self):
        path = self.write("two.csv", MSR + "128166372013237453,hm,1,Write,0,4096,1\n")
        with self.assertRaises(readers.TraceError) as cm:
            readers.read_msr(path)
        self.assertIn("hm/0, hm/1", str(cm.exception))
        self.assertEqual(len(readers.read_msr(path, device="hm/1")), 1)

    def test_empty_and_binary_files(self):
        with self.assertRaises(readers.TraceError):
            readers.read_trace(self.write("empty.csv", ""))
        with self.assertRaises(readers.TraceError):
            readers.read_trace(self.write("junk.txt", "hello world\n"))
        with self.assertRaises(readers.TraceError):
            readers.read_trace(os.path.join(self.dir, "missing.csv"))


BLKPARSE = """\
  8,0    1        1     0.000000000  1234  Q   W 2048 + 8 [kworker/u4:1]
  8,0    1        2     0.000001000  1234  G   W 2048 + 8 [kworker/u4:1]
  8,0    1        3     0.000002000  1234  P   N [kworker/u4:1]
  8,0    1        4     0.000100000  1234  Q  WS 100 + 1 [jbd2/sda1-8]
  8,0    1        5     0.000200000  1234  Q  RA 4096 + 16 [cat]
  8,0    1        6     0.000300000  1234  Q FWS 64 + 8 [jbd2/sda1-8]
  8,0    1        7     0.000400000  1234  Q  FN [sync]
  8,0    1        8     0.000500000  1234  Q   D 0 + 2048 [fstrim]
  8,0    1        9     0.000600000  1234  Q  WFS 200 + 8 [jbd2/sda1-8]
  8,0    1       10     0.000700000  1234  U   N [kworker/u4:1] 1
  8,0    1       11     0.000800000     0  C   W 2048 + 8 [0]
  8,0    1       12     0.000900000  1234  Q   R 8 + 0 [x]
  8,16   0        1     0.001000000  4321  A   W 5 + 8 <- (8,17) 1
CPU0 (8,0):
 Reads Queued:           1,        8KiB  Writes Queued:           4,       16KiB
Total (8,0):
"""


class BlkparseTest(TempDir):
    def test_queue_events_and_flags(self):
        t = readers.read_blkparse(self.write("b.txt", BLKPARSE))
        self.assertEqual([(r.write, r.offset, r.length) for r in t.requests], [
            (True, 2048 * 512, 8 * 512),
            (True, 100 * 512, 512),
            (False, 4096 * 512, 16 * 512),
            (True, 64 * 512, 8 * 512),      # FWS: a write with a preflush
            (True, 200 * 512, 8 * 512),     # WFS: a FUA write
        ])
        self.assertAlmostEqual(t.requests[1].t_us, 100.0)
        self.assertEqual(t.skipped["discard"], 1)
        self.assertEqual(t.skipped["flush or no data"], 1)
        self.assertEqual(t.skipped["zero-length"], 1)
        self.assertTrue(any("2 preflush/FUA" in n for n in t.notes))

    def test_other_event_kind(self):
        t = readers.read_blkparse(self.write("b.txt", BLKPARSE), event="C")
        self.assertEqual(len(t), 1)

    def test_rwbs(self):
        self.assertEqual(readers.classify_rwbs("W"), ("write", False))
        self.assertEqual(readers.classify_rwbs("RW"), ("write", False))
        self.assertEqual(readers.classify_rwbs("RM"), ("read", False))
        self.assertEqual(readers.classify_rwbs("FWFS"), ("write", True))
        self.assertEqual(readers.classify_rwbs("DS"), ("discard", False))
        self.assertEqual(readers.classify_rwbs("F"), ("nodata", False))

    def test_bad_event_line(self):
        path = self.write("b.txt", BLKPARSE + "  8,0    1   13  0.001  1234  Q   W garbage [x]\n")
        with self.assertRaises(readers.TraceError) as cm:
            readers.read_blkparse(path)
        self.assertIn("b.txt:17:", str(cm.exception))

    def test_not_blkparse(self):
        with self.assertRaises(readers.TraceError):
            readers.read_blkparse(self.write("b.txt", "just text\nmore\n"))


# ---------------------------------------------------------------------------
# iolog


def reqs(*specs):
    """("w"|"r", offset, length) -> Req list, 1 ms apart."""
    return [Req(1000.0 * i, k == "w", off, n) for i, (k, off, n) in enumerate(specs)]


class IologTest(TempDir):
    def test_fold_packs_chunks_and_keeps_offsets_inside_them(self):
        mib, gib = 1 << 20, 1 << 30
        t = reqs(("w", 10 * gib + 3584, 4096), ("r", 2 * gib + 512, 1024),
                 ("r", 10 * gib + 3584, 4096), ("w", 10 * gib + mib - 512, 1024))
        out, vol, notes = iolog.fold(t)
        self.assertEqual(vol, 3 * mib)
        self.assertEqual([r.offset for r in out], [mib + 3584, 512, mib + 3584, 2 * mib - 512])
        self.assertTrue(notes)
        # Every reuse is kept: the block sequences are the same up to renaming.
        a = analyze.block_sequence(t)[0].tolist()
        b = analyze.block_sequence(out)[0].tolist()
        self.assertEqual([a.index(x) for x in a], [b.index(x) for x in b])

    def test_fold_wraps_into_a_small_volume(self):
        t = reqs(("w", 0, 4096), ("w", 8 << 20, 4096))
        out, vol, notes = iolog.fold(t, volume_bytes=1 << 20)
        self.assertTrue(all(r.offset + r.length <= vol for r in out))
        self.assertIn("wrapped", notes[-1])

    def test_split(self):
        out, n = iolog.split_large(reqs(("w", 0, 80 << 20)), max_bytes=32 << 20)
        self.assertEqual(n, 1)
        self.assertEqual([(r.offset >> 20, r.length >> 20) for r in out], [(0, 32), (32, 32), (64, 16)])

    def test_write_and_count(self):
        t = reqs(("w", 512, 3584), ("r", 0, 4096))
        for timing, header, first in ((False, "fio version 2 iolog", "nbd add"),
                                      (True, "fio version 3 iolog", "1 nbd add")):
            path = os.path.join(self.dir, "t.iolog")
            self.assertEqual(iolog.write_iolog(t, path, timing=timing), 2)
            with open(path) as f:
                lines = f.read().splitlines()
            self.assertEqual(lines[:2], [header, first])
            self.assertFalse(any("close" in x for x in lines))
            self.assertEqual(iolog.read_iolog_counts(path), (1, 1, 4096, 3584))
        self.assertEqual(lines[-1], "1001 nbd read 0 4096")

    def test_flush_every(self):
        t = reqs(("w", 0, 4096), ("r", 0, 4096), ("w", 4096, 4096), ("w", 8192, 4096))
        for timing in (False, True):
            path = os.path.join(self.dir, "f.iolog")
            self.assertEqual(iolog.write_iolog(t, path, timing=timing, flush_every=2), 4)
            with open(path) as f:
                acts = [x.split()[-3] for x in f.read().splitlines()[3:]]
            self.assertEqual(acts, ["write", "read", "write", "sync", "write"])
            self.assertEqual(iolog.read_iolog_syncs(path), 1)
            self.assertEqual(iolog.read_iolog_counts(path), (1, 3, 4096, 12288))
        with self.assertRaises(ValueError):
            iolog.write_iolog(t, path, flush_every=-1)

    def test_check_replay_catches_lost_requests(self):
        job = {"error": 0, "read": {"total_ios": 2, "io_bytes": 0},
               "write": {"total_ios": 0, "io_bytes": 0}}
        with self.assertRaises(ValueError):
            iolog.check_replay(job, (2, 0, 8192, 0))

    def test_replays_completely_over_nbd(self):
        for tool in ("fio", "nbdkit"):
            if shutil.which(tool) is None:
                self.fail(f"{tool} is not installed (scripts/test.sh installs it)")
        rng = random.Random(7)
        t = [Req(i * 10.0, rng.random() < 0.6, rng.randrange(0, (8 << 20) - 65536, 512),
                 512 * rng.randint(1, 128)) for i in range(600)]
        path = os.path.join(self.dir, "r.iolog")
        iolog.write_iolog(t, path)
        job = tracetool.check_iolog(path, 8 << 20, iodepth=16)
        self.assertEqual(job["read"]["total_ios"] + job["write"]["total_ios"], 600)
        # With flushes (fio's sync entries, NBD FLUSH): every one is sent.
        iolog.write_iolog(t, path, flush_every=16)
        job = tracetool.check_iolog(path, 8 << 20, iodepth=16)
        self.assertEqual(job["sync"]["total_ios"], iolog.read_iolog_syncs(path))
        self.assertGreater(job["sync"]["total_ios"], 10)


# ---------------------------------------------------------------------------
# Generator


class GeneratorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.default = gen.generate(gen.params_for("default"))
        cls.st = analyze.stats(cls.default)

    def test_default_mimics_the_vm_trace(self):
        st = self.st
        self.assertEqual(st["requests"], 20_000)
        self.assertAlmostEqual(st["write_pct"], 79, delta=2.5)
        self.assertAlmostEqual(st["mean_kib"], 36, delta=3)
        self.assertAlmostEqual(st["footprint_bytes"] / 2**20, 630, delta=630 * 0.03)
        self.assertGreaterEqual(st["writes_512_aligned_pct"], 99.9)
        self.assertLessEqual(st["writes_4k_aligned_pct"], 5)
        self.assertGreater(st["writes_sub4k_pct"], 20)
        self.assertTrue(8 <= st["bound_s"] <= 18, st["bound_s"])

    def test_footprint_holds_across_seeds(self):
        for seed in (2, 3):
            st = analyze.stats(gen.generate(gen.params_for("default", seed=seed)))
            self.assertAlmostEqual(st["footprint_bytes"] / 2**20, 630, delta=630 * 0.03)
            self.assertAlmostEqual(st["write_pct"], 79, delta=2.5)

    def test_deterministic(self):
        self.assertEqual(gen.generate(gen.params_for("default")), self.default)
        other = gen.generate(gen.params_for("default", seed=2))
        self.assertNotEqual(other[:100], self.default[:100])

    def test_scans_preset(self):
        p = gen.params_for("scans")
        t = gen.generate(p)
        st = analyze.stats(t)
        scan = [r for r in t if r.length == p.scan_request_kib * 1024]
        self.assertTrue(all(not r.write for r in scan))
        self.assertEqual(len(scan) * 256 * 1024, (p.requests // (p.scan_every + 512)) * 128 << 20)
        self.assertAlmostEqual(st["footprint_bytes"] / 2**20, 512, delta=512 * 0.05)
        # Scans are sequential: each request follows the one before, or wraps.
        gaps = {b.offset - a.offset for a, b in zip(scan, scan[1:])}
        self.assertIn(256 * 1024, gaps)

    def test_msr_round_trip(self):
        d = tempfile.mkdtemp()
        try:
            path = os.path.join(d, "g.csv")
            gen.write_msr(self.default[:500], path)
            back = readers.read_trace(path).requests
            self.assertEqual([(r.write, r.offset, r.length) for r in back],
                             [(r.write, r.offset, r.length) for r in self.default[:500]])
            self.assertAlmostEqual(back[-1].t_us, self.default[499].t_us - self.default[0].t_us, delta=1)
        finally:
            shutil.rmtree(d)


# ---------------------------------------------------------------------------
# Bound


class BoundTest(unittest.TestCase):
    def test_compulsory_reads_by_hand(self):
        k = 1024
        t = reqs(("w", 0, 4 * k),        # writes [0, 4K)
                 ("r", 0, 4 * k),        # all written: not compulsory
                 ("r", 2 * k, 4 * k),    # [4K, 6K) never touched: compulsory
                 ("r", 4 * k, 2 * k),    # read just before: not compulsory
                 ("r", 6 * k - 512, 1024),  # one new sector: compulsory
                 ("w", 100 * k, 512),
                 ("r", 100 * k, 1024))   # second sector new: compulsory
        st = analyze.stats(t, origin_ms=5)
        self.assertEqual(st["compulsory_reads"], 3)
        self.assertAlmostEqual(st["bound_s"], 0.015)
        self.assertEqual(st["writes"], 2)
        self.assertAlmostEqual(st["wt_floor_s"], 0.025)
        self.assertEqual(st["footprint_bytes"], 6 * k + 512 + 1024)
        self.assertEqual((st["written_extents"], st["written_bytes_distinct"]), (2, 4 * k + 512))


# ---------------------------------------------------------------------------
# Policies: slow reference implementations, written from the papers
# independently of policies.py (lists, linear scans).


def ref_lru(seq, cap):
    c, out = [], []
    for x in seq:
        if x in c:
            c.remove(x)
            c.append(x)
            out.append(1)
        else:
            if len(c) == cap:
                c.pop(0)
            c.append(x)
            out.append(0)
    return out


def ref_fifo(seq, cap):
    c, out = [], []
    for x in seq:
        if x in c:
            out.append(1)
        else:
            if len(c) == cap:
                c.pop(0)
            c.append(x)
            out.append(0)
    return out


def ref_sieve(seq, cap):
    q, v, out = [], {}, []   # q[0] is the tail (oldest)
    hand = None              # the key the hand points at
    for x in seq:
        if x in v:
            v[x] = 1
            out.append(1)
            continue
        out.append(0)
        if len(q) == cap:
            i = q.index(hand) if hand is not None else 0
            while v[q[i]]:
                v[q[i]] = 0
                i = (i + 1) % len(q)
            victim = q[i]
            hand = q[i + 1] if i + 1 < len(q) else None
            q.remove(victim)
            del v[victim]
        q.append(x)
        v[x] = 0
    return out


def ref_s3fifo(seq, cap, threshold=2, keep=False):
    small_cap, ghost_cap = max(1, int(cap * 0.1)), int(cap * 0.9)
    S, M, G, f, out = [], [], [], {}, []   # lists from tail (oldest) to head
    for x in seq:
        if x in S or x in M:
            f[x] = f[x] + 1 if x in S else min(f[x] + 1, 3)
            out.append(1)
            continue
        out.append(0)
        ghost_hit = x in G
        if ghost_hit:
            G.remove(x)
        while len(S) + len(M) >= cap:
            if len(S) >= small_cap or not M:
                while S:
                    t = S.pop(0)
                    if f[t] >= threshold:
                        M.append(t)
                        f[t] = min(f[t], 3) if keep else 0
                    else:
                        G.append(t)
                        if len(G) > ghost_cap:
                            G.pop(0)
                        del f[t]
                        break
            else:
                while M:
                    t = M.pop(0)
                    if f[t] > 0:
                        f[t] -= 1
                        M.append(t)
                    else:
                        del f[t]
                        break
        (M if ghost_hit else S).append(x)
        f[x] = 0
    return out


def ref_arc(seq, c):
    T1, T2, B1, B2, out = [], [], [], [], []   # index 0 = LRU
    p = 0.0

    def replace(in_b2):
        if T1 and ((in_b2 and len(T1) == p) or len(T1) > p):
            B1.append(T1.pop(0))
        else:
            B2.append(T2.pop(0))

    for x in seq:
        if x in T1 or x in T2:
            (T1 if x in T1 else T2).remove(x)
            T2.append(x)
            out.append(1)
            continue
        out.append(0)
        if x in B1:
            p = min(c, p + (1 if len(B1) >= len(B2) else len(B2) / len(B1)))
            replace(False)
            B1.remove(x)
            T2.append(x)
        elif x in B2:
            p = max(0, p - (1 if len(B2) >= len(B1) else len(B1) / len(B2)))
            replace(True)
            B2.remove(x)
            T2.append(x)
        else:
            if len(T1) + len(B1) == c:
                if len(T1) < c:
                    B1.pop(0)
                    replace(False)
                else:
                    T1.pop(0)
            elif len(T1) + len(B1) + len(T2) + len(B2) >= c:
                if len(T1) + len(B1) + len(T2) + len(B2) == 2 * c:
                    B2.pop(0)
                replace(False)
            T1.append(x)
        assert len(T1) + len(T2) <= c and len(T1) + len(T2) + len(B1) + len(B2) <= 2 * c
    return out


def ref_2q(seq, cap):
    kin, kout = max(1, int(cap * 0.25)), max(1, int(cap * 0.5))
    A1in, A1out, Am, out = [], [], [], []

    def reclaim():
        if len(A1in) + len(Am) < cap:
            return
        if len(A1in) > kin or not Am:
            A1out.append(A1in.pop(0))
            if len(A1out) > kout:
                A1out.pop(0)
        else:
            Am.pop(0)

    for x in seq:
        if x in Am:
            Am.remove(x)
            Am.append(x)
            out.append(1)
        elif x in A1in:
            out.append(1)
        else:
            out.append(0)
            if x in A1out:
                A1out.remove(x)
                reclaim()
                Am.append(x)
            else:
                reclaim()
                A1in.append(x)
    return out


def brute_opt(seq, cap, bypass=False):
    """Fewest misses over every choice of victim (and, with bypass, of not
    inserting): exhaustive, for short sequences."""
    seq = tuple(seq)

    @lru_cache(maxsize=None)
    def best(i, cache):
        if i == len(seq):
            return 0
        x = seq[i]
        if x in cache:
            return best(i + 1, cache)
        if len(cache) < cap:
            return 1 + best(i + 1, cache | {x})
        options = [best(i + 1, (cache - {v}) | {x}) for v in cache]
        if bypass:
            options.append(best(i + 1, cache))
        return 1 + min(options)

    return best(0, frozenset())


def misses(name, seq, cap):
    h = policies.simulate(name, cap, seq)
    return len(seq) - sum(h)


TEXTBOOK = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]
ANOMALY = [1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]


class PolicyByHandTest(unittest.TestCase):
    def test_textbook_reference_string(self):
        # Silberschatz et al., Operating System Concepts, ch. 10: 3 frames.
        self.assertEqual(misses("opt", TEXTBOOK, 3), 9)
        self.assertEqual(misses("lru", TEXTBOOK, 3), 12)
        self.assertEqual(misses("fifo", TEXTBOOK, 3), 15)

    def test_belady_anomaly(self):
        self.assertEqual(misses("fifo", ANOMALY, 3), 9)
        self.assertEqual(misses("fifo", ANOMALY, 4), 10)   # more frames, more faults
        self.assertEqual(misses("lru", ANOMALY, 3), 10)
        self.assertEqual(misses("lru", ANOMALY, 4), 8)
        self.assertEqual(misses("opt", ANOMALY, 3), 7)
        self.assertEqual(misses("opt", ANOMALY, 4), 6)

    def test_sieve_by_hand(self):
        # A B C fill; A is hit (visited). D: the hand starts at the tail A,
        # clears it, evicts B; the hand rests on C. B: evicts C. E: evicts
        # D. A is still cached: a hit. (LRU would have evicted A at E.)
        seq = list("ABCADBEA")
        self.assertEqual(list(policies.simulate("sieve", 3, seq)), [0, 0, 0, 1, 0, 0, 0, 1])
        self.assertEqual(ref_lru(seq, 3), [0, 0, 0, 1, 0, 0, 0, 0])

    def test_arc_by_hand(self):
        a = policies.Arc(2)
        hits = [a.access(x) for x in "ABAC"]
        self.assertEqual(hits, [False, False, True, False])
        self.assertEqual((list(a.t1), list(a.t2), list(a.b1), list(a.b2), a.p), (["C"], ["A"], ["B"], [], 0))
        self.assertFalse(a.access("B"))   # ghost hit in B1: p grows to 1, A goes to B2
        self.assertEqual((list(a.t1), list(a.t2), list(a.b1), list(a.b2), a.p), (["C"], ["B"], [], ["A"], 1))
        self.assertFalse(a.access("A"))   # ghost hit in B2: p back to 0, C goes to B1
        self.assertEqual((list(a.t1), list(a.t2), list(a.b1), list(a.b2), a.p), ([], ["B", "A"], ["C"], [], 0))

    def test_s3fifo_by_hand(self):
        # 10 blocks: small queue 1, main 9, ghost 9.
        s = policies.S3Fifo(10)
        for x in range(10):
            s.access(x)
        s.access(0)
        s.access(0)                   # block 0: two hits while small
        s.access(1)                   # block 1: one hit
        self.assertFalse(s.access(10))
        # Eviction from the small queue: 0 (two hits) moves to main with
        # its count reset; 1 (one hit, under the threshold of 2) goes to
        # the ghost and is evicted.
        self.assertEqual(list(s.main.items()), [(0, 0)])
        self.assertEqual(list(s.ghost), [1])
        self.assertFalse(s.access(1))  # ghost hit: straight to main
        self.assertIn(1, s.main)
        self.assertEqual(list(s.ghost), [2])   # 2 left the small queue to make room
        # tiercache's variant moves a block hit once, with its count.
        t = policies.S3Fifo(10, move_threshold=1, keep_count=True)
        for x in [*range(10), 0, 10]:
            t.access(x)
        self.assertEqual(list(t.main.items()), [(0, 1)])
        self.assertEqual(list(t.ghost), [1])

    def test_2q_by_hand(self):
        # cap 4: Kin 1, Kout 2. A B C D fill A1in; E pushes A to A1out.
        q = policies.TwoQ(4)
        for x in "ABCDE":
            q.access(x)
        self.assertEqual((list(q.a1in), list(q.a1out)), (list("BCDE"), ["A"]))
        self.assertTrue(q.access("C"))      # a hit in A1in changes nothing
        self.assertFalse(q.access("A"))     # remembered: into Am
        self.assertEqual((list(q.a1in), list(q.a1out), list(q.am)), (list("CDE"), ["B"], ["A"]))

    def test_scan_resistance(self):
        # 50 hot blocks used three times, a scan of 1000 blocks used once,
        # then the hot blocks again: a 100-block cache that resists scans
        # keeps them; LRU and FIFO do not. (2Q would not either: hits in
        # A1in count for nothing, so the hot blocks are forgotten in A1out.)
        hot = list(range(50))
        seq = hot * 3 + list(range(1000, 2000)) + hot
        last = slice(len(seq) - 50, len(seq))
        for name in ("s3fifo", "s3fifo-tc", "arc"):
            h = policies.simulate(name, 100, seq)
            self.assertEqual(sum(h[last]), 50, name)
        for name in ("lru", "fifo"):
            self.assertEqual(sum(policies.simulate(name, 100, seq)[last]), 0, name)


REFS = {"lru": ref_lru, "fifo": ref_fifo, "sieve": ref_sieve, "s3fifo": ref_s3fifo,
        "s3fifo-tc": lambda s, c: ref_s3fifo(s, c, threshold=1, keep=True),
        "arc": ref_arc, "2q": ref_2q}


def random_seq(rng, n, universe):
    # A mix of a hot set, a Zipf-ish tail and short scans.
    out = []
    while len(out) < n:
        r = rng.random()
        if r < 0.5:
            out.append(rng.randrange(universe // 5 or 1))
        elif r < 0.8:
            out.append(rng.randrange(universe))
        else:
            start = rng.randrange(universe * 4)
            out.extend(range(start, start + rng.randint(2, 12)))
    return out[:n]


class PolicyCrossCheckTest(unittest.TestCase):
    def test_against_reference_implementations(self):
        for seed in range(40):
            rng = random.Random(seed)
            seq = random_seq(rng, 400, rng.choice([8, 20, 60]))
            for cap in (1, 2, 3, 7, 10, 25, 64):
                for name, ref in REFS.items():
                    got = list(policies.simulate(name, cap, seq))
                    self.assertEqual(got, ref(seq, cap), f"{name} cap {cap} seed {seed}")

    def test_opt_is_optimal(self):
        for seed in range(60):
            rng = random.Random(1000 + seed)
            seq = [rng.randrange(5) for _ in range(rng.randint(6, 13))]
            for cap in (1, 2, 3):
                self.assertEqual(misses("opt", seq, cap), brute_opt(seq, cap), (seq, cap))
                self.assertEqual(misses("opt-bypass", seq, cap), brute_opt(seq, cap, True), (seq, cap))

    def test_properties(self):
        names = [n for n in policies.POLICIES]
        for seed in range(15):
            rng = random.Random(2000 + seed)
            seq = random_seq(rng, 3000, 300)
            distinct = len(set(seq))
            for cap in (5, 30, 100, distinct, distinct * 2):
                result = {n: misses(n, seq, cap) for n in names}
                for n, m in result.items():
                    # Nothing beats the optimum; bypass never hurts it.
                    self.assertGreaterEqual(m, result["opt-bypass"], (n, cap, seed))
                    # smq and opt-bypass may decline to insert: only opt-bypass bounds them.
                    if n not in ("smq", "opt-bypass"):
                        self.assertGreaterEqual(m, result["opt"], (n, cap, seed))
                    # A cache that holds everything misses each block once.
                    if cap >= distinct:
                        self.assertEqual(m, distinct, (n, cap))
            # LRU is a stack algorithm: more blocks, never more misses.
            lru = [misses("lru", seq, c) for c in (1, 2, 5, 10, 50, 100, 200)]
            self.assertEqual(lru, sorted(lru, reverse=True))


class ToolTest(TempDir):
    def test_bad_input_is_one_line_not_a_traceback(self):
        import contextlib
        import io
        path = self.write("bad.csv", MSR + "1,hm,0,Read,zz,512,1\n")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = tracetool.main(["info", path])
        self.assertEqual(rc, 1)
        self.assertIn("bad.csv:4: Offset is not an integer", err.getvalue())
        self.assertNotIn("Traceback", err.getvalue())
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(tracetool.main(["info", "gen", "--set", "nope=1"]), 1)

    def test_origin_request_log(self):
        import replay
        path = self.write("hdd-requests.log", """\
2026-11-22 21:41:58.670609 Ready thread_model=1
2026-11-22 21:41:59.095517 connection=1 Connect export="" tls=0 size=0x4000000
2026-11-22 21:42:05.027469 connection=2 Read id=1 offset=0x2250000 count=0x2a00 ...
2026-11-22 21:42:05.032579 connection=2 ...Read id=1 return=0
2026-11-22 21:42:05.032600 connection=2 Write id=2 offset=0x0 count=0x200 fua=0 ...
2026-11-22 21:42:05.032700 connection=2 Flush id=3 ...
2026-11-22 21:42:05.033270 connection=2 Disconnect transactions=3
""")
        self.assertEqual(replay.count_origin_requests(path), (1, 1, 1))


class SimReportTest(unittest.TestCase):
    def test_report(self):
        t = reqs(*[("w" if i % 3 else "r", (i % 40) * 4096, 4096) for i in range(400)])
        res = sim.run(t, (0.25, 1.0), ("lru", "s3fifo", "opt"))
        self.assertEqual(res["footprint_blocks"], 40)
        self.assertEqual(res["capacities"], [10, 40])
        self.assertEqual(res["rows"]["opt"][1]["misses"], 40)
        self.assertEqual(res["rows"]["lru"][1]["x_opt"], 1.0)
        md = sim.markdown(res)
        self.assertIn("At 1/4 of the footprint", md)
        self.assertIn("Origin fetches", md)

    def test_origin_fetches_count_missing_stretches(self):
        # LRU, 3 blocks. Read 0-3: four misses, one stretch; cache 1 2 3.
        # Write 1, write 3: hits; LRU order 2 1 3. Read 0-4: 0 misses
        # (evicts 2), 1 hits, 2 misses (evicts 3), 3 misses (evicts 0),
        # 4 misses: stretches {0} and {2, 3, 4}.
        t = reqs(("r", 0, 4 * 4096), ("w", 4096, 4096), ("w", 3 * 4096, 4096), ("r", 0, 5 * 4096))
        res = sim.run(t, (0.6,), ("lru",))
        self.assertEqual(res["capacities"], [3])
        c = res["rows"]["lru"][0]
        self.assertEqual((c["read_requests_missed"], c["origin_read_fetches"]), (2, 3))
        self.assertEqual(sim.parse_fractions("0.125,1.5x"), (0.125, 1.5))
        with self.assertRaises(ValueError):
            sim.parse_fractions("big")


if __name__ == "__main__":
    unittest.main()
