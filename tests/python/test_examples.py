"""The examples run as the README says: the notebook (executed with nbclient,
re-run in one kernel and in fresh kernels, and served again after a kernel is
killed), the two sweeps, the C++ trainer, and the drop-in details (tqdm,
__version__, py.typed, the TensorSocket shim).

Needs, beyond the core test dependencies: nbclient, nbformat, ipykernel,
jupyter_client (notebook), optuna (Optuna sweep), tqdm, pillow (augmentation sweep); each test skips with
the reason when its package is missing. The C++ test runs the example binary
built with -DBATCHCAST_BUILD_EXAMPLES=ON (found in build/*/example_train or
$BATCHCAST_EXAMPLE_TRAIN) and skips when there is none.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import batchcast as bc
from conftest import launch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NOTEBOOK_NAME = "notebook-demo"  # the name examples/notebook.ipynb serves
NOTEBOOK_SAMPLES = 512


# ---- helpers ---------------------------------------------------------------

def run_script(tmp_path: Path, args: list[str], timeout: float = 600) -> str:
    """Runs a Python example to completion; stdout and stderr go to files."""
    out, err = tmp_path / "script.stdout", tmp_path / "script.stderr"
    proc = launch(args, out, err, cwd=tmp_path)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{args} still ran after {timeout} s:\n{out.read_text()}\n{err.read_text()}")
    assert proc.returncode == 0, (f"{args} exited {proc.returncode}:\n"
                                  f"{out.read_text()}\n{err.read_text()}")
    return out.read_text()


def cell_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream")


STATE_CELL = r'''
import json as _json, os as _os, threading as _threading
def _bc_state():
    def read(path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return None
    tasks = [read(f"/proc/self/task/{t}/comm") for t in _os.listdir("/proc/self/task")]
    fds = []
    for fd in _os.listdir("/proc/self/fd"):
        try:
            fds.append(_os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    children = []
    for pid in filter(str.isdigit, _os.listdir("/proc")):
        stat = read(f"/proc/{pid}/stat")
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == _os.getpid():
            children.append(int(pid))
    return {
        "native_threads": sorted(t.strip() for t in tasks if t),
        "python_threads": sorted(t.name for t in _threading.enumerate()),
        # A ring is a memfd named "batchcast:<name>" (not the extension module,
        # whose path may contain "batchcast" too).
        "ring_mappings": sum("/memfd:batchcast:" in line
                             for line in read("/proc/self/maps").splitlines()),
        "ring_fds": sum("/memfd:batchcast:" in f for f in fds),
        "runtime_dir": sorted(_os.listdir(_os.environ["BATCHCAST_RUNTIME_DIR"])),
        "children": children,
    }
print("STATE " + _json.dumps(_bc_state()))
'''


def states(nb) -> list[dict]:
    found = []
    for cell in nb.cells:
        for line in cell_text(cell).splitlines():
            if line.startswith("STATE "):
                found.append(json.loads(line[len("STATE "):]))
    return found


def assert_clean(state: dict) -> None:
    """Nothing of batchcast's is left in the kernel after the notebook ran."""
    assert not [t for t in state["python_threads"] if "batchcast" in t], state
    assert state["ring_mappings"] == 0 and state["ring_fds"] == 0, state
    assert state["runtime_dir"] == [], state
    assert state["children"] == [], state


def check_notebook_outputs(nb, runs: int) -> None:
    text = "".join(cell_text(c) for c in nb.cells)
    # 3 trainers x 2 epochs, the second kernel x 2 epochs, the `with` trainer x 1 epoch
    assert text.count(f"{NOTEBOOK_SAMPLES} samples, exactly once: True") == 9 * runs, text
    assert "exactly once: False" not in text, text
    assert text.count("second kernel, epoch 1") == runs, text
    assert text.count("producers now: []") == 2 * runs, text


def notebook_env():
    def need(module: str):
        return pytest.importorskip(
            module, reason=f"the notebook tests need {module} "
                           "(pip install nbclient nbformat ipykernel jupyter_client)")

    nbformat, nbclient = need("nbformat"), need("nbclient")
    need("ipykernel")
    need("jupyter_client")
    return nbformat, nbclient


def execute(nbclient, nb, cwd: Path) -> None:
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                      resources={"metadata": {"path": str(cwd)}})
    client.execute()


# ---- the notebook ----------------------------------------------------------

def test_notebook_runs_twice_in_one_kernel_and_leaves_nothing(runtime_dir, tmp_path):
    nbformat, nbclient = notebook_env()
    original = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
    v4 = nbformat.v4

    def run_once():  # fresh cells (and cell ids) for each pass
        cells = [v4.new_code_cell(c.source) if c.cell_type == "code"
                 else v4.new_markdown_cell(c.source) for c in original.cells]
        return [*cells, v4.new_code_cell(STATE_CELL)]

    nb = v4.new_notebook(metadata=original.metadata, cells=[*run_once(), *run_once()])
    execute(nbclient, nb, tmp_path)
    check_notebook_outputs(nb, runs=2)
    first, second = states(nb)
    assert_clean(first)
    assert_clean(second)
    # Threads: the second run ends with exactly the threads the first ended with
    # (whatever the first created once, torch's pools say, is not a leak per run).
    assert second["native_threads"] == first["native_threads"], (first, second)
    assert second["python_threads"] == first["python_threads"], (first, second)
    assert os.listdir(runtime_dir) == []


def test_the_serving_cell_run_again_replaces_its_producer(runtime_dir, tmp_path):
    nbformat, nbclient = notebook_env()
    original = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
    code = [c.source for c in original.cells if c.cell_type == "code"]
    serving = next(c for c in code if "bc.Producer(" in c and ".start()" in c)
    stop = next(c for c in code if c.startswith("producer.stop()"))
    v4 = nbformat.v4
    nb = v4.new_notebook(metadata=original.metadata,
                         cells=[v4.new_code_cell(code[0]), v4.new_code_cell(serving),
                                v4.new_code_cell(serving), v4.new_code_cell(stop),
                                v4.new_code_cell(STATE_CELL)])
    execute(nbclient, nb, tmp_path)
    replaced = cell_text(nb.cells[2])
    assert "replaces the one of that name this process started before" in replaced, replaced
    assert "producers now: []" in cell_text(nb.cells[3])
    assert_clean(states(nb)[0])
    assert os.listdir(runtime_dir) == []


def test_notebook_in_fresh_kernels_leaves_nothing(runtime_dir, tmp_path):
    nbformat, nbclient = notebook_env()
    for _ in range(2):
        nb = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(STATE_CELL))
        execute(nbclient, nb, tmp_path)
        check_notebook_outputs(nb, runs=1)
        assert_clean(states(nb)[0])
        assert os.listdir(runtime_dir) == []  # after the kernel exited too


class Kernel:
    """A kernel started with jupyter_client; run() executes code and returns its stdout."""

    def __init__(self, cwd: Path):
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(cwd),
                                            stderr=subprocess.DEVNULL)
        self.pid = int(self.run("import os; print(os.getpid())"))

    def run(self, code: str, timeout: float = 300) -> str:
        out: list[str] = []
        errors: list[str] = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                errors.append("\n".join(msg["content"]["traceback"]))

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        assert reply["content"]["status"] == "ok", "".join(out) + "\n".join(errors)
        return "".join(out)

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def read_epoch(batch_size: int) -> list[int]:
    with bc.Consumer(NOTEBOOK_NAME, batch_size=batch_size, timeout=60) as consumer:
        return sorted(i for _, _, index in consumer for i in index.tolist())


def test_killed_serving_kernel_its_name_is_served_again_by_a_new_kernel(runtime_dir, tmp_path):
    nbformat, _ = notebook_env()
    nb = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    setup, serve = code[0], code[1]
    assert "bc.Producer(" in serve and ".start()" in serve

    first = Kernel(tmp_path)
    try:
        first.run(setup)
        first.run(serve)
        assert read_epoch(50) == list(range(NOTEBOOK_SAMPLES))
        consumer = bc.Consumer(NOTEBOOK_NAME, batch_size=50)
        batches = iter(consumer)
        next(batches)  # mid-epoch when the kernel dies
        os.kill(first.pid, signal.SIGKILL)
        with pytest.raises(bc.ProducerLost):
            for _ in batches:
                pass
        consumer.close()
    finally:
        first.shutdown()
    assert (runtime_dir / f"{NOTEBOOK_NAME}.lock").exists()  # what the dead kernel left

    second = Kernel(tmp_path)  # a restarted kernel: the same cells, no clean-up step
    try:
        second.run(setup)
        second.run(serve)
        assert read_epoch(64) == list(range(NOTEBOOK_SAMPLES))
        second.run("producer.stop()")
    finally:
        second.shutdown()
    assert os.listdir(runtime_dir) == []


# ---- sweeps ----------------------------------------------------------------

SMALL = ["--trials", "2", "--epochs", "1", "--samples", "128", "--size", "16"]


def check_sweep_output(out: str) -> None:
    row = re.compile(r"^\s*[0-9.e-]+\s+\d+\s+[0-9.]+\s+(True|False)")
    rows = [line for line in out.splitlines() if row.match(line)]
    assert len(rows) == 4, out  # 2 trials shared, 2 with their own loader
    assert all(" True " in row for row in rows), out
    assert "one shared producer" in out and "a DataLoader each" in out, out
    assert re.search(r"saved by sharing\s*: wall\s+-?[0-9.]+ s .* CPU\s+-?[0-9.]+ s", out), out


def test_sweep_script(runtime_dir, tmp_path):
    out = run_script(tmp_path, [str(EXAMPLES / "sweep_script.py"), *SMALL])
    check_sweep_output(out)
    assert os.listdir(runtime_dir) == []


def test_speech_sweep_trials_of_three_batch_sizes_get_every_utterance_repadded(runtime_dir, tmp_path):
    out = run_script(tmp_path, [str(EXAMPLES / "speech_sweep.py"), "--trials", "3", "--epochs", "2",
                                "--utterances", "96"])
    row = re.compile(r"^\s+(\d+)\s+[0-9.]+\s+(True|False)\s+(\d+)\s+[0-9.na-]+$")
    rows = [row.match(line) for line in out.splitlines() if row.match(line)]
    assert len(rows) == 6, out  # 3 trials shared, 3 with their own loader
    assert all(r.group(2) == "True" for r in rows), out
    assert sorted(int(r.group(1)) for r in rows[:3]) == [8, 12, 20], out
    # Batches of 12 and 20 join loader batches of 16 of different lengths: re-padded.
    assert sum(int(r.group(3)) for r in rows[:3]) > 0, out
    assert "one shared producer" in out and "a DataLoader each" in out, out
    assert os.listdir(runtime_dir) == []


def test_augment_sweep_trials_augment_their_own_way_and_get_every_image_once(runtime_dir, tmp_path):
    pytest.importorskip("PIL", reason="the augmentation sweep decodes JPEGs with Pillow (pip install pillow)")
    out = run_script(tmp_path, [str(EXAMPLES / "augment_sweep.py"), "--trials", "3", "--epochs", "2",
                                "--images", "160", "--size", "48"])
    row = re.compile(r"^\s+(\d+)\s+([0-9.]+)\s+(\d+)\s+([0-9.]+) ([0-9.]+)\s+(True|False)$")
    rows = [m for m in map(row.match, out.splitlines()) if m]
    assert len(rows) == 3, out
    assert [float(r.group(2)) for r in rows] == [0.1, 0.3, 0.5], out  # each its own strength
    assert all(r.group(6) == "True" for r in rows), out
    assert os.listdir(runtime_dir) == []


def test_sweep_optuna(runtime_dir, tmp_path):
    pytest.importorskip("optuna", reason="the Optuna sweep needs optuna (pip install optuna)")
    out = run_script(tmp_path, [str(EXAMPLES / "sweep_optuna.py"), *SMALL])
    check_sweep_output(out)
    assert re.search(r"^best: lr=", out, re.M), out
    assert os.listdir(runtime_dir) == []


def test_optuna_trials_as_threads(runtime_dir, tmp_path):
    """examples/optuna_threads.py: 3 trials as threads of one process, from a
    producer in a process beside them, then a DataLoader each."""
    pytest.importorskip("optuna", reason="needs optuna (pip install optuna)")
    out = run_script(tmp_path, [str(EXAMPLES / "optuna_threads.py"), "--trials", "3", "--epochs", "2",
                                "--samples", "256", "--size", "32"])
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+0\.\d+\s+(16|32|64)\s", line)]
    assert len(rows) == 6 and all(row[-1] == "True" for row in rows), out  # 3 trials, both ways
    assert [r[:2] for r in rows[:3]] == [r[:2] for r in rows[3:]], out  # the same parameters
    assert re.search(r"^best: lr=", out, re.M), out
    assert re.search(r"saved by sharing: wall -?[0-9.]+ s \([0-9.]+x trials/hour\), CPU -?[0-9.]+ s", out), out
    assert os.listdir(runtime_dir) == []



def test_hugging_face_hyperparameter_search(runtime_dir, tmp_path):
    """examples/hf_search.py: Trainer.hyperparameter_search (Optuna) of 3 trials
    from one cached producer, then the same search with a DataLoader each."""
    pytest.importorskip("optuna", reason="needs optuna (pip install optuna)")
    pytest.importorskip("transformers", reason="needs transformers (pip install transformers accelerate)")
    out = run_script(tmp_path, [str(EXAMPLES / "hf_search.py"), "--trials", "3", "--epochs", "2",
                                "--samples", "192", "--workers", "1"])
    assert "from one producer (cache: ready)" in out, out
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+[0-2]\s+0\.\d+\s+(16|32|64)\s+(True|False)$", line)]
    assert len(rows) == 6 and all(row[-1] == "True" for row in rows), out  # 3 trials, both ways
    # The same seeded sampler: the DataLoader search tried the same parameters.
    assert [row[:3] for row in rows[:3]] == [row[:3] for row in rows[3:]], out
    assert len(re.findall(r"^best: trial \d, eval loss 0\.\d+$", out, re.M)) == 2, out
    assert re.search(r"saved by sharing: wall -?[0-9.]+ s", out), out
    assert os.listdir(runtime_dir) == []

# ---- the C++ trainer -------------------------------------------------------

def example_binary() -> Path | None:
    given = os.environ.get("BATCHCAST_EXAMPLE_TRAIN")
    if given:
        return Path(given)
    found = [p for p in ROOT.glob("build/*/example_train") if os.access(p, os.X_OK)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def test_cpp_trainer_fed_by_a_python_producer(runtime_dir, tmp_path):
    binary = example_binary()
    if binary is None:
        pytest.skip("no C++ example built (configure with -DBATCHCAST_BUILD_EXAMPLES=ON)")
    name = "cpp-example"
    files = {}

    def start(role, cmd):
        files[role] = (tmp_path / f"{role}.out", tmp_path / f"{role}.err")
        with open(files[role][0], "w") as o, open(files[role][1], "w") as e:
            return subprocess.Popen(cmd, stdout=o, stderr=e)

    producer = start("producer", [sys.executable, str(EXAMPLES / "cpp" / "serve.py"), name,
                                  "--samples", "1024", "--epochs", "3", "--consumers", "2"])
    trainers = {b: start(f"train{b}", [str(binary), name, "--batch-size", str(b), "--epochs", "3",
                                       "--report", str(tmp_path / f"report{b}.json")])
                for b in (48, 100)}
    procs = {"producer": producer, **{f"train{b}": p for b, p in trainers.items()}}
    try:
        for role, p in procs.items():
            code = p.wait(timeout=300)
            assert code == 0, (f"{role} exited {code}:\n{files[role][0].read_text()}\n"
                               f"{files[role][1].read_text()}")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for b in trainers:
        report = json.loads((tmp_path / f"report{b}.json").read_text())
        epochs = report["epochs"]
        assert [e["epoch"] for e in epochs] == [0, 1, 2], report
        assert all(e["exactly_once"] and e["samples"] == 1024 for e in epochs), report
        assert all(e["batches"] == math.ceil(1024 / b) for e in epochs), report
        assert epochs[-1]["loss"] < 0.8 * epochs[0]["loss"], report  # it learns
        assert "every sample exactly once: yes" in files[f"train{b}"][0].read_text()
    assert os.listdir(runtime_dir) == []


def test_cpp_trainer_joins_mid_epoch_at_once(runtime_dir, tmp_path):
    """The C++ consumer's door: a trainer that joins while the producer
    stands mid-epoch starts with the next batch (join_now), knows its len()
    from the start, and gets an epoch of its own with every sample once."""
    binary = example_binary()
    if binary is None:
        pytest.skip("no C++ example built (configure with -DBATCHCAST_BUILD_EXAMPLES=ON)")
    from conftest import Procs, eventually

    name, samples = "cpp-join", 1024
    procs = Procs(tmp_path)
    started: list[subprocess.Popen] = []

    def start(role: str, cmd: list[str]) -> subprocess.Popen:
        with open(tmp_path / f"{role}.out", "w") as o, open(tmp_path / f"{role}.err", "w") as e:
            started.append(subprocess.Popen(cmd, stdout=o, stderr=e))
        return started[-1]

    try:
        producer = start("producer", [sys.executable, str(EXAMPLES / "cpp" / "serve.py"), name,
                                      "--samples", str(samples), "--epochs", "3"])
        # A Python trainer takes the stream and holds still at its 3rd batch:
        # the producer stops mid-epoch, its ring full.
        procs.start("consume", name, "--batch-size", 0, "--epochs", 3, "--ready",
                    tmp_path / "held", "--ready-after", 3, "--hold-at", 3, "--until",
                    tmp_path / "go", out="whole.json")
        eventually((tmp_path / "held").exists, "the first trainer to hold", 120,
                   watch=[producer, *procs.procs], err=procs.err)
        trainers = {b: start(f"train{b}", [str(binary), name, "--batch-size", str(b), "--epochs",
                                            "1", "--join-now", "--report",
                                            str(tmp_path / f"report{b}.json")])
                    for b in (48, 100)}
        from batchcast.status import list_producers

        def present() -> bool:
            listing = list_producers(name)
            return bool(listing) and len((listing[0].get("status") or {}).get("consumers", [])) == 3
        eventually(present, "both C++ trainers to join", 60, watch=list(trainers.values()))
        (tmp_path / "go").touch()
        for b, p in trainers.items():
            assert p.wait(120) == 0, (tmp_path / f"train{b}.err").read_text()
        procs.wait_all(120)
        assert producer.wait(60) == 0, (tmp_path / "producer.err").read_text()
    finally:
        procs.kill_all()
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
    for b in (48, 100):
        report = json.loads((tmp_path / f"report{b}.json").read_text())
        assert 0 < report["joined_at"] < samples, report  # mid-epoch, at once
        assert report["batches_per_epoch"] == math.ceil(samples / b), report
        (epoch,) = report["epochs"]
        assert epoch["exactly_once"] and epoch["samples"] == samples, report
        assert epoch["batches"] == math.ceil(samples / b), report


# ---- drop-in details -------------------------------------------------------

def serve_in_thread(loader, name, **options) -> bc.Producer:
    return bc.Producer(loader, name, epochs=None, **options).start()


class Unsized(IterableDataset):
    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(torch.arange(self.n))


@pytest.mark.parametrize("drop_last", [False, True])
def test_tqdm_shows_the_total(runtime_dir, name, drop_last):
    tqdm = pytest.importorskip("tqdm", reason="needs tqdm (pip install tqdm)").tqdm
    loader = DataLoader(TensorDataset(torch.arange(100)), batch_size=16)
    with serve_in_thread(loader, name):
        consumer = bc.Consumer(name, batch_size=7, drop_last=drop_last)
        bar = tqdm(consumer, file=io.StringIO())
        assert bar.total == len(consumer) == (100 // 7 if drop_last else math.ceil(100 / 7))
        n = sum(1 for _ in bar)
        assert n == bar.total and bar.n == bar.total
        consumer.close()


def test_len_of_a_loader_without_length_is_unknown_until_an_epoch_ended(runtime_dir, name):
    tqdm = pytest.importorskip("tqdm", reason="needs tqdm (pip install tqdm)").tqdm
    loader = DataLoader(Unsized(50), batch_size=8)
    with serve_in_thread(loader, name):
        consumer = bc.Consumer(name, batch_size=6)
        assert bool(consumer)  # truthiness never asks for the length
        with pytest.raises(TypeError):
            len(consumer)
        bar = tqdm(consumer, file=io.StringIO())
        assert bar.total is None
        assert sum(1 for _ in bar) == math.ceil(50 / 6)
        assert len(consumer) == math.ceil(50 / 6)  # known from the first epoch's end
        assert tqdm(consumer, file=io.StringIO()).total == math.ceil(50 / 6)
        consumer.close()


def test_version_and_py_typed():
    package = Path(bc.__file__).resolve().parent
    assert (package / "py.typed").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert bc.__version__ == re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.M).group(1)
    if package != (ROOT / "python" / "batchcast").resolve():  # an installed copy
        from importlib.metadata import version

        assert bc.__version__ == version("batchcast")


def test_tensorsocket_shim(runtime_dir):
    from batchcast.compat.tensorsocket import TensorConsumer, TensorProducer

    dataset = TensorDataset(torch.arange(90).float().unsqueeze(1), torch.arange(90))
    data_loader = DataLoader(dataset, batch_size=16)
    epochs = 2
    producer = TensorProducer(data_loader, 5556, 5557, rubber_band_pct=0.02)
    assert producer.name == "tensorsocket-5556" and len(producer) == 6

    def serve():  # TensorSocket's producer loop, unchanged
        for _ in range(epochs):
            for _ in producer:
                pass
        producer.join()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        consumer = TensorConsumer("5556", "5557", batch_size=20)
        assert len(consumer) == 5
        for _epoch in range(epochs):
            seen = []
            for batch_idx, (inputs, targets) in enumerate(consumer):
                assert inputs.shape[1:] == (1,) and len(targets) <= 20
                seen += targets.tolist()
            assert seen == list(range(90))
        with pytest.raises(bc.EpochsExhausted, match="asked for epoch 2"):
            list(consumer)  # the producer has ended (join()): it served its 2 epochs
        consumer.close()
    finally:
        thread.join(60)
    assert not thread.is_alive()
    assert os.listdir(runtime_dir) == []


def test_tensorsocket_shim_pack_and_unpack(runtime_dir):
    from batchcast.compat.tensorsocket import TensorConsumer, TensorProducer

    loader = DataLoader(TensorDataset(torch.arange(40)), batch_size=10)
    producer = TensorProducer(loader, 6000, pack_fn=lambda b: (b[0], b[0] * 2))
    thread = threading.Thread(target=lambda: ([None for _ in producer], producer.join()))
    thread.start()
    try:
        consumer = TensorConsumer(6000, batch_size=8, unpack_fn=lambda b: b[1] - b[0])
        assert torch.cat(list(consumer)).tolist() == list(range(40))
        consumer.close()
    finally:
        thread.join(60)
    assert os.listdir(runtime_dir) == []


def test_ddp_trial_beside_a_single_trial(runtime_dir, tmp_path):
    """examples/ddp_trial.py: a DDP trial of 2 ranks (gloo on CPU) and a
    single-process trial from one producer; the example checks what each saw."""
    out = run_script(tmp_path, [str(EXAMPLES / "ddp_trial.py"), "--samples", "203",
                                "--epochs", "2", "--size", "16"], timeout=300)
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 2, out
    for line in lines:
        assert "(same: True)" in line and "together every sample once (+1 padding)" in line, out
        assert "single trial: every sample once" in line, out
    assert os.listdir(runtime_dir) == []


@pytest.mark.ray
def test_sweep_ray_tune_on_a_local_multi_node_cluster(runtime_dir, tmp_path):
    """examples/sweep_ray_tune.py, small: 2 nodes, 4 trials of different batch
    sizes, each node's trials from its own producer, then a DataLoader each."""
    pytest.importorskip("ray.tune", reason="the Ray Tune sweep needs ray[tune]")
    out = run_script(tmp_path, [str(EXAMPLES / "sweep_ray_tune.py"), "--nodes", "2",
                                "--cpus-per-node", "2", "--trials", "4", "--epochs", "2",
                                "--samples", "256", "--size", "32"], timeout=900)
    rows = [line for line in out.splitlines() if re.match(r"\s+0\.\d+\s+\d+\s", line)]
    assert len(rows) == 8, out  # 4 trials, both ways
    assert all(" True " in row for row in rows), out
    shared_nodes = {row.split()[2] for row in rows[:4]}
    assert len(shared_nodes) == 2, out  # the trials ran on both nodes
    assert re.search(r"saved by sharing\s*: wall\s+-?[0-9.]+ s .* CPU\s+-?[0-9.]+ s", out), out
    assert os.listdir(runtime_dir) == []  # every node's producer ended and left nothing


def check_framework_output(out: str, samples: int) -> None:
    assert "one producer, 2 consumers joined (one per trial)" in out, out
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s*(32|48)\s", line)]
    assert len(rows) == 2 and all(row[-1] == "True" for row in rows), out
    assert f"epochs of {samples} samples" in out, out


def test_lightning_sweep(runtime_dir, tmp_path):
    pytest.importorskip("lightning", reason="needs lightning (pip install lightning, torch pinned)")
    out = run_script(tmp_path, [str(EXAMPLES / "lightning_sweep.py"), "--samples", "256", "--epochs", "2"])
    check_framework_output(out, 256)
    assert os.listdir(runtime_dir) == []


def test_accelerate_sweep(runtime_dir, tmp_path):
    pytest.importorskip("accelerate", reason="needs accelerate (pip install accelerate, torch pinned)")
    out = run_script(tmp_path, [str(EXAMPLES / "accelerate_sweep.py"), "--samples", "256", "--epochs", "2",
                                "--accumulate", "3"])
    check_framework_output(out, 256)
    assert os.listdir(runtime_dir) == []


def test_the_readme_quick_start_runs_as_pasted(runtime_dir, tmp_path):
    """The README's producer and two trainers, saved and run as it says."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A producer and two trainers", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    files = {}
    for lang, code in blocks:
        if lang == "python":
            filename = re.match(r"# (\S+\.py)", code).group(1)
            files[filename] = code
            (tmp_path / filename).write_text(code)
    (command,) = [code.strip() for lang, code in blocks if lang == "bash"]
    assert sorted(files) == ["serve.py", "train.py"], files
    # `python` is this interpreter, whatever else the PATH holds: a script
    # that runs it by its own path (through a symlink elsewhere, a virtual
    # environment's interpreter would not find its pyvenv.cfg, nor batchcast).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "python"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    # The trainers print at once; unbuffered (PYTHONUNBUFFERED), a line's
    # text and its newline are two writes that the other's may come between.
    said = sorted(re.findall(r"batch (\d+): epoch (\d+), (\d+) samples, loss \d+\.\d\d", proc.stdout))
    assert said == [("100", "0", "1000"), ("100", "1", "1000"), ("32", "0", "1000"), ("32", "1", "1000")], \
        f"stdout:\n{proc.stdout}\nstderr (`wait` does not pass a trainer's failure on):\n{proc.stderr}"
    assert os.listdir(runtime_dir) == []
