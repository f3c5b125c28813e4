"""Every way a user starts a producer gets every capability that applies to it.

The doors: ``bc.Producer(...).run()`` in a process, ``.start()`` and ``with``
in the caller's process, ``batchcast serve``, the TensorSocket shim (with and
without ``pack_fn``) and a notebook kernel (the Ray actor is in test_ray.py,
the C++ consumer in test_examples.py). Each serves the same shuffled
DataLoader with two workers, and one scenario of real consumer processes
checks through that door, with the samples a user would look at:

- exactly once, in order, values intact, for batch sizes 5, 6 (a group of
  two ranks) and 7, with ``len()`` known from the start;
- a consumer joining mid-epoch starts at once (``joined_at > 0``);
- the loader's workers write batches into the ring (``batches_in_place``),
  as ``batchcast status --json`` shows it, with every consumer present;
- a consumer's ``state_dict()`` names the loader (the identity a restore is
  checked against) and a restore continues exactly where it stopped.

Where a capability cannot apply (``pack_fn`` makes each batch anew: no
in-place writes) the producer says so once, as a WARNING naming it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import HERE, eventually

N, LOADER_BATCH, SEED, EPOCHS = 240, 8, 5, 3


def loader_source() -> str:
    """The loader every door serves: shuffled with a fixed seed, two workers,
    batches the workers can write in place (the default collate)."""
    return textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import torch
        from torch.utils.data import DataLoader
        from workers import IdDataset


        def ids(n="{N}"):
            return DataLoader(IdDataset(int(n)), batch_size={LOADER_BATCH}, shuffle=True,
                              generator=torch.Generator().manual_seed({SEED}), num_workers=2)


        def repack(batch):
            # TensorSocket's pack_fn: a new batch made of each (same values).
            images, labels = batch
            return [images.clone(), labels.clone()]
    """)


def status_json(name: str) -> dict[str, Any]:
    """What `batchcast status NAME --json` says of the producer (the door a
    user watches it through)."""
    out = subprocess.run([sys.executable, "-m", "batchcast", "status", name, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (listing,) = json.loads(out.stdout)
    return listing.get("status") or {}


def consumers_present(name: str, count: int) -> bool:
    from batchcast.status import list_producers

    listings = list_producers(name)
    status = listings[0]["status"] if listings and listings[0].get("alive") else None
    return bool(status) and len(status.get("consumers", [])) >= count


def stalled(name: str) -> bool:
    from batchcast.status import list_producers

    listings = list_producers(name)
    status = listings[0]["status"] if listings and listings[0].get("alive") else None
    return bool(status) and status.get("waiting_for") == "consumers"


def check_every_capability(procs, name: str, in_place: bool,
                           watch: Callable[[], list] = list) -> dict[str, Any]:
    """The scenario, through a producer of `name` already started by a door.
    Returns the status it saw mid-run."""
    tmp = procs.tmp
    state = tmp / "state.json"
    # W takes the whole stream, and holds still at its 6th batch: the
    # producer stalls mid-epoch (its ring full), and everyone else joins there.
    whole = procs.start("consume", name, "--batch-size", 5, "--epochs", EPOCHS, "--check-values",
                        "--ready", tmp / "w", "--ready-after", 6, "--hold-at", 6,
                        "--until", tmp / "go0", "--late-join", "now", out="whole.json")
    eventually((tmp / "w").exists, "the whole-stream consumer to hold", 120,
               watch=[whole, *watch()], err=procs.err)
    eventually(lambda: stalled(name), "the producer to stall mid-epoch", 60)
    # J joins now and stops after 70 samples, saving its state; K joins with
    # it and holds at 77 (so the producer keeps J's position for the
    # restore); a group of two ranks joins now too.
    first = procs.start("consume", name, "--batch-size", 7, "--epochs", 1, "--late-join", "now",
                        "--check-values", "--save-after", 70, "--save-state", state,
                        out="first.json")
    keeper = procs.start("consume", name, "--batch-size", 7, "--epochs", 1, "--late-join", "now",
                         "--check-values", "--hold-at", 11, "--until", tmp / "go1", out="keeper.json")
    ranks = [procs.start("consume", name, "--group", "g", "--rank", r, "--world", 2,
                         "--batch-size", 6, "--epochs", 1, "--late-join", "now", "--check-values",
                         out=f"rank{r}.json") for r in range(2)]
    joined = [first, keeper, *ranks]
    eventually(lambda: consumers_present(name, 5), "four consumers to join mid-epoch", 120,
               watch=[*joined, *watch()], err=procs.err)
    seen = status_json(name)
    (tmp / "go0").touch()
    first.wait(120)
    procs.procs.remove(first)
    assert first.returncode == 0, procs.err(first)
    again = procs.start("consume", name, "--batch-size", 7, "--epochs", 1, "--late-join", "now",
                        "--state", state, "--record-warnings", "--check-values",
                        "--ready", tmp / "again", out="again.json")
    eventually((tmp / "again").exists, "the restored consumer to join", 120,
               watch=[again, *watch()], err=procs.err)
    (tmp / "go1").touch()
    for p in [whole, keeper, *ranks, again]:
        p.wait(180)
        assert p.returncode == 0, procs.err(p)

    # Exactly once, at every batch size, len() known from the start.
    res = procs.result("whole.json")
    assert res["error"] is None, res["error"]
    assert len(res["epochs"]) == EPOCHS and all(sorted(e) == list(range(N)) for e in res["epochs"])
    assert res["len"] == math.ceil(N / 5) and all(s[:-1] == [5] * (len(s) - 1) for s in res["sizes"])
    stream = [i for e in res["epochs"] for i in e]
    # Joining mid-epoch, at once: epochs of their own, in the producer's order.
    kept = procs.result("keeper.json")
    assert kept["error"] is None, kept["error"]
    at = kept["stats"]["joined_at"]
    assert 0 < at < N, f"the consumer that joined mid-epoch started at position {at}"
    start = (kept["stats"]["epoch"]) * N + at
    assert kept["epochs"][0] == stream[start:start + N] and kept["len"] == math.ceil(N / 7)
    # The group: its two ranks take the epoch of its own between them.
    group = [procs.result(f"rank{r}.json") for r in range(2)]
    for g in group:
        assert g["error"] is None, g["error"]
        assert g["stats"]["joined_at"] > 0 and g["len"] == N // 12
    assert sorted(group[0]["epochs"][0] + group[1]["epochs"][0]) == list(range(N))
    # Resume: the saved state names the loader; the restore is exact.
    saved = json.loads(state.read_text())
    for part in ("DataLoader", "dataset=IdDataset", f"samples={N}", f"seed={SEED}"):
        assert part in saved["loader"], saved["loader"]
    before, after = procs.result("first.json"), procs.result("again.json")
    assert after["error"] is None and after["warnings"] == [], after
    assert after["stats"]["resumed"] == "exact", after["stats"]
    assert sorted(before["epochs"][0] + after["epochs"][0]) == list(range(N))
    # Status showed every consumer, and the workers writing in place.
    assert len(seen["consumers"]) == 5, seen
    assert seen["batches_per_epoch"] == N // LOADER_BATCH, seen
    if in_place:
        assert seen["batches_in_place"] > 0, seen
    else:
        assert seen["batches_in_place"] == 0, seen
    return seen


@pytest.fixture
def loaders(tmp_path) -> Path:
    path = tmp_path / "doorloaders.py"
    path.write_text(loader_source())
    return path


def load(loaders: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("doorloaders", loaders)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["doorloaders"] = module
    spec.loader.exec_module(module)
    return module


def test_producer_run_in_a_process(procs, name, loaders):
    producer = procs.start("produce", name, "--samples", N, "--loader-batch", LOADER_BATCH,
                           "--epochs", EPOCHS, "--shuffle", "--seed", SEED, "--workers", 2,
                           "--slots", 4)
    check_every_capability(procs, name, in_place=True, watch=lambda: [producer])
    producer.wait(60)
    assert producer.returncode == 0, procs.err(producer)


def test_producer_start_in_this_process(procs, name, loaders):
    import batchcast as bc

    producer = bc.Producer(load(loaders).ids(), name, epochs=EPOCHS, slots=4).start()
    try:
        check_every_capability(procs, name, in_place=True)
        assert producer.join(60)
    finally:
        producer.stop()


def test_producer_with_block(procs, name, loaders):
    import batchcast as bc

    with bc.Producer(load(loaders).ids(), name, epochs=EPOCHS, slots=4) as producer:
        check_every_capability(procs, name, in_place=True)
        assert producer.join(60)


def test_batchcast_serve(procs, name, loaders):
    serve = subprocess.Popen(
        [sys.executable, "-m", "batchcast", "serve", f"{loaders}:ids", "--name", name,
         "--epochs", str(EPOCHS), "--slots", "4", "--refresh", "0"],
        cwd=procs.tmp, stdout=subprocess.DEVNULL, stderr=open(procs.tmp / "serve.err", "w"))
    try:
        check_every_capability(procs, name, in_place=True, watch=lambda: [serve])
        assert serve.wait(60) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    err = (procs.tmp / "serve.err").read_text()
    assert f"serving '{name}'" in err and "30 batches per epoch" in err, err
    assert "no joining" not in err and "no in-place" not in err, err


TENSORSOCKET = textwrap.dedent("""
    import sys
    import batchcast as bc
    from batchcast.compat.tensorsocket import TensorProducer
    sys.path.insert(0, sys.argv[1])
    import doorloaders

    pack = doorloaders.repack if sys.argv[3] == "pack" else None
    producer = TensorProducer(doorloaders.ids(), int(sys.argv[2]), pack_fn=pack, slots=4)
    for _ in range({epochs}):
        for _ in producer:
            pass
    producer.join()
""").format(epochs=EPOCHS)


@pytest.mark.parametrize("pack", ["plain", "pack"])
def test_tensorsocket_shim(procs, loaders, pack):
    from batchcast.compat.tensorsocket import name_for_port

    port = 5556 if pack == "plain" else 5557
    script = procs.tmp / "ts_produce.py"
    script.write_text(TENSORSOCKET)
    err = procs.tmp / "ts.err"
    producer = subprocess.Popen([sys.executable, str(script), str(loaders.parent), str(port), pack],
                                stdout=subprocess.DEVNULL, stderr=open(err, "w"))
    try:
        check_every_capability(procs, name_for_port(port), in_place=pack == "plain",
                               watch=lambda: [producer])
        assert producer.wait(60) == 0, err.read_text()
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()
    said = [line for line in err.read_text().splitlines() if "no in-place writes" in line]
    if pack == "pack":  # the one capability pack_fn takes away, said once
        assert len(said) == 1 and "pack_fn" in said[0], err.read_text()
    else:
        assert said == [], err.read_text()


def test_notebook_kernel(procs, name, loaders):
    jupyter_client = pytest.importorskip("jupyter_client", reason="the notebook door needs "
                                         "jupyter_client and ipykernel")
    import importlib.util

    # Not imported here: a process that has imported ipykernel counts as a
    # notebook (a producer made again there replaces the first).
    if importlib.util.find_spec("ipykernel") is None:
        pytest.skip("the notebook door needs ipykernel")
    manager, kernel = jupyter_client.manager.start_new_kernel(kernel_name="python3",
                                                              cwd=str(procs.tmp))

    def run(code: str) -> str:
        out: list[str] = []

        def output(msg: dict) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        reply = kernel.execute_interactive(code, timeout=120, output_hook=output)
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)

    try:
        run(f"import sys; sys.path.insert(0, {str(loaders.parent)!r})\n"
            "import batchcast as bc, doorloaders\n"
            f"producer = bc.Producer(doorloaders.ids(), {name!r}, epochs={EPOCHS}, slots=4).start()")
        check_every_capability(procs, name, in_place=True)
        assert "True" in run("print(producer.join(60))")
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_loader_the_producer_cannot_see_into_is_one_warning_naming_what_is_lost(
        runtime_dir, name, caplog):
    """A user's wrapper of a DataLoader hides its order and workers: the
    producer says once, as a WARNING, which capabilities that costs and
    what to pass instead. A list of batches has no order to keep: INFO."""
    import logging

    import torch
    from torch.utils.data import DataLoader

    import batchcast as bc
    from workers import IdDataset

    class Wrapped:  # delegates to its DataLoader, as users' wrappers do
        def __init__(self, loader):
            self.loader = loader

        def __iter__(self):
            return iter(self.loader)

        def __len__(self):
            return len(self.loader)

    caplog.set_level(logging.DEBUG, logger="batchcast")
    bc.Producer(Wrapped(DataLoader(IdDataset(16), batch_size=4, num_workers=2)), name).close()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, caplog.text
    message = warned[0].getMessage()
    assert "no joining mid-epoch" in message and "Wrapped, not a DataLoader" in message
    assert "pass the DataLoader itself" in message
    caplog.clear()
    bc.Producer([torch.zeros(4, 2)] * 3, name).close()
    assert [r.levelno for r in caplog.records if "no joining" in r.getMessage()] == [logging.INFO]
