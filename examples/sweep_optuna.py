"""An Optuna study whose trials all consume one batchcast producer started
beside the study, then the same trials with a DataLoader each, for comparison.

    pip install optuna
    python examples/sweep_optuna.py [--trials 4] [--epochs 2] [--samples 1024] [--no-compare]

Each trial is a process (examples/sweep_trial.py) with the learning rate and
batch size Optuna suggests; the study runs them all at once (n_jobs = trials)
and minimises the last epoch's training loss. The producer serves from a
thread of this process and waits for every trial before its first epoch. The
comparison reruns the very same parameters (enqueued into a second study) with
a DataLoader per trial, and prints the wall and CPU time that sharing saved.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_script import (  # noqa: E402  (helpers shared with the plain-subprocess sweep)
    BATCH_SIZES,
    Trials,
    add_size_arguments,
    own_loader_sweep,
    print_results,
    print_savings,
    shared_sweep,
)

try:
    import optuna
except ImportError:
    sys.exit("this example needs optuna: pip install optuna")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("batchcast").setLevel(logging.WARNING)
    trials = Trials(args)
    studies: list[optuna.Study] = []

    def run_study(data: str | None, on_failure: Callable[[], None]) -> list[dict]:
        results: list[dict] = []

        def objective(trial: optuna.Trial) -> float:
            params = {"lr": trial.suggest_float("lr", 1e-3, 0.3, log=True),
                      "batch_size": trial.suggest_categorical("batch_size", BATCH_SIZES)}
            proc, out = trials.start(params, data)
            result = trials.finish(proc, out, on_failure)
            results.append(result)
            return result["loss"]

        study = optuna.create_study(direction="minimize",
                                    sampler=optuna.samplers.RandomSampler(seed=args.seed))
        if studies:  # the comparison: the very same parameters as the first study
            for t in studies[0].trials:
                study.enqueue_trial(t.params)
        studies.append(study)
        # n_jobs=trials: all trials at once, so that they share every epoch.
        study.optimize(objective, n_trials=args.trials, n_jobs=args.trials)
        return sorted(results, key=lambda r: (r["lr"], r["batch_size"]))

    shared = shared_sweep(args, run_study)
    print_results("Optuna trials fed by one batchcast producer:", shared[0])
    best = studies[0].best_trial
    print(f"best: lr={best.params['lr']:.4g}, batch_size={best.params['batch_size']}, "
          f"loss {best.value:.4f}")
    own = None
    if not args.no_compare:
        own = own_loader_sweep(run_study)
        print_results("the same trials, each with its own DataLoader:", own[0])
    print_savings(args, shared, own)
    if not all(r["exactly_once"] for r in shared[0]):
        sys.exit("a trial missed or repeated samples")


if __name__ == "__main__":
    main()
