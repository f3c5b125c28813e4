"""A Hugging Face hyperparameter search (``Trainer.hyperparameter_search`` with
the Optuna backend) whose trials all train from one batchcast producer
started beside the search, then the same search with a DataLoader per trial.

    pip install transformers accelerate optuna
    python examples/hf_search.py [--trials 4] [--epochs 2] [--samples 2048] [--workers 2] [--no-compare]

The producer's loader tokenizes synthetic reviews (a word-hashing tokenizer
in Python: CPU work per sample, as a real tokenizer's) and pads them to a
fixed length; ``cache="memory"`` keeps what its first epoch made, so every
later epoch, of every trial, is gathered from it: the search tokenizes each
sample once. Each trial is ``bc.transformers.Trainer(model_init=...,
producer=NAME)`` with the batch size and learning rate Optuna suggests: the
trials run one after another, and each joins the producer wherever it is
(``join="now"``), its own epochs holding every sample once. Evaluation is
each trial's own DataLoader over a small eval set (the objective: its loss).

The comparison is the same search (the same seeded sampler, so the same
parameters) on ``transformers.Trainer`` with its own DataLoader
(``dataloader_num_workers=--workers``), which tokenizes every sample of
every epoch of every trial. Prints what each trial saw and the time of both.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import tempfile
import time
import zlib
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import batchcast as bc

try:
    import optuna
    import transformers
    from transformers import BertConfig, BertForSequenceClassification, TrainingArguments
except ImportError:
    sys.exit("this example needs transformers, accelerate and optuna: pip install transformers accelerate optuna")

NAME = "hf-search"
VOCAB, LENGTH = 2048, 64
WORDS = ("good bad great awful fine plot acting film story slow fast funny dull score music scene "
         "cast end twist hero long short loved hated boring superb").split()


class Reviews(Dataset):
    """Review i: made-up text, tokenized by hashing its words, padded to
    LENGTH; its label is whether it says "good" more than "bad"."""

    def __init__(self, n: int, offset: int = 0, words: int = 400):
        self.n, self.offset, self.words = n, offset, words

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(self.offset + i)
        picks = torch.randint(len(WORDS), (self.words,), generator=g).tolist()
        text = " ".join(WORDS[k] for k in picks)
        # The tokenizer: lower-case, split, hash each word into the vocabulary.
        ids = [1 + zlib.crc32(w.lower().encode()) % (VOCAB - 1) for w in text.split()][:LENGTH]
        mask = [1] * len(ids) + [0] * (LENGTH - len(ids))
        ids += [0] * (LENGTH - len(ids))
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
                "labels": torch.tensor(int(text.count("good") > text.count("bad"))),
                "sample_id": torch.tensor(self.offset + i)}


def model_init(*_: Any) -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=64,
                                                    max_position_embeddings=LENGTH))


def hp_space(trial: optuna.Trial) -> dict[str, Any]:
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True),
            "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [16, 32, 64])}


class RecordsSamples:
    """Notes the samples each trial trains on (``sample_id``, which the model
    does not take), and its parameters."""

    seen: dict[int, list[int]]
    params: dict[int, dict[str, Any]]

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        inputs = dict(inputs)
        ids = inputs.pop("sample_id")
        if model.training:
            trial = self._trial  # type: ignore[attr-defined]
            self.seen.setdefault(trial.number, []).extend(ids.tolist())
            self.params.setdefault(trial.number, dict(trial.params))
        return super().compute_loss(model, inputs, *args, **kwargs)  # type: ignore[misc]


class SharedTrainer(RecordsSamples, bc.transformers.Trainer):
    pass


class OwnTrainer(RecordsSamples, transformers.Trainer):
    pass


def cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def search(args: argparse.Namespace, shared: bool, out: str) -> tuple[Any, Any, float, float]:
    """One search of args.trials trials; its best run, its trainer (what each
    trial saw, its parameters), its wall and CPU seconds."""
    arguments = TrainingArguments(
        output_dir=out, num_train_epochs=args.epochs, use_cpu=True, report_to=[], disable_tqdm=True,
        logging_strategy="no", save_strategy="no", eval_strategy="no", per_device_eval_batch_size=64,
        remove_unused_columns=False,  # keep sample_id: RecordsSamples takes it out
        dataloader_num_workers=0 if shared else args.workers,
        dataloader_persistent_workers=not shared and args.workers > 0)
    common = dict(model_init=model_init, args=arguments, eval_dataset=Reviews(256, offset=10**6))
    if shared:
        trainer = SharedTrainer(producer=NAME, **common)  # the one change: producer= for train_dataset=
    else:
        trainer = OwnTrainer(train_dataset=Reviews(args.samples), **common)
    trainer.seen, trainer.params = {}, {}
    trainer.remove_callback(transformers.PrinterCallback)  # each trial's metrics: not printed here
    cpu, start = cpu_seconds(), time.perf_counter()
    best = trainer.hyperparameter_search(hp_space=hp_space, backend="optuna", n_trials=args.trials,
                                         direction="minimize",
                                         sampler=optuna.samplers.RandomSampler(seed=args.seed))
    return best, trainer, time.perf_counter() - start, cpu_seconds() - cpu


def show(title: str, trainer: Any, args: argparse.Namespace) -> bool:
    """Prints each trial's parameters and whether its epochs each held every
    sample once; whether all did."""
    n = args.samples
    print(title)
    print(f"  {'trial':>5} {'learning_rate':>13} {'batch':>5}  every sample once per epoch")
    every = len(trainer.seen) == args.trials
    for number, ids in sorted(trainer.seen.items()):
        once = len(ids) == args.epochs * n and all(
            sorted(ids[e * n:(e + 1) * n]) == list(range(n)) for e in range(args.epochs))
        params = trainer.params[number]
        print(f"  {number:5d} {params['learning_rate']:13.6f} {params['per_device_train_batch_size']:5d}  {once}")
        every &= once
    return every


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2048, help="training samples per epoch")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="loader workers")
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    parser.add_argument("--no-compare", action="store_true", help="skip the DataLoader-per-trial search")
    args = parser.parse_args()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    transformers.logging.set_verbosity_error()
    logging.getLogger("batchcast").setLevel(logging.WARNING)

    with tempfile.TemporaryDirectory() as out:
        loader = DataLoader(Reviews(args.samples), batch_size=64, shuffle=True, num_workers=args.workers,
                            persistent_workers=args.workers > 0)
        with bc.Producer(loader, NAME, cache="memory") as producer:  # serves until the block ends
            best, shared, wall, cpu = search(args, shared=True, out=out)
            cached = producer.stats()["cache"]
        ok = show(f"{args.trials} trials of Trainer.hyperparameter_search (Optuna), one after another, "
                  f"from one producer (cache: {cached}):", shared, args)
        print(f"best: trial {best.run_id}, eval loss {best.objective:.4f}")
        if not ok:
            sys.exit("a trial fed by the producer did not see every sample once per epoch")
        if args.no_compare:
            return
        own_best, own, own_wall, own_cpu = search(args, shared=False, out=out)
    show("the same search (the same seeded sampler: the same parameters), a DataLoader per trial:", own, args)
    print(f"best: trial {own_best.run_id}, eval loss {own_best.objective:.4f}")
    samples = args.trials * args.epochs * args.samples
    print(f"{'':12}{'wall':>9} {'trials/hour':>12} {'CPU':>9} {'CPU ms/sample':>14}")
    for label, w, c in (("batchcast", wall, cpu), ("dataloader", own_wall, own_cpu)):
        print(f"{label:12}{w:8.1f}s {3600 * args.trials / w:12.0f} {c:8.1f}s {1000 * c / samples:14.2f}")
    print(f"saved by sharing: wall {own_wall - wall:.1f} s ({own_wall / wall:.2f}x trials/hour), "
          f"CPU {own_cpu - cpu:.1f} s")


if __name__ == "__main__":
    main()
