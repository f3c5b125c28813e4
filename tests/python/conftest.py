"""Shared fixtures: a private runtime directory per test, and helpers to run
producer and consumer processes from workers.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


@pytest.fixture
def runtime_dir(tmp_path, monkeypatch):
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("BATCHCAST_RUNTIME_DIR", str(d))
    return d


@pytest.fixture
def name():
    return "t-" + uuid.uuid4().hex[:10]


class Procs:
    """Starts worker processes; kills any left running when the test ends.

    Each child writes its stdout and stderr to files (never pipes, which a
    chatty child could fill and block on); read them with out() and err()."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen] = []
        self._files: dict[int, tuple[Path, Path]] = {}

    def start(self, role: str, name: str, *flags, out: str | None = None, script: str = "workers.py",
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """Runs `script` (beside this file) with ROLE NAME FLAGS; `env` adds to
        the environment."""
        cmd = [sys.executable, str(HERE / script), role, name, *map(str, flags)]
        if out is not None:
            cmd += ["--out", str(self.tmp / out)]
        k = len(self._files)
        paths = (self.tmp / f"{role}{k}.stdout", self.tmp / f"{role}{k}.stderr")
        with open(paths[0], "w") as stdout, open(paths[1], "w") as stderr:
            p = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True,
                                 env={**os.environ, **env} if env else None)
        self._files[p.pid] = paths
        self.procs.append(p)
        return p

    def out(self, p: subprocess.Popen) -> str:
        return self._files[p.pid][0].read_text()

    def err(self, p: subprocess.Popen) -> str:
        return self._files[p.pid][1].read_text()

    def result(self, out: str) -> dict:
        return json.loads((self.tmp / out).read_text())

    def wait_all(self, timeout: float = 120) -> None:
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                raise AssertionError(f"{p.args} still ran after {timeout} s:\n{self.err(p)}")
            if p.returncode != 0:
                raise AssertionError(f"{p.args} exited {p.returncode}:\n{self.err(p)}")

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def procs(tmp_path, runtime_dir):
    p = Procs(tmp_path)
    yield p
    p.kill_all()


def shm_entries() -> set[str]:
    """What batchcast could have left in /dev/shm (its memory is memfds, so
    nothing, ever): entries named after it. Other programs on the machine
    create and remove entries of their own meanwhile (sem.mp-*, say), so the
    whole directory is no baseline."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {e for e in os.listdir("/dev/shm") if "batchcast" in e.lower()}


def batchcast_mappings() -> int:
    """This process's mappings of batchcast's shared memory (rings, mailboxes)."""
    with open("/proc/self/maps") as f:
        return sum("memfd:batchcast" in line for line in f)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def eventually(condition, what: str, timeout: float = 30.0, watch=(), err=None):
    """Waits until condition() is true (returning its value); fails naming
    `what` after `timeout` seconds, or at once when a process in `watch`
    exits first (with its stderr, from err(process), when given). For states
    another process or thread reaches (a stats value, a file), never a fixed
    sleep. The one waiting helper of the tests."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        for p in watch:
            if p.poll() is not None:
                raise AssertionError(f"{what}: {p.args[2:]} exited {p.returncode} first:\n"
                                     + (err(p) if err else ""))
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def expected_sizes(n: int, b: int, drop_last: bool) -> list[int]:
    """Consumer batch sizes for n samples in batches of b."""
    sizes = [b] * (n // b)
    if n % b and not drop_last:
        sizes.append(n % b)
    return sizes
