"""A batch's structure while rebatching: a consumer batch joins samples of
consecutive loader batches, so it may only join batches of one structure.
Every delivered leaf holds the loader's samples for its positions, or the
consumer raises RebatchError saying what changed (a producer on a background
thread, consumers in this process)."""

from __future__ import annotations

import collections
import os
import random
import uuid

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchcast as bc

Point = collections.namedtuple("Point", ["a", "b"])
Other = collections.namedtuple("Other", ["a", "b"])

DTYPES = [torch.float32, torch.int32, torch.int64, torch.uint8, torch.float64]


class Spec:
    """A random batch structure whose leaves are made from sample ids.

    Nodes: ("tensor", key, dtype, trailing shape), ("text", key),
    ("values", key) (per-sample ints), ("scalar", value), ("zero_d", value),
    ("dict", [(name, node)]), ("tuple", [node]), ("list", [node]),
    ("namedtuple", cls, [node, node])."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.keys = 0
        self.root = self._container(0)

    def _key(self) -> int:
        self.keys += 1
        return self.keys

    def _node(self, depth: int):
        r = self.rng.random()
        if depth < 2 and r < 0.3:
            return self._container(depth + 1)
        if r < 0.6:
            shape = tuple(self.rng.randint(1, 3) for _ in range(self.rng.randint(0, 2)))
            return ("tensor", self._key(), self.rng.choice(DTYPES), shape)
        if r < 0.7:
            return ("text", self._key())
        if r < 0.8:
            return ("values", self._key())
        if r < 0.9:
            return ("scalar", self.rng.randint(0, 3))
        return ("zero_d", self.rng.randint(0, 3))

    def _container(self, depth: int):
        kind = self.rng.choice(["dict", "tuple", "list", "namedtuple"])
        # Every container has a tensor with a batch dimension, first, so every
        # batch has one (a batch needs one, or a per-sample list).
        first = ("tensor", self._key(), torch.int64, ())
        if kind == "namedtuple":
            return ("namedtuple", Point, [first, self._node(depth)])
        children = [first] + [self._node(depth) for _ in range(self.rng.randint(1, 3))]
        if kind == "dict":
            return ("dict", [(f"k{i}", c) for i, c in enumerate(children)])
        return (kind, children)


def build(node, ids: list[int]):
    """The batch (or a leaf of it) for samples `ids`."""
    kind = node[0]
    if kind == "tensor":
        _, key, dtype, shape = node
        rows = [torch.full(shape, (i * 7 + key) % 100).to(dtype) for i in ids]
        return torch.stack(rows) if rows else torch.zeros((0, *shape), dtype=dtype)
    if kind == "text":
        return [f"{node[1]}:{i}" for i in ids]
    if kind == "values":
        return [i * 3 + node[1] for i in ids]
    if kind == "scalar":
        return node[1]
    if kind == "zero_d":
        return torch.tensor(node[1])
    if kind == "dict":
        return {name: build(child, ids) for name, child in node[1]}
    if kind == "tuple":
        return tuple(build(child, ids) for child in node[1])
    if kind == "list":
        return [build(child, ids) for child in node[1]]
    return node[1](*(build(child, ids) for child in node[2]))


def same(got, want) -> bool:
    """Equal values in equal structures (dicts by key: a dict's order is not its structure)."""
    if isinstance(want, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.dtype == want.dtype
                and got.shape == want.shape and torch.equal(got, want))
    if isinstance(want, dict):
        return (isinstance(got, dict) and set(got) == set(want)
                and all(same(got[k], want[k]) for k in want))
    if isinstance(want, (tuple, list)):
        return (type(got) is type(want) and len(got) == len(want)
                and all(same(g, w) for g, w in zip(got, want)))
    return type(got) is type(want) and got == want


def changed(node, rng: random.Random):
    """The same structure with one change somewhere: (new node, whether the
    change is real). Changes keep each tensor's bytes per sample at most what
    they were (the ring's lanes are sized from the first batch)."""
    kind = node[0]
    if kind in ("dict", "tuple", "list", "namedtuple"):
        children = node[1] if kind != "namedtuple" else node[2]
        if rng.random() < 0.5:  # change a child
            i = rng.randrange(len(children))
            child = children[i] if kind != "dict" else children[i][1]
            new, real = changed(child, rng)
            kids = list(children)
            kids[i] = new if kind != "dict" else (children[i][0], new)
            return ((kind, kids) if kind != "namedtuple" else (kind, node[1], kids)), real
        if kind == "dict":
            options = ["reorder", "rename", "to_tuple"]
            how = rng.choice(options)
            if how == "reorder" and len(children) > 1:
                kids = list(children)
                while kids == list(children):
                    rng.shuffle(kids)
                return ("dict", kids), False
            if how == "rename":
                kids = list(children)
                kids[-1] = ("renamed", kids[-1][1])
                return ("dict", kids), True
            return ("tuple", [c for _, c in children]), True
        if kind == "namedtuple":
            return ("namedtuple", Other, children), True
        if kind == "tuple":
            return ("list", list(children)), True
        return ("tuple", list(children)), True
    if kind == "tensor":
        _, key, dtype, shape = node
        if shape and rng.random() < 0.5:
            return ("tensor", key, dtype, shape[:-1] + (shape[-1] - 1,) if shape[-1] > 1 else shape[:-1]), True
        smaller = [d for d in DTYPES if d != dtype and torch.empty(0, dtype=d).element_size()
                   <= torch.empty(0, dtype=dtype).element_size()]
        if smaller:
            return ("tensor", key, rng.choice(smaller), shape), True
        return ("tensor", key, dtype, shape), False
    if kind == "text":
        return ("values", node[1]), True
    if kind == "values":
        return ("text", node[1]), True
    return (kind, node[1] + 1), True  # a scalar's or a 0-d tensor's value


@settings(max_examples=int(os.environ.get("BATCHCAST_STRUCTURE_EXAMPLES", "50")), deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), loader_batch=st.integers(1, 9),
       batch_size=st.integers(1, 20), batches=st.integers(2, 8), changes=st.integers(0, 2))
def test_every_delivered_leaf_is_the_loaders_samples_or_the_change_is_refused(
        runtime_dir, seed, loader_batch, batch_size, batches, changes):
    rng = random.Random(seed)
    spec = Spec(rng)
    # The structure of each loader batch: the same, with changes at random batches.
    nodes, real = [spec.root], [False]
    for k in range(1, batches):
        if changes and rng.random() < changes / batches:
            node, is_real = changed(nodes[-1], rng)
        else:
            node, is_real = nodes[-1], False
        nodes.append(node)
        real.append(is_real)
    n = batches * loader_batch
    loader = [build(nodes[k], list(range(k * loader_batch, (k + 1) * loader_batch)))
              for k in range(batches)]

    # A consumer batch [p, p + B) is refused iff it takes samples of loader
    # batches k - 1 and k where batch k's structure really changed; those
    # before it arrive whole.
    expected = []
    for p in range(0, n, batch_size):
        first, last = p // loader_batch, (min(p + batch_size, n) - 1) // loader_batch
        if any(real[k] for k in range(first + 1, last + 1)):
            expected.append(None)  # refused
            break
        ids = list(range(p, min(p + batch_size, n)))
        expected.append(build(nodes[first], ids))

    name = f"structure-{uuid.uuid4().hex[:8]}"
    with bc.Producer(loader, name, epochs=1, samples_per_epoch=n):
        with bc.Consumer(name, batch_size=batch_size, timeout=10) as consumer:
            got = []
            try:
                for batch in consumer:
                    got.append(batch)
            except bc.RebatchError as error:
                got.append(error)
    for i, want in enumerate(expected):
        assert i < len(got), f"batch {i} never came ({len(got)} of {len(expected)})"
        if want is None:
            assert isinstance(got[i], bc.RebatchError), f"batch {i} joined a changed structure: {got[i]}"
            assert "structure changed" in str(got[i]) or "has samples of shape" in str(got[i])
        else:
            assert not isinstance(got[i], Exception), f"batch {i}: {got[i]}"
            assert same(got[i], want), f"batch {i}: {got[i]} != {want}"
    assert len(got) == len(expected)


def serve(batches, name, **consumer):
    """What a consumer of `batches` (one epoch) gets: its batches, then the error if one."""
    got = []
    with bc.Producer(list(batches), name, epochs=1):
        with bc.Consumer(name, timeout=10, **consumer) as c:
            try:
                for b in c:
                    got.append(b)
            except bc.Error as error:
                got.append(error)
    return got


def test_a_reordered_dict_is_the_same_structure_and_keeps_its_values(runtime_dir, name):
    # The loader's keys change order after three batches; batches of 7 over 4
    # join them (the values of x once arrived as y's).
    def batch(k):
        a = torch.arange(4 * k, 4 * k + 4)
        return {"x": a, "y": -a} if k < 3 else {"y": -a, "x": a}

    got = serve([batch(k) for k in range(6)], name, batch_size=7)
    assert [b["x"].tolist() for b in got] == [list(range(p, min(p + 7, 24))) for p in range(0, 24, 7)]
    assert all(torch.equal(b["y"], -b["x"]) for b in got)


@pytest.mark.parametrize("before, after, says", [
    ({"x": 1, "y": 2}, {"x": 1, "z": 2}, "at batch: the dict's keys ['x', 'y'] became ['x', 'z']"),
    ((1, 2), {"x": 1, "y": 2}, "at batch: a tuple of 2 items became a dict with keys ['x', 'y']"),
    (Point(1, 2), Other(1, 2), "a namedtuple Point(a, b) became a namedtuple Other(a, b)"),
])
def test_a_changed_structure_is_refused_naming_the_change_and_the_loader_batch(
        runtime_dir, name, before, after, says):
    def fill(shape, k):
        ids = torch.arange(4 * k, 4 * k + 4)
        if isinstance(shape, dict):
            return {key: ids * v for key, v in shape.items()}
        return type(shape)(*(ids * v for v in shape)) if hasattr(shape, "_fields") else \
            type(shape)(ids * v for v in shape)

    got = serve([fill(before if k < 3 else after, k) for k in range(6)], name, batch_size=7)
    assert len(got) == 2, got  # [0, 7) is whole; [7, 14) would join loader batches 2 and 3
    assert isinstance(got[1], bc.RebatchError)
    message = str(got[1])
    assert "cannot rebatch loader batch 3 of epoch 0 with loader batch 2 before it" in message
    assert says in message
    assert "batch_size=None" in message
    # Without rebatching, every loader batch arrives as it is.
    got = serve([fill(before if k < 3 else after, k) for k in range(6)], name + "f")
    assert len(got) == 6 and not any(isinstance(b, Exception) for b in got)


def test_a_value_beside_the_samples_is_its_loader_batchs_and_may_not_change_in_a_joined_batch(
        runtime_dir, name):
    # The documented rule: a 0-d tensor or a plain value beside the samples
    # comes with each consumer batch as its loader batch has it; a consumer
    # batch that joins loader batches with different values is refused.
    def batch(k, step):
        return {"x": torch.arange(4 * k, 4 * k + 4), "step": torch.tensor(step), "tag": "a"}

    got = serve([batch(k, 5) for k in range(4)], name, batch_size=6)
    assert [b["step"].item() for b in got] == [5, 5, 5]  # equal values: joined freely
    assert all(b["tag"] == "a" for b in got)
    got = serve([batch(k, k // 2) for k in range(4)], name + "b", batch_size=2)
    assert [b["step"].item() for b in got] == [0, 0, 0, 0, 1, 1, 1, 1]  # one loader batch each
    got = serve([batch(k, k // 2) for k in range(4)], name + "c", batch_size=6)
    assert [b["step"].item() for b in got[:1]] == [0]
    assert isinstance(got[1], bc.RebatchError)
    assert "at batch['step']: a 0-d tensor holding 0 (int64) became one holding 1 (int64)" in str(got[1])


def test_a_changed_dtype_or_sample_shape_names_the_leaf(runtime_dir, name):
    def batch(k):
        ids = torch.arange(4 * k, 4 * k + 4)
        return {"img": ids.float().view(-1, 1).repeat(1, 2 if k < 2 else 1), "id": ids}

    got = serve([batch(k) for k in range(4)], name, batch_size=6)
    assert isinstance(got[1], bc.RebatchError)
    assert "cannot rebatch batch['img']: loader batch 1 of epoch 0 has samples of shape [2] float32 " \
           "but loader batch 2 has [1] float32" in str(got[1])
