"""Samples of variable length (a producer on a background thread): each loader
batch padded to its own longest sample, trainers of any batch size get every
sample once, re-padded to the longest of their batch with the value declared
per leaf; the loader's values and its own padding stay; masks agree with the
data; a batch of one loader batch's samples stays a view; wrong declarations
are errors naming the leaf; groups and resume get the same."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchcast as bc

PAD = {("text", "input_ids"): 0, ("text", "attention_mask"): 0, "labels": -100, "mel": 0.0}


def length(i: int, longest: int) -> int:
    return 1 + (i * 7919) % longest


def token_ids(i: int, n: int) -> torch.Tensor:
    return torch.arange(1, n + 1) + 1000 * i  # never 0: a pad position is told apart


def mel(i: int, n: int) -> torch.Tensor:
    return (torch.arange(n * 3, dtype=torch.float32).view(n, 3) + 1) * (i + 1)


class Speech:
    """A loader of variable-length samples: each batch padded to its longest,
    as a collate_fn for sequences does (ids and mask with 0, labels with
    -100, log-mel frames with 0), with one value per sample beside them."""

    def __init__(self, n: int, loader_batch: int, longest: int) -> None:
        self.n, self.loader_batch, self.longest = n, loader_batch, longest
        self.widths: list[int] = []  # each loader batch's padded length, as made

    def __iter__(self):
        self.widths = []
        for start in range(0, self.n, self.loader_batch):
            ids = list(range(start, min(self.n, start + self.loader_batch)))
            lengths = [length(i, self.longest) for i in ids]
            width = max(lengths)
            self.widths.append(width)
            text = torch.zeros(len(ids), width, dtype=torch.int64)
            mask = torch.zeros(len(ids), width, dtype=torch.int64)
            labels = torch.full((len(ids), width), -100, dtype=torch.int64)
            frames = torch.zeros(len(ids), width, 3)
            for r, (i, n) in enumerate(zip(ids, lengths)):
                text[r, :n] = token_ids(i, n)
                mask[r, :n] = 1
                labels[r, :n] = token_ids(i, n)
                frames[r, :n] = mel(i, n)
            yield {"text": {"input_ids": text, "attention_mask": mask}, "labels": labels, "mel": frames,
                   "id": torch.tensor(ids), "name": [f"utt-{i}" for i in ids]}


def check_batch(batch: dict, longest: int, multiple: int, widths_of: dict[int, int]) -> list[int]:
    """Every sample's values up to its length, the pad value after; the
    batch as wide as the widest loader batch among its samples (rounded up
    when re-padded). Returns its sample ids."""
    ids = batch["id"].tolist()
    assert batch["name"] == [f"utt-{i}" for i in ids]
    text, mask = batch["text"]["input_ids"], batch["text"]["attention_mask"]
    labels, frames = batch["labels"], batch["mel"]
    widest = max(widths_of[i] for i in ids)
    sources = {widths_of[i] for i in ids}
    width = text.shape[1]
    if len(sources) > 1:  # re-padded: to the widest, rounded up (the 3 mel bands stay 3)
        assert width == -(-widest // multiple) * multiple, (width, widest, multiple)
    else:
        assert width == widest
    assert mask.shape == labels.shape == (len(ids), width) and frames.shape == (len(ids), width, 3)
    for r, i in enumerate(ids):
        n = length(i, longest)
        assert torch.equal(text[r, :n], token_ids(i, n)) and not text[r, n:].any()
        assert torch.equal(mask[r], (torch.arange(width) < n).long())  # the mask agrees with the data
        assert torch.equal(labels[r, :n], token_ids(i, n)) and bool((labels[r, n:] == -100).all())
        assert torch.equal(frames[r, :n], mel(i, n)) and not frames[r, n:].any()
    return ids


def widths_by_sample(n: int, loader_batch: int, longest: int) -> dict[int, int]:
    out = {}
    for start in range(0, n, loader_batch):
        ids = range(start, min(n, start + loader_batch))
        width = max(length(i, longest) for i in ids)
        out.update({i: width for i in ids})
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    loader_batch=st.integers(1, 12),
    batch_size=st.integers(1, 20),
    n=st.integers(1, 90),
    longest=st.integers(1, 30),
    multiple=st.sampled_from([1, 8]),
    drop_last=st.booleans(),
)
def test_every_sample_arrives_once_repadded_with_its_values(loader_batch, batch_size, n, longest, multiple,
                                                            drop_last):
    name = f"pad-{loader_batch}-{batch_size}-{n}-{longest}-{multiple}-{int(drop_last)}"
    loader = Speech(n, loader_batch, longest)
    widths = widths_by_sample(n, loader_batch, longest)
    # Its loader batches grow to up to 30x the first; the ring, sized from the
    # first batch, refuses batches beyond a few times that (with a message naming
    # ring_bytes: test_refusals): this test is about padding, so the ring is given room.
    with bc.Producer(loader, name, epochs=2, slots=4, samples_per_epoch=n, ring_bytes=1 << 20) as producer:
        consumer = bc.Consumer(
            name,
            batch_size=batch_size,
            drop_last=drop_last,
            timeout=10,
            pad=bc.Pad(PAD, multiple_of=multiple),
        )
        want = list(range(n // batch_size * batch_size if drop_last else n))
        for _ in range(2):
            seen = []
            for batch in consumer:
                seen += check_batch(batch, longest, multiple, widths)
            assert seen == want
        stats = consumer.stats()
        consumer.close()
    assert producer.error is None
    assert stats["repadded"] <= stats["batches"]


@pytest.mark.every_torch
def test_a_batch_of_one_loader_batch_stays_a_view_and_repadding_is_counted(runtime_dir):
    # Loader batches of 4 samples (widths differ), trainer batches of 2 and 6.
    loader = Speech(24, 4, 9)
    with bc.Producer(loader, "views", epochs=1, slots=8, samples_per_epoch=24, min_consumers=2):
        twos = bc.Consumer("views", batch_size=2, pad=PAD)
        sixes = bc.Consumer("views", batch_size=6, pad=PAD)
        got_two = list(twos)
        got_six = list(sixes)
        two_stats, six_stats = twos.stats(), sixes.stats()
        twos.close()
        sixes.close()
    assert len(got_two) == 12 and two_stats["repadded"] == 0 and two_stats["copies"] == 0
    assert two_stats["views"] > 0  # each batch of 2 lies inside one loader batch
    widths = widths_by_sample(24, 4, 9)
    repadded = sum(len({widths[i] for i in b["id"].tolist()}) > 1 for b in got_six)
    assert repadded > 0 and six_stats["repadded"] == repadded


def test_a_leaf_of_varying_shape_that_pad_does_not_name_says_how_to_declare_it(runtime_dir):
    with bc.Producer(Speech(16, 4, 9), "undeclared", epochs=1, samples_per_epoch=16):
        consumer = bc.Consumer("undeclared", batch_size=6, pad={"labels": -100, "mel": 0})
        with pytest.raises(bc.RebatchError, match=r"batch\['text'\]\['input_ids'\].*pad=\{\('text', "
                                                  r"'input_ids'\): 0\}"):
            list(consumer)
        consumer.close()


@pytest.mark.parametrize("pad, message", [
    ({"labels": -100, "audio": 0}, r"pad names audio, which is not a leaf .*their leaves: "
                                   r"\('text', 'input_ids'\), .*'labels'"),
    ({"labels": -100, "name": 0}, r"pad names batch\['name'\], which is a list of values per sample"),
    ({"labels": -100, "id": 0}, r"pad names batch\['id'\], whose samples are single values"),
])
def test_a_wrong_pad_declaration_is_an_error_naming_the_leaf(runtime_dir, pad, message):
    with bc.Producer(Speech(16, 4, 9), "wrong", epochs=1, samples_per_epoch=16):
        consumer = bc.Consumer("wrong", batch_size=6, pad=pad)
        with pytest.raises(ValueError, match=message):
            list(consumer)
        consumer.close()


def test_pad_arguments_are_checked_where_they_are_given(runtime_dir):
    with pytest.raises(ValueError, match="without batch_size= the loader.s batches arrive as they are"):
        bc.Consumer("x", pad=0)
    with pytest.raises(ValueError, match="Pad's multiple_of must be a positive int"):
        bc.Pad(0, multiple_of=0)
    with pytest.raises(TypeError, match=r"pad\['labels'\] must be a number"):
        bc.Consumer("x", batch_size=4, pad={"labels": "zero"})
    with pytest.raises(TypeError, match="pad's keys name leaves"):
        bc.Consumer("x", batch_size=4, pad={1.5: 0})


def test_one_value_pads_every_leaf(runtime_dir):
    n = 40
    with bc.Producer(Speech(n, 5, 11), "all", epochs=1, samples_per_epoch=n):
        consumer = bc.Consumer("all", batch_size=7, pad=0)
        batches = list(consumer)
        consumer.close()
    assert [i for b in batches for i in b["id"].tolist()] == list(range(n))
    for b in batches:  # labels padded with 0 here: what was -100 inside a loader batch stays
        for r, i in enumerate(b["id"].tolist()):
            k = length(i, 11)
            assert torch.equal(b["text"]["input_ids"][r, :k], token_ids(i, k))


@pytest.mark.every_torch
def test_group_ranks_get_their_samples_repadded(runtime_dir):
    n, longest = 60, 13
    widths = widths_by_sample(n, 4, longest)
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            c = bc.Consumer("padgroup", batch_size=5, pad=PAD, group=bc.Group("g", r, 2))
            got[r] = [i for b in c for i in check_batch(b, longest, 1, widths)]
            c.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    # The group counts once complete: the producer begins when both ranks are there.
    with bc.Producer(Speech(n, 4, longest), "padgroup", epochs=1, samples_per_epoch=n):
        threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors
    # Windows of 2 x 5: rank r takes the r-th 5 of each 10 (60 samples, no tail).
    assert got[0] == [i for w in range(0, n, 10) for i in range(w, w + 5)]
    assert got[1] == [i for w in range(0, n, 10) for i in range(w + 5, w + 10)]


@pytest.mark.every_torch
def test_a_resumed_trainer_gets_the_rest_of_its_epoch_repadded(runtime_dir):
    n, longest = 60, 13
    widths = widths_by_sample(n, 4, longest)
    with bc.Producer(Speech(n, 4, longest), "padresume", samples_per_epoch=n):  # until stopped
        first = bc.Consumer("padresume", batch_size=7, pad=PAD)
        it = iter(first)
        seen = [i for _, b in zip(range(3), it) for i in check_batch(b, longest, 1, widths)]
        state = first.state_dict()
        first.close()
        again = bc.Consumer("padresume", batch_size=7, state=state, pad=PAD)
        seen += [i for b in again for i in check_batch(b, longest, 1, widths)]
        again.close()
    assert seen == list(range(n)), seen  # the loader's order is the same every pass
