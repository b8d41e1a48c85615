"""Tests of the benchmark's fio jobs against a real NBD server.

    /usr/bin/python3 -m unittest discover -s bench -p 'test_workloads.py'

Each job that `bench/run` can name is run for a second by real fio
(ioengine=nbd) against `nbdkit memory` on a Unix socket, through the
same `workloads.fio` the benchmark calls, so a fio argument fio refuses
or a result the parser misreads fails here, not in a run of an hour.
scripts/test.sh installs fio and nbdkit.
"""

import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import procs  # noqa: E402
import workloads as wl  # noqa: E402

MiB = 1 << 20


class FioJobsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for tool in ("fio", "nbdkit"):
            if shutil.which(tool) is None:
                raise AssertionError(f"{tool} is not installed (scripts/test.sh installs it)")
        cls.dir = tempfile.mkdtemp(prefix="bench-test-")
        sock = os.path.join(cls.dir, "mem.sock")
        cls.server = procs.Proc(
            "nbdkit memory",
            ["nbdkit", "--foreground", "--unix", sock, "memory", "64M"],
            os.path.join(cls.dir, "nbdkit.log"),
        )
        procs.wait_for_socket(sock, cls.server)
        cls.uri = f"nbd+unix:///?socket={sock}"

    @classmethod
    def tearDownClass(cls):
        cls.server.popen.terminate()
        cls.server.popen.wait(timeout=30)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_every_named_job_runs_with_its_sizes(self):
        for w in wl.WORKLOADS + wl.EXTRA_WORKLOADS:
            with self.subTest(w.key):
                r = wl.fio(self.uri, w.rw, w.bs, w.iodepth, 0, 16 * MiB, runtime_s=1,
                           flush_every=w.flush_every)
                self.assertGreater(r["ios"], 0)
                self.assertGreater(r["iops"], 0)
                mean = r["mib_s"] * MiB / r["iops"]
                if "-" in w.bs:
                    # A range, drawn at random: the mean lies well inside
                    # (fio takes --bs=512-3584 silently and writes 3,584
                    # bytes every time).
                    lo, hi = (size_bytes(x) for x in w.bs.split("-"))
                    inner = (hi - lo) / 6
                    self.assertTrue(lo + inner < mean < hi - inner, f"mean {mean:.0f} bytes")
                else:
                    self.assertAlmostEqual(mean, size_bytes(w.bs), delta=1)


def size_bytes(text):
    """fio's size notation as the jobs use it: 512, 4k, 1m."""
    scale = {"k": 1 << 10, "m": 1 << 20}.get(text[-1].lower(), 1)
    return int(text.rstrip("kKmM")) * scale

if __name__ == "__main__":
    unittest.main()
