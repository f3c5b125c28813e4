"""What the batchcast producers of this user on this machine are doing: each
running producer is asked through the protocol; names left behind by a
producer that died are reported (and their files removed)."""

from __future__ import annotations

import json
from typing import Any, cast

from . import _status


def list_producers(name: str | None = None, *, runtime_dir: str | None = None,
                   timeout: float = 1.0, clean: bool = True) -> list[dict[str, Any]]:
    """One dict per producer name: ``name``, ``alive``, ``status`` (the
    producer's own report: throughput counters, its consumers with their
    batch size, lag, slots held and stall time; ``None`` if it did not answer
    or is gone) and ``note`` (what happened otherwise).

    >>> for p in list_producers():
    ...     print(p["name"], p["alive"], p["status"] and len(p["status"]["consumers"]))
    """
    # The core's listings, with "status" parsed in place (no longer str).
    listings = cast("list[dict[str, Any]]", _status.list_producers(
        runtime_dir=runtime_dir or "", name=name or "", timeout=float(timeout),
        clean=bool(clean)))
    for p in listings:
        p["status"] = json.loads(p["status"]) if p["status"] else None
    return listings
