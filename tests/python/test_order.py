"""The producer's order (batchcast._order): consumers that join mid-epoch get
every sample exactly once per epoch of their own, over any schedule of joins
and leaves, and with nobody joined mid-epoch the order is the loader's own."""

from __future__ import annotations

import collections
import random

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from batchcast._order import BlockOrder, keep_blocks, steering


def batch_sampler(n: int, batch: int, drop_last: bool, seed: int, num_samples: int | None = None
                  ) -> BatchSampler:
    g = torch.Generator().manual_seed(seed)
    return BatchSampler(RandomSampler(range(n), generator=g, num_samples=num_samples), batch, drop_last)


@pytest.mark.parametrize("drop_last", [False, True])
def test_nobody_joined_mid_epoch_is_the_loaders_own_order(drop_last: bool) -> None:
    plain = batch_sampler(103, 8, drop_last, seed=5)
    order = BlockOrder(batch_sampler(103, 8, drop_last, seed=5), 96 if drop_last else 103)
    for _ in range(4):
        order.keep([])
        assert list(order) == list(plain)
    assert len(order) == len(plain)


class Trial:
    """A consumer in the simulation: joined after `offset` samples of an epoch."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.seen: list[int] = []
        self.left = False


def simulate(seed: int, n: int, batch: int, drop_last: bool, epochs: int) -> tuple[int, int]:
    """Random joins (at batch boundaries, several per epoch) and leaves over
    `epochs`; every trial's every whole epoch of its own must hold each of the
    epoch's samples once. Returns (trials, whole epochs checked)."""
    rnd = random.Random(seed)
    per_epoch = n // batch * batch if drop_last else n
    batches = -(-per_epoch // batch)
    order = BlockOrder(batch_sampler(n, batch, drop_last, seed), per_epoch)
    whole = Trial(0)  # a whole-stream consumer throughout
    trials: list[Trial] = [whole]
    everyone = list(trials)
    epoch_sets: list[collections.Counter[int]] = []
    for _ in range(epochs):
        order.keep([t.offset for t in trials if not t.left and t.offset > 0])
        served = 0
        this_epoch: list[int] = []
        joins = {k for k in range(1, batches) if rnd.random() < 0.25}
        if batches > 1:
            joins.add(rnd.randrange(1, batches))  # at least one joins mid-epoch
        for k, indices in enumerate(order):
            if k in joins:  # someone joins before batch k
                t = Trial(served)
                trials.append(t)
                everyone.append(t)
            for t in trials:
                if t is not whole and not t.left and rnd.random() < 0.5 / batches:
                    t.left = True
            for t in trials:
                if not t.left:
                    t.seen.extend(indices)
            served += len(indices)
            this_epoch.extend(indices)
        assert served == per_epoch and k == batches - 1
        assert len(set(this_epoch)) == per_epoch  # each producer epoch: distinct samples
        epoch_sets.append(collections.Counter(this_epoch))
        trials = [t for t in trials if not t.left]
    checked = 0
    for t in everyone:
        for start in range(0, len(t.seen) - per_epoch + 1, per_epoch):
            own = t.seen[start:start + per_epoch]
            assert len(set(own)) == per_epoch, (seed, t.offset, start)
            if not drop_last:
                assert set(own) == set(range(n))
            checked += 1
    return len(everyone), checked


@pytest.mark.parametrize("seed", range(40))
def test_every_epoch_of_every_consumer_is_whole_over_random_joins_and_leaves(seed: int) -> None:
    rnd = random.Random(seed)
    n, batch = rnd.randint(20, 300), rnd.randint(1, 9)
    trials, checked = simulate(seed, n, batch, drop_last=rnd.random() < 0.5, epochs=6)
    assert checked >= 6 and trials >= 2


def test_samples_stay_in_their_block_while_its_join_position_lasts() -> None:
    order = BlockOrder(batch_sampler(64, 8, False, seed=1), 64)
    order.keep([])
    first = [i for b in order for i in b]
    order.keep([24])
    second = [i for b in order for i in b]
    assert set(second[:24]) == set(first[:24]) and second[:24] != first[:24]  # same set, new order
    order.keep([])  # the consumer left: one block again, the loader's fresh order
    third = [i for b in order for i in b]
    assert set(third[:24]) != set(second[:24])


def test_repeated_samples_keep_their_blocks_too() -> None:
    # RandomSampler(num_samples > n) without replacement: whole permutations, concatenated
    order = BlockOrder(batch_sampler(10, 4, False, seed=2, num_samples=30), 30)
    order.keep([])
    first = [i for b in order for i in b]
    order.keep([8, 16])
    second = [i for b in order for i in b]
    for lo, hi in ((0, 8), (8, 16), (16, 30)):
        assert collections.Counter(second[lo:hi]) == collections.Counter(first[lo:hi])


def test_a_sampler_that_changes_its_samples_is_an_error_for_consumers_joined_mid_epoch() -> None:
    with pytest.raises(ValueError, match="not the last epoch's"):
        keep_blocks([0, 1, 2, 3], [0, 1, 2, 5], [2])
    with pytest.raises(ValueError, match="this epoch has 3 samples, the last had 4"):
        keep_blocks([0, 1, 2, 3], [0, 1, 2], [2])
    with pytest.raises(ValueError, match="was not in the last"):
        keep_blocks(["a", "b", "b"], ["a", "b", "c"], [1])
    assert keep_blocks([3, 1, 2, 0], [0, 1, 2, 3], []) == [0, 1, 2, 3]  # nobody to keep it for


def test_what_the_producer_can_steer() -> None:
    data = list(range(10))
    assert steering(DataLoader(data, batch_size=2, shuffle=True)) is None
    assert steering(DataLoader(data, batch_size=2)) is None
    assert steering(DataLoader(data, batch_size=2, sampler=SequentialSampler(data))) is None
    assert "not a DataLoader" in str(steering([torch.zeros(2)]))
    replacement = DataLoader(data, batch_size=2, sampler=RandomSampler(data, replacement=True))
    assert "with replacement" in str(steering(replacement))
    partial = DataLoader(data, batch_size=2, sampler=RandomSampler(data, num_samples=15))
    assert "num_samples=15 of 10" in str(steering(partial))
    assert steering(DataLoader(data, batch_size=2, sampler=RandomSampler(data, num_samples=20))) is None

    class Mine(torch.utils.data.Sampler):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(10))

        def __len__(self) -> int:
            return 10
    assert "Mine" in str(steering(DataLoader(data, batch_size=2, sampler=Mine())))
    assert "BatchSampler" in str(steering(DataLoader(data, batch_sampler=[[0, 1], [2, 3]])))

    class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(4))
    assert "IterableDataset" in str(steering(DataLoader(Stream(), batch_size=2)))
