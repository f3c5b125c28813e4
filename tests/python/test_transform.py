"""Decode once, augment per trial: a consumer's own transform of the shared
samples. What a trainer would notice: every sample once per epoch after its
transform; its augmentation reproducible bit for bit (whatever the batch size,
wherever it joined, after a resume) and its own (another seed, another
augmentation; each sample of a batch its own draw); the sample named when the
transform fails; the loop's own randomness left alone.

The loader's samples are (a vector of 4 copies of the dataset index, index);
the transform adds noise drawn from its generator, so noise = output - index
is the augmentation a sample got.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import batchcast as bc
from conftest import eventually

N = 60


class Indexed(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((4,), i, dtype=torch.uint8), i


class Gated(Indexed):
    """Loads `limit` samples, then waits until the test opens it."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.loaded, self.open = limit, 0, threading.Event()

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.loaded >= self.limit:
            self.open.wait(60)
        self.loaded += 1
        return super().__getitem__(i)


def noisy(sample, generator):  # type: ignore[no-untyped-def]
    image, label = sample
    return image.float() + torch.rand(image.shape, generator=generator), label


def noisy_global(sample):  # type: ignore[no-untyped-def]
    """As torchvision's transforms draw: from torch's global generator."""
    image, label = sample
    return image.float() + torch.rand(image.shape), label


def loader(n: int = N, batch: int = 4, **kw) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(Indexed(n), batch_size=batch, shuffle=True,
                      generator=torch.Generator().manual_seed(7), **kw)


def augmentations(batches, epoch: int, into: dict, within: list | None = None) -> list[int]:  # type: ignore[no-untyped-def,type-arg]
    """Records each sample's noise by (epoch, index); returns the indices in order."""
    order = []
    for x, labels in batches:
        assert x.dtype == torch.float32 and x.shape == (len(labels), 4)
        noise = x - labels.unsqueeze(1).float()
        assert bool(((noise >= 0) & (noise < 1)).all()), "every value is its sample's, plus its noise"
        if within is not None:
            within.append(noise)
        for i, n in zip(labels.tolist(), noise):
            assert (epoch, i) not in into, f"sample {i} twice in epoch {epoch}"
            into[(epoch, i)] = n.clone()
        order += labels.tolist()
    return order


def train(consumer: bc.Consumer, epochs: int, into: dict, orders: list | None = None) -> None:  # type: ignore[type-arg]
    for e in range(epochs):
        order = augmentations(consumer, e, into)
        assert sorted(order) == list(range(N)), f"epoch {e}: not every sample once"
        if orders is not None:
            orders.append(order)


def test_every_sample_once_per_epoch_and_one_seed_one_augmentation_for_any_batch_size(runtime_dir):
    """Two trials with the seed 11 (batch sizes 5 and 7, inline and on
    threads) get bit-identical augmentations of every sample in each epoch;
    a third with another seed gets other ones; each epoch draws anew."""
    got: dict[int, dict] = {0: {}, 1: {}, 2: {}}  # type: ignore[type-arg]
    with bc.Producer(loader(), "aug", epochs=2, min_consumers=3):
        consumers = [bc.Consumer("aug", batch_size=5, transform=bc.Augment(noisy, seed=11, threads=0)),
                     bc.Consumer("aug", batch_size=7, transform=bc.Augment(noisy, seed=11, threads=3)),
                     bc.Consumer("aug", batch_size=7, transform=bc.Augment(noisy, seed=12))]
        threads = [threading.Thread(target=train, args=(c, 2, got[k])) for k, c in enumerate(consumers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for c in consumers:
            assert c.stats()["sample_identity"] == "dataset index"
            c.close()
    assert len(got[0]) == len(got[1]) == len(got[2]) == 2 * N, "a trial did not finish both epochs"
    for key, noise in got[0].items():
        assert torch.equal(noise, got[1][key]), f"seed 11, (epoch, sample) {key}: batch size changed it"
        assert not torch.equal(noise, got[2][key]), f"seeds 11 and 12 drew the same for {key}"
    for i in range(N):
        assert not torch.equal(got[0][(0, i)], got[0][(1, i)]), f"sample {i}: the same in both epochs"


def test_samples_of_one_batch_draw_their_own_parameters(runtime_dir):
    within: list[torch.Tensor] = []
    with bc.Producer(DataLoader(Indexed(), batch_size=N), "onebatch", epochs=1):
        c = bc.Consumer("onebatch", transform=bc.Augment(noisy, seed=3))
        augmentations(c, 0, {}, within)
        c.close()
    (noise,) = within
    assert noise.shape == (N, 4)
    assert len({tuple(row.tolist()) for row in noise}) == N, "two samples of one batch drew the same"
    # Not one draw for the batch in disguise: each column's values spread.
    assert bool((noise.std(dim=0) > 0.1).all())


def test_a_trial_joining_mid_epoch_and_one_resuming_get_the_same_augmentations(runtime_dir):
    """A reference trial from the start; a trial that saves its state after 3
    batches (transform threads: one batch fetched ahead), stops, and resumes
    from it; a trial that joins mid-epoch. Each epoch of their own holds
    every sample once, with the reference's augmentation of it in that epoch."""
    got: dict[str, dict] = {"reference": {}, "first": {}, "resumed": {}, "late": {}}  # type: ignore[type-arg]
    orders: dict[str, list] = {"resumed": [], "late": []}  # type: ignore[type-arg]
    errors: list[BaseException] = []

    def run(consumer: bc.Consumer, key: str, epochs: list[int]) -> None:
        try:
            for e in epochs:
                orders.setdefault(key, []).append(augmentations(consumer, e, got[key]))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    # The producer stops after 10 loader batches (40 samples) until the
    # resumed and the joining trials are there; it keeps those 10 batches of
    # the epoch for trials that resume in them (catch_up_window).
    gated = Gated(limit=40)
    stream = DataLoader(gated, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
    with bc.Producer(stream, "join", epochs=3, slots=20, catch_up_window=10, min_consumers=2):
        ref = bc.Consumer("join", batch_size=5, transform=bc.Augment(noisy, seed=5))
        saver = bc.Consumer("join", batch_size=7, transform=bc.Augment(noisy, seed=5, threads=2))
        batches = iter(saver)
        taken = augmentations((next(batches) for _ in range(3)), 0, got["first"])
        state = saver.state_dict()
        assert state["epoch_number"] == 0 and state["position"] == 21 and state["seed"] == 5
        saver.close()
        again = bc.Consumer("join", batch_size=7, state=state, transform=bc.Augment(noisy, seed=5, threads=2))
        joiner = bc.Consumer("join", batch_size=3, transform=bc.Augment(noisy, seed=5), join="now")
        gated.open.set()
        threads = [threading.Thread(target=run, args=(ref, "reference", [0, 1, 2])),
                   threading.Thread(target=run, args=(again, "resumed", [0, 1])),
                   threading.Thread(target=run, args=(joiner, "late", [0]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert again.stats()["resumed"] == "exact"
        assert joiner.stats()["joined_at"] == 40, "it was to join mid-epoch"
        for c in (ref, again, joiner):
            c.close()
    assert sorted(taken + orders["resumed"][0]) == list(range(N))
    assert sorted(orders["resumed"][1]) == list(range(N))
    assert sorted(orders["late"][0]) == list(range(N))
    assert len(got["reference"]) == 3 * N
    for key, noise in {**got["first"], **got["resumed"], **got["late"]}.items():
        assert torch.equal(noise, got["reference"][key]), f"(epoch, sample) {key} differs from the reference"


def test_a_peek_gives_its_batch_back_and_a_left_epoch_does_not_disturb_the_next(runtime_dir):
    with bc.Producer(loader(), "peek", epochs=3):
        c = bc.Consumer("peek", batch_size=6, transform=bc.Augment(noisy, seed=1, threads=2))
        peeked, _ = next(iter(c))
        seen: dict = {}  # type: ignore[type-arg]
        assert sorted(augmentations(c, 0, seen)) == list(range(N))
        assert peeked.shape == (6, 4)
        for i, b in enumerate(c):  # epoch 1, left after 3 batches (one more fetched ahead)
            if i == 2:
                break
        assert sorted(augmentations(c, 2, seen)) == list(range(N))
        c.close()


def test_a_transform_that_raises_names_the_sample_and_the_epoch(runtime_dir):
    def fails_on_13(sample, generator):  # type: ignore[no-untyped-def]
        if int(sample[1]) == 13:
            raise ValueError("cannot augment this one")
        return noisy(sample, generator)

    with bc.Producer(DataLoader(Indexed(), batch_size=4), "raises", epochs=1):
        c = bc.Consumer("raises", batch_size=5, transform=bc.Augment(fails_on_13, seed=0, threads=2))
        got = []
        with pytest.raises(bc.TransformError, match=r"sample 13 \(its dataset index\) in epoch 0: "
                                                     r"ValueError: cannot augment this one") as caught:
            for _, labels in c:
                got += labels.tolist()
        assert got == list(range(10)), "the batches before it arrive"
        assert isinstance(caught.value.__cause__, ValueError)
        assert caught.value.identity == 13 and caught.value.epoch == 0
        assert isinstance(caught.value, bc.Error)
        c.close()


def test_samples_a_transform_shapes_differently_are_a_clear_error(runtime_dir):
    def crops_13_wrong(sample, generator):  # type: ignore[no-untyped-def]
        x, label = noisy(sample, generator)
        return (x[:3] if int(label) == 13 else x), label

    with bc.Producer(DataLoader(Indexed(), batch_size=20), "shapes", epochs=1):
        c = bc.Consumer("shapes", transform=bc.Augment(crops_13_wrong, seed=0, threads=0))
        with pytest.raises(bc.TransformError, match=r"returned \(a tensor of shape \[3\] float32 on cpu, a tensor of shape "
                                                     r"\[\] int64 on cpu\) for sample 13 .*but \(a tensor of shape \[4\]"):
            list(c)
        c.close()


def test_a_transform_without_a_generator_is_seeded_per_sample_and_leaves_the_loops_randomness(runtime_dir):
    got: dict[int, dict] = {0: {}, 1: {}}  # type: ignore[type-arg]
    with bc.Producer(loader(), "global", epochs=1, min_consumers=2):
        a = bc.Consumer("global", batch_size=5, transform=bc.Augment(noisy_global, seed=9))
        with pytest.warns(bc.BatchcastWarning, match=r"Augment\(threads=3\) is not used: the function has no "
                                                      "parameter named `generator`"):
            b = bc.Consumer("global", batch_size=8, transform=bc.Augment(noisy_global, seed=9, threads=3))
        train(a, 1, got[0])
        torch.manual_seed(1234)
        before = torch.get_rng_state()
        train(b, 1, got[1])  # (its transform runs in this thread: it takes no generator)
        assert torch.equal(torch.get_rng_state(), before), "the transform moved the loop's generator"
        a.close()
        b.close()
    assert got[0].keys() == got[1].keys() and len(got[0]) == N
    for key in got[0]:
        assert torch.equal(got[0][key], got[1][key]), key


def test_results_are_collated_as_a_dataloader_would(runtime_dir):
    def to_dict(sample, generator):  # type: ignore[no-untyped-def]
        x, label = sample
        return {"x": x.float(), "label": int(label), "weight": float(label) / 2, "name": f"s{int(label)}",
                "flag": bool(int(label) % 2)}

    with bc.Producer(DataLoader(Indexed(10), batch_size=4), "collate", epochs=1):
        c = bc.Consumer("collate", batch_size=10, transform=bc.Augment(to_dict, seed=0))
        (batch,) = list(c)
        c.close()
    want = torch.utils.data.default_collate([to_dict(Indexed(10)[i], None) for i in range(10)])
    assert batch.keys() == want.keys()
    for key in want:
        if isinstance(want[key], torch.Tensor):
            assert batch[key].dtype == want[key].dtype and torch.equal(batch[key], want[key]), key
        else:
            assert batch[key] == want[key], key


def test_with_indices_gives_each_samples_dataset_index(runtime_dir):
    with bc.Producer(loader(num_workers=2), "indices", epochs=2):
        c = bc.Consumer("indices", batch_size=7)
        assert c.stats()["sample_identity"] == ""  # no batch yet
        for _ in range(2):
            seen = []
            for (x, labels), indices in c.with_indices():
                assert indices.dtype == torch.int64 and torch.equal(indices, labels)
                seen += indices.tolist()
            assert sorted(seen) == list(range(N))
        assert c.stats()["sample_identity"] == "dataset index"
        c.close()


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(100, 100 + N))


def test_without_dataset_indices_a_sample_is_known_by_its_position_in_the_epoch(runtime_dir, caplog):
    caplog.set_level(logging.INFO, logger="batchcast")
    with bc.Producer(DataLoader(Stream(), batch_size=4), "positions", epochs=2):
        c = bc.Consumer("positions", batch_size=9, transform=bc.Augment(lambda s, generator: s, seed=0))
        for _ in range(2):
            pairs = [(int(v), int(i))
                     for values, indices in c.with_indices() for v, i in zip(values, indices)]
            assert pairs == [(100 + k, k) for k in range(N)]
        assert c.stats()["sample_identity"] == "position"
        c.close()
    assert "know samples by their position in the epoch" in caplog.text and "IterableDataset" in caplog.text


def test_a_collate_that_drops_samples_makes_them_known_by_position_and_says_so(runtime_dir, caplog):
    def drop_multiples_of_5(samples):  # type: ignore[no-untyped-def]
        return torch.utils.data.default_collate([s for s in samples if s[1] % 5])

    with bc.Producer(DataLoader(Indexed(), batch_size=4, collate_fn=drop_multiples_of_5), "drops", epochs=1):
        c = bc.Consumer("drops")
        got = [(labels.tolist(), indices.tolist()) for (_, labels), indices in c.with_indices()]
        c.close()
    assert got[0] == ([1, 2, 3], [0, 1, 2]), "positions in the epoch, not dataset indices"
    assert "has 3 samples, but its batch sampler named 4 indices" in caplog.text


def test_bad_transform_arguments_are_refused(runtime_dir):
    with pytest.raises(TypeError, match="transform must be a function of one sample or a batchcast.Augment, "
                       "not int"):
        bc.Consumer("nobody", timeout=0.1, transform=3)
    with pytest.raises(TypeError, match="Augment takes a function of one sample, not int"):
        bc.Augment(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Augment's threads must be an int >= 0"):
        bc.Augment(noisy, threads=-1)
    with pytest.raises(TypeError, match="Augment's seed must be an int"):
        bc.Augment(noisy, seed="7")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'seed'"):  # the old spelling
        bc.Consumer("nobody", seed=1, timeout=0.1)  # type: ignore[call-arg]


@pytest.mark.filterwarnings("ignore::batchcast.ResumeWarning")
def test_a_state_names_its_seed_and_refuses_another(runtime_dir):
    with bc.Producer(loader(), "seeded", epochs=1):
        c = bc.Consumer("seeded", batch_size=5, transform=noisy)  # its seed drawn
        next(iter(c))
        state = c.state_dict()
        c.close()
        assert isinstance(state["seed"], int)
        with pytest.raises(ValueError, match="seed="):
            bc.Consumer(
                "seeded",
                batch_size=5,
                state=state,
                transform=bc.Augment(noisy, seed=state["seed"] + 1),
            )
        again = bc.Consumer("seeded", batch_size=5, state=state, transform=noisy)  # takes the saved seed
        assert again._transform is not None and again._transform.seed == state["seed"]
        again.close()


def noisy_anywhere(sample, generator):  # type: ignore[no-untyped-def]
    """noisy() for a sample on any device: the noise is drawn on the CPU."""
    image, label = sample
    return image.float() + torch.rand(image.shape, generator=generator).to(image.device), label


@pytest.mark.skipif(not bc.cuda_available(), reason="no CUDA GPU visible to batchcast")
def test_gpu_batches_are_transformed_on_the_gpu_as_the_cpu_would(runtime_dir):
    """A GPU producer's trainer transforms on its GPU (a side stream, one
    batch ahead): every sample once, bit-identical to a host trainer's
    augmentation with the same seed."""
    got: dict[str, dict] = {"gpu": {}, "cpu": {}}  # type: ignore[type-arg]

    def take(consumer: bc.Consumer, key: str) -> None:
        for x, labels in consumer:
            assert x.device.type == ("cuda" if key == "gpu" else "cpu")
            noise = (x - labels.unsqueeze(1).float()).cpu()
            for i, n in zip(labels.tolist(), noise):
                assert i not in got[key]
                got[key][i] = n

    with bc.Producer(loader(), "gpuaug", device="cuda:0", epochs=1, min_consumers=2):
        on_gpu = bc.Consumer("gpuaug", batch_size=6, transform=bc.Augment(noisy_anywhere, seed=4, threads=2))
        on_host = bc.Consumer(
            "gpuaug",
            batch_size=9,
            device="cpu",
            transform=bc.Augment(noisy_anywhere, seed=4),
        )
        worker = threading.Thread(target=take, args=(on_host, "cpu"))
        worker.start()
        take(on_gpu, "gpu")
        worker.join(60)
        on_gpu.close()
        on_host.close()
    assert sorted(got["gpu"]) == sorted(got["cpu"]) == list(range(N))
    for i in range(N):
        assert torch.equal(got["gpu"][i], got["cpu"][i]), i


class StreamOrder:
    """A stand-in for the transform's CUDA calls (its SideStreams) that keeps
    the stream order: for each piece of work queued, the work it comes
    after. The simulated device cannot show this order: its batches reach
    the consumer as host tensors and its streams are batchcast's own, while
    the transform's side stream is torch.cuda's (a CPU build of torch has
    none). So every batch is said to be on a GPU here; the training loop's
    stream is the default one (the fetch thread's current stream too, unless
    it enters another), as on a GPU."""

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name
            self.after: set = set()  # type: ignore[type-arg]  # what the next work queued comes after

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.default = self.Stream("default")
        self.side_stream: StreamOrder.Stream | None = None
        self.local = threading.local()
        self.before: dict = {}  # type: ignore[type-arg]  # work -> the work it comes after
        self.on_stream: dict = {}  # type: ignore[type-arg]  # work -> its stream's name

    def current(self) -> "StreamOrder.Stream":
        return getattr(self.local, "stream", self.default)

    def queue(self, work: object) -> None:
        with self.lock:
            stream = self.current()
            self.before[work] = set(stream.after)
            self.on_stream[work] = stream.name
            stream.after.add(work)

    # SideStreams' interface
    def gpu_of(self, leaves):  # type: ignore[no-untyped-def]
        return "gpu"

    def side(self, device):  # type: ignore[no-untyped-def]
        with self.lock:
            if self.side_stream is None:
                self.side_stream = self.Stream("side")
            return self.side_stream

    def in_use(self):  # type: ignore[no-untyped-def]
        return self.side_stream

    @contextlib.contextmanager
    def on(self, stream):  # type: ignore[no-untyped-def]
        previous = self.current()
        self.local.stream = stream or previous
        try:
            yield
        finally:
            self.local.stream = previous

    def follow(self, side, device) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            side.after |= self.current().after

    def hand_over(self, side, device, tensors) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            recorded = set(side.after)  # an event recorded on the side stream
            self.current().after |= recorded


def test_a_batch_fetched_ahead_is_transformed_on_the_side_stream_without_waiting_for_the_loops_work(
        runtime_dir):
    """On a GPU the transform's work goes on a side stream that waits only for
    the stream that took the batch (for a batch fetched ahead, the side
    stream itself), and the loop's stream waits for that work before it uses
    the batch. Modelled stream order: each batch's training work comes after
    its samples' transforms; the transform of a batch fetched ahead (the
    third of an epoch on) comes after none of the loop's work on the batches
    before it but the first, so a transform ahead overlaps the training step."""
    order = StreamOrder()

    def marked(sample, generator):  # type: ignore[no-untyped-def]
        order.queue(("transform", int(sample[1])))
        return noisy(sample, generator)

    with bc.Producer(loader(), "order", epochs=2):
        c = bc.Consumer("order", batch_size=6, transform=bc.Augment(marked, seed=2, threads=2))
        assert c._transform is not None
        c._transform.streams = order  # type: ignore[assignment]
        batches: list[list[int]] = []
        for e in range(2):
            trains: list[tuple] = []  # type: ignore[type-arg]
            for k, (x, labels) in enumerate(c):
                batches.append(labels.tolist())
                work = ("train", e, k)
                order.queue(work)  # the training step, on the loop's (default) stream
                trains.append(work)
                transforms = [("transform", i) for i in labels.tolist()]
                assert all(order.on_stream[t] == "side" for t in transforms), "a transform off the side stream"
                missing = [t for t in transforms if t not in order.before[work]]
                assert not missing, f"epoch {e} batch {k}: the loop's stream did not wait for {missing}"
                if k >= 2:  # fetched ahead, while the loop trained on batch k - 1
                    waited = sorted({w for t in transforms for w in trains[1:k] if w in order.before[t]})
                    assert not waited, f"epoch {e} batch {k}: its transform waited for the loop's {waited}"
            assert len(trains) == 10
        c.close()
    assert sorted(i for b in batches for i in b) == sorted(list(range(N)) * 2)
