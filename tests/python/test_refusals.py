"""Ordinary code that would get wrong or missing data gets the data right or
a clear error, never an empty epoch with a warning: a producer stopped
before serving a consumer, more epochs asked than served, a peek before
training, a loader that can be iterated once, empty batches, numpy arrays,
absurd sizes. (A producer on a background thread, consumers in this process.)"""

from __future__ import annotations

import os
import threading
import warnings

import pytest
import torch
from conftest import eventually

import batchcast as bc
from batchcast._core import _C


class Ids:
    """A re-iterable loader of `n` sample ids in batches of `b` (ids, ids * 10);
    with a gate, epoch `pause_at[0]` pauses before its batch `pause_at[1]`
    until the gate is set."""

    def __init__(self, n: int, b: int, gate: threading.Event | None = None,
                 pause_at: tuple[int, int] = (-1, -1)):
        self.n, self.b, self.gate, self.pause_at = n, b, gate, pause_at
        self.iters = 0

    def __len__(self) -> int:
        return -(-self.n // self.b)

    def __iter__(self):
        epoch = self.iters
        self.iters += 1
        for k, start in enumerate(range(0, self.n, self.b)):
            if (epoch, k) == self.pause_at and self.gate is not None:
                self.gate.wait(30)
            ids = torch.arange(start, min(self.n, start + self.b))
            yield ids, ids * 10


def epoch_ids(consumer) -> list[int]:
    out = []
    for ids, tens in consumer:
        assert torch.equal(tens, ids * 10)
        out += ids.tolist()
    return out


@pytest.fixture(autouse=True)
def no_quiet_warnings():
    """A warning here would be a quiet difference: every test runs with them as errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ---- 2: a producer stopped before it served a consumer ----------------------------

def test_a_consumer_of_a_producer_stopped_before_serving_it_gets_producer_lost(runtime_dir, name):
    # The producer waits for two consumers; only one comes, and it is stopped.
    producer = bc.Producer(Ids(40, 4), name, epochs=None, min_consumers=2).start()
    consumer = bc.Consumer(name, batch_size=4, timeout=10)
    eventually(lambda: producer.consumers == 1 and consumer.stats()["mailbox"],
               "the consumer to join and open its mailbox")
    producer.stop()
    with pytest.raises(bc.ProducerLost, match=rf"batchcast producer '{name}' was stopped before it "
                       r"served epoch 0 to this consumer \(it served no epoch in full; this "
                       r"consumer was handed no epoch whole\)"):
        list(consumer)
    with pytest.raises(bc.ProducerLost, match="was stopped before"):
        list(consumer)  # and again, for every later epoch
    consumer.close()


def test_a_producer_stopped_between_epochs_is_producer_lost_for_the_next_one(runtime_dir, name):
    gate = threading.Event()
    loader = Ids(12, 4, gate, pause_at=(1, 1))  # epoch 1 pauses after its first batch ...
    producer = bc.Producer(loader, name, epochs=None).start()
    consumer = bc.Consumer(name, batch_size=4, timeout=10)
    assert epoch_ids(consumer) == list(range(12))
    eventually(lambda: producer.stats()["batches_published"] == 4, "epoch 1's first batch")
    stopping = threading.Thread(target=producer.stop)  # ... and is stopped there
    stopping.start()
    eventually(lambda: producer._stop.is_set(), "the stop to be asked for")
    gate.set()  # the loader goes on; the producer publishes nothing more
    stopping.join(30)
    with pytest.raises(bc.ProducerLost, match=r"stopped before (the end of epoch 1|it served epoch 1)"):
        epoch_ids(consumer)
    consumer.close()


# ---- 3: more epochs than the producer serves --------------------------------------

def test_asking_for_more_epochs_than_served_is_an_error_naming_the_fix(runtime_dir, name):
    with bc.Producer(Ids(10, 4), name, epochs=2):
        with bc.Consumer(name, batch_size=3, timeout=10) as consumer:
            for _ in range(2):
                assert epoch_ids(consumer) == list(range(10))
            with pytest.raises(bc.EpochsExhausted) as error:
                epoch_ids(consumer)
    message = str(error.value)
    assert f"batchcast producer '{name}' has served every epoch it was asked to (epochs 0 to 1)" \
        in message
    assert "asked for epoch 2 (this consumer started at epoch 0 and was handed 2 epochs" in message
    assert "epochs=None" in message and "past_last_epoch='empty'" in message


def test_a_late_joiner_is_told_where_it_joined(runtime_dir, name):
    gate = threading.Event()
    with bc.Producer(Ids(12, 4, gate, pause_at=(0, 2)), name, epochs=2) as producer:
        first = bc.Consumer(name, batch_size=4, timeout=10)
        eventually(lambda: producer.stats()["batches_published"] >= 2, "epoch 0 to be under way")
        late = bc.Consumer(name, batch_size=4, timeout=10)  # mid-epoch 0: starts at epoch 1
        gate.set()
        done = threading.Thread(target=lambda: [epoch_ids(first) for _ in range(2)])
        done.start()
        assert epoch_ids(late) == list(range(12))
        with pytest.raises(bc.EpochsExhausted, match=r"asked for epoch 2 \(this consumer started "
                           r"at epoch 1 and was handed 1 epoch to its end\)"):
            epoch_ids(late)
        done.join(30)
        first.close()
        late.close()


def test_an_empty_epoch_past_the_last_is_there_for_code_that_asks_for_it(runtime_dir, name):
    with bc.Producer(Ids(10, 4), name, epochs=1):
        with bc.Consumer(name, batch_size=4, timeout=10, join=bc.Join(past_last_epoch="empty")) as consumer:
            assert epoch_ids(consumer) == list(range(10))
            assert epoch_ids(consumer) == []  # no warning either (they are errors here)
            assert epoch_ids(consumer) == []
            assert consumer.stats()["batches"] == 3


def test_past_last_epoch_must_be_raise_or_empty(runtime_dir, name):
    with pytest.raises(ValueError, match="Join's past_last_epoch must be 'raise' or 'empty', not 'stop'"):
        bc.Consumer(name, join=bc.Join(past_last_epoch="stop"))


# ---- 4: a peek does not eat an epoch ----------------------------------------------

@pytest.mark.parametrize("batch_size", [4, 6, None])
def test_a_peek_before_training_leaves_every_epoch_whole(runtime_dir, name, batch_size):
    epochs = 3
    with bc.Producer(Ids(40, 4), name, epochs=epochs):
        with bc.Consumer(name, batch_size=batch_size, timeout=10) as loader:
            ids, tens = next(iter(loader))  # to infer shapes, as many scripts do
            assert ids.tolist() == list(range(batch_size or 4))
            for _ in range(epochs):
                assert epoch_ids(loader) == list(range(40))  # the peeked samples included
            with pytest.raises(bc.EpochsExhausted):
                epoch_ids(loader)


def test_a_peek_kept_while_training_stays_valid(runtime_dir, name):
    with bc.Producer(Ids(40, 4), name, epochs=2):
        with bc.Consumer(name, batch_size=8, timeout=10) as loader:
            peeked, _ = next(iter(loader))
            for _ in range(2):
                assert epoch_ids(loader) == list(range(40))
            assert peeked.tolist() == list(range(8))  # its memory was never reused


def test_leaving_later_epochs_after_one_batch_goes_on_to_the_next_epoch(runtime_dir, name):
    # Only the first epoch's first batch is a peek; a loop that takes one batch
    # per epoch (a smoke test, limit_train_batches=1) after that gets a new
    # epoch each time, as from a DataLoader.
    with bc.Producer(Ids(40, 4), name, epochs=5):
        with bc.Consumer(name, batch_size=4, timeout=10) as loader:
            firsts = []
            for _ in range(4):
                for ids, _ in loader:
                    firsts.append(ids.tolist())
                    break
            # The peek restarts epoch 0 once; then one batch of epochs 1 and 2.
            assert firsts == [[0, 1, 2, 3]] * 4
            assert loader.stats()["epoch"] == 2
            assert epoch_ids(loader) == list(range(40))  # epoch 3, whole
            assert loader.stats()["epoch"] == 3


def test_a_second_iterator_before_any_batch_is_the_same_epoch(runtime_dir, name):
    with bc.Producer(Ids(20, 4), name, epochs=1):
        with bc.Consumer(name, batch_size=4, timeout=10) as loader:
            iter(loader)  # made and dropped before taking anything
            assert epoch_ids(loader) == list(range(20))


# ---- 5: a loader that can be iterated only once ------------------------------------

def test_a_generator_served_for_two_epochs_is_a_loader_error_at_the_second(runtime_dir, name):
    batches = ((torch.arange(4 * k, 4 * k + 4),) for k in range(5))
    producer = bc.Producer(batches, name, epochs=2).start()
    with bc.Consumer(name, timeout=10) as consumer:
        assert sum((b[0].tolist() for b in consumer), []) == list(range(20))
        with pytest.raises(bc.LoaderError, match=rf"batchcast producer '{name}' cannot serve what "
                           r"its loader yielded in epoch 1: the loader yielded no batch in epoch 1, "
                           r"after 5 in the epochs before: a generator \(or any other iterator\) "
                           r"can be iterated only once"):
            list(consumer)
    with pytest.raises(bc.LoaderError, match="can be iterated only once"):
        producer.stop()


# ---- 8: smaller quiet differences --------------------------------------------------

def test_an_empty_loader_batch_is_delivered_as_the_loader_yields_it(runtime_dir, name):
    batches = [torch.zeros(0, 3), torch.ones(2, 3), torch.zeros(0, 3)]
    with bc.Producer(batches, name, epochs=1):
        with bc.Consumer(name, timeout=10) as consumer:
            assert len(consumer) == 3
            assert [tuple(b.shape) for b in consumer] == [(0, 3), (2, 3), (0, 3)]
    with bc.Producer(batches, name + "r", epochs=1):
        with bc.Consumer(name + "r", batch_size=1, timeout=10) as consumer:  # rebatched: samples
            assert [tuple(b.shape) for b in consumer] == [(1, 3), (1, 3)]


def test_numpy_arrays_in_a_batch_are_refused_saying_how_to_convert(runtime_dir, name):
    np = pytest.importorskip("numpy")
    producer = bc.Producer([(np.zeros((2, 3)), np.ones(2))], name, epochs=1).start()
    with bc.Consumer(name, timeout=10) as consumer:
        with pytest.raises(bc.LoaderError, match=r"cannot serve what its loader yielded in epoch 0: "
                           r"loader batch 0: .*numpy array.*torch.from_numpy"):
            list(consumer)
    with pytest.raises(bc.LoaderError, match="torch.from_numpy"):
        producer.stop()
    producer = bc.Producer([(torch.zeros(2, 3), np.ones(2))], name + "b", epochs=1).start()
    with bc.Consumer(name + "b", timeout=10) as consumer:
        with pytest.raises(bc.LoaderError, match=r"numpy.ndarray at batch\[1\].*torch.from_numpy"):
            list(consumer)
    with pytest.raises(bc.LoaderError):
        producer.stop()


@pytest.mark.parametrize("size", [2**63, 2**64, -1, 0, 1.5, True])
def test_an_absurd_batch_size_is_a_value_error(runtime_dir, name, size):
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        bc.Consumer(name, batch_size=size)


# ---- 7: batches that grow -----------------------------------------------------------

class Growing:
    """Batches whose sizes vary between a quarter of and 4x the first batch's
    bytes (a random walk, seeded): by the number of samples (`rows`, batches
    of 16 +- ), or by the padded length of each sample (`length`)."""

    def __init__(self, how: str, batches: int = 60, seed: int = 0, most: float = 4.0):
        import random

        rng = random.Random(seed)
        self.how = how
        self.sizes = [16] + [max(4, min(int(16 * most), int(16 * rng.uniform(0.25, most))))
                             for _ in range(batches - 1)]
        self.sizes[rng.randrange(1, batches)] = int(16 * most)  # the largest allowed, once

    def __iter__(self):
        start = 0
        for size in self.sizes:
            if self.how == "rows":  # size samples of 4 KiB
                ids = torch.arange(start, start + size)
                yield ids, ids.view(-1, 1).repeat(1, 1024).int()
                start += size
            else:  # 16 samples, each `size` * 256 ints long (padding)
                ids = torch.arange(start, start + 16)
                yield ids, ids.view(-1, 1).repeat(1, size * 256).int()
                start += 16


@pytest.mark.parametrize("how", ["rows", "length"])
def test_batches_up_to_four_times_the_first_just_work(runtime_dir, name, how):
    loader = Growing(how)
    total = sum(loader.sizes) if how == "rows" else 16 * len(loader.sizes)
    sizes = [None, 7] if how == "rows" else [None]  # rebatching needs one sample shape
    with bc.Producer(loader, name, epochs=2, slots=4, min_consumers=len(sizes)) as producer:
        consumers = [bc.Consumer(name, batch_size=b, timeout=10) for b in sizes]
        got = {id(c): [] for c in consumers}

        def take(c):
            for _ in range(2):
                seen = []
                for ids, rows in c:
                    assert torch.equal(rows[:, 0].long(), ids) and torch.equal(rows[:, -1].long(), ids)
                    seen += ids.tolist()
                got[id(c)].append(seen)

        threads = [threading.Thread(target=take, args=(c,)) for c in consumers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for c in consumers:
            assert got[id(c)] == [list(range(total))] * 2
            c.close()
        stats = producer.stats()
    assert stats["batches_published"] == 2 * len(loader.sizes)


def test_a_batch_beyond_what_the_ring_takes_is_an_error_naming_its_size_and_ring_bytes(runtime_dir, name):
    def batches(last):
        return [torch.ones(8, 32768), torch.ones(8, 32768 * 2), torch.ones(8, int(32768 * last))]

    producer = bc.Producer(batches(5), name, epochs=1).start()
    with bc.Consumer(name, timeout=10) as consumer:
        with pytest.raises(bc.LoaderError) as error:
            list(consumer)
    with pytest.raises(bc.LoaderError):
        producer.stop()
    message = str(error.value)
    assert "loader batch 2: its tensor 0 of shape [8, 163840] float32 holds 5.00 MiB, 5.0x that " \
           "tensor of the first batch (1.00 MiB)" in message
    assert "takes batches up to 4.0x it" in message
    ring_bytes = int(message.split("ring_bytes=")[1].split(" ")[0])
    assert f"batchcast serve --ring-bytes {ring_bytes}" in message
    # What it says to pass is enough.
    with bc.Producer(batches(5), name, epochs=1, ring_bytes=ring_bytes):
        with bc.Consumer(name, timeout=10) as consumer:
            assert [b.shape[1] for b in consumer] == [32768, 65536, 163840]



def test_every_dtype_the_core_lists_is_a_torch_dtype_that_arrives_as_its_values(runtime_dir, name):
    # The core's one table of dtypes (wire, torch and DLPack take theirs from
    # it): each name is torch's, and a tensor of it arrives with its dtype
    # and values, through the producer and a rebatching consumer.
    names = _C.dtypes()
    assert len(names) == len(set(names)) == 15 and names[0] == "uint8"
    dtypes = [getattr(torch, n) for n in names]
    assert all(isinstance(d, torch.dtype) for d in dtypes)
    g = torch.Generator().manual_seed(11)
    rows = {n: (torch.randn(8, 3, generator=g, dtype=torch.float64) * 50).abs().to(d) for n, d in zip(names, dtypes)}
    batches = [{n: r[i:i + 4] for n, r in rows.items()} for i in (0, 4)]
    with bc.Producer(batches, name, epochs=1):
        with bc.Consumer(name, batch_size=8, timeout=10) as consumer:
            got = [{n: t.clone() for n, t in b.items()} for b in consumer]
    assert len(got) == 1
    for n, r in rows.items():
        # compared as bytes: torch.equal does not take every dtype on the CPU
        assert got[0][n].dtype == r.dtype and torch.equal(got[0][n].view(torch.uint8), r.view(torch.uint8)), n


def test_a_tensor_of_a_dtype_batchcast_cannot_share_is_an_error_naming_it_and_the_fix(runtime_dir, name):
    # float8 tensors have no place on the wire: the producer says which dtype
    # it was, which it shares, and how to keep its bytes.
    ok = torch.arange(4)
    odd = torch.zeros(4, 3).to(torch.float8_e4m3fn)
    producer = bc.Producer([(ok, odd)], name, epochs=1).start()
    with bc.Consumer(name, timeout=10) as consumer:
        with pytest.raises(bc.LoaderError) as error:
            list(consumer)
    with pytest.raises(bc.LoaderError):
        producer.stop()
    message = str(error.value)
    assert "loader batch 0: batchcast cannot share this tensor (torch.float8_e4m3fn on cpu)" in message
    shared = ", ".join(_C.dtypes())
    assert f"batchcast shares tensors of dtype {shared}, on the CPU or a CUDA GPU" in message
    assert "tensor.view(torch.uint8) keeps its bytes" in message
    # ... which works: the same samples, as bytes.
    with bc.Producer([(ok, odd.view(torch.uint8))], name, epochs=1):
        with bc.Consumer(name, timeout=10) as consumer:
            (ids, raw), = list(consumer)
    assert torch.equal(ids, ok) and torch.equal(raw.view(torch.float8_e4m3fn).float(), odd.float())


# ---- a waiting consumer says what it waits for --------------------------------------

def test_a_consumer_waiting_for_min_consumers_says_so_and_status_shows_it(runtime_dir, name, caplog):
    import logging

    from batchcast._status_text import status_block as _status_block
    from batchcast.status import list_producers

    caplog.set_level(logging.INFO, logger="batchcast")
    with bc.Producer(Ids(12, 4), name, epochs=1, min_consumers=3) as producer:
        first = bc.Consumer(name, timeout=10)
        second = bc.Consumer(name, timeout=10)
        got = []
        waiting = threading.Thread(target=lambda: got.append(epoch_ids(second)))
        waiting.start()
        said = "waits for the producer to begin: it waits for 3 consumers before it loads " \
               "anything (min_consumers), and 2 were present when this one joined"
        eventually(lambda: said in caplog.text, "the waiting consumer to say why")
        assert caplog.text.count(said) == 1
        (listing,) = [p for p in list_producers() if p["name"] == name]
        assert listing["status"]["waiting_for"] == "joins"
        assert listing["status"]["consumers_wanted"] == 3
        lines, _ = _status_block(listing)
        assert "  waiting for 3 consumers to join before loading (min_consumers; 2 present)" in lines
        third = bc.Consumer(name, timeout=10)
        done = [threading.Thread(target=epoch_ids, args=(c,)) for c in (first, third)]
        for t in done:
            t.start()
        waiting.join(30)
        for t in done:
            t.join(30)
        assert got == [list(range(12))]
        assert producer.stats()["waiting_for"] != "joins"
        for c in (first, second, third):
            c.close()


def test_a_late_joiner_says_it_waits_for_the_next_epoch(runtime_dir, name, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="batchcast")
    gate = threading.Event()
    with bc.Producer(Ids(12, 4, gate, pause_at=(0, 2)), name, epochs=2) as producer:
        first = bc.Consumer(name, batch_size=4, timeout=10)
        eventually(lambda: producer.stats()["batches_published"] >= 2, "epoch 0 to be under way")
        late = bc.Consumer(name, batch_size=4, timeout=10, join="next_epoch")
        got = []
        waiting = threading.Thread(target=lambda: got.append(epoch_ids(late)))
        waiting.start()
        eventually(lambda: "waits for epoch 1 to begin: it joined while the producer served epoch 0"
                   in caplog.text, "the late consumer to say why it waits")
        gate.set()
        for _ in range(2):
            epoch_ids(first)
        waiting.join(30)
        assert got == [list(range(12))]
        first.close()
        late.close()


def test_status_says_live_whom_the_producer_waits_for_and_what_each_trainer_does(runtime_dir, name):
    from batchcast._status_text import consumer_now as _consumer_now, status_block as _status_block
    from batchcast.status import list_producers

    with bc.Producer(Ids(4000, 4), name, epochs=1, slots=2, min_consumers=2) as producer:
        slow = bc.Consumer(name, batch_size=4, timeout=10)
        fast = bc.Consumer(name, batch_size=8, timeout=10)
        it = iter(slow)
        next(it)  # takes one batch, then computes for as long as the test likes
        done = threading.Event()

        def take():
            try:
                for _ in fast:
                    pass
            except bc.Error:
                pass
            done.set()

        threading.Thread(target=take, daemon=True).start()

        def stalled():
            (listing,) = [p for p in list_producers() if p["name"] == name]
            status = listing["status"]
            return status if status["waiting_for"] == "consumers" and any(
                c["holding_up"] for c in status["consumers"]) else None

        status = eventually(stalled, "the producer waiting for the slow consumer")
        now = {c["batch_size"]: _consumer_now(c, status) for c in status["consumers"]}
        assert now == {4: "computing; the producer waits for it",
                       8: "waiting: ring full (a slower consumer)"}, now
        lines, _ = _status_block({"name": name, "status": status})
        assert any(line.startswith("  now: waiting ") and f"for consumer pid {os.getpid()} to free ring "
                   "space" in line for line in lines), lines
        slow.close()
        assert done.wait(60)
        fast.close()
