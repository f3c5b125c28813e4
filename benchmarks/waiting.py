"""What a consumer costs while it waits: CPU per second of waiting, and wakeups.

    python benchmarks/waiting.py [--seconds 5] [--repeats 3]

A producer whose loader takes far longer than the measurement to make its
first batch; a consumer process blocked in next() meanwhile (its trainer
waits, as a trainer does for a slow loader). For each thread of the consumer:
CPU time (utime + stime from /proc) and context switches (voluntary +
involuntary: each is a wakeup) per second of waiting, measured after the
consumer has joined. The trainer's thread wakes to check for Ctrl-C about
every 100 ms (its interrupt check); anything else is what the issue calls
"CPU beyond the interrupt check". Medians over --repeats runs, [min, max].
Results also go to benchmarks/results/waiting.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TICKS = os.sysconf("SC_CLK_TCK")

PRODUCER = r"""
import sys, time, torch, batchcast as bc
class Slow:
    def __iter__(self):
        time.sleep(3600)  # the first batch never comes while we measure
        yield torch.zeros(1)
    def __len__(self):
        return 1
bc.Producer(Slow(), name=sys.argv[1], runtime_dir=sys.argv[2], epochs=1).run()
"""

CONSUMER = r"""
import sys, batchcast as bc
c = bc.Consumer(sys.argv[1], join=bc.Join(runtime_dir=sys.argv[2]), timeout=60)
it = iter(c)
open(sys.argv[3], "w").write("joined")
next(it)  # waits for the loader
"""


def threads(pid: int) -> dict[str, tuple[float, int]]:
    """name -> (CPU seconds in clock ticks, context switches) of each thread."""
    out: dict[str, tuple[float, int]] = {}
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        base = f"/proc/{pid}/task/{tid}"
        try:
            stat = Path(f"{base}/stat").read_text()
            status = Path(f"{base}/status").read_text()
        except FileNotFoundError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICKS
        switches = sum(int(line.split()[1]) for line in status.splitlines()
                       if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
        key = "trainer (main)" if int(tid) == pid else name
        while key in out:
            key += "'"
        out[key] = (cpu, switches)
    return out


def thread_schedstat(pid: int) -> dict[str, float]:
    """name -> CPU seconds of each thread, at nanosecond resolution (schedstat)."""
    out: dict[str, float] = {}
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        base = f"/proc/{pid}/task/{tid}"
        try:
            stat = Path(f"{base}/stat").read_text()
            ns = int(Path(f"{base}/schedstat").read_text().split()[0])
        except FileNotFoundError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        key = "trainer (main)" if int(tid) == pid else name
        while key in out:
            key += "'"
        out[key] = ns / 1e9
    return out


def one_run(seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as rt:
        name = f"waiting{os.getpid()}"
        joined = Path(rt) / "joined"
        prod = subprocess.Popen([sys.executable, "-c", PRODUCER, name, rt])
        cons = subprocess.Popen([sys.executable, "-c", CONSUMER, name, rt, str(joined)])
        try:
            deadline = time.monotonic() + 60
            while not joined.exists():
                if time.monotonic() > deadline or cons.poll() is not None:
                    raise RuntimeError("the consumer did not join")
                time.sleep(0.05)
            time.sleep(1.0)  # past the join's own work
            before, cpu0, t0 = threads(cons.pid), thread_schedstat(cons.pid), time.monotonic()
            time.sleep(seconds)
            after, cpu1, t1 = threads(cons.pid), thread_schedstat(cons.pid), time.monotonic()
        finally:
            cons.kill()
            prod.kill()
            cons.wait()
            prod.wait()
    span = t1 - t0
    per_thread = {}
    for key, (_, sw1) in after.items():
        sw0 = before.get(key, (0.0, 0))[1]
        per_thread[key] = {
            "cpu_ms_per_s": (cpu1.get(key, 0.0) - cpu0.get(key, 0.0)) * 1e3 / span,
            "wakeups_per_s": (sw1 - sw0) / span,
        }
    total_cpu = sum(t["cpu_ms_per_s"] for t in per_thread.values())
    total_wakeups = sum(t["wakeups_per_s"] for t in per_thread.values())
    return {"threads": per_thread, "cpu_ms_per_s": total_cpu, "wakeups_per_s": total_wakeups}


def cell(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "waiting.json"))
    args = ap.parse_args()
    runs = [one_run(args.seconds) for _ in range(args.repeats)]
    names = sorted({k for r in runs for k in r["threads"]})
    print(f"consumer blocked in next() for {args.seconds:.0f} s, {args.repeats} runs: median [min, max]")
    print(f"{'thread':<18} {'CPU ms per s':>22} {'wakeups per s':>22}")
    for n in names:
        cpu = [r["threads"].get(n, {"cpu_ms_per_s": 0.0})["cpu_ms_per_s"] for r in runs]
        wk = [r["threads"].get(n, {"wakeups_per_s": 0.0})["wakeups_per_s"] for r in runs]
        print(f"{n:<18} {cell(cpu, '.3f'):>22} {cell(wk, '.1f'):>22}")
    print(f"{'whole process':<18} {cell([r['cpu_ms_per_s'] for r in runs], '.3f'):>22} "
          f"{cell([r['wakeups_per_s'] for r in runs], '.1f'):>22}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"seconds": args.seconds, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
