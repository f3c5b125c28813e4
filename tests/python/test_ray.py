"""batchcast.ray on a local multi-node Ray cluster (ray.cluster_utils.Cluster):
one producer per node that has trials, found by every trial there, exactly
once for every trial, crashes and removed nodes confined to their own trials,
and nothing left behind. Marked `ray` (pytest -m ray): the default run skips
them; scripts/test.sh runs them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="batchcast.ray needs Ray: pip install 'batchcast[ray]'")

from conftest import eventually  # noqa: E402  (after the importorskip)

HERE = Path(__file__).parent
pytestmark = pytest.mark.ray

SAMPLES, LOADER_BATCH = 300, 16


def memfd_rings(pids) -> int:
    """batchcast rings (memfds named batchcast:...) open in these processes."""
    n = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:batchcast:")
            except OSError:
                pass
    return n


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head without CPUs (nothing runs there unless asked) and two nodes of
    2 CPUs, all on this machine, sharing one per-user runtime directory."""
    from ray.cluster_utils import Cluster

    runtime = tmp_path_factory.mktemp("rt")
    os.chmod(runtime, 0o700)
    saved = {k: os.environ.get(k) for k in ("BATCHCAST_RUNTIME_DIR", "PYTHONPATH")}
    # The nodes' processes inherit these: the runtime directory, and this
    # folder for ray_workers (the trials' code) and workers (the dataset).
    os.environ["BATCHCAST_RUNTIME_DIR"] = str(runtime)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), saved["PYTHONPATH"] or ""]).rstrip(
        os.pathsep)
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": 80 * 2**20, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=2, object_store_memory=80 * 2**20) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="tests", log_to_driver=False)
    c.runtime = runtime
    c.workers = nodes
    yield c
    ray.shutdown()
    c.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def on(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def node_dirs(cluster) -> list[str]:
    return sorted(p.name for p in Path(cluster.runtime).iterdir() if p.name.startswith("ray-"))


def batchcast_actors() -> list[dict]:
    import batchcast.ray as bcr

    return [a for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == bcr.NAMESPACE]


def assert_nothing_left(cluster, pids) -> None:
    assert batchcast_actors() == []
    eventually(lambda: all(not os.path.exists(f"/proc/{p}") for p in pids),
               "the producer actors' processes to exit")
    assert memfd_rings(pids) == 0
    assert node_dirs(cluster) == [], node_dirs(cluster)


def test_eight_trials_racing_get_one_producer_per_node_and_every_sample_once(cluster):
    """Four trials per node, started at once (each takes half a CPU: together
    every CPU of its node, so the producer must start without asking for
    one), with batch sizes that divide the loader's batches and that do not."""
    import batchcast.ray as bcr
    from ray_workers import loader_order, trial

    a, b = (n.node_id for n in cluster.workers)
    sizes = [7, 16, 33, 100]
    refs = [trial.options(scheduling_strategy=on(node)).remote(
        "race", SAMPLES, LOADER_BATCH, size, 2, min_consumers=4)
        for node in (a, b) for size in sizes]
    results = ray.get(refs, timeout=240)
    order = loader_order(SAMPLES, LOADER_BATCH)
    for r in results:
        assert r["epochs"] == order[:2]  # every sample of each epoch, once, in the loader's order
    assert sorted(r["node_id"] for r in results) == sorted([a] * 4 + [b] * 4)

    infos = bcr.producers("race")
    assert sorted(i["node_id"] for i in infos) == sorted([a, b])  # one per node, none on the head
    assert all(i["leases"] == 4 for i in infos)
    assert len({i["runtime_dir"] for i in infos}) == 2  # node-scoped: one machine, two producers
    assert all(i["stats"]["batches_published"] >= 2 * -(-SAMPLES // LOADER_BATCH) for i in infos)
    pids = [i["pid"] for i in infos]
    assert memfd_rings(pids) == 2

    reports = bcr.shutdown("race")
    assert sorted(r["node_id"] for r in reports) == sorted([a, b])
    assert_nothing_left(cluster, pids)


def test_a_trial_killed_mid_epoch_does_not_disturb_the_others(cluster):
    import batchcast.ray as bcr
    from ray_workers import loader_order, trial

    a = cluster.workers[0].node_id
    with bcr.serving("crash"):
        victim = trial.options(scheduling_strategy=on(a)).remote(
            "crash", SAMPLES, LOADER_BATCH, 10, 2, min_consumers=3, die_after=3)
        survivors = [trial.options(scheduling_strategy=on(a)).remote(
            "crash", SAMPLES, LOADER_BATCH, size, 2, min_consumers=3) for size in (16, 25)]
        with pytest.raises(ray.exceptions.RayError):  # the worker died: SIGKILL
            ray.get(victim, timeout=240)
        order = loader_order(SAMPLES, LOADER_BATCH)
        for r in ray.get(survivors, timeout=240):
            assert r["epochs"] == order[:2]
        (info,) = bcr.producers("crash")
        assert info["stats"]["crashes"] == 1
        pids = [info["pid"]]
    assert_nothing_left(cluster, pids)


def test_a_node_added_mid_sweep_gets_its_producer_and_removing_it_takes_only_its_trials(
        cluster):
    import batchcast.ray as bcr
    from ray_workers import Progress, loader_order, trial

    a = cluster.workers[0].node_id
    with bcr.serving("grow"):
        progress = Progress.options(scheduling_strategy=on(a)).remote()
        staying = [trial.options(scheduling_strategy=on(a)).remote(
            "grow", SAMPLES, LOADER_BATCH, size, 2, min_consumers=2, started=progress,
            sleep=0.01) for size in (10, 16)]
        eventually(lambda: ray.get(progress.count.remote(a)) > 0, "node A's trials to start", 120)
        added = cluster.add_node(num_cpus=2, object_store_memory=80 * 2**20)
        cluster.wait_for_nodes()
        c = added.node_id
        # Slow trials (0.1 s a batch), removed with their node mid-epoch.
        doomed = [trial.options(scheduling_strategy=on(c)).remote(
            "grow", SAMPLES * 10, LOADER_BATCH, 10, 1, min_consumers=1, started=progress,
            sleep=0.1) for _ in range(2)]
        eventually(lambda: ray.get(progress.count.remote(c)) > 0, "node C's trials to start", 120)
        infos = bcr.producers("grow")
        assert sorted(i["node_id"] for i in infos) == sorted([a, c])
        pids = [i["pid"] for i in infos]
        cluster.remove_node(added, allow_graceful=False)
        for ref in doomed:
            with pytest.raises(ray.exceptions.RayError):
                ray.get(ref, timeout=120)
        order = loader_order(SAMPLES, LOADER_BATCH)
        for r in ray.get(staying, timeout=240):
            assert r["epochs"] == order[:2]
        eventually(lambda: [i["node_id"] for i in bcr.producers("grow")] == [a],
                   "only node A's producer to remain", 60)
    # The removed node's producer was killed with its node: what it left in
    # its node's directory on this machine is cleaned by shutdown().
    assert_nothing_left(cluster, pids)


def test_a_trial_joining_mid_epoch_starts_at_once_and_loader_workers_write_in_place(cluster):
    """The Ray door has what bc.Producer has: a trial that joins while the
    node's producer is mid-epoch starts at once with epochs of its own, and
    the loader's workers write its batches into the ring."""
    import batchcast.ray as bcr
    from batchcast import Group
    from ray_workers import Progress, trial

    a = cluster.workers[0].node_id
    with bcr.serving("door"):
        progress = Progress.options(scheduling_strategy=on(a)).remote()
        # The first trial holds still at its 3rd batch until the late one has
        # joined: loader batches of 4 (75 an epoch), so the producer, which
        # runs ahead by at most the ring's batches, is mid-epoch 0 then.
        first = trial.options(scheduling_strategy=on(a)).remote(
            "door", SAMPLES, 4, 16, 3, started=progress, workers=2, hold_at=3)
        eventually(lambda: ray.get(progress.count.remote(a)) >= 3, "the first trial to start", 120)
        late = trial.options(scheduling_strategy=on(a)).remote(
            "door", SAMPLES, 4, 7, 1, workers=2)
        ranks = [trial.options(scheduling_strategy=on(a)).remote(
            "door", SAMPLES, 4, 6, 1, workers=2,
            consumer_options={"group": Group("g", r, 2)}) for r in range(2)]
        eventually(lambda: len(bcr.producers("door")[0]["stats"]["consumers"]) == 4,
                   "the late trial and a group of two to join", 120)
        progress.open.remote()
        whole, joined, *group = ray.get([first, late, *ranks], timeout=240)
        (info,) = bcr.producers("door")
    at = joined["stats"]["joined_at"]
    assert 0 < at < SAMPLES, f"the late trial started at position {at}"
    stream = [i for epoch in whole["epochs"] for i in epoch]
    assert all(sorted(e) == list(range(SAMPLES)) for e in whole["epochs"])
    start = joined["stats"]["epoch"] * SAMPLES + at  # (the first trial's 3 epochs cover it)
    assert joined["epochs"] == [stream[start:start + SAMPLES]]  # an epoch of its own, in order
    assert joined["len"] == -(-SAMPLES // 7) and whole["len"] == -(-SAMPLES // 16)
    # A data-parallel trial through the same door: its ranks split its own epoch.
    assert all(g["stats"]["joined_at"] > 0 for g in group)
    assert sorted(group[0]["epochs"][0] + group[1]["epochs"][0]) == list(range(SAMPLES))
    assert info["stats"]["batches_in_place"] > 0, info["stats"]


def test_an_idle_producer_ends_itself_and_the_next_trial_starts_a_new_one(cluster):
    from ray_workers import loader_order, trial

    b = cluster.workers[1].node_id
    first = ray.get(trial.options(scheduling_strategy=on(b)).remote(
        "idle", SAMPLES, LOADER_BATCH, 32, 1, idle_timeout=1.0), timeout=240)
    assert first["epochs"] == loader_order(SAMPLES, LOADER_BATCH)[:1]
    eventually(lambda: batchcast_actors() == [], "the idle producer to end itself", 60)
    assert node_dirs(cluster) == []
    # A later trial on that node gets a new producer, from the loader's first epoch.
    second = ray.get(trial.options(scheduling_strategy=on(b)).remote(
        "idle", SAMPLES, LOADER_BATCH, 20, 1, idle_timeout=1.0), timeout=240)
    assert second["epochs"] == loader_order(SAMPLES, LOADER_BATCH)[:1]
    eventually(lambda: batchcast_actors() == [], "the idle producer to end itself", 60)
    assert node_dirs(cluster) == []


def test_a_producer_that_served_its_epochs_keeps_its_report_and_the_next_trial_gets_a_new_one(
        cluster):
    import batchcast.ray as bcr
    from ray_workers import loader_order, trial

    b = cluster.workers[1].node_id
    first = ray.get(trial.options(scheduling_strategy=on(b)).remote(
        "done", SAMPLES, LOADER_BATCH, 16, 1, producer_epochs=1), timeout=240)
    assert first["epochs"] == loader_order(SAMPLES, LOADER_BATCH)[:1]
    (info,) = eventually(lambda: [i for i in bcr.producers("done")
                                  if i["stats"].get("epochs_done") == 1], "its report", 30)
    # Asked again, it ends and a new one serves the loader from its first epoch.
    second = ray.get(trial.options(scheduling_strategy=on(b)).remote(
        "done", SAMPLES, LOADER_BATCH, 25, 1, producer_epochs=1), timeout=240)
    assert second["epochs"] == loader_order(SAMPLES, LOADER_BATCH)[:1]
    (again,) = bcr.producers("done")
    assert again["pid"] != info["pid"]
    bcr.shutdown("done")
    assert_nothing_left(cluster, [info["pid"], again["pid"]])


def test_a_producer_whose_loader_factory_raises_fails_the_trial_clearly(cluster):
    import batchcast.ray as bcr

    b = cluster.workers[1].node_id

    def broken():
        raise ValueError("no such dataset: /data/missing")

    @ray.remote(num_cpus=0.5, max_retries=0)
    def lonely():
        bcr.consumer("broken", broken, batch_size=4)

    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(lonely.options(scheduling_strategy=on(b)).remote(), timeout=120)
    assert "could not start" in str(info.value) and "no such dataset" in str(info.value)
    bcr.shutdown("broken")
    assert batchcast_actors() == []


def test_a_nodes_producer_serves_later_epochs_from_its_decoded_cache(cluster):
    import math

    import batchcast.ray as bcr
    from ray_workers import loader_order, trial

    b = cluster.workers[1].node_id
    got = ray.get(trial.options(scheduling_strategy=on(b)).remote(
        "cached", SAMPLES, LOADER_BATCH, 24, 3, producer_epochs=3, cache="memory"), timeout=240)
    # The loader's own order every epoch, though epochs 1 and 2 were gathered from the kept samples.
    assert got["epochs"] == loader_order(SAMPLES, LOADER_BATCH)[:3]
    (info,) = eventually(lambda: [i for i in bcr.producers("cached")
                                  if i["stats"].get("epochs_done") == 3], "its report", 30)
    assert info["stats"]["cache"] == "ready"
    assert info["stats"]["cache_batches"] == 2 * math.ceil(SAMPLES / LOADER_BATCH)
    bcr.shutdown("cached")
    assert_nothing_left(cluster, [info["pid"]])
