"""Trials where DataLoader workers cannot go: threads of one process
(Optuna's ``study.optimize(n_jobs=K)``) and the daemonic worker processes of
``multiprocessing.Pool`` (joblib's, Optuna's parallel backends). Each trial
consumes the producer with its own batch size and gets every sample once per
epoch, with its values."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch
from torch.utils.data import DataLoader

from workers import IdDataset, check_values, sample_ids

import batchcast as bc

N = 203  # samples per epoch
EPOCHS = 2


def consume(name: str, batch_size: int) -> list[list[int]]:
    """One trial: EPOCHS epochs of the producer in batches of `batch_size`,
    every batch's values checked; the sample ids of each epoch."""
    epochs = []
    with bc.Consumer(name, batch_size=batch_size, timeout=60) as loader:
        for _ in range(EPOCHS):
            seen = []
            for batch in loader:
                check_values(batch)
                assert len(sample_ids(batch)) <= batch_size
                seen += sample_ids(batch)
            epochs.append(seen)
    return epochs


def check_trial(epochs: list[list[int]]) -> None:
    assert len(epochs) == EPOCHS
    for seen in epochs:
        assert sorted(seen) == list(range(N))


def test_optuna_trials_as_threads_of_one_process_each_get_every_sample_once_per_epoch(runtime_dir, name):
    optuna = pytest.importorskip("optuna", reason="needs optuna (pip install optuna)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seen: dict[int, list[list[int]]] = {}
    threads: set[int] = set()
    lock = threading.Lock()

    def objective(trial):
        batch_size = trial.suggest_categorical("batch_size", [5, 16, 33])
        epochs = consume(name, batch_size)
        with lock:
            seen[trial.number] = epochs
            threads.add(threading.get_ident())
        return float(batch_size)

    loader = DataLoader(IdDataset(N), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    # min_consumers=3: the producer waits for the three trials, which then share every epoch.
    with bc.Producer(loader, name, epochs=EPOCHS, min_consumers=3) as producer:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        for batch_size in (5, 16, 33):
            study.enqueue_trial({"batch_size": batch_size})
        study.optimize(objective, n_trials=3, n_jobs=3)
        assert producer.join(60)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3, [t.state for t in study.trials]
    assert len(threads) == 3  # three threads of this process, all at once
    assert sorted(seen) == [0, 1, 2]
    for epochs in seen.values():
        check_trial(epochs)
    assert producer.stats()["joins"] == 3  # one producer served the three


def pool_trial(name: str, batch_size: int) -> tuple[str, list[list[int]]]:
    """A trial in a daemonic pool process: a DataLoader with workers cannot
    start there; a consumer can."""
    try:
        next(iter(DataLoader(IdDataset(4), batch_size=2, num_workers=1)))
        refused = ""
    except AssertionError as exc:
        refused = str(exc)
    return refused, consume(name, batch_size)


def test_trials_in_daemonic_pool_processes_consume_where_a_dataloader_cannot_start_workers(runtime_dir, name):
    loader = DataLoader(IdDataset(N), batch_size=8, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(0))
    with bc.Producer(loader, name, epochs=EPOCHS, min_consumers=2) as producer:
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            results = pool.starmap(pool_trial, [(name, 7), (name, 32)])
        assert producer.join(60)
    for refused, epochs in results:
        assert "daemonic processes are not allowed to have children" in refused
        check_trial(epochs)
    assert producer.stats()["joins"] == 2
