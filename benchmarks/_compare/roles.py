"""The processes of one configuration. Each reads the configuration's spec (a
JSON file the driver wrote), joins the start barrier, and writes what it
measured to <run_dir>/<role>.json.

  trainer      one training process: takes batches from its source (its own
               DataLoader, a batchcast Consumer, a torch.multiprocessing queue,
               a TensorSocket consumer, or an in-memory list), "trains": reads
               the whole batch once (a copy into a buffer kept across steps, as
               a host-to-device copy would), then sleeps the rest of the
               emulated GPU step; records the indices it got;
  producer     batchcast: bc.Producer over the shared loader;
  fanout       torch.multiprocessing: one loader, one bounded queue per trainer
               (it starts the trainers itself, so that they inherit the queues);
  ts-producer  TensorSocket 0.0.5: TensorProducer over the shared loader.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from .barrier import Client
from .workloads import Gated, copied, make_loader, memory_batches


def load_spec(path: str) -> dict:
    spec = json.loads(Path(path).read_text())
    spec["_path"] = path
    return spec


def setup(spec: dict) -> None:
    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])
    torch.set_num_threads(1)


def write_result(spec: dict, role: str, result: dict) -> None:
    path = Path(spec["run_dir"], f"{role}.json")
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result))
    tmp.rename(path)


def cpu_self() -> float:
    """CPU seconds of this process, all its threads (not its children):
    CLOCK_PROCESS_CPUTIME_ID, exact to the nanosecond (getrusage agrees here,
    but is tick-sampled on some kernels)."""
    return time.process_time()


def epoch_samples(spec: dict) -> int:
    w = spec["workload"]
    if w["kind"] == "memory":
        return w["samples"] - w["samples"] % w["loader_batch"]
    return w["samples"]


# ---- sources: one epoch of batches at a time ---------------------------------------------
class DataLoaderSource:
    def __init__(self, spec: dict, index: int):
        bs = spec["trainers"][index]["batch_size"]
        self.loader = make_loader(spec["workload"], bs, spec.get("cpus"))

    def epoch(self, _e: int):
        return iter(self.loader)


class PlainSource:
    """A plain Python loop over batches already in memory: the floor."""

    def __init__(self, spec: dict, index: int):
        self.batches = memory_batches(spec["workload"])

    def epoch(self, _e: int):
        return iter(self.batches)


class BatchcastSource:
    def __init__(self, spec: dict, index: int):
        import batchcast as bc

        bs = spec["trainers"][index]["batch_size"]
        self.consumer = bc.Consumer(spec["name"], batch_size=bs, timeout=spec.get("timeout", 120.0))

    def epoch(self, _e: int):
        return iter(self.consumer)

    def stats(self) -> dict:
        return self.consumer.stats()

    def close(self) -> None:
        self.consumer.close()


def rebatch(items, bs: int):
    """Loader batches (tuples of tensors) -> batches of `bs`, the last one partial."""
    buf = None
    for item in items:
        buf = item if buf is None else tuple(torch.cat([a, b]) for a, b in zip(buf, item))
        while buf is not None and len(buf[0]) >= bs:
            out, rest = tuple(x[:bs] for x in buf), tuple(x[bs:] for x in buf)
            buf = rest if len(rest[0]) else None
            yield out
    if buf is not None:
        yield buf


class QueueSource:
    """torch.multiprocessing fan-out: loader batches from this trainer's queue
    (None ends an epoch), rebatched here when the sizes differ."""

    def __init__(self, spec: dict, index: int, queue):
        self.queue = queue
        self.bs = spec["trainers"][index]["batch_size"]
        self.same = self.bs == spec["loader_batch"]

    def _items(self):
        while True:
            item = self.queue.get()
            if item is None:
                return
            yield item

    def epoch(self, _e: int):
        return self._items() if self.same else rebatch(self._items(), self.bs)


class TensorSocketSource:
    """TensorSocket 0.0.5's TensorConsumer. Its epochs do not reliably end
    (StopIteration may never come, and the last chunk of each epoch is never
    sent), so an epoch here ends after as many batches as a DataLoader would
    give, or at StopIteration, whichever comes first; what arrived is recorded
    as it is. The consumer registers before the start, as a batchcast consumer
    joins: its constructor (which then waits for the producer's first message)
    runs on a thread from set-up on, and the producer says it is ready only
    once every consumer's heartbeat is registered; start() waits for it."""

    def __init__(self, spec: dict, index: int):
        import logging

        from tensorsocket import TensorConsumer

        logging.getLogger().setLevel(logging.WARNING)  # importing it set the root logger to DEBUG
        self.spec, self.index = spec, index
        self.bs = spec["trainers"][index]["batch_size"]
        self.consumer = None
        self.error: BaseException | None = None
        self.built = threading.Event()
        self.stop_iterations = 0
        p = spec["ts"]["ports"]

        def build() -> None:
            try:
                self.consumer = TensorConsumer(port=p[0], ack_port=p[1], heart_ports=(p[2], p[3]),
                                               batch_size=self.bs)
            except BaseException as exc:  # noqa: BLE001 - raised in start()
                self.error = exc
            self.built.set()

        threading.Thread(target=build, name="ts-consumer", daemon=True).start()

    def start(self) -> None:
        self.built.wait()
        if self.error is not None:
            raise self.error

    def epoch(self, _e: int):
        expected = math.ceil(epoch_samples(self.spec) / self.bs)
        got = 0
        it = iter(self.consumer)
        while got < expected:
            try:
                batch = next(it)
            except StopIteration:
                self.stop_iterations += 1
                if got == 0:  # the end of the epoch before, ended here by count
                    continue
                return
            got += 1
            yield batch

    def idle(self) -> bool:
        return self.consumer is None or self.consumer.buffer.empty()

    def stats(self) -> dict:
        return {"stop_iterations": self.stop_iterations}


def content_mismatches(batch) -> int:
    """Samples of a busy-dataset batch whose image is not filled with their index."""
    images, index = batch[0], batch[-1].to(torch.float32)
    flat = images.reshape(len(images), -1)
    return int(((flat[:, 0] != index) | (flat[:, -1] != index)).sum())


class Reader:
    """Reads a whole batch once, as a trainer's host-to-device copy would: every
    tensor of the batch is copied into a buffer kept across steps (a new one
    only when a larger batch or another shape comes; a smaller last batch goes
    into the front of the buffer)."""

    def __init__(self):
        self.buffers: list[torch.Tensor | None] = []
        self.bytes = 0  # the buffers' size

    def __call__(self, batch) -> None:
        tensors = [x for x in batch if isinstance(x, torch.Tensor)]
        if len(self.buffers) != len(tensors):
            self.buffers = [None] * len(tensors)
        for i, t in enumerate(tensors):
            buf = self.buffers[i]
            if (buf is None or buf.dtype != t.dtype or buf.dim() != t.dim() or t.dim() == 0
                    or buf.shape[1:] != t.shape[1:] or len(buf) < len(t)):
                buf = self.buffers[i] = torch.empty(t.shape, dtype=t.dtype)
                self.bytes = sum(b.nbytes for b in self.buffers if b is not None)
            (buf if t.dim() == 0 or len(buf) == len(t) else buf[:len(t)]).copy_(t)


# ---- a trainer ------------------------------------------------------------------------
class Recorder:
    def __init__(self, spec: dict, index: int, source, bar: Client):
        self.spec, self.index, self.source, self.bar = spec, index, source, bar
        self.role = f"trainer{index}"
        self.epochs: list[list[int]] = []
        self.batches = 0
        self.corrupt = 0  # samples whose content does not match their index
        self.wait = 0.0  # seconds inside next() / iter()
        self.wait_at_last = 0.0  # ... up to the last batch's step
        self.next_cpu = 0.0  # main-thread CPU seconds inside next() / iter()
        self.next_times: list[float] = []
        self.reads: list[float] = []  # seconds each batch's read took
        self.reader = Reader()
        self.arrivals: list[float] = []  # when each batch arrived (perf_counter)
        self.sizes: list[int] = []
        self.t_go = self.t0 = self.t_first = self.t_last = None
        self.cpu0 = None
        self.in_next_since: float | None = None
        self.lock = threading.Lock()
        self.written = False

    def finish(self, status: str) -> None:
        with self.lock:
            if self.written:
                return
            self.written = True
            n = epoch_samples(self.spec)
            per_epoch = []
            for ids in list(self.epochs):
                distinct = set(ids)
                per_epoch.append({
                    "received": len(ids), "distinct": len(distinct),
                    "duplicated": len(ids) - len(distinct),
                    "missing": n - len(distinct & set(range(n))),
                    "foreign": len(distinct - set(range(n))),
                })
            t_end = self.t_last if self.t_last is not None else self.t_go
            seconds = (t_end - self.t_go) if self.t_go is not None else float("nan")
            samples = sum(len(ids) for ids in self.epochs)
            times = sorted(self.next_times)
            reads = sorted(self.reads)

            def q(p):
                return times[min(len(times) - 1, int(p * len(times)))] if times else None

            stats = {}
            if hasattr(self.source, "stats"):
                try:
                    stats = self.source.stats()
                except Exception as exc:  # noqa: BLE001 - recorded, not fatal
                    stats = {"error": repr(exc)}
            result = {
                "role": self.role, "status": status, "pid": os.getpid(),
                "batch_size": self.spec["trainers"][self.index]["batch_size"],
                "step_ms": self.spec["trainers"][self.index]["step_ms"],
                "epochs": per_epoch, "expected_per_epoch": n,
                "exact": len(per_epoch) == self.spec["epochs"] and self.corrupt == 0 and all(
                    e["received"] == n and e["distinct"] == n for e in per_epoch),
                "corrupt": self.corrupt,
                "samples": samples, "batches": self.batches,
                "t_go": self.t_go, "t0": self.t0, "t_first": self.t_first, "t_end": t_end,
                "seconds": seconds,
                "rate": samples / seconds if seconds and seconds > 0 else 0.0,
                "wait_s": self.wait,
                "wait_share": self.wait_at_last / seconds if seconds and seconds > 0 else None,
                "next_cpu_s": self.next_cpu,
                "proc_cpu_s": (cpu_self() - self.cpu0) if self.cpu0 is not None else None,
                "next_median_s": statistics.median(times) if times else None,
                "next_p10_s": q(0.1), "next_p90_s": q(0.9),
                "read_median_s": statistics.median(reads) if reads else None,
                "read_p90_s": reads[min(len(reads) - 1, int(0.9 * len(reads)))] if reads else None,
                "read_s": sum(reads), "read_buffer_bytes": self.reader.bytes,
                "source": stats,
            }
            result["arrivals"] = [round(t, 6) for t in self.arrivals]
            result["sizes"] = self.sizes
            if self.spec.get("detail"):
                result["next_times_s"] = self.next_times
            write_result(self.spec, self.role, result)
            try:
                self.bar.send("finished")  # the driver closes the CPU window at the last one
            except OSError:
                pass

    def on_end(self, message: dict) -> None:
        """The driver says stop: a deadline (report now), or a TensorSocket
        producer that has finished (report once what was sent is taken)."""
        if message.get("reason") == "producer finished":
            while True:
                since = self.in_next_since
                if since is not None and time.perf_counter() - since > 0.5 and self.source.idle():
                    break
                if self.written:
                    return
                time.sleep(0.1)
            status = "stream ended (producer finished)"
        else:
            status = f"ended by driver: {message.get('reason')}"
            if self.t_go is not None:
                self.t_last = time.perf_counter()  # it was still trying: its window runs to now
        self.finish(status)
        sys.stdout.flush()
        os._exit(0)


def trainer(spec: dict, index: int, queue=None) -> None:
    setup(spec)
    role = f"trainer{index}"
    bar = Client(spec["barrier"], role)
    system = spec["system"]
    if system == "dataloader":
        source = DataLoaderSource(spec, index)
    elif system == "plain":
        source = PlainSource(spec, index)
    elif system == "batchcast":
        source = BatchcastSource(spec, index)
    elif system == "mpqueue":
        source = QueueSource(spec, index, queue)
    elif system == "tensorsocket":
        source = TensorSocketSource(spec, index)
    else:
        raise SystemExit(f"unknown system {system}")
    rec = Recorder(spec, index, source, bar)
    step = spec["trainers"][index]["step_ms"] / 1e3
    detail = spec.get("detail", False)
    check = spec["workload"]["kind"] == "busy"
    bar.on_end(rec.on_end)
    bar.ready()
    go = bar.wait_go()
    rec.t_go, rec.t0 = go["t_go"], time.perf_counter()
    rec.cpu0 = cpu_self()
    perf, cpu = time.perf_counter, time.thread_time
    if hasattr(source, "start"):
        t, c = perf(), cpu()
        rec.in_next_since = t
        source.start()
        rec.wait += perf() - t
        rec.next_cpu += cpu() - c
    batch = None
    for e in range(spec["epochs"]):
        ids: list[int] = []
        rec.epochs.append(ids)
        t, c = perf(), cpu()
        rec.in_next_since = t
        it = source.epoch(e)
        rec.wait += perf() - t
        rec.next_cpu += cpu() - c
        while True:
            t, c = perf(), cpu()
            rec.in_next_since = t
            try:
                batch = next(it)  # the previous batch is dropped here, as in a for loop
            except StopIteration:
                rec.wait += perf() - t
                rec.next_cpu += cpu() - c
                break
            dt = perf() - t
            rec.next_cpu += cpu() - c
            rec.in_next_since = None
            rec.wait += dt
            if detail:
                rec.next_times.append(dt)
            got = batch[-1].tolist()
            ids.extend(got)
            rec.arrivals.append(t + dt)
            rec.sizes.append(len(got))
            if rec.batches == 0:
                rec.t_first = rec.arrivals[-1]
                bar.send("first")  # the driver samples memory once every trainer is running
            rec.batches += 1
            r = perf()
            rec.reader(batch)  # the step reads the whole batch once (its host-to-device copy)
            r = perf() - r
            rec.reads.append(r)
            if step > r:
                time.sleep(step - r)  # the rest of the emulated GPU step, holding the batch
            if check:  # still what was sent, after holding it through the step
                rec.corrupt += int(content_mismatches(batch))
            rec.t_last = perf()
            rec.wait_at_last = rec.wait
    del batch
    rec.in_next_since = None
    rec.finish("complete")
    if hasattr(source, "close"):
        source.close()


def trainer_entry(spec_path: str, index: int, queue=None) -> None:
    """Target of the fan-out's spawned trainers."""
    trainer(load_spec(spec_path), index, queue)


# ---- shared loaders -----------------------------------------------------------------------
def _end_now(spec: dict, role: str, result: dict):
    def callback(message: dict) -> None:
        write_result(spec, role, {**result, "status": f"ended by driver: {message.get('reason')}"})
        os._exit(0)
    return callback


def producer(spec: dict) -> None:
    setup(spec)
    import batchcast as bc

    bar = Client(spec["barrier"], "producer")
    clock = {}

    def start() -> None:
        bar.wait_go()
        clock["go"] = cpu_self()

    # The DataLoader itself (gated by its sampler), so that its workers write
    # into the ring; "batchcast+copy" keeps them out (the producer's one copy).
    loader = make_loader(spec["workload"], spec["loader_batch"], spec.get("cpus"), gate=start)
    if isinstance(loader, list):
        loader = Gated(loader, start)
    elif spec.get("variant") == "copy":
        loader.collate_fn = copied
    p = bc.Producer(loader, spec["name"], epochs=spec["epochs"],
                    min_consumers=len(spec["trainers"]),
                    slots=spec["slots"], ring_bytes=spec.get("ring_bytes", 0))
    bar.on_end(_end_now(spec, "producer", {}))
    bar.ready()
    p.run()  # waits for every trainer; its first batch waits for the start
    write_result(spec, "producer", {"status": "complete", "stats": p.stats(),
                                    "serve_cpu_s": cpu_self() - clock.get("go", 0.0)})


def fanout(spec: dict) -> None:
    setup(spec)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queues = [ctx.Queue(maxsize=spec["slots"]) for _ in spec["trainers"]]
    procs = [ctx.Process(target=trainer_entry, args=(spec["_path"], i, q), name=f"trainer{i}")
             for i, q in enumerate(queues)]
    for p in procs:
        p.start()
    bar = Client(spec["barrier"], "producer")
    loader = make_loader(spec["workload"], spec["loader_batch"], spec.get("cpus"))
    bar.on_end(_end_now(spec, "producer", {}))
    bar.ready()
    bar.wait_go()
    cpu0 = cpu_self()
    batches, batch = 0, None
    for _ in range(spec["epochs"]):
        for batch in loader:
            for q in queues:
                q.put(batch)
            batches += 1
        for q in queues:
            q.put(None)
    del batch
    for q in queues:  # until the feeder threads have handed everything over
        q.close()
        q.join_thread()
    serve_cpu = cpu_self() - cpu0
    for p in procs:
        p.join()
    write_result(spec, "producer", {"status": "complete", "batches": batches,
                                    "serve_cpu_s": serve_cpu,
                                    "exitcodes": [p.exitcode for p in procs]})


def ts_producer(spec: dict) -> None:
    setup(spec)
    import logging

    from tensorsocket import TensorProducer

    logging.getLogger().setLevel(logging.WARNING)  # importing it set the root logger to DEBUG
    bar = Client(spec["barrier"], "producer")
    loader = Gated(make_loader(spec["workload"], spec["loader_batch"], spec.get("cpus")),
                   bar.wait_go)
    ports = spec["ts"]["ports"]
    p = TensorProducer(loader, port=ports[0], ack_port=ports[1], heart_ports=(ports[2], ports[3]),
                       producer_batch_size=spec["ts"]["producer_batch_size"],
                       consumer_max_buffer_size=spec["slots"])
    bar.on_end(_end_now(spec, "producer", {}))
    k = len(spec["trainers"])
    t0 = time.perf_counter()
    while len(p.hb.consumers) < k:  # every consumer registered (heartbeat): poll, it has no event
        time.sleep(0.02)
    registered = time.perf_counter() - t0
    bar.ready()
    bar.wait_go()
    cpu0 = cpu_self()
    calls = 0
    for _ in range(spec["epochs"]):
        for _ in p:
            calls += 1
    write_result(spec, "producer", {"status": "complete", "calls": calls, "epochs": p.epoch,
                                    "serve_cpu_s": cpu_self() - cpu0,
                                    "registration_s": registered})
    bar.send("done")
    p.join()
    os._exit(0)  # its sockets and daemon threads can hold up a normal exit


ROLES = {"trainer": trainer, "producer": producer, "fanout": fanout, "ts-producer": ts_producer}


def main(role: str, spec_path: str, index: int) -> None:
    spec = load_spec(spec_path)
    if role == "trainer":
        trainer(spec, index)
    else:
        ROLES[role](spec)
