"""The GPU path with real processes: a producer with a ring on cuda:0 and
consumers on the same GPU (zero-copy views), on the CPU, and on another GPU.
Skipped, with the reason shown, where no GPU is visible.

Zero copy is asserted by address: every tensor a consumer counts as a view
must lie inside the ring it imported (stats()["ring_address"], ["ring_bytes"]),
and with the loader's batch size no torch allocation happens on the consumer's
GPU while it iterates (memory opened over CUDA IPC never shows in torch's
allocator, so an allocation there would be a copy). The processes are
tests/python/gpu_workers.py; tests wait for what they write, never for a time."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import batchcast as bc
from conftest import eventually

HERE = Path(__file__).parent
MiB = 1 << 20

pytestmark = pytest.mark.skipif(
    not bc.cuda_available(),
    reason="no CUDA GPU visible to batchcast (or built without the CUDA transport); "
           "run scripts/gpu-check.sh on a GPU machine",
)


class GpuProcs:
    """Starts gpu_workers.py processes, each writing stdout and stderr to files
    (never pipes); kills whatever still runs when the test ends."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.files: dict[int, tuple[Path, Path]] = {}

    def start(self, role: str, name: str, *flags, out: str | None = None) -> subprocess.Popen:
        cmd = [sys.executable, str(HERE / "gpu_workers.py"), role, name, *map(str, flags)]
        if out is not None:
            cmd += ["--out", str(self.tmp / out)]
        k = len(self.files)
        paths = (self.tmp / f"gpu-{role}{k}.stdout", self.tmp / f"gpu-{role}{k}.stderr")
        with open(paths[0], "w") as stdout, open(paths[1], "w") as stderr:
            p = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True)
        self.files[p.pid] = paths
        self.procs.append(p)
        return p

    def path(self, name: str) -> Path:
        return self.tmp / name

    def err(self, p: subprocess.Popen) -> str:
        return self.files[p.pid][1].read_text()[-4000:]

    def result(self, out: str) -> dict:
        return json.loads((self.tmp / out).read_text())

    def wait_all(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{p.args[2:]} still ran after {timeout} s:\n{self.err(p)}")
            if p.returncode != 0:
                raise AssertionError(f"{p.args[2:]} exited {p.returncode}:\n{self.err(p)}")

    def kill(self, p: subprocess.Popen) -> None:
        p.kill()
        p.wait()
        self.procs.remove(p)

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def gpu(tmp_path, runtime_dir):
    g = GpuProcs(tmp_path)
    yield g
    g.kill_all()


def gpu_free_bytes() -> int:
    return torch.cuda.mem_get_info(0)[0]


def assert_gpu_memory_back_to(before: int) -> None:
    # The driver frees a process's memory as it exits; wait for it, not for a time.
    eventually(lambda: before - gpu_free_bytes() < 64 * MiB,
               "GPU memory back to its baseline after every process exited", timeout=30)


def expected_sizes(n: int, b: int, drop_last: bool) -> list[int]:
    sizes = [b] * (n // b)
    if n % b and not drop_last:
        sizes.append(n % b)
    return sizes


def test_three_consumers_get_views_inside_the_imported_ring_exactly_once(gpu, name):
    n, loader_batch = 1003, 32
    consumers = {16: False, 32: False, 100: True}  # batch size: drop_last
    gpu.start("produce", name, "--samples", n, "--loader-batch", loader_batch, "--epochs", 2,
              "--min-consumers", 3, "--workers", 2)
    for b, drop in consumers.items():
        gpu.start("consume", name, "--batch-size", b, "--epochs", 2, "--check-values",
                  *(["--drop-last"] if drop else []), out=f"c{b}.json")
    gpu.wait_all()
    opens = set()
    for b, drop in consumers.items():
        r = gpu.result(f"c{b}.json")
        assert r["error"] is None, r["error"]
        want = list(range(n // b * b)) if drop else list(range(n))
        assert r["epochs"] == [want, want], f"B={b}"
        assert r["sizes"] == [expected_sizes(n, b, drop)] * 2, f"B={b}"
        s = r["stats"]
        assert s["device"] == "cuda:0" and s["transfer"] == "view", s
        # Mapped once at join: one ring allocation, its events, whatever the batch count.
        assert s["ipc_memory_opens"] == 1, s
        assert 0 < s["ipc_event_opens"] < s["loader_batches"], s
        opens.add(s["ipc_event_opens"])
        # One ring, at one address, for every batch.
        assert len(r["rings"]) == 1 and r["rings"][0][0] != 0 and r["rings"][0][1] > 0, r["rings"]
        # Zero copy by address: each tensor counted as a view lies inside the
        # imported ring; the others (copies across a ring wrap) do not.
        assert s["views"] > 0 and r["tensors_in_ring"] == s["views"], (r["tensors_in_ring"], s, r["outside_ring"])
        if s["copies"] == 0 and s["spills"] == 0:
            assert all(r["batches_all_in_ring"]), r["outside_ring"]
            assert max(r["allocated_during"]) == 0 and r["max_memory_allocated"] == 0, r["allocated_during"]
        assert r["memory_allocated"] == 0, r
    assert len(opens) == 1
    # The loader's batch size: every tensor of every batch (images and labels,
    # both epochs) is a view inside the ring, and torch allocated nothing.
    r = gpu.result("c32.json")
    assert r["stats"]["copies"] == 0 and r["stats"]["spills"] == 0, r["stats"]
    assert r["tensors"] == r["tensors_in_ring"] == 2 * 2 * math.ceil(n / loader_batch), r["outside_ring"]
    assert all(r["batches_all_in_ring"])
    assert set(r["allocated_during"]) == {0} and r["max_memory_allocated"] == 0, r["allocated_during"]


def test_by_default_gpu_batches_are_private_copies_on_the_gpu(gpu, name):
    # CUDA IPC maps the ring writable in every consumer: by default each batch
    # is copied (device to device, on the current stream) into torch's memory,
    # so an in-place op cannot reach another trainer.
    n = 640
    gpu.start("produce", name, "--samples", n, "--loader-batch", 32, "--epochs", 1)
    gpu.start("consume", name, "--batch-size", 48, "--epochs", 1, "--check-values", "--views", "copy",
              out="c.json")
    gpu.wait_all()
    r = gpu.result("c.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(n))]
    s = r["stats"]
    assert s["device"] == "cuda:0" and s["transfer"] == "view" and s["ipc_memory_opens"] == 1, s
    # Nothing handed out lies in the ring: views were copied (counted), the
    # rest were joins across a wrap of the ring (copies anyway).
    assert r["tensors_in_ring"] == 0 and 0 < s["batch_copies"] <= math.ceil(n / 48), (s, r["outside_ring"])
    assert max(r["allocated_during"]) > 0  # the copies are torch's memory


def test_pinned_loader_batches_are_copied_straight_into_the_ring_and_stay_intact(gpu, name):
    # pin_memory=True: the producer copies the loader's pinned tensors straight
    # into the ring (no staging) and keeps each alive until its copy is done.
    # The loader recycles freed pinned blocks for later batches, and a 4-slot
    # ring wraps often, so a source let go too early shows as wrong values.
    n = 1200
    producer = gpu.start("produce", name, "--samples", n, "--loader-batch", 16, "--workers", 2,
                         "--pin-memory", "--slots", 4)
    gpu.start("consume", name, "--batch-size", 16, "--check-values", out="c.json")
    gpu.wait_all()
    r = gpu.result("c.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(n))]
    s = r["stats"]
    assert s["transfer"] == "view" and s["private_copies"] == 0, s
    assert r["tensors"] == r["tensors_in_ring"] == 2 * math.ceil(n / 16), r["outside_ring"]
    # ...and really without staging: every tensor (images and labels) went straight in.
    produced = json.loads(gpu.files[producer.pid][0].read_text().strip().splitlines()[-1])
    assert produced["direct_copies"] == 2 * math.ceil(n / 16), produced


def test_a_cpu_consumer_of_a_gpu_producer_gets_host_tensors(gpu, name, monkeypatch):
    # batchcast allocates its ring itself: torch's allocator settings do not matter.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    gpu.start("produce", name, "--samples", 300, "--loader-batch", 16)
    gpu.start("consume", name, "--device", "cpu", "--batch-size", 40, "--check-values", out="c.json")
    gpu.wait_all()
    r = gpu.result("c.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(300))]
    s = r["stats"]
    assert s["device"] == "cpu" and s["transfer"] == "device-to-host", s
    assert s["transfers"] == math.ceil(300 / 16)
    assert r["tensors_in_ring"] == 0  # host tensors: copies, not the GPU ring


def test_batches_held_for_an_epoch_are_never_overwritten(gpu, name):
    # 13 loader batches per epoch, a ring of 24 slots. The keeper holds all of
    # epoch 0 until the producer has been asked for epoch 1's batch 10 (so it
    # has published ten of them into the 11 free slots), then checks every
    # batch it held; the other consumer reads epoch 1 meanwhile.
    mark = gpu.path("epoch1-batch10")
    gpu.start("produce", name, "--samples", 200, "--loader-batch", 16, "--epochs", 2, "--slots", 24,
              "--min-consumers", 2, "--mark-at", "1:10", "--mark", mark)
    gpu.start("consume", name, "--batch-size", 10, "--epochs", 2, "--keep", "--wait-for", mark,
              "--check-values", out="keeper.json")
    gpu.start("consume", name, "--batch-size", 16, "--epochs", 2, "--check-values", out="other.json")
    gpu.wait_all()
    for out in ("keeper.json", "other.json"):
        r = gpu.result(out)
        assert r["error"] is None, (out, r["error"])
        assert r["epochs"] == [list(range(200))] * 2, out
    assert gpu.result("keeper.json")["waited_for"] is True, "the producer never reached epoch 1's batch 10"


def test_gpu_memory_returns_to_baseline_whoever_exits_first(gpu, name):
    ring = 256 * MiB  # large enough that a leaked ring shows in free memory
    before = gpu_free_bytes()
    # The consumer keeps every batch until the producer's loader is exhausted
    # (a file the producer writes), so the producer finishes while the consumer
    # still holds its batches: its close() waits for them.
    exhausted = gpu.path("exhausted")
    gpu.start("produce", name, "--samples", 120, "--loader-batch", 8, "--ring-bytes", ring, "--slots", 16,
              "--exhausted", exhausted)
    gpu.start("consume", name, "--batch-size", 8, "--keep", "--wait-for", exhausted, "--check-values",
              out="c.json")
    gpu.wait_all()
    r = gpu.result("c.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(120))]
    assert r["waited_for"] is True, "the producer's loader never ended"
    assert_gpu_memory_back_to(before)


def test_a_consumer_killed_while_holding_gpu_batches_does_not_hold_the_others(gpu, name):
    before = gpu_free_bytes()
    slots = 8
    producer = gpu.start("produce", name, "--samples", 2000, "--loader-batch", 10, "--min-consumers", 2,
                         "--ring-bytes", 128 * MiB, "--slots", slots)
    held = gpu.path("victim.held")
    # The victim keeps every batch it takes (the first as views of the ring,
    # then private copies once it pins its share) and says so once it holds
    # six; then it is killed, mid-epoch, still referencing ring slots.
    victim = gpu.start("consume", name, "--batch-size", 10, "--keep", "--held-after", slots - 2,
                       "--held", held, out="victim.json")
    survivor = gpu.start("consume", name, "--batch-size", 30, "--check-values", out="survivor.json")
    eventually(held.exists, "the victim holds most of the ring", timeout=90,
               watch=(victim, producer, survivor), err=gpu.err)
    gpu.kill(victim)  # mid-epoch, holding every batch it took
    gpu.wait_all()
    r = gpu.result("survivor.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(2000))]
    assert_gpu_memory_back_to(before)


@pytest.mark.parametrize("keepers", [1, 2])
def test_consumers_keeping_every_gpu_batch_never_stall_the_others(gpu, name, keepers):
    """As on the host: trainers that keep every batch of three epochs (120
    loader batches through a 4-slot GPU ring) keep valid batches, take private
    GPU copies once they pin their share, warn once, and their neighbour never
    waits more than a second."""
    every = list(range(400))
    gpu.start("produce", name, "--samples", 400, "--loader-batch", 10, "--epochs", 3, "--slots", 4,
              "--min-consumers", keepers + 1)
    kept = [gpu.start("consume", name, "--batch-size", 10, "--epochs", 3, "--keep-all",
                      "--check-values", out=f"k{i}.json") for i in range(keepers)]
    gpu.start("consume", name, "--batch-size", 16, "--epochs", 3, "--check-values", out="n.json")
    gpu.wait_all()
    for i, k in enumerate(kept):
        r = gpu.result(f"k{i}.json")
        assert r["error"] is None, r["error"]
        assert r["epochs"] == [every] * 3 and r["kept_all"] == 120
        assert r["stats"]["private_copies"] > 100, r["stats"]
        assert gpu.err(k).count("KeptBatchesWarning") == 1, gpu.err(k)
    r = gpu.result("n.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [every] * 3
    assert r["max_wait"] < 1.0, f"the neighbour waited {r['max_wait']:.2f} s for a batch"
    assert r["stats"]["private_copies"] == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for a consumer on another GPU")
def test_a_consumer_on_another_gpu_gets_one_copy_per_loader_batch(gpu, name):
    gpu.start("produce", name, "--samples", 300, "--loader-batch", 16)
    gpu.start("consume", name, "--device", "cuda:1", "--batch-size", 24, "--check-values", out="c.json")
    gpu.wait_all()
    r = gpu.result("c.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(300))]
    s = r["stats"]
    assert s["device"] == "cuda:1" and s["transfer"] in ("peer", "host-staged"), s
    assert s["transfers"] == math.ceil(300 / 16)
    assert r["tensors_in_ring"] == 0  # copies on cuda:1, not views of cuda:0's ring
