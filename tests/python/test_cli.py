"""The `batchcast` command line, run as real processes (`python -m batchcast`):
serve a loader from a file, status while serving, clean stops on SIGTERM
and Ctrl-C, one-line errors, the demo."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import threading
from pathlib import Path

import pytest

from conftest import eventually, launch

LOADERS = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Ids(Dataset):
        # Sample i as tests/python/workers.py checks it: (image derived from i, i).
        def __init__(self, n, fail_at=-1):
            self.n, self.fail_at = n, fail_at

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if i == self.fail_at:
                raise ValueError(f"corrupt sample {i}")
            return torch.arange(12, dtype=torch.float32).view(3, 2, 2) + i * 0.5, i


    def ids(n="100", batch="8"):
        return DataLoader(Ids(int(n)), batch_size=int(batch))


    def failing(n="100", at="20"):
        return DataLoader(Ids(int(n), fail_at=int(at)), batch_size=4)


    def boom():
        raise ValueError("no data here")


    def number():
        return 42


    def once():
        yield torch.zeros(2)


    class Stream:
        # Re-iterable, with no length: the producer cannot tell an epoch's samples.
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            for start in range(0, self.n, 8):
                ids = torch.arange(start, min(self.n, start + 8))
                yield torch.stack([Ids(self.n)[int(i)][0] for i in ids]), ids


    def stream(n="100"):
        return Stream(int(n))


    not_a_function = 3
""")


@pytest.fixture
def loaders(tmp_path) -> Path:
    path = tmp_path / "loaders.py"
    path.write_text(LOADERS)
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    return path


class Cli:
    """Runs `python -m batchcast ...` with stdout and stderr in files."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.files: dict[int, tuple[Path, Path]] = {}

    def start(self, *args: str, stderr=None) -> subprocess.Popen:
        k = len(self.procs)
        paths = (self.tmp / f"cli{k}.stdout", self.tmp / f"cli{k}.stderr")
        if stderr is None:
            p = launch(["-m", "batchcast", *args], paths[0], paths[1], cwd=self.tmp)
        else:  # a terminal, say: a new interpreter, so that stderr is that file
            with open(paths[0], "w") as out:
                p = subprocess.Popen([sys.executable, "-m", "batchcast", *args], cwd=self.tmp,
                                     stdout=out, stderr=stderr, stdin=subprocess.DEVNULL, text=True)
        self.procs.append(p)
        self.files[p.pid] = paths
        return p

    def run(self, *args: str, timeout: float = 120) -> tuple[int, str, str]:
        p = self.start(*args)
        p.wait(timeout)
        return p.returncode, self.out(p), self.err(p)

    def out(self, p: subprocess.Popen) -> str:
        return self.files[p.pid][0].read_text()

    def err(self, p: subprocess.Popen) -> str:
        return self.files[p.pid][1].read_text()

    def finish(self, p: subprocess.Popen, timeout: float = 60) -> int:
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError(f"{p.args} still ran after {timeout} s:\n{self.err(p)}")

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def cli(tmp_path, runtime_dir):
    c = Cli(tmp_path)
    yield c
    c.kill_all()


def producer_status(name: str) -> dict | None:
    from batchcast.status import list_producers

    listings = list_producers(name)
    return listings[0]["status"] if listings and listings[0]["alive"] else None


def consuming(name: str, count: int) -> bool:
    """Whether `count` consumers of `name` have each been sent a batch."""
    status = producer_status(name)
    return bool(status) and sum(c["batches_sent"] > 0 for c in status["consumers"]) >= count


def serving(runtime_dir: Path, name: str, p: subprocess.Popen, cli: Cli):
    def ready():
        assert p.poll() is None, f"serve exited {p.returncode}:\n{cli.err(p)}"
        return (runtime_dir / f"{name}.sock").exists()
    return ready


def test_serve_serves_a_loader_from_a_file_to_a_checking_consumer(cli, procs, loaders,
                                                                   runtime_dir, tmp_path):
    serve = cli.start("serve", f"{loaders}:ids", "--epochs", "2", "--refresh", "0.2",
                      "--", "203", "8")
    consumer = procs.start("consume", "ids", "--batch-size", "10", "--epochs", "2",
                           "--check-values", out="c.json")  # name: the function's
    procs.wait_all()
    assert cli.finish(serve) == 0, cli.err(serve)
    result = procs.result("c.json")
    assert result["error"] is None, result
    assert result["epochs"] == [list(range(203))] * 2
    assert result["sizes"][0] == [10] * 20 + [3]
    err = cli.err(serve)
    assert "serving 'ids'" in err and "26 batches per epoch" in err, err
    assert "served 2 epochs, 52 batches, 406 samples" in err, err
    assert f"consumer pid {consumer.pid} of producer 'ids' joined" in err, err
    assert "Traceback" not in err and cli.out(serve) == "", err
    assert list(runtime_dir.iterdir()) == []


def test_serve_takes_samples_per_epoch_and_ring_bytes(cli, procs, loaders, runtime_dir):
    # A loader with no length: --samples-per-epoch gives trainers len() from the start.
    serve = cli.start("serve", f"{loaders}:stream", "--epochs", "1", "--samples-per-epoch", "100",
                      "--ring-bytes", str(64 << 20), "--refresh", "0", "--", "100")
    procs.start("consume", "stream", "--batch-size", "10", "--check-values", out="c.json")
    procs.wait_all()
    assert cli.finish(serve) == 0, cli.err(serve)
    result = procs.result("c.json")
    assert result["error"] is None and result["epochs"] == [list(range(100))], result
    assert result["len"] == 10  # known before the first epoch ended
    assert result["stats"]["ring_bytes"] >= 64 << 20


def test_serve_keeps_a_decoded_cache_on_disk_for_the_next_serve(cli, procs, loaders, runtime_dir, tmp_path):
    # --cache disk: the first serve decodes each sample once and leaves the
    # file; the next serve of that name starts from it. Consumers check every
    # sample's values both times.
    cache_dir = tmp_path / "decoded"
    for run in range(2):
        serve = cli.start("serve", f"{loaders}:ids", "--epochs", "2", "--refresh", "0",
                          "--cache", "disk", "--cache-dir", str(cache_dir), "--", "203", "8")
        procs.start("consume", "ids", "--batch-size", "10", "--epochs", "2", "--check-values",
                    out=f"c{run}.json")
        procs.wait_all()
        assert cli.finish(serve) == 0, cli.err(serve)
        result = procs.result(f"c{run}.json")
        assert result["error"] is None and result["epochs"] == [list(range(203))] * 2, result
        err = cli.err(serve)
        if run == 0:
            assert "decoded once are kept" in err and "for the next producer of this name" in err, err
        else:
            assert "203 decoded samples from" in err, err
    assert [p.name for p in cache_dir.iterdir()] == ["ids.batchcast-cache"]
    code, _, err = cli.run("serve", f"{loaders}:ids", "--cache-dir", str(cache_dir))
    assert code == 2 and "--cache-dir and --cache-key go with --cache" in err, err


def test_status_while_serving_two_consumers_then_sigterm_stops_cleanly(cli, procs, loaders,
                                                                       runtime_dir):
    serve = cli.start("serve", f"{loaders}:ids", "--name", "sweep", "--min-consumers", "2",
                      "--refresh", "0", "--", "100000", "8")
    eventually(serving(runtime_dir, "sweep", serve, cli), "serve to take the name")
    a = procs.start("consume", "sweep", "--batch-size", "6", "--sleep", "0.01",
                    "--check-values", out="a.json")
    b = procs.start("consume", "sweep", "--batch-size", "10", "--sleep", "0.01",
                    "--check-values", out="b.json")
    eventually(lambda: consuming("sweep", 2), "both consumers to receive batches", 60)

    rc, out, err = cli.run("status", "--json")
    assert rc == 0, err
    (listing,) = json.loads(out)
    assert listing["name"] == "sweep" and listing["alive"], listing
    status = listing["status"]
    assert status["pid"] == serve.pid and status["batches_published"] > 0
    assert sorted((c["pid"], c["batch_size"]) for c in status["consumers"]) == \
        sorted([(a.pid, 6), (b.pid, 10)])

    rc, out, err = cli.run("status")
    assert rc == 0, err
    assert out.startswith(f"sweep: pid {serve.pid}, cpu, up "), out
    assert "epoch 0 (0 done)" in out and "consumers: 2" in out and "samples/s" in out, out
    assert "waiting for loader" in out and "for consumers" in out and "copying" in out, out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.strip().split(" ")[0] in (str(a.pid), str(b.pid))}
    assert rows[str(a.pid)][1] == "6" and rows[str(b.pid)][1] == "10", out

    rc, out, _ = cli.run("status", "sweep", "--json")
    assert rc == 0 and [p["name"] for p in json.loads(out)] == ["sweep"]
    rc, out, _ = cli.run("status", "elsewhere")
    assert rc == 1 and "no producer named 'elsewhere' is running" in out, out

    rc, out, err = cli.run("serve", f"{loaders}:ids", "--name", "sweep")
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith("batchcast: error: ") and "sweep" in err and "--name" in err, err

    serve.send_signal(signal.SIGTERM)
    assert cli.finish(serve) == 0, cli.err(serve)
    procs.wait_all()
    for out_file in ("a.json", "b.json"):
        result = procs.result(out_file)
        assert result["error"].startswith("ProducerLost"), result
        assert result["epochs"] == []  # lost in the middle of their first epoch
    err = cli.err(serve)
    assert "SIGTERM: stopping" in err and "stopped after 0 epochs" in err, err
    assert "Traceback" not in err, err
    assert list(runtime_dir.iterdir()) == []


def test_ctrl_c_on_a_terminal_stops_cleanly(cli, procs, loaders, runtime_dir):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    screen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        serve = cli.start("serve", f"{loaders}:ids", "--", "100000", "8", stderr=slave)
        eventually(serving(runtime_dir, "ids", serve, cli), "serve to take the name")
        procs.start("consume", "ids", "--batch-size", "16", "--sleep", "0.01",
                    "--check-values", out="c.json")
        # The live status, redrawn in place (refreshed every second).
        eventually(lambda: b"batches/s" in screen and b"1 consumer, slowest lag" in screen,
                   "the live status on the terminal", 60)
        assert b"\r" in screen and b"\x1b[" in screen  # redrawn, not appended
        assert b"epoch 0" in screen  # from 0, as `status` and the consumers number them
        serve.send_signal(signal.SIGINT)
        assert cli.finish(serve) == 0
        procs.wait_all()
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    text = screen.decode(errors="replace")
    assert "SIGINT: stopping" in text and "stopped after 0 epochs" in text, text
    assert "'ids' is free" in text and "Traceback" not in text, text
    assert procs.result("c.json")["error"].startswith("ProducerLost")
    assert list(runtime_dir.iterdir()) == []


def test_the_status_off_a_terminal_is_one_plain_line_per_refresh():
    # What a log file or a notebook cell running `batchcast serve` shows:
    # the same text, no control codes, messages in between.
    import io
    import re

    from batchcast._display import Screen

    # The progress comes from the producer's own statistics.
    stats = {"epoch": 0, "epochs_done": 0, "epoch_batches": 3, "batches_per_epoch": 10}
    out = io.StringIO()
    screen = Screen(out, tty=False, epochs=2)
    screen.message("consumer pid 7 [joined] 1.5")
    screen.update(stats, "3.0 batches/s | 1 consumer, slowest lag 2 (pid 7)")
    screen.update({**stats, "epoch_batches": 4}, "[bold]4.0[/] batches/s")
    screen.update({**stats, "epoch": 1, "epoch_batches": 2, "batches_per_epoch": -1}, "x")
    screen.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "consumer pid 7 [joined] 1.5", lines
    assert re.fullmatch(r"\d\d:\d\d:\d\d epoch 0 of 0-1: 3/10 batches \| 3\.0 batches/s \| "
                        r"1 consumer, slowest lag 2 \(pid 7\)", lines[1]), lines
    assert re.fullmatch(r"\d\d:\d\d:\d\d epoch 0 of 0-1: 4/10 batches \| \[bold\]4\.0\[/\] "
                        r"batches/s", lines[2]), lines
    assert re.fullmatch(r"\d\d:\d\d:\d\d epoch 1 of 0-1: 2 batches \| x", lines[3]), lines
    assert len(lines) == 4 and "\x1b" not in out.getvalue()


def test_the_live_status_fits_the_terminal_in_whole_parts():
    from batchcast._display import fit

    parts = ["12.0 batches/s, 384 samples/s", "3 consumers, slowest lag 4 (pid 77)",
             "waiting for loader 80%, for consumers 10%, copying 5%"]
    assert fit(parts, 200) == " | ".join(parts)
    assert fit(parts, 70) == " | ".join(parts[:2])
    assert fit(parts, 10) == parts[0]  # the first part always, even where it does not fit


def test_status_reports_and_removes_what_a_killed_serve_left(cli, loaders, runtime_dir):
    serve = cli.start("serve", f"{loaders}:ids", "--name", "ghost")
    eventually(serving(runtime_dir, "ghost", serve, cli), "serve to take the name")
    serve.kill()  # no chance to clean up
    serve.wait()
    assert sorted(f.name for f in runtime_dir.iterdir()) == ["ghost.lock", "ghost.sock"]
    rc, out, err = cli.run("status")
    assert rc == 0, err
    assert out.strip() == "ghost: left behind by a producer that is gone; removed", out
    assert list(runtime_dir.iterdir()) == []
    rc, out, _ = cli.run("status")
    assert rc == 0 and out.strip() == "no batchcast producers are running", out


def test_help_version_and_status_never_load_torch(cli, loaders, runtime_dir):
    # What makes them instant: torch (seconds to import) stays out, even while
    # a producer answers the status query.
    serve = cli.start("serve", f"{loaders}:ids", "--name", "quick")
    eventually(serving(runtime_dir, "quick", serve, cli), "serve to take the name")
    code = (
        "import contextlib, io, json, sys\n"
        "from batchcast.cli import main\n"
        "codes = []\n"
        "for argv in (['--help'], ['--version'], ['status'], ['status', '--json'], ['status', 'quick']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        codes.append((main(argv), out.getvalue()))\n"
        "print(json.dumps({'codes': codes, 'torch': sorted(m for m in sys.modules\n"
        "                  if m == 'torch' or m.startswith('torch.'))}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=cli.tmp)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["torch"] == []
    (help_rc, help_out), (version_rc, version_out), (status_rc, status_out), \
        (json_rc, json_out), (named_rc, _) = result["codes"]
    assert (help_rc, version_rc, status_rc, json_rc, named_rc) == (0, 0, 0, 0, 0)
    assert "batchcast status" in help_out and version_out.startswith("batchcast ")
    assert status_out.startswith("quick: pid ")
    (listing,) = json.loads(json_out)
    assert listing["name"] == "quick" and listing["alive"] and listing["status"]["pid"] == serve.pid
    serve.terminate()
    assert cli.finish(serve) == 0


def test_a_loader_that_raises_stops_serve_with_one_line(cli, procs, loaders, runtime_dir):
    serve = cli.start("serve", f"{loaders}:failing", "--epochs", "1", "--", "100", "21")
    procs.start("consume", "failing", "--batch-size", "4", out="c.json")
    procs.wait_all()
    assert cli.finish(serve) == 1
    err = cli.err(serve).splitlines()
    assert err[-1].startswith("batchcast: error: the loader raised ValueError: "), err
    assert "corrupt sample 21" in err[-1], err
    assert not any("Traceback" in line for line in err), err
    result = procs.result("c.json")
    assert result["error"].startswith("LoaderError") and "corrupt sample 21" in result["error"]
    assert list(runtime_dir.iterdir()) == []


@pytest.mark.parametrize("args, message, code", [
    (["serve", "missing.py:ids"], "no such file: missing.py", 2),
    (["serve", "loaders.py"], "'loaders.py' is not PATH.py:FUNCTION", 2),
    (["serve", "loaders.py:nope"], "loaders.py has no function 'nope' (it defines: ", 2),
    (["serve", "loaders.py:not_a_function"],
     "'not_a_function' in loaders.py is an int, not a function", 2),
    (["serve", "broken.py:f"], "importing broken.py raised ModuleNotFoundError", 1),
    (["serve", "loaders.py:boom"], "loaders.py:boom() raised ValueError: no data here", 1),
    (["serve", "loaders.py:ids", "--", "many"], "raised ValueError: invalid literal", 1),
    (["serve", "loaders.py:number"], "returned an int, which is not iterable", 1),
    (["serve", "loaders.py:once"], "returned a generator, an iterator that can be iterated "
     "only once", 1),
    (["serve", "loaders.py:ids", "--device", "tpu"], "--device 'tpu' is not a device", 2),
    (["serve", "loaders.py:ids", "--name", "a/b"], "invalid producer name 'a/b'", 2),
    (["serve", "loaders.py:ids", "--epochs", "0"], "Invalid value for '--epochs'", 2),
    (["serve", "loaders.py:ids", "--slots", "many"], "Invalid value for '--slots'", 2),
    (["serve"], "Missing argument 'PATH.py:FUNCTION'", 2),
    (["status", "a/b"], "invalid producer name 'a/b'", 2),
    (["bogus"], "No such command 'bogus'", 2),
])
def test_errors_are_one_line(cli, loaders, runtime_dir, args, message, code):
    rc, out, err = cli.run(*args)
    assert rc == code, (rc, err)
    assert err.startswith("batchcast: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert out == "" and list(runtime_dir.iterdir()) == []


def test_demo_runs(cli):
    rc, out, err = cli.run("demo", "--samples", "256", "--epochs", "1", timeout=600)
    assert rc == 0, err
    assert "Every consumer saw every sample exactly once per epoch" in out, out
    assert "aggregate samples/s" in out, out
