"""The GPU ring's rules, where breaking them shows: on the simulated device
(every run, several seeds, random delays) and on a real GPU (when one is
visible). Processes are gpu_rules_workers.py.

What would be wrong, and what catches it:
  - a consumer reads a slot before the producer's copy into it is done (no
    wait on the slot's event, the event recorded before the copy, the wrong
    event): the producer's ring stream is made to fall behind before every
    batch's copies (BATCHCAST_TEST_RING_DELAY_US), so such a read sees another
    batch's bytes;
  - the producer reuses a staging buffer, or lets go of a pinned loader tensor
    whose block is then handed out again, before the copy from it is done: the
    ring receives the next batch's bytes;
  - a slot goes back to the producer before the consumer's stream is past its
    last use: consumers check values on their stream, after making it fall
    behind, and drop each batch at once; a ring of 2 slots is rewritten under
    the queued check.
Values depend on the sample and the epoch, so any of these is a mismatch.
"""

from __future__ import annotations

import json
import os
import time

import pytest

import batchcast as bc
from conftest import eventually

SCRIPT = "gpu_rules_workers.py"
SEEDS = [int(s) for s in os.environ.get("BATCHCAST_SIMULATED_SEEDS", "1,2").split(",")]
GPU = bc.cuda_available()


@pytest.fixture(params=[f"simulated-{s}" for s in SEEDS] + ["hardware"])
def device(request):
    """Where the ring lives: the simulated device with a seed, or a real GPU
    ("hardware": pytest -k hardware selects those runs, -k simulated the others)."""
    if request.param == "hardware":
        if not GPU:
            pytest.skip("no CUDA GPU visible to batchcast (the simulated device runs these rules here)")
        return Device(None, sample_bytes=16 << 20, loader_batch=4, samples=32, lag_us=20000)
    seed = int(request.param.split("-")[1])
    return Device(seed, sample_bytes=64 << 10, loader_batch=8, samples=64, lag_us=5000)


class Device:
    """Sizes and environment for one backend. On a GPU, loader batches of
    64 MiB; simulated, 512 KiB (copies take random time anyway). `lag_us`: how
    far a stream is made to fall behind, per batch, where a test wants it to."""

    def __init__(self, seed, sample_bytes, loader_batch, samples, lag_us):
        self.seed = seed
        self.sample_bytes, self.loader_batch, self.samples = sample_bytes, loader_batch, samples
        self.lag_us = lag_us
        simulated = f"seed={seed},max_delay_us=2000" if seed is not None else ""
        self.env = {"BATCHCAST_SIMULATED_CUDA": simulated, "BATCHCAST_TEST_RING_DELAY_US": "0"}

    def flags(self):
        return ["--sample-bytes", self.sample_bytes, "--loader-batch", self.loader_batch,
                "--samples", self.samples]


def start(procs, device, role, name, *flags, out=None, ring_lags=False):
    """A worker; with ring_lags, the producer's ring stream falls behind the
    host by device.lag_us before every batch's copies."""
    env = dict(device.env)
    if ring_lags:
        env["BATCHCAST_TEST_RING_DELAY_US"] = str(device.lag_us)
    return procs.start(role, name, *device.flags(), *flags, out=out, script=SCRIPT, env=env)


def producer_stats(procs, p) -> dict:
    lines = [line for line in procs.out(p).splitlines() if line.startswith("{")]
    assert lines, f"producer printed no stats:\n{procs.err(p)}"
    return json.loads(lines[-1])


def assert_clean(result: dict, device, epochs: list[int], batches_per_epoch: int) -> None:
    assert result["error"] is None, result["error"]
    assert result["mismatches"] == 0, f"{result['mismatches']} of {result['checks']} batches held other bytes"
    assert [e["epoch"] for e in result["epochs"]] == epochs, result["epochs"]
    assert all(e["samples"] == device.samples for e in result["epochs"]), result["epochs"]
    assert all(e["batches"] == batches_per_epoch for e in result["epochs"]), result["epochs"]
    assert result["checks"] == batches_per_epoch * len(epochs)


@pytest.mark.every_torch
@pytest.mark.parametrize("memory", ["pageable", "pinned"])
@pytest.mark.parametrize("check", ["host", "stream"])
def test_every_value_is_read_after_its_copy(procs, name, device, memory, check):
    """The producer's ring stream falls behind before every batch's copies:
    two consumers of a 2-slot ring, one with the loader's batch size checking
    on the host or on its current stream (zero-copy views), one rebatching to
    another size (checking its private copies on the host), must never see a
    batch before its copy is done."""
    p = start(procs, device, "produce", name, "--memory", memory, "--slots", 2, "--epochs", 2,
              "--min-consumers", 2, ring_lags=True)
    start(procs, device, "consume", name, "--check", check, "--epochs", 2, "--views", "shared",
          out="a.json")
    start(procs, device, "consume", name, "--check", "host", "--batch-size", device.loader_batch + 4,
          "--epochs", 2, out="b.json")  # private copies (the default)
    procs.wait_all(timeout=180)
    per_epoch = device.samples // device.loader_batch
    assert_clean(procs.result("a.json"), device, [0, 1], per_epoch)
    rb = procs.result("b.json")
    assert rb["error"] is None and rb["mismatches"] == 0, rb
    assert [e["samples"] for e in rb["epochs"]] == [device.samples] * 2
    stats = producer_stats(procs, p)
    # Pinned loader batches went straight from their memory into the ring.
    if memory == "pinned":
        assert stats["direct_copies"] == 2 * per_epoch, stats  # the images (labels are not pinned)
    else:
        assert stats["direct_copies"] == 0, stats
    assert procs.result("a.json")["stats"]["transfer"] == "view"


@pytest.mark.parametrize("persistent", [False, True], ids=["workers-per-epoch", "persistent-workers"])
def test_loader_workers_write_into_the_pinned_mirror_and_every_value_arrives(procs, name, device, persistent):
    """A DataLoader's two workers write each batch into the GPU ring's pinned
    host mirror, and the producer copies it from there to the GPU, while the
    ring stream falls behind before every batch's copies (so slots, and their
    mirror, are leased again while earlier copies are still queued). Two
    consumers, one checking on its stream and one rebatching on the host, see
    every value of three epochs; after the batches the loader asked for before
    the ring existed, the producer copies nothing on the host."""
    flags = ["--persistent-workers"] if persistent else []
    p = start(procs, device, "produce", name, "--memory", "workers", *flags, "--slots", 2, "--epochs", 3,
              "--min-consumers", 2, ring_lags=True)
    start(procs, device, "consume", name, "--check", "stream", "--epochs", 3, out="a.json")
    start(procs, device, "consume", name, "--check", "host", "--batch-size", device.loader_batch + 4,
          "--epochs", 3, out="b.json")
    procs.wait_all(timeout=180)
    per_epoch = device.samples // device.loader_batch
    assert_clean(procs.result("a.json"), device, [0, 1, 2], per_epoch)
    rb = procs.result("b.json")
    assert rb["error"] is None and rb["mismatches"] == 0, rb
    assert [e["samples"] for e in rb["epochs"]] == [device.samples] * 3
    stats = producer_stats(procs, p)
    total = 3 * per_epoch
    in_flight = 2 * 2 + 1  # workers * prefetch_factor + 1: asked for before the ring existed
    batch_bytes = device.loader_batch * (device.sample_bytes + 8)
    assert stats["batches_published"] == total, stats
    assert stats["batches_in_place"] >= total - in_flight, stats
    assert stats["bytes_copied"] <= in_flight * batch_bytes, stats
    # Images and labels of every batch in place went straight from the mirror.
    assert stats["direct_copies"] >= 2 * stats["batches_in_place"], stats
    assert stats["leases_out"] == 0, stats


@pytest.mark.parametrize("views", ["copy", "shared"])
def test_one_consumers_in_place_write_leaves_anothers_values_intact(procs, name, device, tmp_path, views):
    """A trainer negates its batches in place (a Mixup, an in-place
    normalization) while another trainer's batches wait in the ring; the other
    takes them afterwards. By default each GPU batch is a private copy, so
    the other sees the loader's values; with shared_gpu_views=True both see
    one memory (CUDA IPC maps it writable), and the write shows: the hazard
    that makes copies the default."""
    per_epoch = device.samples // device.loader_batch
    done = tmp_path / "a.done"
    start(procs, device, "produce", name, "--slots", per_epoch + 1, "--epochs", 1, "--min-consumers", 2)
    start(procs, device, "consume", name, "--check", "host", "--epochs", 1, "--write-in-place",
          "--views", views, "--done", done, out="a.json")
    start(procs, device, "consume", name, "--check", "host", "--epochs", 1, "--start-after", done,
          out="b.json")
    procs.wait_all(timeout=180)
    a, b = procs.result("a.json"), procs.result("b.json")
    assert_clean(a, device, [0], per_epoch)  # each checked its batch before writing into it
    assert a["stats"]["transfer"] == "view"
    if views == "copy":
        assert_clean(b, device, [0], per_epoch)
        assert a["stats"]["batch_copies"] == b["stats"]["batch_copies"] == per_epoch
    else:
        assert a["stats"]["batch_copies"] == 0  # zero-copy views: the writes went to the ring
        assert b["error"] is None and b["mismatches"] == per_epoch, b


@pytest.mark.parametrize("views", ["copy", "shared"])
def test_a_slot_is_reused_only_after_the_consumers_stream_is_past_it(procs, name, device, views):
    """A consumer checks each batch on its current stream, which falls further
    behind with every batch, and drops the batch at once; the producer's
    copies are quick. A 2-slot ring would be rewritten under the queued checks
    if a slot went back when its tensors were freed rather than when the
    stream was past them."""
    start(procs, device, "produce", name, "--slots", 2, "--epochs", 2)
    start(procs, device, "consume", name, "--check", "stream", "--stream-delay-us", device.lag_us,
          "--epochs", 2, "--views", views, out="a.json")
    procs.wait_all(timeout=180)
    assert_clean(procs.result("a.json"), device, [0, 1], device.samples // device.loader_batch)


def test_release_after_device_covers_work_on_a_side_stream(procs, name, device):
    """The same with the checks on a side stream (which waits for the current
    one) and release_after='device': no slot goes back before the side stream
    is past it."""
    start(procs, device, "produce", name, "--slots", 2, "--epochs", 2)
    start(procs, device, "consume", name, "--check", "side", "--stream-delay-us", device.lag_us,
          "--release-after", "device", "--epochs", 2, "--views", "shared", out="a.json")
    procs.wait_all(timeout=180)
    assert_clean(procs.result("a.json"), device, [0, 1], device.samples // device.loader_batch)


@pytest.mark.parametrize("late_join", ["next_epoch", "catch_up"])
def test_a_consumer_joining_a_ring_that_exists_maps_it_from_its_welcome(procs, name, device, tmp_path,
                                                                        late_join):
    """The producer has served epoch 0 and the first batch of epoch 1 when a
    second consumer joins: it gets the ring in its Welcome and epoch 2
    (next_epoch), or epoch 1 from its retained first batch (catch_up)."""
    joined = tmp_path / "b.joined"
    start(procs, device, "produce", name, "--slots", 4, "--epochs", 3, "--pause-before", "1:1",
          "--pause-until", joined, ring_lags=True)
    start(procs, device, "consume", name, "--check", "stream", "--epochs", 3, out="a.json")
    paused = tmp_path / "b.joined.paused"
    eventually(paused.exists, "the producer pausing after the first batch of epoch 1", timeout=120)
    start(procs, device, "consume", name, "--check", "host", "--epochs", 1, "--late-join", late_join,
          "--joined", joined, out="b.json")
    procs.wait_all(timeout=180)
    per_epoch = device.samples // device.loader_batch
    assert_clean(procs.result("a.json"), device, [0, 1, 2], per_epoch)
    assert_clean(procs.result("b.json"), device, [2] if late_join == "next_epoch" else [1], per_epoch)


def test_the_callers_cuda_context_is_left_as_it_was(procs, name, device):
    """A process that never used a GPU has no current context before and after
    every batchcast call, in its main thread and in a fresh one; the producer's
    thread likewise."""
    p = start(procs, device, "produce", name, "--epochs", 1)
    # Checking values on a GPU would be the caller's own use of it: not here.
    start(procs, device, "consume", name, "--check", "none", "--epochs", 1, "--fresh-thread", out="a.json")
    procs.wait_all(timeout=180)
    r = procs.result("a.json")
    assert r["error"] is None, r["error"]
    assert r["context_before"] == 0
    assert r["contexts"] == [], r["contexts"]
    stats = producer_stats(procs, p)
    assert stats["context_before"] == 0 and stats["context_after"] == 0, stats


def test_a_consumer_in_the_producers_own_process_is_a_cuda_error(procs, name, device):
    start(procs, device, "same-process", name, out="r.json")
    procs.wait_all(timeout=120)
    r = procs.result("r.json")
    assert r["is_cuda_error"], r
    assert "in its own process" in r["error"] and "another process" in r["error"], r["error"]


@pytest.mark.parametrize("views", ["shared", "copy"])
def test_a_ring_still_mapped_past_linger_is_freed_with_a_warning(procs, name, device, tmp_path, views):
    """A consumer keeps a batch and stays alive after the last epoch: with
    shared views, the producer waits `linger` (1 s), then frees its ring with
    a LingerWarning; the consumer, still holding the batch, exits cleanly
    later. A private copy (the default) holds none of the ring: the producer
    frees it at once, with nothing to warn of."""
    holding, release = tmp_path / "holding", tmp_path / "release"
    p = start(procs, device, "produce", name, "--epochs", 1, "--linger", 1)
    c = start(procs, device, "consume", name, "--check", "host", "--epochs", 1, "--keep", 1,
              "--holding", holding, "--hold-until", release, "--views", views, out="a.json")
    eventually(lambda: holding.exists(), "the consumer holding a batch after its epoch", timeout=120)
    started = time.monotonic()
    p.wait(60)
    waited = time.monotonic() - started
    assert p.returncode == 0, procs.err(p)
    assert ("LingerWarning" in procs.err(p)) == (views == "shared"), procs.err(p)
    assert waited < 30, f"the producer took {waited:.1f} s to give up its ring (linger 1 s)"
    assert c.poll() is None  # the consumer still holds its batch
    release.touch()
    procs.wait_all(timeout=60)
    assert procs.result("a.json")["error"] is None


def test_two_gpu_consumers_in_one_process(procs, name, device):
    start(procs, device, "produce", name, "--slots", 2, "--epochs", 2, "--min-consumers", 2)
    start(procs, device, "consume-two", name, "--epochs", 2, "--batch-sizes", device.loader_batch,
          device.loader_batch * 3 // 2, out="two.json")
    procs.wait_all(timeout=180)
    for r in procs.result("two.json"):
        assert r["error"] is None, r["error"]
        assert r["mismatches"] == 0 and r["samples"] == 2 * device.samples, r
        assert r["stats"]["ipc_memory_opens"] == 1, r["stats"]


@pytest.mark.parametrize("memory", ["pageable", "workers"])
def test_a_trainers_own_transform_of_gpu_batches(procs, name, device, memory):
    """A consumer with a transform on threads (a batch fetched ahead) over a
    ring of 2 slots: every sample once per epoch, its values, and the noise
    seeded from its identity (positions of the producer's own batches, the
    dataset index with a DataLoader's workers)."""
    start(procs, device, "produce", name, "--slots", 2, "--epochs", 2, "--memory", memory)
    start(procs, device, "consume-transformed", name, "--epochs", 2, "--batch-size",
          device.loader_batch * 3 // 2, out="t.json")
    procs.wait_all(timeout=180)
    r = procs.result("t.json")
    assert r["error"] is None, r["error"]
    assert r["mismatches"] == [] and r["samples"] == 2 * device.samples, r
    assert r["identity"] == ("dataset index" if memory == "workers" else "position"), r


@pytest.mark.parametrize("views", ["copy", "shared"])
def test_small_and_odd_tensors_arrive_byte_for_byte(procs, name, device, views):
    """Labels, one element per sample, 3 bytes a sample, bools, complex, a 0-d
    tensor: every leaf arrives with its dtype, shape and bytes, rebatched
    (7 over loader batches of 8) and not, through a ring that wraps."""
    start(procs, device, "produce-odd", name, "--slots", 2, "--epochs", 2, "--min-consumers", 2,
          "--samples", 61, "--loader-batch", 8)
    start(procs, device, "consume-odd", name, "--epochs", 2, "--views", views, "--samples", 61,
          "--loader-batch", 8, out="a.json")
    start(procs, device, "consume-odd", name, "--epochs", 2, "--views", views, "--batch-size", 7,
          "--samples", 61, "--loader-batch", 8, out="b.json")
    procs.wait_all(timeout=180)
    for out, batches in (("a.json", 2 * 8), ("b.json", 2 * 9)):
        r = procs.result(out)
        assert r["error"] is None and r["mismatches"] == [], r
        assert r["batches"] == batches and r["samples"] == 2 * 61, r


@pytest.mark.parametrize("views", ["copy", "shared"])
def test_a_killed_producer_is_producer_lost_and_the_batches_kept_stay_readable(procs, name, device, tmp_path,
                                                                              views):
    """The producer is SIGKILLed while a consumer keeps three of its batches:
    the consumer's next next() raises ProducerLost (no hang), and what it
    kept still holds its values (shared views: the ring's memory stays mapped
    in the consumer while it holds them)."""
    kept = tmp_path / "kept"
    p = start(procs, device, "produce", name, "--slots", 4, "--epochs", 1000)
    c = start(procs, device, "consume", name, "--check", "host", "--epochs", 1000, "--keep", 3,
              "--kept", kept, "--views", views, out="a.json")
    eventually(kept.exists, "the consumer keeping three batches", timeout=120, watch=[c], err=procs.err)
    p.kill()
    p.wait()
    procs.procs.remove(p)
    c.wait(60)
    r = procs.result("a.json")
    assert r["error"] is not None and r["error"].startswith("ProducerLost"), r["error"]
    assert r["kept_intact"] is True, r


def test_a_consumer_finds_the_producers_gpu_by_uuid_however_its_gpus_are_numbered(procs, name, device):
    """The producer's ring is on the machine's second GPU. A consumer whose
    CUDA_VISIBLE_DEVICES shows only that GPU (its cuda:0), one that lists both
    in the usual order (its cuda:1) and one that lists them the other way
    round (its cuda:0 again) find it by UUID and read every value as views of
    the ring; one that sees only the other GPU is refused at once, with the fix."""
    if device.seed is None:
        import torch
        if torch.cuda.device_count() < 2:
            pytest.skip("needs two GPUs (the simulated device runs this rule here)")
        env = {}
    else:
        env = {"BATCHCAST_SIMULATED_CUDA": device.env["BATCHCAST_SIMULATED_CUDA"] + ",devices=2"}

    def with_visible(visible):
        d = Device(device.seed, device.sample_bytes, device.loader_batch, device.samples, device.lag_us)
        d.env.update(env)
        if visible is not None:
            d.env["CUDA_VISIBLE_DEVICES"] = visible
        return d

    two = with_visible(None)  # the producer sees both

    # One that cannot see it, against a producer of its own (which then waits
    # for a consumer for ever, and is stopped).
    p = start(procs, two, "produce", name + "-b", "--device", "cuda:1", "--epochs", 1)
    c = start(procs, with_visible("0"), "consume", name + "-b", "--epochs", 1, out="other.json")
    c.wait(120)
    p.kill()
    p.wait()
    procs.procs.remove(p)
    start(procs, two, "produce", name, "--device", "cuda:1", "--epochs", 1, "--min-consumers", 3)
    for visible, out in [("1", "only.json"), ("0,1", "both.json"), ("1,0", "renumbered.json")]:
        start(procs, with_visible(visible), "consume", name, "--check", "host", "--epochs", 1,
              "--views", "shared", out=out)
    procs.wait_all(timeout=240)
    other = procs.result("other.json")
    assert other["error"].startswith("CudaError"), other
    assert "cannot see" in other["error"] and "CUDA_VISIBLE_DEVICES=0" in other["error"], other["error"]
    assert "make that GPU visible" in other["error"], other["error"]
    for out, seen_as in [("only.json", 0), ("both.json", 1), ("renumbered.json", 0)]:
        r = procs.result(out)
        assert_clean(r, device, [0], device.samples // device.loader_batch)
        assert r["stats"]["ring_device"] == seen_as, (out, r["stats"])
        if device.seed is None:  # (the simulated device's batches are CPU tensors)
            assert r["stats"]["device"] == f"cuda:{seen_as}", (out, r["stats"])
        assert r["stats"]["transfer"] == "view" and r["stats"]["ipc_memory_opens"] == 1, (out, r["stats"])


@pytest.mark.parametrize("views", ["copy", "shared"])
def test_memory_stays_flat_over_thousands_of_batches_half_dropped_unread(procs, name, device, views):
    """A consumer that drops every other batch unread (never read, never on a
    stream) over 3,000 loader batches: its memory (host RSS; on a GPU, what
    torch allocated there) is the same at the end as after the first 500,
    it opened the ring's memory once and its slot events once each (at join:
    no IPC opened per batch), and every batch it read held its values."""
    flags = ["--samples", 3000 * 2, "--loader-batch", 2, "--sample-bytes", 4096]
    env = dict(device.env)
    if device.seed is not None:  # short delays: thousands of batches
        env["BATCHCAST_SIMULATED_CUDA"] = f"seed={device.seed},max_delay_us=50"
    procs.start("produce", name, *flags, "--epochs", 1, "--slots", 4, script=SCRIPT, env=env)
    procs.start("consume", name, *flags, "--epochs", 1, "--check", "stream", "--views", views,
                "--drop-every", 2, "--rss-at", 500, out="a.json", script=SCRIPT, env=env)
    procs.wait_all(timeout=600)
    r = procs.result("a.json")
    assert r["error"] is None, r["error"]
    assert r["received"] == 3000 and r["checks"] == 1500, r
    assert r["mismatches"] == 0, r
    s = r["stats"]
    assert s["ipc_memory_opens"] == 1, s
    assert s["ipc_event_opens"] == r["stats_at"]["ipc_event_opens"] > 0, (r["stats_at"], s)
    grew = r["rss_end"] - r["rss_at"]
    assert grew < 8 << 20, f"host RSS grew by {grew / 2**20:.1f} MiB over 2,500 batches"
    assert r["gpu_end"] - r["gpu_at"] <= 2 * 2 * 4096 * 2, (r["gpu_at"], r["gpu_end"])


@pytest.mark.parametrize("where", ["producer", "consumer", "both"])
def test_expandable_segments_in_either_process_changes_nothing(procs, name, device, where):
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (memory torch maps in
    segments it can grow, which CUDA IPC cannot export as one allocation) in
    the producer, the consumer or both: every value arrives, as views and as
    copies. The ring is batchcast's own allocation, never torch's."""
    if device.seed is not None:
        pytest.skip("torch's CUDA allocator is not part of the simulated device (the GPU check runs this)")
    conf = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    producer_env = {**device.env, **(conf if where in ("producer", "both") else {})}
    consumer_env = {**device.env, **(conf if where in ("consumer", "both") else {})}
    procs.start("produce", name, *device.flags(), "--epochs", 1, "--min-consumers", 2, script=SCRIPT,
                env=producer_env)
    for views in ("shared", "copy"):
        procs.start("consume", name, *device.flags(), "--epochs", 1, "--check", "stream", "--views", views,
                    out=f"{views}.json", script=SCRIPT, env=consumer_env)
    procs.wait_all(timeout=240)
    for views in ("shared", "copy"):
        assert_clean(procs.result(f"{views}.json"), device, [0], device.samples // device.loader_batch)
