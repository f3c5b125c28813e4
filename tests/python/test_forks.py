"""Threads meet forks: a producer's DataLoader forks its workers every epoch
while trainers of the same process run transforms on threads; trainers fork
(a validation loader's workers, os.fork, a pool) while their consumer is open;
a loader that delivers nothing is reported, and its workers end with the
producer.

Before batchcast seeded a transform's samples through torch's own generators
alone (not torch.manual_seed) and made forks wait for a sample under way, the
first test hung in 4 runs of 4: a DataLoader worker forked while the trainer
was inside torch.manual_seed inherited one of torch's locks held, and waited
for it for ever in its own torch.manual_seed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import eventually

from batchcast.status import list_producers

# How interpreters start, fork and end is what these tests are about: each
# worker is a new interpreter, not a fork of the launcher (conftest.py).
pytestmark = pytest.mark.fresh_interpreters

BOUND = 120  # seconds: a run that takes longer hangs


def run_script(tmp_path, code: str, timeout: float = BOUND) -> str:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"hung: still running after {timeout} s:\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


COMMON = """
    import os, sys, threading, uuid
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import batchcast as bc

    N, EPOCHS = 384, 6
    name = "forks-" + uuid.uuid4().hex[:8]
    data = TensorDataset(torch.arange(N).float().view(-1, 1).repeat(1, 16), torch.arange(N))
    # Workers are forked anew every epoch, from the producer's thread.
    producer = bc.Producer(DataLoader(data, batch_size=32, shuffle=True, num_workers=2), name=name,
                           epochs=EPOCHS, min_consumers=MIN)

    def global_draws(sample):          # torchvision-style: torch's global generator
        x, i = sample
        return x + 0 * torch.rand(x.shape), i

    def seeds_itself(sample):          # a transform that seeds torch itself
        x, i = sample
        torch.manual_seed(int(i))
        return x + 0 * torch.rand(x.shape), i

    def own_generator(sample, generator):  # on batchcast's transform threads
        x, i = sample
        return x + 0 * torch.rand(x.shape, generator=generator), i

    def train(transform, batch_size, out):
        consumer = bc.Consumer(name, batch_size=batch_size, transform=bc.Augment(transform, seed=1),
                               timeout=60)
        for _ in range(EPOCHS):
            seen = []
            for x, i in consumer:
                assert torch.equal(x[:, 0], i.float()), "wrong values"
                seen += i.tolist()
            assert sorted(seen) == list(range(N)), "not every sample once"
        consumer.close()
        out.append(batch_size)
"""


def test_a_notebook_trainer_transforms_while_the_producer_thread_forks_workers(tmp_path, runtime_dir):
    """The notebook shape: one cell starts a producer (a thread of the
    kernel), the next trains in the main thread with a torchvision-style
    transform (no generator parameter)."""
    out = run_script(tmp_path, COMMON.replace("MIN", "1") + """
    producer.start()
    done = []
    train(global_draws, 24, done)
    producer.join()
    print("trained", done)
    """)
    assert "trained [24]" in out


def test_trainers_in_threads_of_the_producer_process_with_transforms_of_every_kind(tmp_path, runtime_dir):
    out = run_script(tmp_path, COMMON.replace("MIN", "3") + """
    producer.start()
    done = []
    threads = [threading.Thread(target=train, args=(t, b, done))
               for t, b in ((global_draws, 24), (seeds_itself, 40), (own_generator, 17))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    producer.join()
    print("trained", sorted(done))
    """)
    assert "trained [17, 24, 40]" in out


@pytest.mark.parametrize("how", ["validation", "persistent", "fork", "pool"])
def test_a_trial_that_forks_leaves_its_stream_exact(procs, name, tmp_path, runtime_dir, how):
    """A trainer whose consumer is open (and holds views of the ring) starts
    a validation DataLoader's workers (fork; persistent or not), forks a child
    that exits the normal way after trying the parent's consumer (a clear
    error), or maps over a fork pool: the children touch nothing of the
    parent's connection, ring or threads."""
    gate = tmp_path / "gate"
    gate.touch()
    producer = procs.start("serve", name, "--gate", gate, "--epochs", 3, script="endings.py")
    forker = procs.start("forker", name, "--how", how, "--epochs", 3, out="forker.json", script="endings.py")
    procs.wait_all(BOUND)
    result = procs.result("forker.json")
    assert result["epochs"] == [list(range(600))] * 3
    if how == "fork":
        assert result["children"] == [0, 0, 0], result  # each child: the clear error, exit 0
    assert "Fatal Python error" not in procs.err(forker) + procs.err(producer)


def test_a_loader_that_delivers_nothing_is_reported_and_its_workers_end_with_the_producer(
        procs, name, tmp_path, runtime_dir):
    """A worker stuck inside the dataset (a file system that never answers):
    the producer warns, naming the wait and its workers alive, and `batchcast
    status` says the same; once the producer's process is killed, its workers
    end within seconds (DataLoader's own watchdog never looks while a worker
    is inside __getitem__) and the trainer gets ProducerLost."""
    producer = procs.start("serve", name, "--gate", tmp_path / "never", "--gate-at", 100,
                           script="endings.py", env={"BATCHCAST_LOADER_WARN_SECONDS": "0.5"})
    trainer = procs.start("steady", name, out="steady.json", script="endings.py")
    warned = eventually(lambda: "waited" in procs.err(producer) and procs.err(producer), "the warning",
                        60, watch=[producer])
    status = eventually(lambda: next((p["status"] for p in list_producers(name) if p["status"]
                                      and p["status"]["loader_workers"]), None), "the status", 30)
    workers = status["loader_workers"]
    assert len(workers) == 2 and status["waiting_for"] == "loader", status
    assert f"its worker processes alive: {', '.join(map(str, workers))}" in warned, warned
    assert f"producer '{name}' has waited" in warned and "for its loader's next batch" in warned
    text = subprocess.run([sys.executable, "-m", "batchcast", "status", name], capture_output=True,
                          text=True, timeout=60).stdout
    assert "for the loader's next batch (its worker processes alive: " in text, text
    os.kill(producer.pid, signal.SIGKILL)
    producer.wait()
    eventually(lambda: not any(os.path.exists(f"/proc/{pid}") and not zombie(pid) for pid in workers),
               "the workers ended with their producer", 10)
    trainer.wait(60)
    assert trainer.returncode != 0 and "ProducerLost" in procs.err(trainer), procs.err(trainer)
    procs.procs.clear()


def zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")


def held_lock_and_a_loader_that_takes_it(workers: int = 1):
    """A Python lock standing for a torch lock a trainer's op holds, and a
    loader (workers not persistent: forked as each epoch begins) whose
    worker_init_fn takes it: a worker forked while it was held fails."""
    import threading

    from torch.utils.data import DataLoader

    from workers import IdDataset

    held = threading.Lock()

    def take_the_lock(_):
        if not held.acquire(timeout=5):
            raise RuntimeError("this worker was forked while the trainer held its lock: it would hang")
        held.release()

    return held, DataLoader(IdDataset(40), batch_size=4, num_workers=workers, worker_init_fn=take_the_lock)


def a_new_child(before: set[int]) -> bool:
    import multiprocessing

    return any(p.pid not in before for p in multiprocessing.active_children())


def children() -> set[int]:
    import multiprocessing

    return {p.pid for p in multiprocessing.active_children()}


def test_the_producer_forks_its_first_workers_once_a_trainer_that_just_connected_asks_for_a_batch(
        runtime_dir, name):
    """A trial connects its consumer, then builds its model (drawing its weights under the generator's
    lock) while the producer, which the sweep's second consumer just completed, forks the epoch's
    workers: the fork waits for the trial's first next(). (Connecting is waiting inside the consumer:
    a fork may go on meanwhile, as the producer answers joins between its forks.)"""
    import threading

    import batchcast as bc
    from batchcast import _forks
    from workers import sample_ids

    held, loader = held_lock_and_a_loader_that_takes_it()
    waited = _forks.forks_held()
    other: list[int] = []

    def second_trial() -> None:  # waits inside its consumer for the epoch
        with bc.Consumer(name, batch_size=4, timeout=30) as c:
            other.extend(i for batch in c for i in sample_ids(batch))

    with bc.Producer(loader, name, epochs=1, min_consumers=2) as producer:
        consumer = bc.Consumer(name, batch_size=4, timeout=30)
        with held:  # the trial builds its model, just connected
            t = threading.Thread(target=second_trial)
            t.start()
            eventually(_forks.forking, "the producer forking epoch 0's worker", timeout=30)
        with consumer:
            ids = [i for batch in consumer for i in sample_ids(batch)]
        t.join(30)
        assert producer.join(30)
    assert sorted(ids) == sorted(other) == list(range(40))
    assert _forks.forks_held() > waited  # the fork waited for the trial to ask for its first batch


def test_the_producer_forks_its_workers_while_no_trainer_thread_of_its_process_holds_a_batch(runtime_dir, name):
    """A trainer training in the producer's process (a trial thread, a notebook) holds torch's locks
    while its ops run (a dropout's draw holds the generator's): a DataLoader worker forked then would
    copy such a lock held and wait for it for ever. Here a Python lock stands for it, held by the
    trainer through each of its steps, and the loader's worker_init_fn takes it: the producer forks
    its next epoch's worker while the trainer is inside a step, and the worker must find the lock
    free: the fork waited until the trainer came back for its next batch."""
    import batchcast as bc
    from batchcast import _forks
    from workers import sample_ids

    held, loader = held_lock_and_a_loader_that_takes_it()
    waited = _forks.forks_held()
    seen = []
    with bc.Producer(loader, name, epochs=2, slots=16) as producer:
        with bc.Consumer(name, batch_size=4, timeout=30) as consumer:
            for epoch in range(2):
                for k, batch in enumerate(consumer):
                    with held:  # the trainer's step
                        if epoch == 0 and k == 0:
                            # Inside its first step, until the producer forks epoch 1's worker: it
                            # waits for this step (or, were it not to, has forked it meanwhile).
                            before = children()
                            eventually(lambda: _forks.forking() or a_new_child(before),
                                       "the producer forking epoch 1's worker", timeout=30)
                        seen.append(sample_ids(batch))
        assert producer.join(30)
    assert sorted(i for ids in seen[:10] for i in ids) == sorted(i for ids in seen[10:] for i in ids) == list(
        range(40))
    assert _forks.forks_held() > waited  # the fork of epoch 1's worker waited for the trainer's step


# ---- the fork guard counts threads, not consumers --------------------------

NOTEBOOK = """
    import logging, sys, threading, time, uuid
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import batchcast as bc
    from batchcast import _forks

    _forks.FORK_WAIT = FORK_WAIT  # (shortened: a fork held shows as an epoch of FORK_WAIT s)
    # The notebook's earlier cells: torch's first optimizer imports its
    # compiler (1-2 s of the trainer's own code, more on a busy machine,
    # which a fork would rightly wait for).
    torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    logged = []

    class Keep(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage())

    logging.getLogger("batchcast").addHandler(Keep())
    N, V, EPOCHS, TRIALS = 512, 256, 3, int(sys.argv[2]) if len(sys.argv) > 2 else 1
    HOW = sys.argv[1]


    def rows(n):
        return TensorDataset(torch.arange(n).float().view(-1, 1).repeat(1, 8), torch.arange(n))


    # The first cell: a training producer (2 workers forked anew each epoch)
    # and a validation one, both serving from threads of this process.
    train_name, val_name = "train-" + uuid.uuid4().hex[:8], "val-" + uuid.uuid4().hex[:8]
    bc.Producer(DataLoader(rows(N), batch_size=32, shuffle=True, num_workers=2), name=train_name,
                epochs=EPOCHS, min_consumers=TRIALS).start()
    bc.Producer(DataLoader(rows(V), batch_size=32, num_workers=2), name=val_name, epochs=EPOCHS,
                min_consumers=TRIALS).start()


    def trial(out):
        # The next cell: the loader pair made up front, then train-then-validate.
        train = bc.Consumer(train_name, 32, timeout=60)
        val = bc.Consumer(val_name, 16, timeout=60)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        for epoch in range(EPOCHS):
            began = time.monotonic()
            seen, checked = [], []
            if HOW == "zip":  # one step of each per batch (16 batches of each)
                ti, vi = iter(train), iter(val)
                for (x, i), (vx, vi_ids) in zip(ti, vi):
                    model(x).pow(2).mean().backward()
                    opt.step()
                    with torch.no_grad():
                        model(vx)
                    seen += i.tolist()
                    checked += vi_ids.tolist()
                assert next(vi, None) is None
            else:
                for x, i in train:
                    opt.zero_grad()
                    model(x).pow(2).mean().backward()
                    opt.step()
                    seen += i.tolist()
                with torch.no_grad():
                    for vx, vi_ids in val:
                        model(vx)
                        checked += vi_ids.tolist()
            assert sorted(seen) == list(range(N)) and checked == list(range(V)), "not every sample once"
            out.append(time.monotonic() - began)
        train.close()
        val.close()


    times = []
    if TRIALS == 1:
        trial(times)
    else:  # trials as threads (Optuna's n_jobs)
        threads = [threading.Thread(target=trial, args=(times,), name=f"trial-{k}") for k in range(TRIALS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(times) == EPOCHS * TRIALS, times
    print("epochs", " ".join(f"{t:.3f}" for t in times))
    print("logged", repr(logged))
"""


@pytest.mark.parametrize("how, trials", [("train-then-validate", 1), ("zip", 1), ("train-then-validate", 2)])
def test_a_notebook_with_a_train_and_a_validation_consumer_open_forks_without_waiting(
        tmp_path, runtime_dir, how, trials):
    """The ordinary notebook: a training and a validation producer started in
    the kernel, their consumers opened up front as a DataLoader pair. While
    the trainer waits inside one consumer, the other (open, idle) must not
    count as its thread running its own code: the producers fork their
    epochs' workers without waiting for the fork guard's FORK_WAIT (3 s
    here), with no WARNING, and every epoch takes under 1.5 s (0.1 s on an
    idle machine). (Before the guard counted threads, each epoch took
    10-60 s with a WARNING per fork.) Also with one step of each per batch
    (zip), and with two trials as threads."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(NOTEBOOK).replace("= FORK_WAIT ", f"= {NOTEBOOK_FORK_WAIT} ", 1))
    done = subprocess.run([sys.executable, str(script), how.split("-")[0], str(trials)],
                          capture_output=True, text=True, timeout=BOUND)
    assert done.returncode == 0, done.stdout + done.stderr
    logged = next(line for line in done.stdout.splitlines() if line.startswith("logged "))
    epochs = [float(t) for t in done.stdout.split("epochs ")[1].split("\n")[0].split()]
    assert "a fork of process" not in logged, (epochs, logged)
    # An epoch forks 4 workers: one fork held for FORK_WAIT makes it >= 3 s;
    # without one, an epoch of these few rows takes about 0.1 s (up to 1 s
    # beside CPU hogs: scripts/endings-under-load.sh).
    assert max(epochs) < NOTEBOOK_FORK_WAIT / 2, epochs


NOTEBOOK_FORK_WAIT = 3.0


def test_a_fork_waits_for_a_thread_with_an_idle_consumer_and_the_warning_names_it(tmp_path, runtime_dir):
    """A consumer opened in another thread and never iterated keeps that
    thread in its own code: a fork waits for it (FORK_WAIT, shortened here)
    and goes on with a WARNING that names the thread and where the consumer
    was made."""
    out = run_script(tmp_path, """
        import logging, threading, uuid
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        import batchcast as bc
        from batchcast import _forks

        _forks.FORK_WAIT = 1.0
        logged = []

        class Keep(logging.Handler):
            def emit(self, record):
                logged.append(record.getMessage())

        logging.getLogger("batchcast").addHandler(Keep())
        data = TensorDataset(torch.arange(64).float(), torch.arange(64))
        a, b = "a-" + uuid.uuid4().hex[:8], "b-" + uuid.uuid4().hex[:8]
        bc.Producer(DataLoader(data, batch_size=8), name=b, epochs=1).start()
        opened, finish = threading.Event(), threading.Event()

        def idle():
            c = bc.Consumer(b, 8, timeout=60)  # IDLE-LINE
            opened.set()
            finish.wait()
            c.close()

        t = threading.Thread(target=idle, name="idle-trial")
        t.start()
        opened.wait()
        producer = bc.Producer(DataLoader(data, batch_size=8, num_workers=1), name=a, epochs=1).start()
        with bc.Consumer(a, 8, timeout=60) as c:
            assert sorted(i for _, ids in c for i in ids.tolist()) == list(range(64))
        finish.set()
        t.join()
        print("logged", repr(logged))
    """)
    line = next(k for k, text in enumerate((tmp_path / "script.py").read_text().splitlines(), 1)
                if "IDLE-LINE" in text)
    assert "a fork of process" in out and "waited 1 s for thread 'idle-trial'" in out, out
    assert f"the consumer of 'b-" in out and f"made in thread 'idle-trial' at {tmp_path / 'script.py'}:{line}" in out, out


def test_concurrent_forks_of_two_producers_each_wait_for_the_trainers_step_and_a_dead_thread_holds_none(
        runtime_dir, name, caplog):
    """Two producers in the trainer's process fork their next epoch's
    workers at about the same time, while the trainer (one step over a zip
    of their consumers) holds a lock standing for torch's: each fork waits
    for the step (one slot for forks let the second go on unguarded). And a
    thread that ended with a consumer still open (kept referenced) runs no
    code: no fork waits for it (it would wait FORK_WAIT, with a WARNING)."""
    import logging
    import threading

    from torch.utils.data import DataLoader

    import batchcast as bc
    from batchcast import _forks
    from workers import IdDataset, sample_ids

    held_a, loader_a = held_lock_and_a_loader_that_takes_it()
    held_b, loader_b = held_lock_and_a_loader_that_takes_it()
    kept = []

    def ends_with_a_consumer_open():
        kept.append(bc.Consumer(name + "-c", batch_size=4, timeout=30))

    seen_a, seen_b = [], []
    with caplog.at_level(logging.WARNING, logger="batchcast"), \
            bc.Producer(DataLoader(IdDataset(8), batch_size=4), name + "-c", epochs=1) as pc, \
            bc.Producer(loader_a, name + "-a", epochs=2, slots=16) as pa, \
            bc.Producer(loader_b, name + "-b", epochs=2, slots=16) as pb:
        dead = threading.Thread(target=ends_with_a_consumer_open, name="ended")
        dead.start()
        dead.join()
        with bc.Consumer(name + "-a", batch_size=4, timeout=30) as a, \
                bc.Consumer(name + "-b", batch_size=4, timeout=30) as b:
            for _ in range(2):
                ia, ib = iter(a), iter(b)
                for x, y in zip(ia, ib):
                    with held_a, held_b:  # the trainer's step
                        seen_a.append(sample_ids(x))
                        seen_b.append(sample_ids(y))
                assert next(ib, None) is None  # (zip stops at a's end: b's ends too)
        assert pa.join(30) and pb.join(30)
        kept[0].close()
        assert pc.join(30)
    for seen in (seen_a, seen_b):
        assert sorted(i for ids in seen[:10] for i in ids) == sorted(i for ids in seen[10:] for i in ids) == \
            list(range(40))
    assert not [r.getMessage() for r in caplog.records if "a fork of process" in r.getMessage()]
    assert _forks.active() == 0
