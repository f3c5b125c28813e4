"""The producer's order (batchcast._order over the core's join plan): consumers
that join mid-epoch get every sample exactly once per epoch of their own, over
any schedule of joins and leaves, with torch's own samplers, and with nobody
joined mid-epoch the order is the loader's own. (The plan's own model test,
with groups, resumes and a last epoch, is tests/cpp/test_join_plan.cpp.)"""

from __future__ import annotations

import collections
import random

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, SubsetRandomSampler

from batchcast import _C
from batchcast._order import BlockOrder, steering


def planned(sampler: BatchSampler, per_epoch: int) -> tuple[BlockOrder, _C._testing.JoinPlan]:
    """The sampler as a producer serves it, and the join plan it asks."""
    batches = -(-per_epoch // sampler.batch_size)
    plan = _C._testing.JoinPlan(join_now=True, samples_per_epoch=per_epoch, batches_per_epoch=batches)
    return BlockOrder(sampler, plan.order), plan


def batch_sampler(n: int, batch: int, drop_last: bool, seed: int, num_samples: int | None = None
                  ) -> BatchSampler:
    g = torch.Generator().manual_seed(seed)
    return BatchSampler(RandomSampler(range(n), generator=g, num_samples=num_samples), batch, drop_last)


@pytest.mark.parametrize("drop_last", [False, True])
def test_nobody_joined_mid_epoch_is_the_loaders_own_order(drop_last: bool) -> None:
    plain = batch_sampler(103, 8, drop_last, seed=5)
    order, plan = planned(batch_sampler(103, 8, drop_last, seed=5), 96 if drop_last else 103)
    for epoch in range(4):
        assert plan.steer(epoch) == []
        assert list(order) == list(plain)
    assert len(order) == len(plain)


class Trial:
    """A consumer in the simulation: joined after `offset` samples of an epoch."""

    def __init__(self, offset: int, plan: _C._testing.JoinPlan, number: int) -> None:
        self.offset = offset
        self.number = number
        plan.joined(number, offset)
        self.seen: list[int] = []
        self.left = False


def simulate(seed: int, n: int, batch: int, drop_last: bool, epochs: int) -> tuple[int, int]:
    """Random joins (at batch boundaries, several per epoch) and leaves over
    `epochs`; every trial's every whole epoch of its own must hold each of the
    epoch's samples once. Returns (trials, whole epochs checked)."""
    rnd = random.Random(seed)
    per_epoch = n // batch * batch if drop_last else n
    batches = -(-per_epoch // batch)
    order, plan = planned(batch_sampler(n, batch, drop_last, seed), per_epoch)
    whole = Trial(0, plan, 0)  # a whole-stream consumer throughout
    trials: list[Trial] = [whole]
    everyone = list(trials)
    epoch_sets: list[collections.Counter[int]] = []
    for epoch in range(epochs):
        assert plan.steer(epoch) == sorted({t.offset for t in trials if not t.left and t.offset > 0})
        served = 0
        this_epoch: list[int] = []
        joins = {k for k in range(1, batches) if rnd.random() < 0.25}
        if batches > 1:
            joins.add(rnd.randrange(1, batches))  # at least one joins mid-epoch
        for k, indices in enumerate(order):
            if k in joins:  # someone joins before batch k
                t = Trial(served, plan, len(everyone))
                trials.append(t)
                everyone.append(t)
            for t in trials:
                if t is not whole and not t.left and rnd.random() < 0.5 / batches:
                    t.left = True
                    plan.left(t.number)
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
    order, plan = planned(batch_sampler(64, 8, False, seed=1), 64)
    plan.steer(0)
    first = [i for b in order for i in b]
    plan.joined(1, 24)
    plan.steer(1)
    second = [i for b in order for i in b]
    assert set(second[:24]) == set(first[:24]) and second[:24] != first[:24]  # same set, new order
    plan.left(1)  # the consumer left: one block again, the loader's fresh order
    plan.steer(2)
    third = [i for b in order for i in b]
    assert set(third[:24]) != set(second[:24])


def test_repeated_samples_keep_their_blocks_too() -> None:
    # RandomSampler(num_samples > n) without replacement: whole permutations, concatenated
    order, plan = planned(batch_sampler(10, 4, False, seed=2, num_samples=30), 30)
    plan.steer(0)
    first = [i for b in order for i in b]
    plan.joined(1, 8)
    plan.joined(2, 16)
    plan.steer(1)
    second = [i for b in order for i in b]
    for lo, hi in ((0, 8), (8, 16), (16, 30)):
        assert collections.Counter(second[lo:hi]) == collections.Counter(first[lo:hi])


def test_a_sampler_that_changes_its_samples_is_an_error_for_consumers_joined_mid_epoch() -> None:
    indices = [0, 1, 2, 3]
    order, plan = planned(BatchSampler(SubsetRandomSampler(indices), 2, False), 4)
    plan.steer(0)
    list(order)
    plan.joined(1, 2)
    plan.steer(1)
    indices[3] = 5  # the dataset changed under the sampler
    with pytest.raises(ValueError, match="changed what an epoch holds .*Keep the dataset and the sampler"):
        list(order)
    plan.left(1)  # nobody to keep it for: any order goes
    plan.steer(2)
    assert sorted(i for b in order for i in b) == [0, 1, 2, 5]


def test_samples_that_are_not_integers_keep_their_blocks_too() -> None:
    keys = [f"clip-{k}" for k in range(12)]
    order, plan = planned(BatchSampler(SubsetRandomSampler(keys), 3, False), 12)
    plan.steer(0)
    first = [k for b in order for k in b]
    plan.joined(1, 6)
    plan.steer(1)
    second = [k for b in order for k in b]
    assert sorted(second) == sorted(keys) and set(second[:6]) == set(first[:6])


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
