"""`batchcast status`: a producer's listing as the lines and the consumers'
table a person reads."""

from __future__ import annotations

from typing import Any

from ._display import duration, rate, share


def bytes_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def consumer_now(c: dict[str, Any], status: dict[str, Any]) -> str:
    """What a consumer's trainer is most likely doing, as the producer sees it:
    computing (it has batches it has not taken: the producer waits for it if
    the ring is full), or waiting for batches (it took everything it was
    sent): for the loader, or for the ring, which a slower consumer fills."""
    if c.get("waiting_for_group"):
        return "waiting for its group"
    if c.get("leaving"):
        return "leaving"
    if c.get("holding_up"):
        return "computing; the producer waits for it"
    if int(c.get("lag", 0)) > 0:
        return "computing"
    if status.get("waiting_for") == "consumers":
        return "waiting: ring full (a slower consumer)"
    if status.get("waiting_for") == "joins":
        return "waiting: other consumers to join"
    return "waiting: the loader"


def status_block(listing: dict[str, Any]) -> tuple[list[str], Any]:
    """A producer's status: its lines, then its consumers' table (a rich
    renderable; None without consumers)."""
    name = listing["name"]
    status = listing.get("status")
    if status is None:
        if listing.get("alive"):
            return [f"{name}: running, but did not answer: "
                    f"{listing.get('note') or 'no reply'}"], None
        return [f"{name}: {listing.get('note') or 'not running'}"], None
    uptime = float(status.get("uptime_seconds", 0))
    epoch, done = status.get("epoch", -1), status.get("epochs_done", 0)
    if epoch < 0:
        epoch_text = "no epoch begun yet"
    elif done > epoch:
        epoch_text = f"between epochs ({done} done)"
    else:
        epoch_text = f"epoch {epoch} ({done} done)"
    lines = [
        f"{name}: pid {status.get('pid')}, {status.get('ring_device', '?')}, "
        f"up {duration(uptime)}, {epoch_text}, ring {bytes_text(status.get('ring_bytes', 0))} "
        f"({status.get('slots', '?')} slots, {status.get('slots_in_use', 0)} batches in it)",
    ]
    batches, samples = status.get("batches_published", 0), status.get("samples_published", 0)

    def per_s(v: float) -> str:
        return rate(v / uptime) if uptime > 0 else "-"

    lines.append(f"  published {batches} batches, {samples} samples: {per_s(batches)} batches/s, "
                 f"{per_s(samples)} samples/s (over uptime)")
    loader, wait, copy = (float(status.get(k, 0)) for k in
                          ("loader_seconds", "wait_seconds", "publish_seconds"))
    other = max(0.0, uptime - loader - wait - copy)
    lines.append(f"  time: waiting for loader {share(loader, uptime)}, for consumers "
                 f"{share(wait, uptime)}, copying {share(copy, uptime)}, "
                 f"other {share(other, uptime)} (waiting for joins, between epochs)")
    events = [f"{status.get(k, 0)} {k}" for k in ("joins", "leaves", "crashes", "evictions")
              if status.get(k, 0)]
    consumers = status.get("consumers", [])
    lines.append(f"  consumers: {len(consumers)}" + (f" ({', '.join(events)})" if events else ""))
    waiting, since = status.get("waiting_for"), float(status.get("waiting_seconds", 0))
    if waiting == "joins":
        lines.append(f"  waiting for {status.get('consumers_wanted')} consumers to join before "
                     f"loading (min_consumers; {len(consumers)} present)")
    elif waiting == "consumers":
        behind = [c for c in consumers if c.get("holding_up")]
        who = f"consumer pid {behind[0].get('pid')}" if behind else "the consumers"
        lines.append(f"  now: waiting {duration(since)} for {who} to free ring space")
    elif waiting == "loader":
        workers = status.get("loader_workers") or []
        alive = f" (its worker processes alive: {', '.join(map(str, workers))})" if workers else ""
        lines.append(f"  now: waiting {duration(since)} for the loader's next batch{alive}")
    if status.get("stuck"):  # nothing can move: the consumers keeping batches are about to go
        lines.append(f"  stuck: {status['stuck']}")
    if not consumers:
        return lines, None
    from rich.padding import Padding
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in ("pid", "batch", "first epoch", "batches sent", "lag", "slots held/kept",
                   "stalled", "now"):
        table.add_column(header, justify="right", no_wrap=True)
    for c in consumers:
        table.add_row(
            str(c.get("pid")) + (" (leaving)" if c.get("leaving") else ""),
            str(c.get("batch_size") or "loader's"),
            str(c.get("first_epoch")),
            str(c.get("batches_sent")),
            str(c.get("lag")),
            f"{c.get('slots_held', 0)}/{c.get('slots_pinned', 0)}",
            share(float(c.get("stall_seconds", 0)), uptime),
            consumer_now(c, status),
        )
    return lines, Padding(table, (0, 0, 0, 4), expand=False)
