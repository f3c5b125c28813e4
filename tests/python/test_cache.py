"""The producer's decoded cache (Producer(cache=...)): the loader decodes each
sample once per sweep, and the batches made from the cache are bit for bit
the ones the loader would have made in the same order — whatever the
consumers' batch sizes, joins, resumes and groups."""

from __future__ import annotations

import collections
import json
import logging
import os
import random
import struct
import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import batchcast as bc


class Decoded(Dataset):
    """A deterministic "decoder": sample i's values are made from i. Counts
    how often each sample is decoded (the loader runs in this process)."""

    def __init__(self, n: int, shape=(3, 4), random_part: bool = False, varying: bool = False, salt: int = 0):
        self.n, self.shape, self.random_part, self.varying = n, shape, random_part, varying
        self.salt = salt  # another salt: other data of the same length and kind
        self.calls: collections.Counter[int] = collections.Counter()
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        with self.lock:
            self.calls[i] += 1
        g = torch.Generator().manual_seed(1000 + i + 100_003 * self.salt)
        image = torch.randint(0, 255, self.shape, generator=g, dtype=torch.uint8)
        if self.random_part:  # an augmentation left in the producer: another draw every call
            image = image ^ torch.randint(0, 255, self.shape, dtype=torch.uint8)
        length = 2 + i % 3 if self.varying else 4
        return {"image": image, "embedding": torch.full((length,), i / 7, dtype=torch.float32),
                "label": i % 10, "name": f"sample-{i}"}


def loader_of(dataset, batch_size=8, seed=5, **kwargs):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(seed), **kwargs)


def served(dataset, name, epochs, cache=None, batch_size=8, consumer_batch=None, seed=5, **loader_kwargs):
    """Every epoch one consumer got: [(names, labels, images, embeddings, indices)] per batch."""
    loader = loader_of(dataset, batch_size, seed, **loader_kwargs)
    got = []
    with bc.Producer(loader, name, epochs=epochs, cache=cache, linger=1) as producer:
        with bc.Consumer(name, consumer_batch, timeout=20, join="next_epoch") as consumer:
            for _ in range(epochs):
                epoch = []
                for batch, ids in consumer.with_indices():
                    epoch.append((list(batch["name"]), batch["label"].clone(), batch["image"].clone(),
                                  batch["embedding"].clone(), ids.clone()))
                got.append(epoch)
        stats = producer.stats()
    return got, stats


def same(a, b) -> bool:
    if len(a) != len(b):
        return False
    for ea, eb in zip(a, b):
        if len(ea) != len(eb):
            return False
        for (na, la, ia, xa, da), (nb, lb, ib, xb, db) in zip(ea, eb):
            if na != nb or not torch.equal(la, lb) or not torch.equal(ia, ib) or not torch.equal(xa, xb) \
                    or not torch.equal(da, db):
                return False
    return True


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_later_epochs_are_the_loaders_batches_decoded_once(runtime_dir, name, tmp_path, where):
    # Four epochs of a shuffling loader: with the cache, each sample is decoded
    # in the first epoch only (and `check` samples per later epoch, compared),
    # and every batch is the one the loader makes without it, bit for bit, in
    # its order (the same generator), with the same identities.
    n, epochs = 61, 4
    plain = Decoded(n)
    want, _ = served(plain, name + "-plain", epochs, consumer_batch=5)
    assert all(plain.calls[i] == epochs for i in range(n))
    cached = Decoded(n)
    option = bc.Cache(where, directory=str(tmp_path / "cache")) if where == "disk" else "memory"
    got, stats = served(cached, name, epochs, cache=option, consumer_batch=5)
    assert same(got, want)
    # Decoded once, plus the samples re-made to check each later epoch.
    assert sum(cached.calls.values()) == n + 4 * (epochs - 1)
    assert max(cached.calls.values()) <= 1 + (epochs - 1)
    assert stats["cache"] == "ready" and stats["cache_samples"] == n
    assert stats["cache_batches"] == (epochs - 1) * 8 and stats["cache_batches_remade"] == 0
    assert stats["cache_bytes"] >= n * (3 * 4 + 4 * 4)
    # Gathered straight into leased ring slots: only the first epoch was copied.
    assert stats["batches_in_place"] == stats["cache_batches"]
    assert stats["bytes_copied"] * epochs == stats["bytes_published"]
    for epoch in got:  # each epoch whole
        assert sorted(i for _, labels, _, _, ids in epoch for i in ids.tolist()) == list(range(n))


@pytest.mark.filterwarnings("ignore::batchcast.ResumeWarning")  # (a next-pass resume is checked below)
def test_joins_and_resumes_on_a_cached_stream_keep_every_epoch_whole(runtime_dir, name):
    # Random loader and consumer batch sizes and drop_last; a consumer that
    # joins now while the producer serves from the cache, and one resuming
    # its state: each epoch holds every sample once, with the dataset's values.
    rng = random.Random(7)
    for trial in range(3):
        n = rng.randint(30, 70)
        loader_batch = rng.randint(2, 9)
        drop_last = rng.random() < 0.5
        loader = DataLoader(Decoded(n), batch_size=loader_batch, shuffle=True, drop_last=drop_last,
                            generator=torch.Generator().manual_seed(trial))
        per_epoch = n // loader_batch * loader_batch if drop_last else n
        label = f"{name}-{trial}"
        producer = bc.Producer(loader, label, epochs=8, cache="memory", linger=1, slots=16).start()
        try:
            first = bc.Consumer(label, rng.randint(1, 12), join="next_epoch", timeout=20)
            for _ in range(2):  # the first epoch from the loader, the second from the cache
                ids = [i for batch, d in first.with_indices() for i in check_values(batch, d)]
                assert len(ids) == len(set(ids)) == per_epoch, trial
            partial = iter(first.with_indices())
            next(partial)  # the producer is in its third epoch, made from the cache
            late_batch = rng.randint(1, 12)
            late = bc.Consumer(label, late_batch, join="now", timeout=20)
            del partial
            first.close()
            taken = iter(late.with_indices())
            part = [i for _ in range(2) for i in check_values(*next(taken))]
            state = late.state_dict()
            del taken
            late.close()
            with bc.Consumer(label, late_batch, state=state, timeout=20) as again:
                rest = [i for batch, d in again.with_indices() for i in check_values(batch, d)]
                how = again.stats()["resumed"]
            assert len(rest) == len(set(rest)) and len(part) == len(set(part)), trial
            if how == "exact":
                assert len(part) + len(rest) == len(set(part + rest)) == per_epoch, (trial, how)
            else:
                assert how == "next-pass" and len(part) + len(rest) == per_epoch, (trial, how)
        finally:
            producer.stop()
        assert producer.stats()["cache_batches"] > 0


def check_values(batch, ids):
    """Each sample's values are the dataset's for its identity."""
    ids = ids.tolist()
    for k, i in enumerate(ids):
        g = torch.Generator().manual_seed(1000 + i)
        assert torch.equal(batch["image"][k], torch.randint(0, 255, (3, 4), generator=g, dtype=torch.uint8)), i
        assert batch["name"][k] == f"sample-{i}" and int(batch["label"][k]) == i % 10
    return ids


def test_a_random_augmentation_left_in_the_producer_turns_it_off_naming_the_leaf(runtime_dir, name, caplog):
    # A loader whose samples differ every epoch would have its first epoch's
    # draws frozen: the check finds it, says so, and the producer serves from
    # the loader from then on (every epoch whole, with fresh draws).
    n = 24
    dataset = Decoded(n, random_part=True)
    with caplog.at_level(logging.WARNING, logger="batchcast"):
        got, stats = served(dataset, name, 3, cache="memory")
    assert stats["cache"] == "off"
    warned = [r.getMessage() for r in caplog.records if "decoded cache is off" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "batch['image']" in warned[0] and "transform=" in warned[0]
    # every epoch decoded by the loader, and the four samples re-made to check
    assert sum(dataset.calls.values()) == 3 * n + 4 and min(dataset.calls.values()) == 3
    for epoch in got:
        assert sorted(i for *_, ids in epoch for i in ids.tolist()) == list(range(n))


def test_a_leaf_of_varying_length_is_refused_naming_it_and_serving_goes_on(runtime_dir, name, caplog):
    def pad(samples):
        batch = torch.utils.data.default_collate([{k: v for k, v in s.items() if k != "embedding"}
                                                  for s in samples])
        longest = max(len(s["embedding"]) for s in samples)
        batch["embedding"] = torch.stack([torch.nn.functional.pad(s["embedding"], (0, longest - len(s["embedding"])))
                                          for s in samples])
        return batch

    n = 30
    dataset = Decoded(n, varying=True)
    loader = loader_of(dataset, 4, collate_fn=pad)
    with caplog.at_level(logging.WARNING, logger="batchcast"):
        with bc.Producer(loader, name, epochs=2, cache="memory", linger=1) as producer:
            with bc.Consumer(name, 4, timeout=20) as consumer:
                seen = [sorted(int(x) for _, ids in consumer.with_indices() for x in ids) for _ in range(2)]
            stats = producer.stats()
    assert stats["cache"] == "off"
    assert "batch['embedding']" in stats["cache_off_because"]
    assert any("batch['embedding']" in r.getMessage() for r in caplog.records)
    assert seen == [list(range(n))] * 2


@pytest.mark.parametrize("loader, why", [
    ([torch.arange(8)], "not a DataLoader"),
    (None, "IterableDataset"),
])
def test_a_loader_it_cannot_key_by_dataset_index_is_an_error_naming_why(runtime_dir, name, loader, why):
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(8))

    if loader is None:
        loader = DataLoader(Stream(), batch_size=4)
    with pytest.raises(ValueError, match=why) as error:
        bc.Producer(loader, name, cache="memory")
    assert "cannot keep a decoded cache" in str(error.value)
    with bc.Producer(loader, name, epochs=1):  # the name was not taken by the refused one
        pass


def test_cache_options_are_checked_where_they_are_written():
    with pytest.raises(ValueError, match="'memory' or 'disk'"):
        bc.Cache("ram")
    with pytest.raises(ValueError, match="where=\"disk\""):
        bc.Cache("memory", directory="/tmp")
    with pytest.raises(ValueError, match="max_bytes"):
        bc.Cache(max_bytes=0)
    with pytest.raises(TypeError, match="cache must be"):
        bc.Producer(DataLoader(Decoded(4)), "options", cache="yes")


def test_more_than_max_bytes_is_said_and_served_from_the_loader(runtime_dir, name, caplog):
    dataset = Decoded(40)
    with caplog.at_level(logging.WARNING, logger="batchcast"):
        got, stats = served(dataset, name, 2, cache=bc.Cache(max_bytes=100))
    assert stats["cache"] == "off" and "max_bytes" in stats["cache_off_because"]
    assert all(dataset.calls[i] == 2 for i in range(40))
    assert [sorted(i for *_, ids in e for i in ids.tolist()) for e in got] == [list(range(40))] * 2


def test_the_next_sweep_starts_from_the_disk_cache(runtime_dir, name, tmp_path, caplog):
    # A second producer of that name over the same data: its first epoch too
    # comes from the file (the dataset decodes only the samples it checks).
    option = bc.Cache("disk", directory=str(tmp_path))
    n = 37
    want, _ = served(Decoded(n), name + "-plain", 2, seed=9)
    first = Decoded(n)
    got, stats = served(first, name, 2, cache=option, seed=9)
    assert same(got, want) and not stats["cache_warm"]
    path = stats["cache_path"]
    assert os.path.exists(path) and not [p for p in os.listdir(tmp_path) if "partial" in p]
    second = Decoded(n)
    with caplog.at_level(logging.INFO, logger="batchcast"):
        again, stats = served(second, name, 2, cache=option, seed=9)
    assert stats["cache_warm"] and stats["cache"] == "ready"
    assert same(again, want)
    assert sum(second.calls.values()) == 2 * 4  # only the samples checked, each epoch
    # Another dataset under that name: made again, and said why.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="batchcast"):
        other, stats = served(Decoded(n + 1), name, 1, cache=option)
    assert not stats["cache_warm"]
    assert any("made for other data" in r.getMessage() for r in caplog.records)
    # A truncated file: said, made again, served right.
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    caplog.clear()
    third = Decoded(n + 1)
    with caplog.at_level(logging.WARNING, logger="batchcast"):
        got, stats = served(third, name, 2, cache=option)
    assert any("cannot be used" in r.getMessage() and "truncated" in r.getMessage() for r in caplog.records)
    assert not stats["cache_warm"] and stats["cache"] == "ready"
    assert [sorted(i for *_, ids in e for i in ids.tolist()) for e in got] == [list(range(n + 1))] * 2


def test_samples_the_first_epoch_left_out_are_made_when_asked(runtime_dir, name):
    # drop_last with a shuffle leaves other samples out of each epoch: those
    # a later epoch asks for are made in the producer, as the loader would.
    n = 29
    want, _ = served(Decoded(n), name + "-plain", 4, batch_size=6, drop_last=True)
    got, stats = served(Decoded(n), name, 4, cache="memory", batch_size=6, drop_last=True)
    assert same(got, want)
    assert stats["cache_batches_remade"] > 0


@pytest.mark.parametrize("device", ["simulated", "hardware"])
def test_a_gpu_ring_is_served_from_the_cache_through_its_pinned_mirror(runtime_dir, device):
    # The GPU path: cached batches are gathered into the leased slot of the
    # ring's pinned host mirror and copied to the GPU once, as a loader
    # worker's batch is; consumers get the loader's batches.
    import json
    import subprocess
    import sys

    env = dict(os.environ)
    if device == "simulated":
        env["BATCHCAST_SIMULATED_CUDA"] = "seed=3,max_delay_us=500"
    elif not bc.cuda_available():
        pytest.skip("no CUDA GPU visible to batchcast (the simulated device runs this here)")
    script = os.path.join(os.path.dirname(__file__), "cache_gpu.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["same"], result
    assert result["cached"]["cache_batches"] == 16 and result["cached"]["in_place"] == 16, result
    assert result["cached"]["calls"] == 45 + 2 * 4 and result["plain"]["calls"] == 3 * 45, result


def test_a_group_on_a_cached_stream_gets_the_loaders_batches(runtime_dir, name):
    # A data-parallel trial of 2 ranks (threads here) on 3 epochs: with the cache, each rank gets
    # bit for bit the batches it gets from the loader itself (the same order), and the ranks
    # together every sample of each epoch (padded to a multiple of the ranks, as a DistributedSampler).
    n, epochs = 53, 3

    def run(label, cache):
        got: dict[int, list] = {}

        def rank(r):
            with bc.Consumer(label, 4, group=bc.Group("trial", r, 2), join="next_epoch", timeout=20) as c:
                got[r] = [[(check_values(b, d), b["image"].clone(), b["embedding"].clone())
                           for b, d in c.with_indices()] for _ in range(epochs)]

        with bc.Producer(loader_of(Decoded(n), 6), label, epochs=epochs, cache=cache, linger=1) as producer:
            threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            stats = producer.stats()
        assert sorted(got) == [0, 1]
        return got, stats

    want, _ = run(name + "-plain", None)
    got, stats = run(name, "memory")
    assert stats["cache_batches"] == (epochs - 1) * 9
    for r in range(2):
        assert len(got[r]) == epochs
        for mine, theirs in zip(got[r], want[r]):
            assert len(mine) == len(theirs) == 7  # 53 samples in windows of 2 x 4: 7 each
            for (ids, image, emb), (ids2, image2, emb2) in zip(mine, theirs):
                assert ids == ids2 and torch.equal(image, image2) and torch.equal(emb, emb2)
    for e in range(epochs):
        ids = [i for r in range(2) for batch in got[r][e] for i in batch[0]]
        assert set(ids) == set(range(n)) and len(ids) == 54  # + 1: to a multiple of the ranks


def cache_header(path) -> dict:
    with open(path, "rb") as f:
        head = f.read(16)
        assert head[:8] == b"BCCACHE2"
        length, _ = struct.unpack("<II", head[8:])
        return json.loads(f.read(length))


def flip(path, offsets) -> None:
    with open(path, "r+b") as f:
        for at in offsets:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ 0xA5]))


def test_a_damaged_disk_cache_serves_no_damaged_sample_and_is_repaired(runtime_dir, name, tmp_path, caplog):
    """64 bytes flipped over the middle half of a cache file's rows (size and
    header intact): the next sweep says which samples, decodes those again,
    serves every sample right, and writes the file whole again."""
    option = bc.Cache("disk", directory=str(tmp_path))
    n, shape = 300, (3, 16, 16)  # 768 bytes a sample: rows over 4 blocks of 64 KiB
    want, _ = served(Decoded(n, shape), name + "-plain", 2, seed=3)
    _, stats = served(Decoded(n, shape), name, 1, cache=option, seed=3)
    path = stats["cache_path"]
    header = cache_header(path)
    image = next(spec for spec in header["leaves"] if spec["path"].endswith("['image']"))
    rows = n * 768
    offsets = sorted(random.Random(7).sample(range(image["at"] + rows // 4, image["at"] + 3 * rows // 4), 64))
    flip(path, offsets)
    hit = sorted({(at - image["at"]) // 768 for at in offsets})
    second = Decoded(n, shape)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="batchcast"):
        got, stats = served(second, name, 2, cache=option, seed=3)
    assert stats["cache_warm"] and stats["cache"] == "ready"
    assert same(got, want)  # every sample, every value, in the loader's order
    warned = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(warned) == 1 and path in warned[0], [r.getMessage() for r in caplog.records]
    # The samples named are those whose rows the damaged blocks hold (64 KiB
    # each: every sample of them, the flipped ones among them), decoded again.
    assert "decoded again and written back" in warned[0], warned[0]
    redone = {i for i, calls in second.calls.items() if calls > 0}
    assert set(hit) <= redone
    # Written back: the next sweep finds nothing damaged.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="batchcast"):
        again, stats = served(Decoded(n, shape), name, 1, cache=option, seed=3)
    assert stats["cache_warm"] and not [r for r in caplog.records if "damaged" in r.getMessage()]
    assert same(again, want[:1])


@pytest.mark.parametrize("where", ["header", "bitmap"])
def test_damage_outside_the_rows_makes_the_file_again(runtime_dir, name, tmp_path, caplog, where):
    option = bc.Cache("disk", directory=str(tmp_path))
    n = 50
    want, _ = served(Decoded(n), name + "-plain", 2, seed=4)
    _, stats = served(Decoded(n), name, 1, cache=option, seed=4)
    path = stats["cache_path"]
    header = cache_header(path)
    flip(path, [40] if where == "header" else [header["bitmap_at"] + 3])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="batchcast"):
        got, stats = served(Decoded(n), name, 2, cache=option, seed=4)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "cannot be used" in said and ("header does not match its checksum" if where == "header"
                                         else "bitmap of samples kept") in said, said
    assert not stats["cache_warm"] and stats["cache"] == "ready"
    assert same(got, want)


def test_a_changed_dataset_makes_the_file_again_and_is_served_from_it(runtime_dir, name, tmp_path, caplog):
    """Same length, same kind, same key, other values: the check at the first
    epoch's start sees it; that epoch comes from the loader and is kept, and
    the rest of the sweep from the cache made again (not the loader)."""
    option = bc.Cache("disk", directory=str(tmp_path))
    n = 60
    served(Decoded(n), name, 1, cache=option, seed=2)
    changed = Decoded(n, salt=1)
    want, _ = served(Decoded(n, salt=1), name + "-plain", 3, seed=2)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="batchcast"):
        got, stats = served(changed, name, 3, cache=option, seed=2)
    assert same(got, want)
    assert any("made again" in r.getMessage() and "differ" in r.getMessage() for r in caplog.records)
    assert stats["cache"] == "ready" and not stats["cache_warm"] and stats["cache_batches"] > 0
    # Decoded in the epoch that made it again, and for the checks: not every epoch.
    assert sum(changed.calls.values()) <= n + 3 * 4, changed.calls  # a loader each epoch: 3 * n
    warm, stats = served(Decoded(n, salt=1), name, 1, cache=option, seed=2)
    assert stats["cache_warm"] and same(warm, want[:1])
