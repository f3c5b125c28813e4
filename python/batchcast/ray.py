"""One producer per node for sweeps on a Ray cluster.

Sharing is per machine (the ring is local memory), so a sweep spread over
several nodes gets one producer per node that has trials: a named, detached
Ray actor pinned to that node, created by the first trial there, found by the
others, and ended by a lease (no consumer for ``idle_timeout`` seconds) or by
the driver at the end of the sweep (``shutdown()``, or ``with serving():``).

    import batchcast as bc

    def make_loader():            # picklable; every node builds the same loader
        return DataLoader(dataset, batch_size=64, shuffle=True,
                          generator=torch.Generator().manual_seed(0), num_workers=4)

    def trial(config):            # a Ray Tune trainable, task or actor
        loader = bc.ray.consumer("imagenet", make_loader, batch_size=config["batch_size"])
        for epoch in range(10):
            for images, labels in loader:
                ...

    with bc.ray.serving("imagenet"):   # on the driver: producers end with the sweep
        tune.Tuner(trial, param_space=...).fit()

Resources. A producer actor asks Ray for no CPU (``num_cpus=0``), so it can
always start on a node whose CPUs the trials already hold: it never waits for
a trial to finish, and a trial never waits for it to be scheduled. Its
loader's workers still use real CPUs that Ray does not count; reserve them by
giving trials fewer CPUs than the node has, by ``num_cpus=``/``resources=``
(then that much must be free on the node: start producers from the driver
with ``start()`` before the trials take it), or leave them unaccounted.

Names. Everything that names a producer is node-scoped: the actor's name
holds the node ID (not its IP: several nodes can share one), and its socket
and lock live in a runtime directory of that node ID, so several Ray nodes
on one machine never share a producer.

Lifetime. Ray never cleans up detached actors, and ``ray.kill`` skips
``atexit``; nothing here depends on either. A producer ends itself once no
consumer has been connected for ``idle_timeout`` seconds, and ``shutdown()``
stops each one (its files removed) before killing it. One given ``epochs``
that has served them all stays, idle, with its report (``producers()``,
``shutdown()``) until its lease runs out, or until a trial asks for it again:
then it ends and that trial gets a new one, from the loader's first epoch.

``import batchcast`` does not import Ray; ``batchcast.ray`` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import resource
import threading
import time
from typing import Any, Callable, Iterator

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from . import _status
from .consumer import Consumer
from .options import Join
from .producer import Producer

NAMESPACE = "batchcast"  # the Ray namespace of every producer actor
_log = logging.getLogger("batchcast")


def _cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + workers.ru_utime + workers.ru_stime


def node_runtime_dir(node_id: str) -> str:
    """The runtime directory of producers on Ray node `node_id` (created 0700):
    a directory of that node inside the per-user one, so that Ray nodes that
    share a machine never share a producer's socket or lock."""
    if not node_id or any(c not in "0123456789abcdef" for c in node_id):
        raise ValueError(f"not a Ray node ID: {node_id!r}")
    return _status.runtime_dir(os.path.join(_status.runtime_dir(), f"ray-{node_id[:16]}"))


def actor_name(name: str, node_id: str) -> str:
    """The Ray actor name of producer `name` on node `node_id`."""
    return f"{name}@{node_id}"


class NodeProducer:
    """The Ray actor that serves `name` on one node: a batchcast.Producer over
    ``make_loader()`` serving epochs until stopped, from a background thread.
    Created through ``producer()``/``consumer()``/``start()``, not directly."""

    def __init__(self, name: str, make_loader: Callable[[], Any], node_id: str,
                 idle_timeout: float | None, options: dict[str, Any]) -> None:
        here = ray.get_runtime_context().get_node_id()
        if here != node_id:  # the scheduling strategy is hard: this is a bug
            raise RuntimeError(f"producer for node {node_id} started on node {here}")
        self._cpu0 = _cpu_seconds()
        self._name, self._node_id, self._idle_timeout = name, node_id, idle_timeout
        self._dir = node_runtime_dir(node_id)
        self._producer = Producer(make_loader(), name, runtime_dir=self._dir, **options).start()
        self._lock = threading.Lock()
        self._last_used = time.monotonic()
        self._leases = 0
        self._closing = False   # ending: no more leases
        self._replace = False   # a trial it cannot serve asked: end once its consumers are done
        threading.Thread(target=self._watch, name=f"batchcast-lease-{name}", daemon=True).start()

    def _done(self) -> bool:
        """Whether a newcomer would get nothing: its last epoch has begun (a
        consumer joining now starts after it), or it no longer serves."""
        p = self._producer
        return not p.serving or (p.epochs is not None and p.epochs_begun >= p.epochs)

    def lease(self) -> dict[str, Any] | None:
        """Where to connect, and the lease renewed; None when this producer is
        ending, or has begun its last epoch (then it ends once its consumers
        are done, and the caller, asking again, gets a new one)."""
        with self._lock:
            if not self._closing and self._done():
                self._replace = True
            if self._closing or self._replace:
                return None
            self._last_used = time.monotonic()
            self._leases += 1
        return {"runtime_dir": self._dir, "pid": os.getpid(), "node_id": self._node_id}

    def info(self) -> dict[str, Any]:
        """The node, the process, the leases given, the CPU seconds since it
        was made of this process and of its loader workers that have exited
        (DataLoader workers exit at each epoch's end unless persistent), and
        the producer's stats()."""
        return {"name": self._name, "node_id": self._node_id, "pid": os.getpid(),
                "runtime_dir": self._dir, "leases": self._leases,
                "cpu_seconds": _cpu_seconds() - self._cpu0, "stats": self._producer.stats()}

    def stop(self) -> dict[str, Any]:
        """Stops serving (consumers still iterating get ProducerLost), removes
        this node's files, and returns info() as of then."""
        with self._lock:
            self._closing = True
        self._close()
        return self.info()  # its loader workers have exited: their CPU is counted

    def _close(self) -> None:
        try:
            self._producer.stop()
        except Exception as exc:  # noqa: BLE001 - the loader's error; consumers had it
            _log.info("producer '%s' on node %s ended with %s: %s", self._name, self._node_id,
                      type(exc).__name__, exc)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)  # only when no other producer of this node uses it

    def _watch(self) -> None:
        """Ends the actor once no consumer has been connected for idle_timeout
        seconds (its lease ran out), or once it is done, a trial it cannot
        serve asked for it, and its own consumers have gone."""
        while True:
            time.sleep(0.2)
            with self._lock:
                if self._closing:
                    return
                now = time.monotonic()
                busy = self._producer.consumers > 0
                if busy:
                    self._last_used = now
                idle = (self._idle_timeout is not None
                        and now - self._last_used >= self._idle_timeout)
                replaced = self._replace and not busy and not self._producer.serving
                if idle or replaced:
                    self._closing = True
                    break
        self._end("idle" if idle else "done; a new trial gets a new producer")

    def _end(self, why: str) -> None:
        _log.info("producer '%s' on node %s ends: %s", self._name, self._node_id, why)
        self._close()
        ray.get_runtime_context().current_actor.__ray_terminate__.remote()


_actor_class = ray.remote(NodeProducer)


def producer(name: str, make_loader: Callable[[], Any], *, node_id: str | None = None,
             idle_timeout: float | None = 300.0, num_cpus: float = 0,
             resources: dict[str, float] | None = None, **producer_options: Any) -> Any:
    """The actor serving `name` on `node_id` (default: this process's node),
    created if there is none (race-free: every caller gets the same one).

    `make_loader` is called once, on that node, when the actor is created;
    `producer_options` go to ``batchcast.Producer`` (``epochs`` defaults to
    None: serve until stopped; ``runtime_dir`` is the node's). `idle_timeout`:
    seconds without any consumer after which the producer ends (None: only
    ``shutdown()`` ends it). `num_cpus`/`resources`: what the actor asks Ray
    for (default nothing, so it can start beside trials holding every CPU)."""
    if "runtime_dir" in producer_options:
        raise TypeError("runtime_dir is the node's own (node_runtime_dir); do not pass it")
    if idle_timeout is not None and not idle_timeout > 0:
        raise ValueError(f"idle_timeout must be None or > 0 seconds, not {idle_timeout!r}")
    node_id = node_id or ray.get_runtime_context().get_node_id()
    producer_options.setdefault("epochs", None)
    return _actor_class.options(
        name=actor_name(name, node_id), namespace=NAMESPACE, lifetime="detached",
        get_if_exists=True, num_cpus=num_cpus, resources=resources or {}, max_restarts=0,
        max_concurrency=4,  # lease() and info() while the watcher sleeps
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(name, make_loader, node_id, idle_timeout, producer_options)


def _lease(name: str, make_loader: Callable[[], Any], node_id: str, timeout: float,
           options: dict[str, Any]) -> dict[str, Any]:
    """A lease from the node's producer, made if needed; waits out one that is
    ending (its idle time just ran out) and asks its successor."""
    told = False
    while True:
        actor = producer(name, make_loader, node_id=node_id, **options)
        try:
            lease: dict[str, Any] | None = ray.get(actor.lease.remote(), timeout=timeout)
        except ray.exceptions.ActorDiedError as exc:
            if getattr(exc, "actor_init_failed", False):
                raise RuntimeError(f"the batchcast producer '{name}' on node {node_id} could not "
                                   f"start (make_loader or Producer raised): {exc}") from exc
            lease = None  # it ended between the lookup and the call
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"the batchcast producer '{name}' on node {node_id} did not answer "
                               f"within {timeout} s") from None
        if lease is not None:
            return lease
        # It answers but ends (or finishes its last epoch for its consumers):
        # wait for it to be gone, then ask again, which makes a new one.
        if not told:
            _log.info("waiting for batchcast producer '%s' on node %s to end (it has begun its "
                      "last epoch); then a new one starts", name, node_id)
            told = True
        time.sleep(0.2)


def consumer(name: str, make_loader: Callable[[], Any], batch_size: int | None = None, *,
             idle_timeout: float | None = 300.0, num_cpus: float = 0,
             resources: dict[str, float] | None = None,
             producer_options: dict[str, Any] | None = None, timeout: float = 60.0,
             **consumer_options: Any) -> Consumer:
    """A ``batchcast.Consumer`` of this node's producer of `name`, which the
    first caller on the node creates (see ``producer()`` for `make_loader`,
    `idle_timeout`, `num_cpus`, `resources` and `producer_options`; they apply
    only when the producer is created here). `consumer_options` go to
    ``batchcast.Consumer``. Call it inside a Ray task, actor or Tune trial."""
    join = Join.of(consumer_options.pop("join", "now"))
    if join.runtime_dir is not None:
        raise TypeError("a Join's runtime_dir is the node's own here (node_runtime_dir); do not pass it")
    node_id = ray.get_runtime_context().get_node_id()
    options = dict(producer_options or {}, idle_timeout=idle_timeout, num_cpus=num_cpus,
                   resources=resources)
    lease = _lease(name, make_loader, node_id, timeout, options)
    return Consumer(name, batch_size, join=dataclasses.replace(join, runtime_dir=lease["runtime_dir"]),
                    timeout=consumer_options.pop("timeout", timeout), **consumer_options)


def start(name: str, make_loader: Callable[[], Any], node_ids: list[str] | None = None,
          **options: Any) -> dict[str, Any]:
    """From the driver, before trials take the nodes' resources: creates the
    producer of `name` on each node in `node_ids` (default: every alive node
    with CPUs) and waits until each one serves. Returns {node_id: actor}.
    `options` as for ``producer()``."""
    if node_ids is None:
        node_ids = [n["NodeID"] for n in ray.nodes()  # type: ignore[no-untyped-call]
                    if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    actors = {node: producer(name, make_loader, node_id=node, **options) for node in node_ids}
    ray.get([a.info.remote() for a in actors.values()])  # created: serving (or raised)
    return actors


def _actors(name: str | None) -> list[tuple[str, Any]]:
    out = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] != NAMESPACE or "@" not in entry["name"]:
            continue
        if name is not None and entry["name"].rsplit("@", 1)[0] != name:
            continue
        with contextlib.suppress(ValueError):  # gone meanwhile
            out.append((entry["name"], ray.get_actor(entry["name"], namespace=NAMESPACE)))
    return out


def producers(name: str | None = None, timeout: float = 10.0) -> list[dict[str, Any]]:
    """What every batchcast producer actor (of `name`, or all) reports: node,
    process, leases, CPU seconds of it and its loader workers, and stats()."""
    out = []
    for _, actor in _actors(name):
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            out.append(ray.get(actor.info.remote(), timeout=timeout))
    return out


def shutdown(name: str | None = None, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Ends every batchcast producer actor (of `name`, or all) on the cluster:
    each stops serving and removes its files, then the actor is killed (also
    when it did not answer within `timeout`). Returns what each reported last."""
    found = _actors(name)
    pending = {actor.stop.remote(): actor for _, actor in found}
    reports = []
    with contextlib.suppress(ray.exceptions.GetTimeoutError):
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=timeout)
        for ref in done:
            with contextlib.suppress(ray.exceptions.RayActorError):
                reports.append(ray.get(ref))
    for _, actor in found:
        ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout
    for actor_id, _ in found:  # gone from Ray's names: a new one of the name can start
        while time.monotonic() < deadline:
            try:
                ray.get_actor(actor_id, namespace=NAMESPACE)
            except ValueError:
                break
            time.sleep(0.05)
    _clean_node_dirs()
    return reports


def _clean_node_dirs() -> None:
    """Removes what producers that died with their node (or were killed) left
    in the node directories on this machine: a dead producer's socket and
    lock, then the directory once empty. Live producers' files stay."""
    base = _status.runtime_dir()
    try:
        entries = [e for e in os.listdir(base) if e.startswith("ray-")]
    except OSError:
        return
    for entry in entries:
        path = os.path.join(base, entry)
        with contextlib.suppress(Exception):
            _status.list_producers(runtime_dir=path, name="", timeout=1.0, clean=True)
        with contextlib.suppress(OSError):
            os.rmdir(path)


@contextlib.contextmanager
def serving(name: str | None = None, timeout: float = 30.0) -> Iterator[None]:
    """``with serving("imagenet"): tuner.fit()``: every producer of `name` (or
    every batchcast producer) the sweep made is ended when the block ends,
    however it ends."""
    try:
        yield
    finally:
        shutdown(name, timeout)


__all__ = ["NAMESPACE", "NodeProducer", "actor_name", "consumer", "node_runtime_dir",
           "producer", "producers", "serving", "shutdown", "start"]
