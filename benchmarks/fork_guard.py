"""What the fork guard costs a trainer per batch: each next() of a consumer
leaves the thread's own code (the guard's wait) and comes back to it (its
resume), two turns of one lock. Timed alone, in this process, with one and
with two consumers open in the thread (train and validation), and the
empty loop beside it (the bound).

    python benchmarks/fork_guard.py                      # the guard installed with batchcast
    python benchmarks/fork_guard.py --module OLD_forks.py  # another version of it (A/B:
        git show REV:python/batchcast/_forks.py > /tmp/old_forks.py)

Prints a table: nanoseconds per batch, median and [min, max] of the repeats.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time


def load(path: str | None):
    if path is None:
        from batchcast import _forks

        return _forks
    spec = importlib.util.spec_from_file_location("forks_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cycle(forks, turns: int):
    """One batch's turns of the guard: (leave, come back) of the first turn."""
    if hasattr(forks.Turn, "resume"):  # the guard that counts threads
        made = [forks.Turn("benchmark") for _ in range(turns)]
        for t in made:
            t.resume()
        first = made[0]
        return first.wait, first.resume, lambda: [t.close() for t in made]
    made = [forks.Turn() for _ in range(turns)]  # the guard that counted consumers
    for t in made:
        t.begin()
    first = made[0]
    return first.end, first.begin, lambda: [t.end() for t in made]


def per_batch(leave, back, n: int) -> float:
    began = time.perf_counter_ns()
    for _ in range(n):
        leave()
        back()
    return (time.perf_counter_ns() - began) / n


def empty(n: int) -> float:
    began = time.perf_counter_ns()
    for _ in range(n):
        pass
    return (time.perf_counter_ns() - began) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", help="a _forks.py to time instead of the installed one")
    parser.add_argument("--batches", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    forks = load(args.module)
    rows = [("the empty loop (bound)", [empty(args.batches) for _ in range(args.repeats)])]
    for turns in (1, 2):
        leave, back, done = cycle(forks, turns)
        rows.append((f"guard, {turns} consumer(s) open in the thread",
                     [per_batch(leave, back, args.batches) for _ in range(args.repeats)]))
        done()
    print(f"fork guard: {args.module or forks.__file__}, {args.batches} batches x {args.repeats}")
    print(f"{'':44} {'ns/batch median':>16} {'[min, max]':>16}")
    for label, values in rows:
        print(f"{label:44} {statistics.median(values):16.0f} "
              f"{'[%.0f, %.0f]' % (min(values), max(values)):>16}")


if __name__ == "__main__":
    main()
