"""The systems under test, each started by the harness and stopped by PID.

Every system is an NBD export that fio reaches at `self.uri`:

- origin        the emulated HDD alone: nbdkit file plugin, noparallel and
                delay filters (one request at a time, 5 ms each).
- qemu-nbd      the raw fast device: a file on the same disk exported by
                qemu-nbd with O_DIRECT (--cache=none) and io_uring.
- nbdkit-cache  nbdkit's cache filter (writeback, 4 KiB blocks, caches reads)
                in its own nbdkit, over the nbd plugin pointing at an
                emulated HDD (so it reaches the origin over NBD exactly as
                tiercache does). Its cache is a temporary file used through
                the page cache.
- tc-MODE       tiercache in MODE over an emulated HDD reached through
                `nbd+unix:///?socket=HDD`; its cache device is a file on the
                same disk, which tiercache opens with O_DIRECT.
- tc-set        tiercache writeback on a cache set of two such files, each
                the size of tc-MODE's one, every slot mirrored
                (--mirror-share 100: the same dirty space as tc-writeback).
- tc-inplace    tiercache writeback with the in-place placement
                (--placement in-place: any free slot, overwrites in place);
                the tc-MODE systems take create's default, the log
                placement (new data down in order through 1 MiB segments).
- tc-ordered    tiercache writeback with writeback in flush order
                (--writeback-order flush); every other tiercache system is
                created with --writeback-order address.

Each system gets its own HDD image, so no system sees another's data.

On a single-node Ceph cluster (scripts/ceph-up.sh, docs/ceph.md), started
once for the run when one of these is asked for; each system gets its own
RBD image in pool `tc`:

- rbd-fio       the RBD image alone, reached by fio's own rbd engine
                (librbd in the fio process, no NBD).
- rbd           the RBD image alone, exported by qemu-nbd's rbd driver
                (librbd in qemu-nbd).
- tc-rbd        tiercache writeback over `rbd` (`nbd+unix://` origin), its
                cache file on the same disk as the OSD's BlueStore file.
- tc-rbd-native tiercache writeback over the image through librbd in
                tiercache itself (`rbd://` origin, src/device/rbd/).
- tc-rbd-pt, tc-rbd-native-pt   the same in passthrough: every request goes
                to the image, so these compare the two ways of reaching it.
- tc-rbd-ordered  tc-rbd-native with writeback in flush order.
"""

import json
import os
import time

from procs import BenchError, Observed, Proc, run, wait_for_socket
from workloads import FioTarget

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BLOCK_BYTES = 4096
_CHUNK_BYTES = 8 << 20


def make_sparse(path, size_bytes):
    with open(path, "wb") as f:
        f.truncate(size_bytes)


def make_written(path, size_bytes):
    """A file whose every block is allocated and written (zeros), as a
    device is: ext4 would answer reads of unwritten extents without I/O,
    and convert extents on first write."""
    zeros = bytes(_CHUNK_BYTES)
    with open(path, "wb") as f:
        left = size_bytes
        while left > 0:
            n = min(left, _CHUNK_BYTES)
            f.write(zeros[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())


def unix_uri(sock):
    return f"nbd+unix:///?socket={sock}"


class Hdd:
    """The emulated HDD (TOOLS.md): without noparallel, the delay filter
    sleeps in parallel threads and the "HDD" does ~3,000 IOPS.
    serialize=all-requests makes it one request at a time across all
    connections too (the default serializes per connection only), so a
    client that opens several connections gets no faster disk."""

    DELAY = "5ms"

    def __init__(self, dir_path, size_bytes, log_requests=False):
        self.image = os.path.join(dir_path, "hdd.img")
        self.sock = os.path.join(dir_path, "hdd.sock")
        make_sparse(self.image, size_bytes)
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        # nbdkit's log filter, outermost, writes a line as each request
        # arrives: a live count of the requests that reached the origin.
        self.request_log = os.path.join(dir_path, "hdd-requests.log") if log_requests else None
        log_filter = ["--filter=log"] if log_requests else []
        log_arg = [f"logfile={self.request_log}"] if log_requests else []
        self.proc = Proc(
            "origin nbdkit",
            [
                "nbdkit", "-f", "-U", self.sock, "--exit-with-parent",
                *log_filter, "--filter=noparallel", "--filter=delay",
                "file", self.image, "serialize=all-requests",
                f"delay-read={self.DELAY}", f"delay-write={self.DELAY}", *log_arg,
            ],
            os.path.join(dir_path, "hdd.log"),
        )
        wait_for_socket(self.sock, self.proc)
        self.uri = unix_uri(self.sock)

    def stop(self):
        self.proc.stop()


class CephCluster:
    """The single-node cluster of scripts/ceph-up.sh in `dir_path`, started
    on first use and stopped (scripts/ceph-down.sh) by `stop`."""

    POOL = "tc"

    def __init__(self, dir_path):
        self.dir = dir_path
        self.conf = os.path.join(dir_path, "ceph.conf")
        self.up = False

    def start(self):
        if self.up:
            return
        t0 = time.monotonic()
        # ceph-up.sh says what failed, with the daemons' log tails.
        run([os.path.join(REPO, "scripts/ceph-up.sh"), self.dir], timeout_s=600)
        self.up = True
        self.start_s = time.monotonic() - t0

    def env(self):
        return dict(os.environ, CEPH_CONF=self.conf)

    def create_image(self, name, size_bytes):
        """A new image of `size_bytes`, written in full (an earlier one of
        that name is removed first). Written, because librbd answers reads
        of objects that were never written with zeros and no OSD request
        (the object map), which would make the cold reads of the RBD image
        alone free; as make_written does for files."""
        self.start()
        spec = f"{self.POOL}/{name}"
        run(["rbd", "rm", "--no-progress", spec], check=False, env=self.env())
        run(["rbd", "create", "--size", f"{size_bytes // (1 << 20)}M", spec], env=self.env())
        run(["fio", "--name=fill", "--ioengine=rbd", "--clientname=admin",
             f"--pool={self.POOL}", f"--rbdname={name}", "--rw=write", "--bs=4m",
             "--iodepth=8", f"--size={size_bytes}", "--output-format=terse"],
            timeout_s=1800, env=self.env())
        return spec

    def remove_image(self, spec):
        run(["rbd", "rm", "--no-progress", spec], check=False, env=self.env())

    def osd(self):
        """osd.0, for CPU time (the server side of fio's rbd engine)."""
        with open(os.path.join(self.dir, "run", "osd.0.pid")) as f:
            return Observed("ceph-osd", int(f.read()))

    def stop(self, force=False):
        """Stops the daemons (by their PID files) and removes the directory;
        `force`: also a cluster this object did not start."""
        if self.up or force:
            run([os.path.join(REPO, "scripts/ceph-down.sh"), self.dir], timeout_s=120)
            self.up = False


class RbdNbd:
    """An RBD image exported by qemu-nbd's rbd driver on a Unix socket.
    qemu-nbd's default cache mode (writeback) leaves librbd's defaults:
    rbd_cache on, rbd_cache_policy writearound (writes go to the OSD at
    once), as in fio's rbd engine."""

    def __init__(self, cluster, name, dir_path, volume_bytes):
        self.cluster = cluster
        self.spec = cluster.create_image(name, volume_bytes)
        self.sock = os.path.join(dir_path, "rbd.sock")
        self.proc = Proc(
            "qemu-nbd rbd",
            ["qemu-nbd", "-t", "--shared=8", "-f", "raw", "-k", self.sock,
             f"rbd:{self.spec}:conf={cluster.conf}:id=admin"],
            os.path.join(dir_path, "qemu-nbd-rbd.log"),
        )
        wait_for_socket(self.sock, self.proc)
        self.uri = unix_uri(self.sock)

    def stop(self):
        try:
            self.proc.stop()
        finally:
            self.cluster.remove_image(self.spec)


class RbdDirect:
    """An RBD image for tiercache's own librbd client: `rbd://POOL/IMAGE`."""

    def __init__(self, cluster, name, volume_bytes):
        self.cluster = cluster
        self.spec = cluster.create_image(name, volume_bytes)
        self.uri = f"rbd://{self.spec}?conf={cluster.conf}"

    def stop(self):
        self.cluster.remove_image(self.spec)


class System:
    """Base: `start` sets `uri` and `server` (the process whose CPU and
    memory are measured); `stop` ends everything `start` began."""

    key = "?"
    describe = ""
    # Whether the emulated HDD logs each request (Hdd.request_log).
    log_origin_requests = False

    def __init__(self):
        self.uri = None
        self.server = None
        self.notes = []
        self.dir = None
        # Whether the server holds its fast device open with O_DIRECT
        # (checked in /proc/PID/fdinfo); None where not applicable.
        self.direct = None

    def start(self, work_dir, volume_bytes):
        raise NotImplementedError

    def stop(self):
        raise NotImplementedError

    def counters(self):
        """Engine counters (tiercache only), for hit ratios."""
        return None


class Origin(System):
    key = "origin"
    describe = ("emulated HDD alone: nbdkit file plugin, noparallel filter "
                "(serialize=all-requests), delay filter 5 ms per read and write")

    def start(self, work_dir, volume_bytes):
        self.dir = work_dir
        self.hdd = Hdd(work_dir, volume_bytes, self.log_origin_requests)
        self.uri = self.hdd.uri
        self.server = self.hdd.proc

    def stop(self):
        if getattr(self, "hdd", None):
            self.hdd.stop()


class QemuRaw(System):
    key = "qemu-nbd"
    describe = "raw fast device: file on the same disk, qemu-nbd --cache=none --aio=io_uring"

    def start(self, work_dir, volume_bytes):
        self.dir = work_dir
        image = os.path.join(work_dir, "fast.img")
        sock = os.path.join(work_dir, "fast.sock")
        make_written(image, volume_bytes)
        self.server = Proc(
            "qemu-nbd",
            [
                "qemu-nbd", "-t", "--shared=8", "-f", "raw", "--cache=none",
                "--aio=io_uring", "-k", sock, image,
            ],
            os.path.join(work_dir, "qemu-nbd.log"),
        )
        wait_for_socket(sock, self.server)
        self.uri = unix_uri(sock)
        self.direct = self.server.opened_with_o_direct(image)

    def stop(self):
        if self.server:
            self.server.stop()


class NbdkitCache(System):
    key = "nbdkit-cache"

    def __init__(self, cache_bytes):
        super().__init__()
        self.cache_bytes = cache_bytes
        self.describe = (
            "nbdkit cache filter (cache=writeback, cache-min-block-size=4096, cache-on-read=true, "
            f"cache-max-size={cache_bytes >> 20}M) in its own nbdkit, nbd plugin -> emulated HDD; "
            "cache file in $TMPDIR through the page cache"
        )

    def start(self, work_dir, volume_bytes):
        self.dir = work_dir
        self.hdd = Hdd(work_dir, volume_bytes, self.log_origin_requests)
        sock = os.path.join(work_dir, "cache.sock")
        # The filter keeps its cache in an unlinked file in $TMPDIR: put it
        # on the same disk as everything else.
        env = dict(os.environ, TMPDIR=work_dir)
        self.server = Proc(
            "nbdkit cache",
            [
                "nbdkit", "-f", "-U", sock, "--exit-with-parent",
                "--filter=cache", "nbd", f"socket={self.hdd.sock}",
                "cache=writeback", "cache-min-block-size=4096", "cache-on-read=true",
                f"cache-max-size={self.cache_bytes}",
            ],
            os.path.join(work_dir, "nbdkit-cache.log"),
            env=env,
        )
        wait_for_socket(sock, self.server)
        self.uri = unix_uri(sock)

    def stop(self):
        try:
            if self.server:
                self.server.stop()
        finally:
            if getattr(self, "hdd", None):
                self.hdd.stop()


class Tiercache(System):
    """tiercache serve over an emulated HDD. `writeback` = (high %, low %,
    max age s) or None for the defaults; a high watermark of 100 means
    background writeback off (no idle drain either). `extra_create`: more
    `tiercache create` options."""

    def __init__(self, binary, mode, cache_bytes, key=None, writeback=None, cache_written=True,
                 extra_create=(), caches=1, origin=None, origin_describe="an emulated HDD"):
        super().__init__()
        self.binary = binary
        self.mode = mode
        self.cache_bytes = cache_bytes
        self.key = key or f"tc-{mode}"
        self.writeback = writeback
        self.cache_written = cache_written
        self.extra_create = list(extra_create)
        self.caches = caches
        what = ("cache file" if caches == 1 else
                f"cache set of {caches} files (dirty data mirrored), each")
        self.describe = (f"tiercache {mode} over {origin_describe}, 4 KiB blocks, default "
                         f"policy and admission, {what} of {cache_bytes >> 20} MiB on the same disk")
        self.serve_proc = None
        self.hdd = None
        # (work_dir, volume_bytes) -> an origin with `uri` and `stop()`;
        # None: the emulated HDD.
        self.origin = origin

    def _tc(self, *args):
        return [self.binary, "--state-dir", self.state_dir, *args]

    def start(self, work_dir, volume_bytes):
        self.dir = work_dir
        self.state_dir = os.path.join(work_dir, "state")
        self.name = "bench"
        if self.origin is None:
            self.hdd = Hdd(work_dir, volume_bytes, self.log_origin_requests)
        else:
            self.hdd = self.origin(work_dir, volume_bytes)
        caches = [os.path.join(work_dir, "cache.img" if i == 0 else f"cache{i}.img")
                  for i in range(self.caches)]
        create = ["create", "--name", self.name, "--mode", self.mode, "--block-size", "4K",
                  "--force", "--wipe", "--lose-dirty-data"]
        for cache in caches:
            if self.cache_written:
                make_written(cache, self.cache_bytes)
            else:
                make_sparse(cache, self.cache_bytes)
            create += ["--cache", cache]
        cache = caches[0]
        if self.writeback:
            high, low, age = self.writeback
            create += ["--writeback-high", str(high), "--writeback-low", str(low),
                       "--writeback-age", str(age)]
            if high >= 100:
                create += ["--writeback-idle", "0"]
        create += self.extra_create
        if "--writeback-order" not in create:
            # Address order unless the system asks for another, whatever
            # create's default for this origin.
            create += ["--writeback-order", "address"]
        # The emulated HDD (or the origin given) is tiercache's NBD origin
        # (its NBD client backend).
        run(self._tc(*create, "--origin", self.hdd.uri))
        sock = os.path.join(work_dir, "tc.nbd")
        self.serve_proc = Proc(
            f"tiercache serve ({self.key})",
            self._tc("serve", "--name", self.name, "--socket", sock),
            os.path.join(work_dir, "serve.log"),
        )
        wait_for_socket(sock, self.serve_proc)
        self.server = self.serve_proc
        self.uri = unix_uri(sock)
        self.direct = self.server.opened_with_o_direct(cache)

    def status(self):
        _, out, _ = run(self._tc("status", "--name", self.name, "--json"), timeout_s=60)
        return json.loads(out)

    def counters(self):
        return self.status()

    def set_writeback(self, high, low, age):
        run(self._tc("set-writeback", "--name", self.name, "--high", str(high),
                     "--low", str(low), "--age", str(age)))

    def stop(self):
        try:
            if self.serve_proc is not None:
                rc = self.serve_proc.stop(grace_s=120)
                log = self.serve_proc.log_tail(200)
                if rc != 0:
                    self.notes.append(f"tiercache serve exited with {rc}: {log.strip()[-500:]}")
                for line in log.splitlines():
                    if any(w in line for w in ("WARN", "ERROR", "panicked")) and "SIGTERM" not in line:
                        self.notes.append(f"serve log: {line.strip()}")
        finally:
            if self.hdd is not None:
                self.hdd.stop()


class RbdFio(System):
    key = "rbd-fio"
    describe = ("RBD image alone through fio's rbd engine (librbd in fio, no NBD; librbd "
                "defaults: rbd_cache on, policy writearound); CPU is ceph-osd's")

    def __init__(self, cluster):
        super().__init__()
        self.cluster = cluster

    def start(self, work_dir, volume_bytes):
        self.dir = work_dir
        self.spec = self.cluster.create_image(self.key, volume_bytes)
        pool, image = self.spec.split("/")
        self.uri = FioTarget(("--ioengine=rbd", "--clientname=admin", f"--pool={pool}",
                              f"--rbdname={image}"), (("CEPH_CONF", self.cluster.conf),))
        self.server = self.cluster.osd()

    def stop(self):
        self.cluster.remove_image(self.spec)


class RbdQemu(System):
    key = "rbd"
    describe = ("RBD image alone through qemu-nbd's rbd driver (qemu-block-extra; librbd "
                "defaults: rbd_cache on, policy writearound); CPU is qemu-nbd's")

    def __init__(self, cluster):
        super().__init__()
        self.cluster = cluster
        self.rbd = None

    def start(self, work_dir, volume_bytes):
        self.dir = work_dir
        self.rbd = RbdNbd(self.cluster, self.key, work_dir, volume_bytes)
        self.uri = self.rbd.uri
        self.server = self.rbd.proc

    def stop(self):
        if self.rbd is not None:
            self.rbd.stop()
