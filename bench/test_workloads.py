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

    def run_job(self, w):
        r = wl.fio(self.uri, w.rw, w.bs, w.iodepth, 0, 16 * MiB, runtime_s=1,
                   flush_every=w.flush_every)
        self.assertGreater(r["ios"], 0, w.key)
        self.assertGreater(r["iops"], 0, w.key)
        return r

    def test_every_named_job_runs(self):
        for w in wl.WORKLOADS + wl.EXTRA_WORKLOADS:
            with self.subTest(w.key):
                self.run_job(w)

    def test_a_size_range_gives_writes_of_those_sizes(self):
        sub = next(w for w in wl.EXTRA_WORKLOADS if w.key == "rw4k_sub")
        r = self.run_job(sub)
        mean = r["mib_s"] * MiB / r["iops"]
        # 512 B-3.5 KiB, drawn at random: the mean lies well inside.
        self.assertTrue(1024 < mean < 3072, f"mean write {mean:.0f} bytes")
        four_k = next(w for w in wl.WORKLOADS if w.key == "rw4k")
        r = self.run_job(four_k)
        self.assertAlmostEqual(r["mib_s"] * MiB / r["iops"], 4096, delta=1)


if __name__ == "__main__":
    unittest.main()
