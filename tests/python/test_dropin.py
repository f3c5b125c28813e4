"""A Consumer where a DataLoader was: the attributes training code reads of
a DataLoader, len() for any loader with a length, and a notebook's way of
serving (join(), a cell run again). Producer on a background thread."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import batchcast as bc


def id_loader(n: int = 50, b: int = 8) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n)), batch_size=b)


@pytest.mark.parametrize("batch_size, drop_last", [(7, False), (7, True), (None, False)])
def test_the_dataloader_attributes_training_code_reads_are_true_for_a_consumer(
        runtime_dir, name, batch_size, drop_last):
    with bc.Producer(id_loader(50, 8), name, epochs=1):
        with bc.Consumer(name, batch_size=batch_size, drop_last=drop_last, timeout=10) as c:
            batches = 50 // 7 if drop_last else math.ceil(50 / 7) if batch_size else math.ceil(50 / 8)
            assert len(c) == batches
            assert len(c.dataset) == 50 and len(c.sampler) == 50
            assert len(c.batch_sampler) == batches
            assert c.batch_sampler.batch_size == batch_size and c.batch_sampler.drop_last == drop_last
            assert c.batch_size == batch_size and c.drop_last == drop_last
            assert (c.num_workers, c.collate_fn, c.pin_memory, c.generator, c.persistent_workers,
                    c.prefetch_factor) == (0, None, False, None, False, None)
            c.sampler.set_epoch(3)  # what a DDP script calls each epoch: accepted, nothing changes
            with pytest.raises(TypeError, match="has no samples to index"):
                c.dataset[0]
            with pytest.raises(TypeError, match="no sampler to iterate"):
                iter(c.sampler)
            assert sum(len(x[0]) for x in c) == (50 // 7 * 7 if drop_last else 50)


def test_a_group_ranks_sampler_is_its_part_of_the_epoch(runtime_dir, name):
    import threading

    with bc.Producer(id_loader(50, 8), name, epochs=1):
        ranks = [bc.Consumer(name, batch_size=4, timeout=10, group=bc.Group("g", r, 3))
                 for r in range(3)]
        # Windows of 12: four whole ones (16 samples each rank), then 2 left
        # padded to 3 and split: 1 each.
        assert [len(r.sampler) for r in ranks] == [17] * 3
        assert all(len(r.dataset) == 50 for r in ranks)
        got = {}
        threads = [threading.Thread(target=lambda r=r: got.setdefault(r.rank, sum(len(x[0]) for x in r)))
                   for r in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert got == {0: 17, 1: 17, 2: 17}
        for r in ranks:
            r.close()


def test_len_is_known_for_a_list_of_batches(runtime_dir, name):
    batches = [(torch.arange(k * 5, k * 5 + 5),) for k in range(6)] + [(torch.arange(30, 33),)]
    with bc.Producer(batches, name, epochs=1):
        with bc.Consumer(name, batch_size=4, timeout=10) as c:
            assert len(c.dataset) == 33 and len(c) == 9
            assert [len(b[0]) for b in c] == [4] * 8 + [1]


def test_a_sized_loader_that_cannot_say_its_samples_names_the_fix(runtime_dir, name):
    class Sized:
        def __len__(self):
            return 3

        def __iter__(self):
            for k in range(3):
                yield (torch.arange(k * 4, k * 4 + 4),)

    with bc.Producer(Sized(), name, epochs=2):
        with bc.Consumer(name, batch_size=3, timeout=10) as c:
            with pytest.raises(TypeError, match=r"samples_per_epoch=.*--samples-per-epoch"):
                len(c)
            list(c)
            assert len(c) == 4  # known once an epoch ended
    with bc.Producer(Sized(), name, epochs=1, samples_per_epoch=12):
        with bc.Consumer(name, batch_size=3, timeout=10) as c:
            assert len(c) == 4


def test_join_waits_for_a_background_producer_and_raises_its_loaders_error(runtime_dir, name):
    producer = bc.Producer(id_loader(20, 4), name, epochs=1).start()
    with bc.Consumer(name, batch_size=5, timeout=10) as c:
        assert sum(len(x[0]) for x in c) == 20
    assert producer.join(30) is True
    assert not producer.serving
    assert producer.join() is True  # and again: nothing left to wait for

    def broken():
        yield (torch.arange(4),)
        raise ValueError("sample 4 is corrupt")

    class Broken:
        def __iter__(self):
            return broken()

    producer = bc.Producer(Broken(), name, epochs=1).start()
    with bc.Consumer(name, timeout=10) as c:
        with pytest.raises(bc.LoaderError):
            list(c)
    with pytest.raises(ValueError, match="sample 4 is corrupt"):
        producer.wait(30)
    with pytest.raises(RuntimeError, match="was not started"):
        bc.Producer(id_loader(), name + "x", epochs=1).join()


def test_a_cell_run_again_replaces_its_producer_and_a_script_is_told_what_to_run(
        runtime_dir, name, monkeypatch, caplog):
    import batchcast.producer as producer_module

    first = bc.Producer(id_loader(), name, epochs=None).start()
    with pytest.raises(bc.NameInUse, match=rf"already running in this process .*stop it first "
                       r"\(producer.stop\(\)\)"):
        bc.Producer(id_loader(), name, epochs=None)
    monkeypatch.setattr(producer_module, "_interactive", lambda: True)
    second = bc.Producer(id_loader(), name, epochs=1).start()  # the same cell, run again
    assert "replaces the one of that name" in caplog.text
    assert not first.serving
    with bc.Consumer(name, batch_size=10, timeout=10) as c:
        assert sum(len(x[0]) for x in c) == 50
    assert second.join(30)


def test_a_one_cycle_schedule_sized_from_len_takes_exactly_its_steps(runtime_dir, name):
    epochs = 3
    with bc.Producer(id_loader(50, 8), name, epochs=epochs):
        with bc.Consumer(name, batch_size=7, timeout=10) as loader:
            model = torch.nn.Linear(1, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=epochs * len(loader))
            seen = []
            for _ in range(epochs):
                ids = []
                for (x,) in loader:
                    opt.step()
                    sched.step()  # one step too many would raise ValueError
                    ids += x.tolist()
                seen.append(ids)
    assert seen == [list(range(50))] * epochs
    assert sched.last_epoch == epochs * math.ceil(50 / 7)
