"""The GPU path with real processes: a producer with a ring on cuda:0 and
consumers on the same GPU (zero-copy views), on the CPU, and on another GPU.
Skipped, with the reason shown, where no GPU is visible."""

from __future__ import annotations

import math
import time

import pytest
import torch

import batchcast as bc
from conftest import expected_sizes

pytestmark = pytest.mark.skipif(
    not bc.cuda_available(),
    reason="no CUDA GPU visible to batchcast (or built without the CUDA transport); "
           "run scripts/gpu-check.sh on a GPU machine",
)

N, L = 1003, 32


def gpu_free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info(0)[0]


def test_three_consumers_on_the_producers_gpu_get_views_exactly_once(procs, name, runtime_dir):
    consumers = {16: False, 32: False, 100: True}
    procs.start("produce", name, "--device", "cuda:0", "--samples", str(N), "--loader-batch", str(L),
                "--epochs", "2", "--min-consumers", "3", "--workers", "2")
    for b, drop in consumers.items():
        procs.start("consume", name, "--batch-size", str(b), "--epochs", "2", "--check-values",
                    *(["--drop-last"] if drop else []), out=f"c{b}.json")
    procs.wait_all()
    opens = set()
    for b, drop in consumers.items():
        r = procs.result(f"c{b}.json")
        assert r["error"] is None, r["error"]
        want = list(range(N // b * b)) if drop else list(range(N))
        assert r["epochs"] == [want, want], f"B={b}"
        assert r["sizes"] == [expected_sizes(N, b, drop)] * 2, f"B={b}"
        s = r["stats"]
        assert s["device"] == "cuda:0" and s["transfer"] == "view", s
        # Mapped once at join: one ring allocation, its events, whatever the batch count.
        assert s["ipc_memory_opens"] == 1, s
        assert 0 < s["ipc_event_opens"] < s["loader_batches"], s
        opens.add(s["ipc_event_opens"])
        assert s["views"] > 0
        # Nothing of this process's own stays allocated on the GPU; and where
        # every tensor was a view, its caching allocator never held batch data.
        assert r["cuda_memory_allocated"] == 0, r
        if s["copies"] == 0 and s["spills"] == 0:
            assert r["cuda_max_memory_allocated"] == 0, r
    assert len(opens) == 1
    # Equal batch sizes: every tensor a view of the GPU ring, no copy at all.
    assert procs.result("c32.json")["stats"]["copies"] == 0


def test_a_cpu_consumer_of_a_gpu_producer_gets_host_tensors(procs, name, monkeypatch):
    # batchcast allocates its ring itself: torch's allocator settings do not matter.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    procs.start("produce", name, "--device", "cuda:0", "--samples", "300", "--loader-batch", "16",
                "--epochs", "1")
    procs.start("consume", name, "--device", "cpu", "--batch-size", "40", "--check-values",
                out="c.json")
    procs.wait_all()
    r = procs.result("c.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(300))]
    s = r["stats"]
    assert s["device"] == "cpu" and s["transfer"] == "device-to-host", s
    assert s["transfers"] == math.ceil(300 / 16)


def test_batches_held_for_an_epoch_are_never_overwritten(procs, name):
    # 13 loader batches per epoch, ring for 24: while the keeper holds all of
    # epoch 0 and sleeps, the producer writes epoch 1 into the rest of the ring.
    procs.start("produce", name, "--device", "cuda:0", "--samples", "200", "--loader-batch", "16",
                "--epochs", "2", "--slots", "24", "--min-consumers", "2")
    procs.start("consume", name, "--batch-size", "10", "--epochs", "2", "--keep",
                "--check-kept", "1.5", out="keeper.json")
    procs.start("consume", name, "--batch-size", "16", "--epochs", "2", "--check-values",
                out="other.json")
    procs.wait_all()
    for out in ("keeper.json", "other.json"):
        r = procs.result(out)
        assert r["error"] is None, (out, r["error"])
        assert r["epochs"] == [list(range(200))] * 2, out


def test_gpu_memory_returns_to_baseline_whoever_exits_first(procs, name):
    ring = 256 << 20  # large enough that a leaked ring shows in free memory
    before = gpu_free_bytes()
    # The producer finishes while the consumer still holds its last batches:
    # its close() waits for them, so the consumer's checks still see its data.
    procs.start("produce", name, "--device", "cuda:0", "--samples", "120", "--loader-batch", "8",
                "--epochs", "1", "--ring-bytes", str(ring), "--slots", "16")
    procs.start("consume", name, "--batch-size", "8", "--keep", "--check-kept", "2.0",
                "--check-values", out="c.json")
    procs.wait_all()
    r = procs.result("c.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(120))]
    assert before - gpu_free_bytes() < 64 << 20, "GPU memory still allocated after every process exited"


def test_a_consumer_killed_while_holding_gpu_batches_does_not_hold_the_others(procs, name):
    before = gpu_free_bytes()
    procs.start("produce", name, "--device", "cuda:0", "--samples", "2000", "--loader-batch", "10",
                "--epochs", "1", "--min-consumers", "2", "--ring-bytes", str(128 << 20))
    ready = procs.tmp / "victim.ready"
    victim = procs.start("consume", name, "--batch-size", "10", "--keep", "--sleep", "0.01",
                         "--ready", str(ready), out="victim.json")
    procs.start("consume", name, "--batch-size", "30", "--check-values", out="survivor.json")
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), "the victim never joined"
    # It keeps every batch: within a second it holds as many as the producer
    # has slot events, and everyone waits for it.
    time.sleep(1.5)
    victim.kill()  # mid-epoch, holding every batch it took
    victim.wait()
    procs.procs.remove(victim)
    procs.wait_all()
    r = procs.result("survivor.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(2000))]
    assert before - gpu_free_bytes() < 64 << 20, "GPU memory still allocated after every process exited"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for a consumer on another GPU")
def test_a_consumer_on_another_gpu_gets_one_copy_per_loader_batch(procs, name):
    procs.start("produce", name, "--device", "cuda:0", "--samples", "300", "--loader-batch", "16")
    procs.start("consume", name, "--device", "cuda:1", "--batch-size", "24", "--check-values",
                out="c.json")
    procs.wait_all()
    r = procs.result("c.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(300))]
    s = r["stats"]
    assert s["device"] == "cuda:1" and s["transfer"] in ("peer", "host-staged"), s
    assert s["transfers"] == math.ceil(300 / 16)
