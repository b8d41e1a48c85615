"""Processes the harness starts, and what /proc says about them.

Every server is started here and remembered; `stop` ends it by its PID
(SIGTERM, then SIGKILL after a grace period) and nothing else is ever
signalled. Children also get PR_SET_PDEATHSIG, so a harness killed with
SIGKILL does not leave servers behind.
"""

import ctypes
import os
import signal
import socket
import subprocess
import time

_PR_SET_PDEATHSIG = 1
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")

_started = []


class BenchError(Exception):
    """A failure the harness reports in one line and stops on."""


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Proc:
    """One started server: its argv, PID and log file."""

    def __init__(self, name, argv, log_path, env=None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        log = open(log_path, "wb")
        try:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_die_with_parent,
            )
        except FileNotFoundError as e:
            raise BenchError(f"{name}: cannot run {argv[0]}: {e}") from e
        finally:
            log.close()
        self.pid = self.popen.pid
        _started.append(self)

    def alive(self):
        return self.popen.poll() is None

    def log_tail(self, lines=15):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s=30.0):
        """SIGTERM, wait, SIGKILL if still running. Returns the exit code."""
        if self in _started:
            _started.remove(self)
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            try:
                return self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait()
                raise BenchError(
                    f"{self.name} (pid {self.pid}) ignored SIGTERM for {grace_s:.0f} s; killed"
                )
        return self.popen.returncode

    # /proc/PID/stat fields 14 and 15 (1-based): utime and stime in ticks.
    def cpu_s(self):
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK

    def rss_bytes(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise BenchError(f"{self.name}: no VmRSS in /proc/{self.pid}/status")


    def opened_with_o_direct(self, path):
        """True/False if the process holds `path` open with/without
        O_DIRECT (from /proc/PID/fdinfo), None if it does not hold it."""
        real = os.path.realpath(path)
        fd_dir = f"/proc/{self.pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                if os.readlink(os.path.join(fd_dir, fd)) != real:
                    continue
                with open(f"/proc/{self.pid}/fdinfo/{fd}") as f:
                    for line in f:
                        if line.startswith("flags:"):
                            return int(line.split()[1], 8) & os.O_DIRECT != 0
            except OSError:
                continue
        return None


class Observed:
    """A process the harness did not start as a Proc (a Ceph daemon, started
    and stopped by scripts/ceph-up.sh and ceph-down.sh): measured, never
    signalled."""

    def __init__(self, name, pid):
        self.name = name
        self.pid = pid

    cpu_s = Proc.cpu_s
    rss_bytes = Proc.rss_bytes
    opened_with_o_direct = Proc.opened_with_o_direct


def stop_all():
    """Stops whatever is still running, newest first (cache before origin)."""
    for p in reversed(list(_started)):
        try:
            p.stop(grace_s=10.0)
        except (BenchError, OSError):
            pass


def wait_for_socket(path, proc, timeout_s=30.0):
    """Waits until `path` accepts a connection, or fails with the log tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise BenchError(
                f"{proc.name} exited with {proc.popen.returncode} before listening on {path}:\n"
                + proc.log_tail()
            )
        if os.path.exists(path):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    raise BenchError(f"{proc.name} did not listen on {path} within {timeout_s:.0f} s:\n" + proc.log_tail())


def run(argv, timeout_s=600, check=True, env=None):
    """Runs a short command; returns (exit code, stdout, stderr)."""
    try:
        r = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env=env
        )
    except FileNotFoundError as e:
        raise BenchError(f"cannot run {argv[0]}: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{' '.join(argv)} took longer than {timeout_s} s") from e
    if check and r.returncode != 0:
        raise BenchError(
            f"{' '.join(argv)} failed with {r.returncode}: {(r.stderr or r.stdout).strip()}"
        )
    return r.returncode, r.stdout, r.stderr
