"""Turns the device arguments users pass (strings, torch.device, ints) into
what the core takes: a kind ('cpu' or 'cuda') and a CUDA index."""

from __future__ import annotations

from typing import Any

import torch


def parse_device(device: Any, what: str) -> tuple[str, int]:
    """'cpu' -> ('cpu', -1); 'cuda', 'cuda:N', torch.device('cuda', N) or N -> ('cuda', N).

    A bare 'cuda' means the current CUDA device, as in torch.
    """
    if isinstance(device, bool):
        raise TypeError(f"{what} must be 'cpu', 'cuda', 'cuda:N' or a torch.device, not {device!r}")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{what}={device!r} is not a device: {exc}") from None
    if d.type == "cpu":
        return "cpu", -1
    if d.type != "cuda":
        raise ValueError(f"{what}={device!r}: batchcast serves host memory ('cpu') or CUDA GPUs ('cuda:N')")
    if d.index is not None:
        return "cuda", d.index
    return "cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0
