"""Flattens whatever a DataLoader yields into leaves the C++ core can share,
and rebuilds the same structure on the consumer side.

A leaf is a tensor whose dim 0 is the batch (shared through the ring) or a
per-sample list of plain values such as file names (sent with the
announcement). Everything else in the structure (containers, scalars) is
described by a small JSON layout; nothing is pickled.

The layout: one node, as JSON, for the batch; a node is one of

    ["T", k]                             leaf k: a tensor, the batch its dim 0
    ["S", k, is_tuple]                   leaf k: a per-sample list (a tuple if
                                         is_tuple), of str (ListKind.TEXT) or
                                         of JSON texts (ListKind.JSON)
    ["v", value]                         a plain value, the whole batch's
    ["z", value, dtype]                  a 0-dim tensor ("float32", ...)
    ["d", [key, ...], [node, ...]]       a dict (str or int keys), in order
    ["t", [node, ...]], ["l", [node, ...]]   a tuple, a list
    ["n", module, qualname, [field, ...], [node, ...]]   a namedtuple

`_visit` writes it; `_build` is its one decoder here (a batch, or one sample
of it for a transform); csrc/batchcast/consumer/layout.cpp reads the same
schema in C++ (leaf paths and keys for messages and padding).
"""

from __future__ import annotations

import collections
import importlib
import json
from typing import TYPE_CHECKING, Any, Sequence, cast

import torch

from ._core import _C

if TYPE_CHECKING:
    from ._C import _Leaf as Leaf  # a tensor, or (ListKind, [str, ...])

ListKind = _C.ListKind

TEXT, JSON = ListKind.TEXT, ListKind.JSON
_PLAIN = (str, int, float, bool, type(None))


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def batch_size(obj: Any) -> int | None:
    """The samples in a loader batch (None: it has no tensor with a batch
    dimension nor a per-sample list)."""
    return _batch_size(obj)


def _batch_size(obj: Any) -> int | None:
    """Dim 0 of the first tensor with one, else the length of the first plain list."""
    stack = [obj]
    first_list = None
    while stack:
        node = stack.pop(0)
        if isinstance(node, torch.Tensor):
            if node.dim() > 0:
                return node.shape[0]
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            if node and all(isinstance(v, _PLAIN) for v in node) and not _is_namedtuple(node):
                if first_list is None:
                    first_list = len(node)
            else:
                stack.extend(node)
    return first_list


def flatten(batch: Any) -> tuple[list[Leaf], str, int]:
    """Returns (leaves, layout, samples) for one loader batch."""
    leaves, layout, samples, _ = flatten_after(batch, None)
    return leaves, layout, samples


def flatten_after(batch: Any, previous: list[Any] | None) -> tuple[list[Leaf], str, int, list[Any]]:
    """Returns (leaves, layout, samples, tree) for one loader batch. `previous`
    is the tree of the batch before it: a dict with the same keys in another
    order is laid out in the previous order, so that it is the same structure
    (its leaves in the same places) and consumers can rebatch across it."""
    samples = _batch_size(batch)
    if samples is None:
        raise TypeError(
            f"batchcast cannot tell the batch size of a {type(batch).__name__}: a batch needs at "
            "least one tensor with a batch dimension or one per-sample list" + _numpy_hint(batch)
        )
    leaves: list[Leaf] = []
    tree = _visit(batch, "batch", samples, leaves, previous)
    return leaves, json.dumps(tree, separators=(",", ":")), samples, tree


def _numpy_hint(batch: Any) -> str:
    """What to do when a batch holds numpy arrays, which batchcast does not share."""
    stack, seen = [batch], 0
    while stack and seen < 10_000:
        node = stack.pop()
        seen += 1
        if type(node).__module__ == "numpy" and hasattr(node, "shape"):
            return ("; it holds a numpy array, which batchcast does not share: return tensors "
                    "(torch.from_numpy(a) in the dataset, or the default collate_fn, which "
                    "converts numpy arrays)")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return ""


def _visit(node: Any, path: str, samples: int, leaves: list[Leaf],
           previous: list[Any] | None) -> list[Any]:
    # Module level for the same reason as _build: no reference cycles over tensors.
    if isinstance(node, torch.Tensor):
        if node.dim() == 0:
            return ["z", node.item(), str(node.dtype).removeprefix("torch.")]
        if node.shape[0] != samples:
            raise TypeError(
                f"tensor at {path} has {node.shape[0]} rows but the batch has {samples} "
                "samples; every tensor in a batch must have the batch as dim 0"
            )
        if node.is_sparse or node.layout != torch.strided:
            raise TypeError(f"tensor at {path} is not a dense (strided) tensor")
        leaves.append(node)
        return ["T", len(leaves) - 1]
    if isinstance(node, _PLAIN):
        return ["v", node]
    if isinstance(node, dict):
        keys = list(node.keys())
        for k in keys:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"dict at {path} has a key of type {type(k).__name__}; "
                                "batchcast supports str and int keys")
        before = previous if previous is not None and previous[0] == "d" else None
        if before is not None and before[1] != keys and len(before[1]) == len(keys) \
                and set(before[1]) == set(keys):
            keys = list(before[1])  # the same dict in another order: the order before it
        children = (dict(zip(before[1], before[2])) if before is not None else {})
        return ["d", keys, [_visit(node[k], f"{path}[{k!r}]", samples, leaves, children.get(k))
                            for k in keys]]
    if _is_namedtuple(node):
        cls = type(node)
        kids = _children(previous, "n", 4, len(node))
        return ["n", cls.__module__, cls.__qualname__, list(cls._fields),
                [_visit(v, f"{path}.{f}", samples, leaves, kid)
                 for f, v, kid in zip(cls._fields, node, kids)]]
    if isinstance(node, (list, tuple)):
        if node and all(isinstance(v, _PLAIN) for v in node):
            if len(node) != samples:
                raise TypeError(
                    f"list at {path} has {len(node)} items but the batch has {samples} "
                    "samples; a list of plain values must have one item per sample"
                )
            if all(isinstance(v, str) for v in node):
                leaves.append((TEXT, list(node)))
            else:
                leaves.append((JSON, [json.dumps(v) for v in node]))
            return ["S", len(leaves) - 1, isinstance(node, tuple)]
        tag = "t" if isinstance(node, tuple) else "l"
        kids = _children(previous, tag, 1, len(node))
        return [tag, [_visit(v, f"{path}[{i}]", samples, leaves, kid)
                      for i, (v, kid) in enumerate(zip(node, kids))]]
    raise TypeError(
        f"batchcast cannot share the {type(node).__module__}.{type(node).__qualname__} at "
        f"{path}: supported are tensors, per-sample lists of str/int/float/bool/None, "
        "scalars, and tuples, lists, dicts and namedtuples of these (convert other objects "
        "to tensors in the dataset or collate_fn" +
        ("; torch.from_numpy(a) for a numpy array" if type(node).__module__ == "numpy" else "")
        + ")"
    )


def _children(previous: list[Any] | None, tag: str, at: int, count: int) -> list[Any]:
    """The previous batch's children of a container like this one (else Nones)."""
    if previous is not None and previous[0] == tag and len(previous[at]) == count:
        return list(previous[at])
    return [None] * count


_layouts: dict[str, Any] = {}
_namedtuples: dict[tuple[str, str, tuple[str, ...]], type] = {}


def _namedtuple_class(module: str, qualname: str, fields: list[str]) -> type:
    key = (module, qualname, tuple(fields))
    cls = _namedtuples.get(key)
    if cls is None:
        cls = _namedtuples[key] = _find_namedtuple(module, qualname, fields)
    return cls


def _find_namedtuple(module: str, qualname: str, fields: list[str]) -> type:
    try:  # the producer's own class when this process can import it
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        if (isinstance(found, type) and issubclass(found, tuple)
                and tuple(getattr(found, "_fields", ())) == tuple(fields)):
            return found
    except Exception:
        pass
    return collections.namedtuple(qualname.rsplit(".", 1)[-1], fields)


def tree_of(layout: str) -> list[Any]:
    """The structure a layout describes (parsed once per layout)."""
    tree: list[Any] | None = _layouts.get(layout)
    if tree is None:
        tree = cast("list[Any]", json.loads(layout))
        if len(_layouts) > 256:
            _layouts.clear()
        _layouts[layout] = tree
    return tree


def unflatten(layout: str, leaves: list[Leaf]) -> Any:
    return _build(tree_of(layout), leaves, None)


def sample_of(tree: list[Any], leaves: Sequence[Any], i: int) -> Any:
    """Sample i of a batch laid out as `tree`: each tensor indexed at i, each
    per-sample list's item i, the rest as the batch has it."""
    return _build(tree, leaves, i)


def leaf_paths(tree: list[Any]) -> list[str]:
    """Where each leaf lies in a batch laid out as `tree`, as the user
    writes it (``batch['image']``, ``batch[1]``, ``batch.label``), by leaf."""
    paths: dict[int, str] = {}
    _paths(tree, "batch", paths)
    return [paths[k] for k in sorted(paths)]


def _paths(node: list[Any], path: str, out: dict[int, str]) -> None:
    tag = node[0]
    if tag in ("T", "S"):
        out[node[1]] = path
    elif tag == "d":
        for key, child in zip(node[1], node[2]):
            _paths(child, f"{path}[{key!r}]", out)
    elif tag in ("t", "l"):
        for i, child in enumerate(node[1]):
            _paths(child, f"{path}[{i}]", out)
    elif tag == "n":
        for field, child in zip(node[3], node[4]):
            _paths(child, f"{path}.{field}", out)


def _build(node: list[Any], leaves: Sequence[Any], i: int | None) -> Any:
    # Module level on purpose: a recursive closure is a reference cycle that would
    # keep each batch's tensors, and so their ring slots, alive until gc runs.
    tag = node[0]
    if tag == "T":
        return leaves[node[1]] if i is None else leaves[node[1]][i]
    if tag == "S":
        kind, values = leaves[node[1]]
        if i is not None:
            return values[i] if kind == TEXT else json.loads(values[i])
        items = values if kind == TEXT else [json.loads(v) for v in values]
        return tuple(items) if node[2] else items
    if tag == "v":
        return node[1]
    if tag == "z":
        return torch.tensor(node[1], dtype=getattr(torch, node[2]))
    if tag == "d":
        return dict(zip(node[1], (_build(c, leaves, i) for c in node[2])))
    if tag == "t":
        return tuple(_build(c, leaves, i) for c in node[1])
    if tag == "l":
        return [_build(c, leaves, i) for c in node[1]]
    if tag == "n":
        return _namedtuple_class(node[1], node[2], node[3])(*(_build(c, leaves, i) for c in node[4]))
    raise ValueError(f"unknown layout node {tag!r}")
