"""Joining any time (join="now"): a consumer that connects mid-epoch gets
the next batch, and every epoch of its own holds every sample exactly once —
beside whole-stream consumers whose epochs are unchanged, with nothing loaded
twice. Real processes, except where one process with a producer thread is
what the test needs (the fallback's log line, the loader's pauses)."""

from __future__ import annotations

import json
import logging
import threading
import warnings

import pytest
import torch
from conftest import eventually
from torch.utils.data import DataLoader, IterableDataset

import batchcast as bc
from test_groups import group_reference
from workers import IdDataset, sample_ids

from batchcast.status import list_producers

N, LOADER_BATCH = 200, 8  # 25 loader batches per epoch


def published(name: str) -> dict:
    (listing,) = list_producers(name)
    return listing["status"] or {}


def consumers_present(name: str, count: int) -> bool:
    return len(published(name).get("consumers", [])) >= count


def stream_of(result: dict) -> list[int]:
    return [i for epoch in result["epochs"] for i in epoch]


def assert_whole_epochs(result: dict, epochs: int) -> None:
    assert result["error"] is None, result["error"]
    assert len(result["epochs"]) == epochs
    for ids in result["epochs"]:
        assert sorted(ids) == list(range(N))  # every sample, once


@pytest.mark.every_torch
def test_consumers_joining_mid_epoch_get_every_sample_once_per_epoch_of_their_own(procs, name):
    """A whole-stream consumer holds the producer still at three points of
    the stream; a consumer joins at each (batch sizes 5, 7 and the loader's).
    Each gets the next batch the producer publishes and, from there, epochs
    of its own, each every sample once, values intact, in the producer's
    order; the whole-stream consumer's epochs are the loader's as ever."""
    tmp = procs.tmp
    procs.start("produce", name, "--samples", N, "--loader-batch", LOADER_BATCH, "--epochs", 6,
                "--shuffle", "--seed", 3)
    procs.start("consume", name, "--batch-size", 8, "--epochs", 6, "--check-values",
                "--ready", tmp / "w", "--ready-after", 10, "--hold-at", 10, "--until", tmp / "go0",
                out="whole.json")
    joiners = [("j1", ["--batch-size", 5, "--epochs", 3]),
               ("j2", ["--batch-size", 7, "--epochs", 2]),
               ("j3", ["--batch-size", 0, "--epochs", 2])]
    holding = tmp / "w"
    for k, (key, flags) in enumerate(joiners):
        eventually(holding.exists, f"the stream held still before {key} joins", 60)
        last = k == len(joiners) - 1
        hold = [] if last else ["--ready", tmp / key, "--ready-after", 9, "--hold-at", 9,
                                "--until", tmp / f"go{k + 1}"]
        proc = procs.start("consume", name, *flags, "--late-join", "now", "--check-values", *hold,
                           out=f"{key}.json")
        eventually(lambda: consumers_present(name, k + 2), f"{key} to join", 60, watch=(proc,))
        (tmp / f"go{k}").touch()  # the stream goes on: the newcomer gets its next batch
        holding = tmp / key
    procs.wait_all(timeout=120)

    whole = procs.result("whole.json")
    assert_whole_epochs(whole, 6)
    stream = stream_of(whole)
    offsets = []
    for key, flags in joiners:
        res = procs.result(f"{key}.json")
        epochs = flags[flags.index("--epochs") + 1]
        assert_whole_epochs(res, epochs)
        at = res["stats"]["joined_at"]
        assert 0 < at < N and at % LOADER_BATCH == 0, at  # joined mid-epoch, at a loader batch
        first_epoch = res["stats"]["epoch"] - epochs + 1
        start = first_epoch * N + at
        assert stream_of(res) == stream[start:start + epochs * N]  # the producer's order
        offsets.append((first_epoch, at))
        if key == "j2":  # its own batch size, within its own epochs
            assert all(s == [7] * (N // 7) + [N % 7] for s in res["sizes"])
    assert len(set(offsets)) == 3, offsets  # three different places in the stream


def test_a_seeded_loader_with_nobody_joining_late_is_the_dataloaders_own_order(procs, name):
    procs.start("produce", name, "--samples", N, "--loader-batch", LOADER_BATCH, "--epochs", 3,
                "--shuffle", "--seed", 11, "--workers", 2)
    procs.start("consume", name, "--batch-size", 0, "--epochs", 3, "--late-join", "now",
                out="c.json")
    procs.wait_all(timeout=120)
    loader = DataLoader(IdDataset(N), batch_size=LOADER_BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(11))
    expected = [[i for batch in loader for i in sample_ids(batch)] for _ in range(3)]
    res = procs.result("c.json")
    assert res["error"] is None, res["error"]
    assert res["epochs"] == expected


def test_a_group_joins_mid_epoch_and_its_ranks_split_epochs_of_their_own(procs, name):
    tmp = procs.tmp
    procs.start("produce", name, "--samples", N, "--loader-batch", LOADER_BATCH, "--epochs", 4,
                "--shuffle")
    procs.start("consume", name, "--batch-size", 8, "--epochs", 4, "--ready", tmp / "w",
                "--ready-after", 6, "--hold-at", 6, "--until", tmp / "go", out="whole.json")
    eventually((tmp / "w").exists, "the stream held still", 60)
    ranks = [procs.start("consume", name, "--group", "g", "--rank", r, "--world", 2, "--batch-size",
                         6, "--epochs", 2, "--late-join", "now", "--check-values", out=f"r{r}.json")
             for r in range(2)]
    eventually(lambda: consumers_present(name, 3), "both ranks to join", 60, watch=ranks)
    (tmp / "go").touch()
    procs.wait_all(timeout=120)
    whole = procs.result("whole.json")
    assert_whole_epochs(whole, 4)
    stream = stream_of(whole)
    results = [procs.result(f"r{r}.json") for r in range(2)]
    at = results[0]["stats"]["joined_at"]
    assert 0 < at < N and results[1]["stats"]["joined_at"] == at
    first_epoch = results[0]["stats"]["epoch"] - 1
    for e in range(2):
        own = stream[(first_epoch + e) * N + at:(first_epoch + e + 1) * N + at]
        assert sorted(own) == list(range(N))
        for r, res in enumerate(results):
            assert res["error"] is None, res["error"]
            # the group rule over the epoch of its own (positions into `own`)
            want = [[own[i] for i in b] for b in group_reference(N, 2, 6, r, False)]
            ids, got = res["epochs"][e], []
            for size in res["sizes"][e]:
                got.append(ids[:size])
                ids = ids[size:]
            assert got == want


def test_a_consumer_that_joined_mid_epoch_resumes_exactly(procs, name):
    """It joins mid-epoch, saves its state partway through its own epoch and
    stops while a keeper (joined with it) holds the rest (a small ring: the
    producer stays within that epoch of the stream); restored, it gets
    exactly the rest of that epoch of its own, then whole ones, as if it
    never stopped."""
    tmp = procs.tmp
    state = tmp / "state.json"
    procs.start("produce", name, "--samples", N, "--loader-batch", LOADER_BATCH, "--epochs", 4,
                "--shuffle", "--slots", 4)
    procs.start("consume", name, "--batch-size", 8, "--epochs", 4, "--ready", tmp / "w",
                "--ready-after", 5, "--hold-at", 5, "--until", tmp / "go0", out="whole.json")
    eventually((tmp / "w").exists, "the whole-stream consumer to hold", 60)
    eventually(lambda: published(name).get("waiting_for") == "consumers", "the producer to stall", 60)
    # Both join where the stream stands still: the same place.
    first = procs.start("consume", name, "--batch-size", 6, "--epochs", 2, "--late-join", "now",
                        "--save-after", 180, "--save-state", state, out="first.json")
    keeper = procs.start("consume", name, "--batch-size", 6, "--epochs", 3, "--late-join", "now",
                         "--hold-at", 30, "--until", tmp / "go1", out="keeper.json")
    eventually(lambda: consumers_present(name, 3), "both to join", 60, watch=(first, keeper))
    (tmp / "go0").touch()
    first.wait(60)
    procs.procs.remove(first)
    saved = json.loads(state.read_text())
    assert saved["joined_at"] > 0 and saved["position"] == 180, saved
    again = procs.start("consume", name, "--batch-size", 6, "--epochs", 2, "--state", state,
                        "--late-join", "now", "--record-warnings", "--ready", tmp / "again",
                        out="again.json")
    eventually((tmp / "again").exists, "the restored trial to join", 60, watch=(again,))
    (tmp / "go1").touch()  # the keeper lets go of the batches from position 174 on
    procs.wait_all(timeout=120)
    stream = stream_of(procs.result("whole.json"))
    before = procs.result("first.json")
    res = procs.result("again.json")
    assert res["error"] is None, res["error"]
    assert res["stats"]["resumed"] == "exact" and res["warnings"] == []
    assert res["stats"]["joined_at"] == saved["joined_at"]
    start = saved["epoch"] * N + saved["joined_at"]
    assert stream_of(before) == stream[start:start + 180]
    assert stream_of(res) == stream[start + 180:start + 2 * N]
    assert sorted(stream_of(before) + res["epochs"][0]) == list(range(N))
    assert sorted(res["epochs"][1]) == list(range(N))
    assert stream_of(procs.result("keeper.json"))[:3 * N] == stream[start:start + 3 * N]


# ---- in one process --------------------------------------------------------------


class Gate:
    """Lets a loader yield only as many batches as the test has allowed."""

    def __init__(self) -> None:
        self.allowed = threading.Semaphore(0)

    def let(self, batches: int) -> None:
        for _ in range(batches):
            self.allowed.release()


class GatedStream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(40):
            if i % 4 == 0:
                self.gate.allowed.acquire()
            yield i


def announced(producer: bc.Producer, batches: int) -> None:
    eventually(lambda: producer.stats()["batches_published"] >= batches and all(
        c["batches_sent"] >= batches - 1 for c in producer.stats()["consumers"] if c["first_epoch"] == 0),
        f"{batches} batches published")


def test_an_iterable_dataset_falls_back_to_the_next_epoch_and_says_so_once(runtime_dir, caplog):
    caplog.set_level(logging.INFO, logger="batchcast")
    gate = Gate()
    producer = bc.Producer(DataLoader(GatedStream(gate), batch_size=4), "stream", epochs=2).start()
    results: dict[str, object] = {}

    def train(key: str, consumer: bc.Consumer, epochs: int) -> None:
        results[key] = [sorted(int(i) for b in consumer for i in b) for _ in range(epochs)]
        results[key + "-at"] = (consumer.stats()["joined_at"], consumer.stats()["epoch"])
        consumer.close()

    first = threading.Thread(target=train, args=("first", bc.Consumer("stream", batch_size=4), 2))
    first.start()
    gate.let(3)
    announced(producer, 3)
    late = [threading.Thread(target=train, args=(k, bc.Consumer("stream", batch_size=4), 1))
            for k in ("late1", "late2")]
    for t in late:
        t.start()
    eventually(lambda: producer.consumers == 3, "the late consumers to join")
    gate.let(100)
    for t in [first, *late]:
        t.join(30)
    producer.stop()
    every = list(range(40))
    assert results["first"] == [every, every]
    assert results["late1"] == results["late2"] == [every]
    assert results["late1-at"] == results["late2-at"] == (0, 1)  # epoch 1, from its start
    said = [r for r in caplog.records if "cannot start consumers mid-epoch" in r.getMessage()]
    assert len(said) == 1 and "IterableDataset" in said[0].getMessage(), caplog.text


class Counting(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n, self.loaded = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.loaded += 1
        return i


def test_with_nobody_left_mid_epoch_the_loader_is_not_asked_for_more(runtime_dir):
    """epochs=None: the last consumer leaves mid-epoch, and the producer stops
    asking its loader for batches until someone comes; the newcomer gets the
    next batch, and its epoch is whole."""
    data = Counting(40)
    # (two slots: the producer is never more than a few batches ahead of `first`)
    producer = bc.Producer(DataLoader(data, batch_size=4, shuffle=True), "idle", epochs=None,
                           slots=2).start()
    first = bc.Consumer("idle", batch_size=4)
    batches = iter(first)
    taken = [int(i) for _ in range(3) for i in next(batches)]
    first.close()
    eventually(lambda: producer.stats()["waiting_for"] == "joins", "the producer to wait")
    stopped_at = producer.stats()["samples_published"]
    assert 12 <= stopped_at < 40  # mid-epoch
    assert data.loaded == stopped_at  # nothing loaded for nobody
    late = bc.Consumer("idle", batch_size=4)
    epoch = [int(i) for b in late for i in b]
    assert late.stats()["joined_at"] == stopped_at  # where the loader stopped
    assert sorted(epoch) == list(range(40))
    assert set(taken) <= set(range(40))
    late.close()
    producer.stop()


def test_a_late_joiner_of_a_finite_producer_gets_its_whole_epochs_then_exhausted(runtime_dir):
    # (two slots: the producer is never more than a few batches ahead of `first`)
    producer = bc.Producer(DataLoader(list(range(40)), batch_size=4, shuffle=True), "finite",
                           epochs=3, slots=2).start()
    first = bc.Consumer("finite", batch_size=4)
    batches = iter(first)
    head = [int(i) for _ in range(4) for i in next(batches)]
    late = bc.Consumer("finite", batch_size=5)
    results: dict[str, object] = {}

    def train_late() -> None:
        try:
            results["own"] = [sorted(int(i) for b in late for i in b) for _ in range(2)]
            results["at"] = late.stats()["joined_at"]
            list(late)  # a third would end past the producer's last epoch
        except Exception as exc:  # noqa: BLE001 (asserted below)
            results["error"] = exc

    thread = threading.Thread(target=train_late)
    thread.start()
    rest = [int(i) for b in batches for i in b]
    assert sorted(head + rest) == list(range(40))
    for _ in range(2):
        assert sorted(int(i) for b in first for i in b) == list(range(40))
    thread.join(30)
    assert not thread.is_alive()
    assert 16 <= results["at"] < 40  # type: ignore[operator]
    assert results["own"] == [list(range(40))] * 2  # epochs of its own from epochs 0 and 1
    assert isinstance(results["error"], bc.EpochsExhausted), results["error"]
    assert "served every epoch" in str(results["error"])
    first.close()
    late.close()
    producer.stop()


def test_a_resume_against_a_restarted_producer_is_not_quietly_wrong(runtime_dir):
    """A state saved mid-epoch, the producer restarted over an unseeded
    shuffling loader: the new run cannot give the rest of the old run's
    epoch, so the resumed consumer is told (a ResumeWarning naming the
    restart, resumed == "next-pass"), not handed the new order's positions
    as if exact (before the state named the run: 13 of 64 samples twice, 13
    missing, silently)."""
    def loader():
        return DataLoader(torch.arange(64), batch_size=8, shuffle=True)

    first = bc.Producer(loader(), "restarted", epochs=1, linger=0.1)
    first.start()
    with bc.Consumer("restarted", 8, join="next_epoch") as consumer:
        batches = iter(consumer)
        seen = [int(i) for _ in range(3) for i in next(batches)]
        state = consumer.state_dict()
    first.stop()
    second = bc.Producer(loader(), "restarted", epochs=1, linger=0.1)
    second.start()
    try:
        with pytest.warns(bc.ResumeWarning, match="another run of the producer"):
            with bc.Consumer("restarted", 8, state=state, join="next_epoch") as resumed:
                rest = [int(i) for batch in resumed for i in batch]
                assert resumed.stats()["resumed"] == "next-pass"
    finally:
        second.stop()
    assert len(seen) == 24 and len(rest) == 40  # the same positions of the new run's pass, told


def test_a_state_saved_between_epochs_resumes_a_restarted_producer_exactly(runtime_dir):
    """Between epochs nothing of an epoch was taken: against a restarted
    producer the state resumes with its next epoch, whole (every sample
    once), exactly and without a warning."""
    def loader():
        return DataLoader(torch.arange(64), batch_size=8, shuffle=True)

    first = bc.Producer(loader(), "restarted-between", epochs=2, linger=0.1)
    first.start()
    with bc.Consumer("restarted-between", 8, join="next_epoch") as consumer:
        assert sorted(int(i) for batch in consumer for i in batch) == list(range(64))
        state = consumer.state_dict()
    first.stop()
    assert state["epoch"] == 1 and state["position"] == 0
    second = bc.Producer(loader(), "restarted-between", epochs=1, linger=0.1)
    second.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", bc.ResumeWarning)
            with bc.Consumer("restarted-between", 8, state=state, join="next_epoch") as resumed:
                assert resumed.stats()["resumed"] == "exact"
                epoch = [int(i) for batch in resumed for i in batch]
    finally:
        second.stop()
    assert sorted(epoch) == list(range(64))
