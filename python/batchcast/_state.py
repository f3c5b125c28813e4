"""The format of a consumer's ``state_dict()``: what it names, how it is
checked against the consumer it is restored into, and what it asks of the
core (where to resume, and in which run of the producer it was saved).

Plain data, to be saved with a trial's checkpoint::

    {"format": "batchcast.Consumer/1", "producer": name,
     "epoch": the producer's epoch it is in (None: before any), "position":
     the stream position of the first sample not taken, "joined_at": where
     its epochs begin in the producer's (0: with them), "epoch_number": its
     own count of that epoch, "seed": its transform's seed, "batch_size",
     "drop_last", "group", "rank", "world_size", "loader": the producer's
     description of its loader, "run": the producer's run it was saved in}
"""

from __future__ import annotations

from typing import Any, TypedDict

FORMAT = "batchcast.Consumer/1"


class Resume(TypedDict, total=False):
    """The core's keywords for a resume (its options list)."""

    resume_epoch: int
    resume_position: int
    resume_joined_at: int
    resume_run: int


def saved(*, producer: str, epoch: int | None, position: int, joined_at: int, epoch_number: int,
          seed: int | None, batch_size: int | None, drop_last: bool, group: str | None, rank: int | None,
          world_size: int | None, loader: str, run: int) -> dict[str, Any]:
    return {"format": FORMAT, "producer": producer, "epoch": epoch, "position": position,
            "joined_at": joined_at, "epoch_number": epoch_number, "seed": seed,
            "batch_size": batch_size, "drop_last": drop_last,
            "group": group, "rank": rank, "world_size": world_size, "loader": loader, "run": run}


def check(state: Any, mine: dict[str, Any]) -> None:
    """ValueError unless `state` is a consumer state saved with what `mine`
    names (producer, batch size, group, rank, ... as the restoring consumer
    has them)."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError("not a batchcast.Consumer state_dict() (or one of another batchcast "
                         f"version): {state!r}")
    for key, value in mine.items():
        if state.get(key) != value:
            raise ValueError(
                f"this state was saved by a consumer with {key}={state.get(key)!r}; this one "
                f"has {key}={value!r}. Restore it into a consumer made as the one that saved it")


def resume_from(state: dict[str, Any]) -> Resume:
    """The core's resume keywords for a checked state (none: it was saved
    before its first epoch)."""
    if state["epoch"] is None:
        return {}
    return {"resume_epoch": int(state["epoch"]), "resume_position": int(state["position"]),
            "resume_joined_at": int(state.get("joined_at", 0)), "resume_run": int(state.get("run", 0))}


def other_loader(state: dict[str, Any] | None, name: str, loader: str) -> str | None:
    """Why `state` cannot be restored against producer `name` serving
    `loader` (None: it can)."""
    if state is None or not state.get("loader") or not loader or state["loader"] == loader:
        return None
    return (f"this state was saved from a consumer of another loader ({state['loader']!r}); "
            f"producer '{name}' serves {loader!r}. Restore it against the loader it was saved from")
