"""End to end with real processes: one producer, several consumers, each
checking every sample id exactly once and in order, and the payload of each."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import eventually, expected_sizes, shm_entries
from torch.utils.data import DataLoader

from workers import IdDataset

import batchcast as bc

N, L = 1003, 32


@pytest.mark.every_torch
def test_four_consumers_get_every_sample_once_in_order_over_two_epochs(procs, name, runtime_dir):
    shm_before = shm_entries()
    consumers = {16: False, 32: False, 100: False, 7: True}  # smaller, equal, larger, odd+drop_last
    procs.start("produce", name, "--samples", str(N), "--loader-batch", str(L), "--epochs", "2",
                "--min-consumers", str(len(consumers)), "--workers", "2")
    for b, drop in consumers.items():
        flags = ["--batch-size", str(b), "--epochs", "2", "--check-values"]
        procs.start("consume", name, *flags, *(["--drop-last"] if drop else []), out=f"c{b}.json")
    procs.wait_all()
    for b, drop in consumers.items():
        r = procs.result(f"c{b}.json")
        assert r["error"] is None, r["error"]
        want = list(range(N // b * b)) if drop else list(range(N))
        assert r["epochs"] == [want, want], f"B={b}"
        assert r["sizes"] == [expected_sizes(N, b, drop)] * 2, f"B={b}"
        assert r["len"] == (N // b if drop else math.ceil(N / b))
        assert r["stats"]["views"] > 0
    # Equal batch sizes never need a copy: every tensor is a view of the ring.
    assert procs.result("c32.json")["stats"]["copies"] == 0
    # Nothing left behind: no /dev/shm entries, no socket or lock files.
    assert shm_entries() == shm_before
    assert os.listdir(runtime_dir) == []


def test_seeded_shuffle_gives_the_same_order_as_a_plain_training_loop(procs, name):
    procs.start("produce", name, "--samples", "200", "--loader-batch", "16", "--epochs", "2",
                "--shuffle", "--seed", "1234")
    procs.start("consume", name, "--batch-size", "24", "--epochs", "2", out="c.json")
    procs.wait_all()
    r = procs.result("c.json")
    loader = DataLoader(IdDataset(200), batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(1234))
    plain = [[i for _, ids in loader for i in ids.tolist()] for _ in range(2)]
    assert r["epochs"] == plain
    assert plain[0] != plain[1] and sorted(plain[0]) == list(range(200))


@pytest.mark.parametrize("kind", ["dict", "namedtuple"])
def test_structures_with_per_sample_lists_are_rebatched(procs, name, kind):
    procs.start("produce", name, "--samples", "50", "--loader-batch", "8", "--kind", kind)
    procs.start("consume", name, "--batch-size", "5", "--check-values", out="c.json")
    procs.wait_all()
    r = procs.result("c.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(50))]


def test_a_finished_producer_keeps_its_ring_open_until_every_consumer_mapped_it(procs, name, caplog, tmp_path):
    # Consumers reopen a host ring through /proc/<producer pid>/fd. A consumer
    # slower to take in the ring than the producer to serve the whole run
    # (here: stopped by a signal right after joining) must still get every
    # sample: the finished producer keeps the ring open until it has mapped it.
    import logging
    import threading

    import batchcast as bc
    from workers import sample_ids

    caplog.set_level(logging.INFO, logger="batchcast")
    ready = tmp_path / "a.ready"
    a = procs.start("consume", name, "--batch-size", "5", "--check-values", "--ready", str(ready),
                    out="a.json")
    p = bc.Producer(DataLoader(IdDataset(50), batch_size=8), name, epochs=1, min_consumers=2).start()
    eventually(ready.exists, "consumer a to join")
    os.kill(a.pid, signal.SIGSTOP)  # the ring does not exist yet: loading waits for a second consumer
    try:
        with bc.Consumer(name, batch_size=5, timeout=30) as b:
            assert [i for batch in b for i in sample_ids(batch)] == list(range(50))
        eventually(lambda: not p._thread.is_alive(), "the producer to serve its one epoch")
        closer = threading.Thread(target=p.stop)
        closer.start()
        eventually(lambda: f"waits for consumer pid(s) {a.pid} to map its ring" in caplog.text,
                   "the producer to wait for consumer a")
    finally:
        os.kill(a.pid, signal.SIGCONT)
    closer.join(30)
    assert not closer.is_alive()
    procs.wait_all()
    r = procs.result("a.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [list(range(50))]


def test_loader_exception_reaches_consumers_with_its_message(procs, name):
    p = procs.start("produce", name, "--samples", "100", "--loader-batch", "10", "--fail-at", "55")
    procs.start("consume", name, "--batch-size", "10", out="c.json")
    p.wait(60)
    assert p.returncode != 0 and "corrupt sample 55" in procs.err(p)
    procs.procs.remove(p)
    procs.wait_all()
    r = procs.result("c.json")
    assert r["error"].startswith("LoaderError")
    assert "ValueError: corrupt sample 55" in r["error"]
    assert r["epochs"] == []  # the epoch did not complete, so it was not reported as one


def test_unsupported_leaf_is_a_type_error_naming_its_path(procs, name):
    p = procs.start("produce", name, "--kind", "object")
    procs.start("consume", name, out="c.json")
    p.wait(60)
    err = procs.err(p)
    assert "TypeError" in err and "builtins.object at batch[1][0]" in err, err
    procs.procs.remove(p)
    procs.wait_all()
    assert "builtins.object at batch[1][0]" in procs.result("c.json")["error"]


def test_mismatched_sample_shapes_are_a_clear_error_not_corruption(procs, name):
    procs.start("produce", name, "--samples", "40", "--loader-batch", "8", "--bad-shape-at", "16")
    procs.start("consume", name, "--batch-size", "12", "--check-values", out="c.json")
    procs.wait_all()
    r = procs.result("c.json")
    assert r["error"].startswith("RebatchError"), r["error"]
    assert "[3, 2, 2]" in r["error"] and "[3, 3, 3]" in r["error"]


def test_producer_killed_raises_producer_lost_within_seconds(procs, name):
    p = procs.start("produce", name, "--samples", "100000", "--loader-batch", "10", "--slots", "4")
    c = procs.start("consume", name, "--batch-size", "10", "--sleep", "0.01",
                    "--ready", str(procs.tmp / "ready"), "--ready-after", "5", out="c.json")
    eventually((procs.tmp / "ready").exists, "the consumer's fifth batch", 60, watch=(p, c))
    p.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    c.wait(30)
    assert time.monotonic() - killed < 4
    r = procs.result("c.json")
    assert r["error"].startswith("ProducerLost") and "exited or was killed" in r["error"]


SLOW_LOADER = """
import sys, time, torch, batchcast as bc
class Slow:
    def __iter__(self):
        time.sleep(600)  # its first batch never comes while the test runs
        yield torch.zeros(1)
    def __len__(self):
        return 1
bc.Producer(Slow(), name=sys.argv[1], epochs=1).run()
"""


def _threads_named(thread_name: str) -> dict[int, int]:
    """tid -> context switches so far, of this process's threads named `thread_name`."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != thread_name:
                continue
            status = (task / "status").read_text()
        except FileNotFoundError:
            continue
        out[int(task.name)] = sum(
            int(line.split()[1]) for line in status.splitlines()
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
    return out


def test_a_consumer_waiting_for_a_slow_loader_sleeps_until_its_producer_goes(runtime_dir, name):
    """While a trainer waits for a loader's first batch, the consumer's watchdog
    sleeps (about one wakeup a second; it woke ten times a second) and still
    notices at once that the producer died."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:  # before Linux 5.3, or a sandbox that denies it
        pytest.skip(f"no pidfd here ({exc}): the watchdog checks every 100 ms instead")
    p = subprocess.Popen([sys.executable, "-c", SLOW_LOADER, name])
    consumer = None
    earlier = set(_threads_named("batchcast-watch"))  # other consumers' of this process
    try:
        consumer = bc.Consumer(name, timeout=60)
        (ours,) = set(_threads_named("batchcast-watch")) - earlier
        batches = iter(consumer)
        errors: list[BaseException] = []

        def trainer() -> None:
            try:
                next(batches)
            except BaseException as exc:  # noqa: BLE001 (asserted below)
                errors.append(exc)

        t = threading.Thread(target=trainer)
        t.start()
        before, since = _threads_named("batchcast-watch")[ours], time.monotonic()
        time.sleep(3.0)  # a window to count wakeups in, not a wait for an event
        woke = _threads_named("batchcast-watch")[ours] - before
        window = time.monotonic() - since
        assert woke <= 2 * window + 1, f"the watchdog woke {woke} times in {window:.1f} s"
        p.kill()
        killed = time.monotonic()
        t.join(30)
        assert not t.is_alive()
        assert time.monotonic() - killed < 4
        assert len(errors) == 1 and isinstance(errors[0], bc.ProducerLost), errors
        assert "exited or was killed" in str(errors[0])
    finally:
        p.kill()
        p.wait()
        if consumer is not None:
            consumer.close()


def test_a_trainer_with_a_stall_limit_ends_with_an_error_naming_the_hung_loader(procs, name, tmp_path):
    """A loader worker stuck inside the dataset (sample 100 of 600 waits
    for a file): a consumer with stall_timeout gets its three batches, then
    batchcast.Stalled once that long has passed with nothing from the
    producer, naming the wait, the producer waiting for its loader, the
    workers alive and what to do; where it stands is still exact. A trainer
    beside it without a limit waits, and once the loader moves on gets the
    whole epoch."""
    gate = tmp_path / "gate"
    # (the producer notes its loader's workers every 1/8 s: BATCHCAST_LOADER_WARN_SECONDS / 4)
    procs.start("serve", name, "--gate", gate, "--gate-at", 100, "--epochs", 1, "--min-consumers", 2,
                script="endings.py", env={"BATCHCAST_LOADER_WARN_SECONDS": "0.5"})
    steady = procs.start("steady", name, "--epochs", 1, out="steady.json", script="endings.py")
    consumer = bc.Consumer(name, batch_size=32, timeout=60, stall_timeout=2.0)
    try:
        seen: list[int] = []
        batches = iter(consumer)
        with pytest.raises(bc.Stalled) as caught:
            for x, i in batches:
                assert torch.equal(x[:, 0], i.float())
                seen += i.tolist()
                stalled_from = time.monotonic()
        waited = time.monotonic() - stalled_from
        assert seen == list(range(96))
        assert 2.0 <= waited < 30, waited
        text = str(caught.value)
        assert f"consumer of '{name}' waited " in text and "(stall_timeout=2) for its next batch of epoch 0 " \
            "(3 of its batches handed out) and the producer brought it no sample in that time" in text, text
        assert "has waited" in text and "for its loader's next batch (epoch 0, after 3 batches of it)" in text, text
        # The worker stuck is one of the two the producer noted, named with how to look at it.
        workers = text.split("worker processes alive: ")[1].split(" ")[0].split(",")[0]
        assert f"`py-spy dump --pid {workers}`" in text and "raise stall_timeout" in text, text
        assert f"`batchcast status {name}`" in text, text
        assert consumer.state_dict()["position"] == 96
    finally:
        consumer.close()
    gate.touch()
    steady.wait(60)
    assert procs.result("steady.json")["epochs"] == [list(range(600))]
    procs.wait_all(60)


def test_a_stall_limit_is_seconds_or_none(name):
    for wrong in (0, -1.0, True, "600", float("nan"), float("inf")):
        with pytest.raises(ValueError, match="stall_timeout must be a positive number of seconds"):
            bc.Consumer(name, stall_timeout=wrong)


def test_killed_consumer_does_not_stall_the_others(procs, name):
    procs.start("produce", name, "--samples", "3000", "--loader-batch", "10", "--slots", "4",
                "--min-consumers", "2")
    # Killed once it has batches: both consumers had joined, loading began, and
    # the producer waits for the victim (lockstep) while it sleeps.
    victim = procs.start("consume", name, "--batch-size", "10", "--sleep", "0.5",
                         "--ready", str(procs.tmp / "ready"), "--ready-after", "2", out="v.json")
    procs.start("consume", name, "--batch-size", "10", "--check-values", out="c.json")
    eventually((procs.tmp / "ready").exists, "the victim's second batch", 60, watch=(victim,))
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    procs.procs.remove(victim)
    procs.wait_all(timeout=60)
    r = procs.result("c.json")
    assert r["error"] is None
    assert r["epochs"] == [list(range(3000))]


def test_a_consumer_without_producer_fails_clearly_after_its_timeout(procs, name):
    started = time.monotonic()
    c = procs.start("consume", name, "--timeout", "1.5", out="c.json")
    c.wait(30)
    assert c.returncode != 0  # the constructor raised
    assert time.monotonic() - started < 15
    err = procs.err(c)
    assert "ProducerLost" in err and f"no batchcast producer named '{name}'" in err


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_consumers_killed_at_random_points_are_dropped_and_the_others_get_everything(
        procs, name, seed):
    rng = random.Random(seed)
    p = procs.start("produce", name, "--samples", "2000", "--loader-batch", "10", "--slots", "3",
                    "--min-consumers", "3", "--epochs", "2")
    # The survivor trains (10 ms a batch: about 6 s in all) well past the kills,
    # which come within about 3 s of the start.
    survivor = procs.start("consume", name, "--batch-size", "7", "--check-values", "--sleep", "0.01",
                           "--epochs", "2", out="s.json")
    ready = [procs.tmp / f"ready{k}" for k in range(2)]
    # Ready at their first batch: all three joined and loading began (killed
    # before that, a victim would leave the producer waiting for a third).
    victims = [procs.start("consume", name, "--batch-size", str(rng.choice([3, 10, 25])),
                           "--sleep", "0.02", "--ready", str(ready[k]), "--ready-after", "1",
                           "--epochs", "2", out=f"v{k}.json") for k in range(2)]
    for f in ready:
        eventually(f.exists, f"{f.name}: a victim's first batch", 60, watch=(p, *victims))
    # One more joins mid-epoch and dies at a random point of its start-up or join.
    victims.append(procs.start("consume", name, "--batch-size", "5", out="v2.json"))
    for v in victims:  # waiting, mid-epoch, holding batches: whenever the seed says
        time.sleep(rng.uniform(0.0, 1.0))
        v.send_signal(signal.SIGKILL)
        v.wait()
        procs.procs.remove(v)
    assert survivor.poll() is None, "the test is meant to kill while the survivor consumes"
    procs.wait_all(timeout=90)
    r = procs.result("s.json")
    assert r["error"] is None and r["epochs"] == [list(range(2000))] * 2
    stats = json.loads(procs.out(p).strip().splitlines()[-1])
    assert stats["crashes"] >= 2  # the two that had joined; the third may have died before


# 6 KiB samples: a ring of 4 slots (9 batches with its room for kept ones) of
# 10-sample batches really reuses its memory.
WIDE = ["--width", "256"]


@pytest.mark.parametrize("keepers", [1, 2])
def test_consumers_keeping_every_batch_never_stall_the_others(procs, name, keepers):
    """A trainer that appends every batch to a list (3 epochs, 120 loader
    batches through a 4-slot ring) keeps valid batches, takes private copies
    once it pins its share, warns once — and its neighbour never waits."""
    p = procs.start("produce", name, "--samples", "400", "--loader-batch", "10", "--slots", "4",
                    "--epochs", "3", "--min-consumers", str(keepers + 1), *WIDE)
    kept = [procs.start("consume", name, "--batch-size", "10", "--epochs", "3", "--keep",
                        "--check-values", out=f"k{i}.json") for i in range(keepers)]
    procs.start("consume", name, "--batch-size", "16", "--epochs", "3", "--check-values",
                out="n.json")
    procs.wait_all(timeout=120)
    every = list(range(400))
    stats = json.loads(procs.out(p).strip().splitlines()[-1])
    assert stats["ring_bytes"] * 3 < stats["bytes_published"]  # each part of the ring reused 3+ times
    assert stats["evictions"] == 0
    for i, k in enumerate(kept):
        r = procs.result(f"k{i}.json")
        assert r["error"] is None, r["error"]
        assert r["epochs"] == [every] * 3
        assert r["kept"] == 1200  # all of them, every value checked at the end
        assert r["stats"]["private_copies"] > 100
        err = procs.err(k)
        assert err.count("KeptBatchesWarning") == 1, err
        assert ".clone()" in err
    r = procs.result("n.json")
    assert r["error"] is None, r["error"]
    assert r["epochs"] == [every] * 3
    assert r["max_wait"] < 1.0, f"the neighbour waited {r['max_wait']:.2f} s for a batch"
    assert r["stats"]["private_copies"] == 0
    assert "Warning" not in procs.err(procs.procs[-1])


STORM = """
import os, signal, sys, time
pids = [int(p) for p in sys.argv[1:]]
while pids:
    for _ in range(20):
        for pid in list(pids):
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pids.remove(pid)
    time.sleep(0.005)  # about 4,000 signals per second to each process
"""


def test_a_signal_storm_aborts_nothing_and_loses_nothing(procs, name):
    """Thousands of signals per second (a handler installed, as profilers and
    schedulers do) to the producer and both consumers while they serve three
    epochs: every blocking call retries, nothing aborts, every sample arrives."""
    ready = [procs.tmp / f"ready{k}" for k in range(3)]
    p = procs.start("produce", name, "--samples", "3000", "--loader-batch", "10", "--slots", "4",
                    "--epochs", "3", "--min-consumers", "2", "--count-signals", "--ready",
                    str(ready[0]))
    a = procs.start("consume", name, "--batch-size", "7", "--epochs", "3", "--check-values",
                    "--count-signals", "--ready", str(ready[1]), out="a.json")
    b = procs.start("consume", name, "--batch-size", "32", "--epochs", "3", "--count-signals",
                    "--ready", str(ready[2]), out="b.json")
    for f in ready:  # handlers installed: a signal no longer kills
        eventually(f.exists, f"{f.name}: a signal handler installed", 60, watch=(p, a, b))
    storm = subprocess.Popen([sys.executable, "-c", STORM, str(p.pid), str(a.pid), str(b.pid)])
    try:
        procs.wait_all(timeout=180)
    finally:
        storm.kill()
        storm.wait()
    every = list(range(3000))
    for out in ("a.json", "b.json"):
        r = procs.result(out)
        assert r["error"] is None, r["error"]
        assert r["epochs"] == [every] * 3
        # Signals that arrive while one is pending merge into it, and Python
        # runs its handler only between bytecodes: this counts far fewer than
        # were sent, but shows the storm went through the run.
        assert r["signals"] > 20, r["signals"]
    assert json.loads(procs.out(p).strip().splitlines()[-1])["signals"] > 20


def test_loader_workers_that_start_and_exit_every_epoch_abort_nothing(procs, name):
    """persistent_workers=False: two DataLoader workers start and exit every
    epoch (SIGCHLD each time) for 30 short epochs."""
    procs.start("produce", name, "--samples", "64", "--loader-batch", "8", "--epochs", "30",
                "--workers", "2", "--min-consumers", "2")
    procs.start("consume", name, "--batch-size", "5", "--epochs", "30", "--check-values",
                out="a.json")
    procs.start("consume", name, "--batch-size", "8", "--epochs", "30", out="b.json")
    procs.wait_all(timeout=180)
    for out in ("a.json", "b.json"):
        r = procs.result(out)
        assert r["error"] is None, r["error"]
        assert r["epochs"] == [list(range(64))] * 30


def test_the_core_prints_nothing_to_stderr(procs, name):
    """Joins, leaves, a consumer that keeps its batches, a crash: what the core
    has to say goes through warnings and logging, so that a user who silences
    those (warnings filter, a logging handler) sees nothing at all."""
    p = procs.start("produce", name, "--samples", "400", "--loader-batch", "10", "--slots", "4",
                    "--min-consumers", "3", "--quiet", *WIDE)
    a = procs.start("consume", name, "--batch-size", "10", "--keep", "--quiet", out="a.json")
    b = procs.start("consume", name, "--batch-size", "10", "--sleep", "0.001", "--quiet",
                    out="b.json")
    # Killed at its first batch: all three joined (killed sooner, it would leave
    # the producer waiting for a third), and the producer waits for it
    # (lockstep) until it dies.
    victim = procs.start("consume", name, "--batch-size", "10", "--sleep", "0.5", "--quiet",
                         "--ready", str(procs.tmp / "victim"), "--ready-after", "1", out="v.json")
    eventually((procs.tmp / "victim").exists, "the victim's first batch", 60, watch=(p, victim))
    victim.kill()
    victim.wait()
    procs.procs.remove(victim)
    procs.wait_all(timeout=120)
    assert procs.result("a.json")["stats"]["private_copies"] > 0  # it had a warning to give
    assert json.loads(procs.out(p).strip().splitlines()[-1])["crashes"] == 1  # and an event
    for proc in (p, a, b):
        assert procs.err(proc) == "", procs.err(proc)


def test_writing_into_a_batch_in_place_crashes_with_an_explanation_and_corrupts_nothing(
        procs, name):
    procs.start("produce", name, "--samples", "200", "--loader-batch", "10",
                "--min-consumers", "2")
    bad = procs.start("consume", name, "--batch-size", "10", "--write-in-place", out="b.json")
    procs.start("consume", name, "--batch-size", "10", "--check-values", out="c.json")
    bad.wait(60)
    assert bad.returncode == -signal.SIGSEGV
    err = procs.err(bad)
    assert "batchcast: a batch tensor was written in place" in err and "clone()" in err
    assert "Consumer(..., device=bc.Placement(writable=True))" in err
    # The Python traceback names the line that wrote.
    script = Path(__file__).parent / "workers.py"
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "batch[0].mul_(2)" in text)
    assert f'File "{script}", line {line}' in err, err
    procs.procs.remove(bad)
    procs.wait_all()
    r = procs.result("c.json")
    assert r["error"] is None and r["epochs"] == [list(range(200))]  # values checked too


def test_a_writable_consumer_modifies_private_copies_and_nobody_else_sees_it(procs, name):
    procs.start("produce", name, "--samples", "200", "--loader-batch", "10",
                "--min-consumers", "2")
    procs.start("consume", name, "--batch-size", "15", "--write-in-place", "--writable",
                out="w.json")
    procs.start("consume", name, "--batch-size", "10", "--check-values", out="c.json")
    procs.wait_all()
    w, c = procs.result("w.json"), procs.result("c.json")
    assert w["error"] is None and w["epochs"] == [list(range(200))]
    # Every batch handed out was a copy: of the ring (counted) or a join of two
    # loader batches across a wrap of the ring (a copy anyway: "copies").
    assert 14 - w["stats"]["copies"] <= w["stats"]["batch_copies"] <= 14
    assert c["error"] is None and c["epochs"] == [list(range(200))]
    assert c["stats"]["batch_copies"] == 0


def test_a_name_is_free_as_soon_as_its_producer_dies_even_with_loader_workers_alive(procs, name):
    """DataLoader workers are forked children: they must not keep the name's
    lock. (They end with their producer now, within a second: stopped here,
    they outlive it for as long as the test needs, then end once let go.)"""
    import batchcast as bc

    p = procs.start("produce", name, "--samples", "100000", "--loader-batch", "10", "--workers", "2",
                    "--slots", "2")
    c = procs.start("consume", name, "--batch-size", "10", "--sleep", "0.01",
                    "--ready", str(procs.tmp / "ready"), "--ready-after", "1", out="c.json")
    eventually((procs.tmp / "ready").exists, "the consumer's first batch", 60, watch=(p, c))
    workers = eventually(lambda: [int(d) for d in os.listdir("/proc") if d.isdigit() and _parent(int(d)) == p.pid],
                         "the producer's loader workers")
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    p.kill()
    p.wait()
    with bc.Producer([torch.zeros(2)], name, epochs=1):  # not NameInUse
        assert any(_alive(pid) for pid in workers), "the workers were already gone: nothing tested"
    for pid in workers:
        os.kill(pid, signal.SIGCONT)
    eventually(lambda: not any(_alive(pid) for pid in workers), "the workers ended with their producer", 10)
    c.wait(30)
    assert procs.result("c.json")["error"].startswith("ProducerLost")


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
