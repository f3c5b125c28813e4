"""Consumer groups (the ranks of a data-parallel trial split the stream) and
resumable consumers (state_dict / state=), with real processes and, for the
property tests, in one process with a producer thread."""

from __future__ import annotations

import json
import threading
import time

import pytest
from conftest import eventually
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import batchcast as bc
from workers import IdDataset, sample_ids


def group_reference(n: int, world: int, b: int, rank: int, drop_last: bool) -> list[list[int]]:
    """The batches rank `rank` of a group of `world` (batch b) gets from an epoch
    of samples 0..n-1: of each window of world*b samples the rank-th b; the
    last, partial window padded up to a multiple of world with the epoch's
    first samples, split evenly (dropped with drop_last)."""
    window = world * b
    full = n // window
    out = [list(range(k * window + rank * b, k * window + (rank + 1) * b)) for k in range(full)]
    rest = n - full * window
    if rest and not drop_last:
        part = -(-rest // world)
        head = list(range(min(world - 1, n)))
        padded = list(range(full * window, n))
        padded += [head[i % len(head)] for i in range(part * world - rest)]
        out.append(padded[rank * part:(rank + 1) * part])
    return out


def batches_of(result: dict, epoch: int) -> list[list[int]]:
    ids, out = result["epochs"][epoch], []
    for size in result["sizes"][epoch]:
        out.append(ids[:size])
        ids = ids[size:]
    return out


# ---- groups, real processes ------------------------------------------------------

@pytest.mark.every_torch
def test_groups_split_the_stream_beside_a_whole_stream_consumer(procs, name):
    """A group of 2 and one of 3 with different batch sizes beside a
    whole-stream consumer: each rank gets its part, the same number of batches
    as its group's other ranks, together the epoch once (plus the padding),
    every epoch; the whole-stream consumer gets everything."""
    n = 203
    procs.start("produce", name, "--samples", n, "--loader-batch", 10, "--epochs", 2,
                "--min-consumers", 3)
    procs.start("consume", name, "--batch-size", 32, "--epochs", 2, "--check-values", out="all.json")
    for world, b in ((2, 8), (3, 5)):
        for r in range(world):
            procs.start("consume", name, "--batch-size", b, "--epochs", 2, "--check-values",
                        "--group", f"g{world}", "--rank", r, "--world", world,
                        out=f"g{world}-{r}.json")
    procs.wait_all(timeout=120)
    assert procs.result("all.json")["epochs"] == [list(range(n))] * 2
    for world, b in ((2, 8), (3, 5)):
        results = [procs.result(f"g{world}-{r}.json") for r in range(world)]
        for r, res in enumerate(results):
            assert res["error"] is None, res["error"]
            assert res["len"] == len(group_reference(n, world, b, r, False))
            for epoch in range(2):
                assert batches_of(res, epoch) == group_reference(n, world, b, r, False)
        seen = sorted(i for res in results for i in res["epochs"][0])
        assert sorted(set(seen)) == list(range(n))  # together: the epoch, once...
        assert len(seen) - n < world  # ... plus fewer than world_size padding samples


def test_a_rank_killed_mid_epoch_fails_the_other_ranks_at_once_and_nobody_else(procs, name):
    p = procs.start("produce", name, "--samples", 3000, "--loader-batch", 10, "--slots", 4,
                    "--min-consumers", 2)
    solo = procs.start("consume", name, "--batch-size", 16, "--check-values", out="solo.json")
    ranks = [procs.start("consume", name, "--batch-size", 5, "--sleep", "0.02", "--group", "job",
                         "--rank", r, "--world", 3, "--ready", str(procs.tmp / f"r{r}"),
                         "--ready-after", 3, out=f"r{r}.json") for r in range(3)]
    for r in range(3):
        eventually((procs.tmp / f"r{r}").exists, f"rank {r}'s third batch", 60,
                   watch=(p, solo, *ranks))
    ranks[2].kill()
    ranks[2].wait()
    killed = time.monotonic()
    procs.procs.remove(ranks[2])
    for r in (0, 1):
        ranks[r].wait(30)
        res = procs.result(f"r{r}.json")
        assert res["error"].startswith("GroupError: rank 2 (pid "), res["error"]
        assert "of consumer group 'job'" in res["error"] and "exited" in res["error"]
        assert res["error_at"] - killed < 1.5  # the liveness sweep, then its next next()
        assert res["epochs"] == []  # the epoch never ended for it
    procs.wait_all(timeout=120)
    assert procs.result("solo.json")["epochs"] == [list(range(3000))]
    assert json.loads(procs.out(p).strip().splitlines()[-1])["groups_broken"] == 1


def test_a_rank_whose_group_is_not_complete_waits_and_the_others_are_served(procs, name):
    """Rank 0 of 2 alone: its iter() waits for rank 1 while a whole-stream
    consumer is served; once rank 1 comes, the group starts at the next epoch."""
    procs.start("produce", name, "--samples", 40, "--loader-batch", 8, "--epochs", 8)
    # The whole-stream consumer holds its third batch until rank 1 has joined:
    # the producer cannot run out of epochs before the group is complete,
    # however slowly rank 1 starts.
    # It joins first, so that the producer starts with it (rank 0, alone,
    # would start the producer too, and solo would then miss epochs).
    solo = procs.start("consume", name, "--batch-size", 8, "--epochs", 8, "--sleep", "0.05",
                       "--hold-at", 3, "--until", str(procs.tmp / "r1"),
                       "--ready", str(procs.tmp / "solo"), out="solo.json")
    eventually((procs.tmp / "solo").exists, "the whole-stream consumer to join", 60, watch=(solo,))
    r0 = procs.start("consume", name, "--batch-size", 4, "--epochs", 1, "--group", "late",
                     "--rank", 0, "--world", 2, "--ready", str(procs.tmp / "r0"), out="r0.json")
    eventually((procs.tmp / "r0").exists, "rank 0 to join", 60, watch=(solo, r0))
    r1 = procs.start("consume", name, "--batch-size", 4, "--epochs", 1, "--group", "late",
                     "--rank", 1, "--world", 2, "--ready", str(procs.tmp / "r1"), out="r1.json")
    procs.wait_all(timeout=120)
    assert procs.result("solo.json")["epochs"] == [list(range(40))] * 8
    for r in (0, 1):
        res = procs.result(f"r{r}.json")
        assert res["error"] is None, res["error"]
        assert res["stats"]["epoch"] >= 1  # not the epoch in progress when it completed
        assert batches_of(res, 0) == group_reference(40, 2, 4, r, False)
    assert r0.returncode == r1.returncode == 0


# ---- resume, real processes ------------------------------------------------------

@pytest.mark.every_torch
def test_a_consumer_stopped_and_restored_continues_exactly_while_the_producer_holds_it(
        procs, name):
    """A trial saves its state after 35 samples (batch 7 of a loader of 10) and
    stops; a slower consumer still holds that part of the ring; restored, the
    trial gets exactly what an uninterrupted run gets after sample 35."""
    n = 300
    state = procs.tmp / "state.json"
    procs.start("produce", name, "--samples", n, "--loader-batch", 10, "--epochs", 2,
                "--min-consumers", 2, "--shuffle")
    procs.start("consume", name, "--batch-size", 10, "--epochs", 2, "--hold-at", 3,
                         "--until", str(procs.tmp / "go"), out="keeper.json")
    first = procs.start("consume", name, "--batch-size", 7, "--epochs", 2, "--save-after", 35,
                        "--save-state", str(state), out="first.json")
    first.wait(60)
    procs.procs.remove(first)
    saved = json.loads(state.read_text())
    assert (saved["epoch"], saved["position"]) == (0, 35)
    again = procs.start("consume", name, "--batch-size", 7, "--epochs", 2, "--state", str(state),
                        "--record-warnings", "--ready", str(procs.tmp / "again"), out="again.json")
    eventually((procs.tmp / "again").exists, "the restored consumer to join", 60, watch=(again,))
    (procs.tmp / "go").touch()  # the keeper lets go
    procs.wait_all(timeout=120)
    whole = procs.result("keeper.json")["epochs"]  # the stream, uninterrupted
    assert procs.result("first.json")["epochs"] == [whole[0][:35]]
    res = procs.result("again.json")
    assert res["error"] is None, res["error"]
    assert res["stats"]["resumed"] == "exact"
    assert res["warnings"] == []
    assert res["epochs"] == [whole[0][35:], whole[1]]
    assert res["sizes"][0] == [7] * (265 // 7) + [265 % 7]  # batches restart at the position


def test_a_restore_the_producer_no_longer_holds_gets_the_next_pass_and_warns(procs, name):
    n = 100
    state = procs.tmp / "state.json"
    # Two slots: the producer cannot finish epoch 0 (and begin epoch 1 for the
    # first consumer) before that consumer is gone.
    procs.start("produce", name, "--samples", n, "--loader-batch", 10, "--epochs", 3,
                "--shuffle", "--slots", 2)
    first = procs.start("consume", name, "--batch-size", 8, "--save-after", 24,
                        "--save-state", str(state), out="first.json")
    first.wait(60)
    procs.procs.remove(first)
    # Nobody holds epoch 0 any more: the producer serves it to its end at once.
    procs.start("consume", name, "--batch-size", 8, "--epochs", 2, "--state", str(state),
                "--record-warnings", out="again.json")
    procs.wait_all(timeout=120)
    res = procs.result("again.json")
    assert res["error"] is None, res["error"]
    assert res["stats"]["resumed"] == "next-pass"
    assert len(res["warnings"]) == 1, res["warnings"]
    (warning,) = res["warnings"]
    assert warning.startswith("ResumeWarning: consumer of") and "no longer holds" in warning
    assert "positions from 24 of epoch 1" in warning
    # Positions 24.. of the next pass, then a whole epoch: nothing twice within an epoch.
    assert len(res["epochs"][0]) == n - 24 and len(set(res["epochs"][0])) == n - 24
    assert sorted(res["epochs"][1]) == list(range(n))
    assert res["epochs"][0] != sorted(res["epochs"][0])  # shuffled: another pass's order


# ---- in one process: errors and properties ----------------------------------------

def run_producer(loader, name, **kw):
    return bc.Producer(loader, name, **kw).start()


def test_bad_group_arguments_are_clear_errors(runtime_dir):
    with pytest.raises(ValueError, match=r"group 'g' needs its rank and world_size \(bc.Group\('g', rank, "
                       r"world_size\)\), or an initialized torch.distributed process group"):
        bc.Consumer("x", batch_size=4, group="g")
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\)"):
        bc.Group("g", 2, 2)
    with pytest.raises(ValueError, match="a group's name must be a non-empty str"):
        bc.Group("")
    with pytest.raises(ValueError, match="needs batch_size="):
        bc.Consumer("x", group=bc.Group("g", 0, 2))


def test_a_duplicate_rank_is_refused_with_the_reason(runtime_dir):
    p = run_producer(DataLoader(IdDataset(20), batch_size=4), "dup", epochs=1)
    try:
        first = bc.Consumer("dup", batch_size=2, group=bc.Group("g", 0, 2))
        with pytest.raises(bc.Refused, match="rank 0 is already there"):
            bc.Consumer("dup", batch_size=2, group=bc.Group("g", 0, 2))
        first.close()
    finally:
        p.stop()


def test_a_state_is_restored_only_into_the_same_loader_and_configuration(runtime_dir):
    p = run_producer(DataLoader(IdDataset(40), batch_size=4), "st", epochs=None)
    c = bc.Consumer("st", batch_size=4)
    it = iter(c)
    next(it)
    state = c.state_dict()
    del it
    c.close()
    assert state["epoch"] == 0 and state["position"] == 4 and "IdDataset" in state["loader"]
    with pytest.raises(ValueError, match="batch_size=4; this one has batch_size=5"):
        bc.Consumer("st", batch_size=5, state=state)
    with pytest.raises(ValueError, match="not a batchcast.Consumer state_dict"):
        bc.Consumer("st", batch_size=4, state={"epoch": 0})
    p.stop()
    q = run_producer(DataLoader(IdDataset(44), batch_size=4), "st", epochs=None)
    try:
        with pytest.raises(ValueError, match="another loader"):
            bc.Consumer("st", batch_size=4, state=state)
    finally:
        q.stop()


def collect_rank(consumer, out, index):
    try:
        out[index] = [[sample_ids(b) for b in consumer]]
    except Exception as exc:  # noqa: BLE001 - the test asserts on it
        out[index] = exc
    finally:
        consumer.close()


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(world=st.integers(1, 4), b=st.integers(1, 9), loader_batch=st.integers(1, 12),
       n=st.integers(0, 90), drop_last=st.booleans())
def test_group_splits_match_the_rule_for_any_sizes(runtime_dir, world, b, loader_batch, n,
                                                    drop_last):
    name = f"prop-{world}-{b}-{loader_batch}-{n}-{int(drop_last)}"
    p = run_producer(DataLoader(IdDataset(n), batch_size=loader_batch), name, epochs=1,
                     min_consumers=1, slots=4)
    try:
        consumers = [bc.Consumer(name, batch_size=b, drop_last=drop_last, group=bc.Group("g", r, world))
                     for r in range(world)]
        out: list = [None] * world
        threads = [threading.Thread(target=collect_rank, args=(c, out, r))
                   for r, c in enumerate(consumers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for r in range(world):
            assert not isinstance(out[r], Exception), out[r]
            assert out[r] == [group_reference(n, world, b, r, drop_last)], (r, out[r])
    finally:
        p.stop()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(b=st.integers(1, 9), loader_batch=st.integers(1, 12), n=st.integers(1, 80),
       stop=st.integers(1, 12), data=st.data())
def test_a_restored_consumer_continues_exactly_for_any_sizes(runtime_dir, b, loader_batch, n,
                                                             stop, data):
    """A keeper holds what the producer serves, so the restored consumer gets
    the rest of its epoch exactly while the producer is still in that epoch
    (or just ended it), else the same positions of the next pass; the loader
    is not shuffled, so either way it gets exactly the samples after those it took."""
    name = f"res-{b}-{loader_batch}-{n}-{stop}"
    batches = -(-n // loader_batch)
    p = run_producer(DataLoader(IdDataset(n), batch_size=loader_batch), name, epochs=None,
                     min_consumers=2, slots=batches + 2)  # serves until stopped: a next pass exists
    try:
        keeper = bc.Consumer(name, batch_size=loader_batch)
        first = bc.Consumer(name, batch_size=b)
        taken, it = [], iter(first)
        for batch in it:
            taken += sample_ids(batch)
            if len(taken) >= min(stop * b, n):
                break
        state = first.state_dict()
        del it, batch
        first.close()
        restored = bc.Consumer(name, batch_size=b, state=state)
        out: list = [None, None]
        threads = [threading.Thread(target=collect_rank, args=(c, out, i))
                   for i, c in enumerate((keeper, restored))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not isinstance(out[1], Exception), out[1]
        assert restored.stats()["resumed"] in ("exact", "next-pass")
        rest = [i for batch_ids in out[1][0] for i in batch_ids]
        if len(taken) == n:  # saved after the epoch's last sample: the next epoch, whole
            assert (state["epoch"], state["position"]) == (1, 0)
            assert rest == list(range(n))
        else:
            assert (state["epoch"], state["position"]) == (0, len(taken))
            assert taken + rest == list(range(n))
    finally:
        p.stop()
