"""Shared fixtures: a private runtime directory per test, and helpers to run
producer and consumer processes from workers.py."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
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


class Launched:
    """A worker that launcher.py forked: what the tests use of subprocess.Popen
    (pid, args, returncode, poll, wait, send_signal, terminate, kill). Its end
    arrives as a line on its connection to the launcher, so wait() waits for
    that event, never for time."""

    def __init__(self, args: list[str], request: dict):
        self.args = args
        self.returncode: int | None = None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(_launcher())
        self._conn.sendall(json.dumps(request).encode() + b"\n")
        self._buffer = b""
        self.pid: int = json.loads(self._line(None))["pid"]

    def _line(self, timeout: float | None) -> bytes | None:
        """The launcher's next line; None if none came within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._conn], [], [], left)[0]:
                return None
            chunk = self._conn.recv(4096)
            if not chunk:
                raise AssertionError(f"the launcher lost worker {self.args[1:]}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _read_end(self, timeout: float | None) -> None:
        if self.returncode is None:
            line = self._line(timeout)
            if line is not None:
                self.returncode = json.loads(line)["returncode"]
                self._conn.close()

    def poll(self) -> int | None:
        self._read_end(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_end(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_launcher_state: dict = {}


def launch(argv: list[str], stdout: Path, stderr: Path, cwd: Path | None = None,
           env: dict[str, str] | None = None) -> Launched:
    """Starts `python ARGV...` (a script and its arguments, or "-m", a module
    and its arguments) as a fork of the launcher, with stdout and stderr in
    files, in `cwd` (default: this one) and with this environment plus `env`.
    Returns a Launched (subprocess.Popen's interface) whose args are the
    command line a fresh interpreter would have had."""
    return Launched([sys.executable, *map(str, argv)],
                    {"argv": list(map(str, argv)), "env": {**os.environ, **(env or {})},
                     "cwd": str(cwd or os.getcwd()), "stdout": str(stdout), "stderr": str(stderr)})


def _launcher() -> str:
    """The socket of this test run's launcher (started on first use)."""
    if "path" not in _launcher_state:
        d = tempfile.mkdtemp(prefix="batchcast-launcher-")
        path = os.path.join(d, "socket")
        proc = subprocess.Popen([sys.executable, str(HERE / "launcher.py"), path],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the tests' launcher did not start (exit {proc.wait()})")
        _launcher_state.update(path=path, proc=proc, dir=d)
    return _launcher_state["path"]


def pytest_sessionfinish(session, exitstatus):
    proc = _launcher_state.get("proc")
    if proc is not None:
        # Ended, not asked to end: a child a test forked may still hold
        # the write end of its stdin (which ends it when pytest dies).
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        shutil.rmtree(_launcher_state["dir"], ignore_errors=True)


class Procs:
    """Starts worker processes; kills any left running when the test ends.

    Each child writes its stdout and stderr to files (never pipes, which a
    chatty child could fill and block on); read them with out() and err().
    Workers are forked from launcher.py's interpreter, which has torch
    imported already; a test marked `fresh_interpreters` gets new ones."""

    def __init__(self, tmp_path: Path, fresh: bool = False):
        self.tmp = tmp_path
        self.fresh = fresh
        self.procs: list[subprocess.Popen | Launched] = []
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
        if self.fresh:
            with open(paths[0], "w") as stdout, open(paths[1], "w") as stderr:
                p = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True,
                                     env={**os.environ, **env} if env else None)
        else:
            p = launch(cmd[1:], paths[0], paths[1], env=env)
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
            try:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            except AssertionError:  # the launcher lost it: it may still run
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def procs(request, tmp_path, runtime_dir):
    p = Procs(tmp_path, fresh=request.node.get_closest_marker("fresh_interpreters") is not None)
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
