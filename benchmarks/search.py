"""A whole hyperparameter search on a CPU-bound loader, shared through one
batchcast producer, against the same search with a DataLoader per trial:
trials per hour and CPU per sample trained.

    python benchmarks/search.py              # Trainer K = 4, threads K = 2 4, E = 2, 2 repeats
    python benchmarks/search.py --images 2048 --epochs 3 --repeats 3
    python benchmarks/search.py --parts A    # only the Trainer search
    python benchmarks/search.py --quick      # smoke run (~1 min), into benchmarks/.cache/quick/

The data: --images samples per epoch (N); sample i decodes file i % --files
(benchmarks/_augment_ops.py's photo-like JPEGs of 500x375, ~120 KB), resized
to uint8 3x256x256 (decode_resize), then every 4th pixel of each row and
column, as float32 3x64x64 in [0, 1]; label i % 10; and its index i, which
every trial records, so that what each trial trained on is checked: every
trial must take every sample exactly once per epoch (the run fails loudly
otherwise). The model is tiny (a 5x5 stride-4 convolution to 8 channels,
average-pooled to 4x4, a linear layer to 10 classes; AdamW), so that the
loader, not the model, is what a trial waits for. torch.set_num_threads(1)
everywhere.

Part A: transformers' Trainer.hyperparameter_search(backend="optuna"), K
(--trials, default 4) trials one after another in one process (n_jobs=1),
each E (--epochs, default 2) epochs of a fresh model (model_init); the search
space is learning_rate (log-uniform 1e-4 to 1e-2) and
per_device_train_batch_size (16, 32, 64), drawn by
optuna.samplers.RandomSampler(seed=0), so every system trains the same trials.
The objective is the trial's mean training loss over its last epoch
(evaluate() returns it: no evaluation set, so the Trainer's own cost stays
small against the loader's).

  trainer-dataloader  transformers.Trainer(train_dataset=...) with
                      dataloader_num_workers=2 (not persistent): every trial
                      decodes every sample every epoch
  batchcast           bc.transformers.Trainer(producer=name), one
                      bc.Producer(DataLoader(dataset, batch_size=32,
                      shuffle=True, num_workers=2), name, epochs=None) serving
                      from a thread of the same process for the whole search
                      (a with block around it); each trial's consumer joins
                      it when its train() starts (join="now": its epochs are
                      its own) and leaves when it ends
  batchcast-cache     the same with Producer(..., cache="memory"): the loader
                      decodes the producer's first epoch only; every later
                      epoch of every trial is gathered from the kept samples

Part B: optuna's study.optimize(objective, n_trials=K, n_jobs=K) for K in --ks
(default 2 4): the K trials run at once as threads of one process, each a
plain PyTorch loop (E epochs, its own batch size from 16, 32, 64 and learning
rate, the same model). The K parameter sets are drawn by a RandomSampler(seed=0)
one after another and enqueued, so both systems train the same K (which thread
takes which depends on the threads' race).

  dataloader-no-workers  each trial iterates its own DataLoader(dataset,
                         batch_size=bs, shuffle=True, num_workers=0): what
                         trials run where they cannot start processes (a
                         daemonic process "is not allowed to have children",
                         optuna#2465)
  batchcast              one bc.Producer(DataLoader(dataset, batch_size=32,
                         shuffle=True, num_workers=2), name, epochs=None,
                         min_consumers=K) serving from a thread beside the
                         study; each trial iterates bc.Consumer(name,
                         batch_size=bs) for E epochs (one iter() per epoch)
                         and closes it

Each trial builds its model before it connects its consumer, and the model
draws no random numbers while it trains (no dropout): the producer's loader
forks its workers from the producer's thread when an epoch begins, and a
worker forked while another thread of the process holds torch's default
generator (initialising weights, say) waits for it for ever in
torch.manual_seed (docs/guarantees.md, "Forks beside a transform": "Code of
yours that runs torch in another thread while a loader forks is not
batchcast's to guard"). Part A's Trainer builds its model (model_init) before
it makes its consumer too.

Every run is a fresh process (imports done, photos on disk, before anything
is timed). Measured per run: the wall time of the whole search (from just
before the producer is made, or the search starts, to its end, producer
stopped); trials per hour (K / that); the CPU (user + system, psutil) of
the process and all its children (loader workers, reaped) over the same span,
per sample trained (K x E x N); and each trial's sample indices, epoch by
epoch. The producer runs in the same process as the trials, so its CPU is
not separable: the totals are reported. Also: the producer's samples
published per sample trained (1/K when K trials share each batch; more where
it ran ahead into its ring for a trial that then ended), and the other work
on the machine during the run (its busy CPU time from /proc/stat less the
run's own, per second of the run: 0 on a quiet machine).

The physical bound, from costs measured first, alone, one thread: D (decode +
resize + the 64x64 crop + its share of the collate) and T (a training step of
the model with AdamW, per sample, at batch sizes 16, 32, 64; a run's T is the
mean over its trials' batch sizes). Ideal CPU per sample trained: D + T
(trainer-dataloader; batchcast too: trials one after another decode every
epoch either way), D / (E K) + T (batchcast-cache), D + T
(dataloader-no-workers), D / K + T (batchcast in part B). Part A also shows
T_trainer: the CPU per sample of transformers' Trainer training the same
trials from samples already in memory (num_workers=0), i.e. T plus the
Trainer's own cost, and the bound with it in place of T.

Medians [min, max] over --repeats runs, the systems alternated (A B C A B C).
The machine may be shared: a run during which other work took more than
--max-other CPUs (default 0.25) is run again, up to --reruns times, after
--rerun-wait seconds; the disturbed runs are kept in the JSON ("discarded")
and counted in the report. Part A also reports how much of the wall time was
spent outside the trials' train() (Optuna, the Trainer's work between trials,
the producer's start and stop).
Writes --out (default benchmarks/results/search.md) and the raw measurements
beside it (search.json). Needs transformers (5.x), accelerate, optuna, Pillow
and psutil.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

PART_A = ["trainer-dataloader", "batchcast", "batchcast-cache"]
PART_B = ["dataloader-no-workers", "batchcast"]
BATCH_SIZES = [16, 32, 64]
LR_RANGE = (1e-4, 1e-2)
SUB = 4  # every 4th pixel of the 256x256 decoded image: 64x64
PRODUCER_BATCH = 32
PRODUCER_WORKERS = 2


# ---- the data and the model ------------------------------------------------------------
def make_dataset(folder: str, images: int, files: int):
    import _augment_ops as ops
    import torch
    from torch.utils.data import Dataset

    class Photos(Dataset):
        """Sample i: file i % files decoded and resized to 256x256, every 4th
        pixel -> {"pixel_values": float32 3x64x64, "labels": i % 10, "index": i}."""

        def __init__(self) -> None:
            self.folder, self.length, self.files = folder, images, files

        def __len__(self) -> int:
            return self.length

        def __getitem__(self, index: int) -> dict:
            path = os.path.join(self.folder, f"{index % self.files:06d}.jpg")
            image = ops.decode_resize(path)[:, ::SUB, ::SUB].to(torch.float32).div_(255.0)
            return {"pixel_values": image, "labels": index % 10, "index": index}

    return Photos()


def make_model():
    import torch
    import torch.nn.functional as F

    class TinyNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, kernel_size=5, stride=4, padding=2)
            self.head = torch.nn.Linear(8 * 4 * 4, 10)

        def forward(self, pixel_values, labels=None):
            x = F.relu(self.conv(pixel_values))
            logits = self.head(F.adaptive_avg_pool2d(x, 4).flatten(1))
            loss = None if labels is None else F.cross_entropy(logits, labels)
            return {"loss": loss, "logits": logits}

    return TinyNet()


def quiet() -> list[str]:
    """Logging as the brief of a benchmark wants it: batchcast at WARNING (its
    warnings are kept for the report), transformers and optuna quiet."""
    import warnings

    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            line = f"{record.levelname} {record.name}: {record.getMessage()}"
            kept.append(line)
            print(line, file=sys.stderr, flush=True)  # (in the run's output, should it hang)

    log = logging.getLogger("batchcast")
    log.setLevel(logging.WARNING)
    log.addHandler(Keep(logging.WARNING))
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass
    try:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
    except ImportError:
        pass
    warnings.filterwarnings("ignore", module="transformers")
    warnings.filterwarnings("ignore", module="accelerate")
    return kept


def cpu_now() -> float:
    """CPU seconds (user + system) of this process and its reaped children
    (psutil), plus its live descendants'."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (/proc/stat: all but idle
    and iowait), to tell other work on the machine during a run."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def check_epochs(epochs: list[list[int]], n: int, want: int) -> str | None:
    """None when there are `want` epochs, each every index of range(n) once;
    else what is wrong."""
    if len(epochs) != want:
        return f"{len(epochs)} epochs, not {want}"
    for e, got in enumerate(epochs):
        if len(got) != n or sorted(got) != list(range(n)):
            seen = set(got)
            return (f"epoch {e}: {len(got)} samples, {len(seen)} distinct, "
                    f"{len([i for i in range(n) if i not in seen])} missing, "
                    f"{len(got) - len(seen)} repeated")
    return None


def last_epoch_loss(losses: list[float], epochs: int) -> float:
    """The mean loss over the last epoch's steps (the objective)."""
    last = losses[-max(1, len(losses) // epochs):] or [float("nan")]
    return sum(last) / len(last)


def chunks(flat: list[int], n: int) -> list[list[int]]:
    return [flat[i:i + n] for i in range(0, len(flat), n)]


# ---- part A: Trainer.hyperparameter_search ---------------------------------------------------
def part_a(cfg: dict, kept: list[str]) -> dict:
    import batchcast as bc
    import optuna
    import torch
    import transformers
    from torch.utils.data import DataLoader
    from transformers import TrainingArguments

    system, n, epochs, k = cfg["system"], cfg["images"], cfg["epochs"], cfg["trials"]
    dataset = make_dataset(cfg["folder"], n, cfg["files"])
    base = transformers.Trainer if system == "trainer-dataloader" else bc.transformers.Trainer

    class Recording(base):  # type: ignore[misc, valid-type]
        """Records each trial's sample indices and losses (the index is
        popped before the model sees the batch); evaluate() is the trial's
        mean loss over its last epoch."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.records: list[dict] = []

        def train(self, *args: Any, **kwargs: Any) -> Any:
            rec: dict[str, Any] = {"indices": [], "losses": [], "t0": time.monotonic(),
                                   "cpu0": cpu_now()}
            self.records.append(rec)
            try:
                return super().train(*args, **kwargs)
            finally:
                rec["t1"], rec["cpu1"] = time.monotonic(), cpu_now()
                rec["batch_size"] = self.args.per_device_train_batch_size
                rec["learning_rate"] = self.args.learning_rate
                consumer = getattr(self, "consumer", None)
                if consumer is not None:
                    rec["consumer_stats"] = consumer.stats()

        def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                         **kwargs: Any) -> Any:
            rec = self.records[-1]
            rec["indices"].append(inputs.pop("index").clone())
            out = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
            loss = out[0] if return_outputs else out
            rec["losses"].append(float(loss.detach()))
            return out

        def evaluate(self, *args: Any, **kwargs: Any) -> dict:
            return {"eval_loss": last_epoch_loss(self.records[-1]["losses"], epochs)}

    def hp_space(trial: Any) -> dict:
        return {"learning_rate": trial.suggest_float("learning_rate", *LR_RANGE, log=True),
                "per_device_train_batch_size": trial.suggest_categorical(
                    "per_device_train_batch_size", BATCH_SIZES)}

    args = TrainingArguments(
        output_dir=os.path.join(cfg["tmp"], "trainer"), num_train_epochs=epochs,
        per_device_train_batch_size=32, use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", eval_strategy="no", disable_tqdm=True,
        dataloader_num_workers=PRODUCER_WORKERS if system == "trainer-dataloader" else 0,
        dataloader_persistent_workers=False, remove_unused_columns=False, seed=0)
    options: dict[str, Any] = ({"train_dataset": dataset} if system == "trainer-dataloader"
                               else {"producer": cfg["name"]})
    trainer = Recording(model_init=make_model, args=args, **options)
    out: dict[str, Any] = {}
    search = {"direction": "minimize", "backend": "optuna", "hp_space": hp_space, "n_trials": k,
              "compute_objective": lambda metrics: metrics["eval_loss"],
              "sampler": optuna.samplers.RandomSampler(seed=0)}
    torch.set_num_threads(1)
    busy0, cpu0, t0 = machine_busy(), cpu_now(), time.monotonic()
    if system == "trainer-dataloader":
        best = trainer.hyperparameter_search(**search)
    else:
        loader = DataLoader(dataset, batch_size=PRODUCER_BATCH, shuffle=True,
                            num_workers=PRODUCER_WORKERS)
        producer = bc.Producer(loader, cfg["name"], epochs=None,
                               cache="memory" if system == "batchcast-cache" else None)
        with producer:
            best = trainer.hyperparameter_search(**search)
            out["producer_stats_at_end"] = producer.stats()
        out["producer_stats"] = producer.stats()
    t1 = time.monotonic()
    cpu1, busy1 = cpu_now(), machine_busy()
    out["other_cpus"] = max(0.0, (busy1 - busy0) - (cpu1 - cpu0)) / (t1 - t0)
    out.update(wall_s=t1 - t0, cpu_s=cpu1 - cpu0, best={"run_id": best.run_id,
                                                       "objective": best.objective,
                                                       "params": best.hyperparameters})
    trials = []
    for rec in trainer.records:
        flat = torch.cat(rec["indices"]).tolist() if rec["indices"] else []
        why = check_epochs(chunks(flat, n), n, epochs)
        trials.append({"batch_size": rec["batch_size"], "learning_rate": rec["learning_rate"],
                       "wall_s": rec["t1"] - rec["t0"], "cpu_s": rec["cpu1"] - rec["cpu0"],
                       "samples": len(flat),
                       "steps": len(rec["indices"]), "exact": why is None, "why": why,
                       "last_epoch_loss": last_epoch_loss(rec["losses"], epochs),
                       "consumer_stats": rec.get("consumer_stats")})
    out["trials"] = trials
    out["samples"] = sum(t["samples"] for t in trials)
    out["outside_train_s"] = out["wall_s"] - sum(t["wall_s"] for t in trials)
    out["outside_train_cpu_s"] = out["cpu_s"] - sum(t["cpu_s"] for t in trials)
    if len(trials) != k:
        out.setdefault("errors", []).append(f"{len(trials)} trials ran, not {k}")
    return out


# ---- part B: study.optimize(n_jobs=K), trials as threads -------------------------------------
def fixed_params(k: int) -> list[dict]:
    """K parameter sets drawn one after another by RandomSampler(seed=0)."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    space = {"learning_rate": FloatDistribution(*LR_RANGE, log=True),
             "batch_size": CategoricalDistribution(BATCH_SIZES)}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    params = []
    for _ in range(k):
        trial = study.ask(space)
        params.append(dict(trial.params))
        study.tell(trial, 0.0)
    return params


def part_b(cfg: dict, kept: list[str]) -> dict:
    import threading

    import batchcast as bc
    import optuna
    import torch
    from torch.utils.data import DataLoader

    system, n, epochs, k = cfg["system"], cfg["images"], cfg["epochs"], cfg["k"]
    dataset = make_dataset(cfg["folder"], n, cfg["files"])
    records: list[dict] = []
    lock = threading.Lock()

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("learning_rate", *LR_RANGE, log=True)
        bs = trial.suggest_categorical("batch_size", BATCH_SIZES)
        rec: dict[str, Any] = {"number": trial.number, "batch_size": bs, "learning_rate": lr,
                               "epochs": [], "t0": time.monotonic()}
        with lock:
            records.append(rec)
        torch.manual_seed(trial.number)
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        if system == "dataloader-no-workers":
            loader: Any = DataLoader(dataset, batch_size=bs, shuffle=True, num_workers=0)
        else:
            loader = bc.Consumer(cfg["name"], batch_size=bs, timeout=cfg["timeout"])
        losses: list[float] = []
        try:
            for _ in range(epochs):
                seen, losses = [], []
                for batch in loader:
                    seen.append(batch["index"].clone())
                    loss = model(batch["pixel_values"], batch["labels"])["loss"]
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    losses.append(float(loss.detach()))
                    del batch
                rec["epochs"].append(torch.cat(seen).tolist() if seen else [])
        except BaseException as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            rec["t1"] = time.monotonic()
            if system == "batchcast":
                loader.close()
                rec["consumer_stats"] = loader.stats()
        rec["last_epoch_loss"] = sum(losses) / max(1, len(losses))
        return rec["last_epoch_loss"]

    params = fixed_params(k)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.RandomSampler(seed=0))
    for p in params:
        study.enqueue_trial(p)
    torch.set_num_threads(1)
    out: dict[str, Any] = {"params": params}
    busy0, cpu0, t0 = machine_busy(), cpu_now(), time.monotonic()
    if system == "dataloader-no-workers":
        study.optimize(objective, n_trials=k, n_jobs=k)
    else:
        loader = DataLoader(dataset, batch_size=PRODUCER_BATCH, shuffle=True,
                            num_workers=PRODUCER_WORKERS)
        producer = bc.Producer(loader, cfg["name"], epochs=None, min_consumers=k)
        with producer:
            study.optimize(objective, n_trials=k, n_jobs=k)
            out["producer_stats_at_end"] = producer.stats()
        out["producer_stats"] = producer.stats()
    t1 = time.monotonic()
    cpu1, busy1 = cpu_now(), machine_busy()
    out["other_cpus"] = max(0.0, (busy1 - busy0) - (cpu1 - cpu0)) / (t1 - t0)
    out.update(wall_s=t1 - t0, cpu_s=cpu1 - cpu0)
    trials = []
    for rec in sorted(records, key=lambda r: r["number"]):
        why = rec.get("error") or check_epochs(rec["epochs"], n, epochs)
        trials.append({"number": rec["number"], "batch_size": rec["batch_size"],
                       "learning_rate": rec["learning_rate"], "wall_s": rec["t1"] - rec["t0"],
                       "start_s": rec["t0"] - t0, "samples": sum(len(e) for e in rec["epochs"]),
                       "exact": why is None, "why": why,
                       "last_epoch_loss": rec.get("last_epoch_loss"),
                       "consumer_stats": rec.get("consumer_stats")})
    out["trials"] = trials
    out["samples"] = sum(t["samples"] for t in trials)
    out["states"] = [str(t.state) for t in study.trials]
    if len(trials) != k:
        out.setdefault("errors", []).append(f"{len(trials)} trials ran, not {k}")
    return out


# ---- one run, in its own process --------------------------------------------------------------
def one_run(cfg: dict) -> None:
    import torch

    torch.set_num_threads(1)
    kept = quiet()
    import batchcast  # noqa: F401
    import optuna  # noqa: F401
    import psutil  # noqa: F401  (imported before anything is timed)
    import transformers  # noqa: F401

    out: dict[str, Any] = {"errors": []}
    try:
        warm_up(cfg, trainer=cfg["part"] == "A")
        got = part_a(cfg, kept) if cfg["part"] == "A" else part_b(cfg, kept)
        out.update({key: value for key, value in got.items() if key != "errors"})
        out["errors"] += got.get("errors", [])
    except BaseException as exc:  # noqa: BLE001 - the driver marks the run failed
        out["errors"].append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
    out["log"] = kept
    Path(cfg["result"]).write_text(json.dumps(out, default=str))


def measure(cfg: dict) -> None:
    """D, T (per batch size) and T_trainer (per batch size), one thread, CPU time."""
    import torch
    from torch.utils.data import default_collate

    torch.set_num_threads(1)
    quiet()
    n_files = min(cfg["files"], cfg["measure_samples"])
    dataset = make_dataset(cfg["folder"], n_files, cfg["files"])
    for i in range(min(8, n_files)):  # warm: page cache, PIL
        dataset[i]
    decode = []
    collate = []
    for _ in range(cfg["measure_passes"]):
        t = time.process_time()
        samples = [dataset[i] for i in range(n_files)]
        decode.append((time.process_time() - t) / n_files)
        t = time.process_time()
        for j in range(0, n_files, PRODUCER_BATCH):
            default_collate(samples[j:j + PRODUCER_BATCH])
        collate.append((time.process_time() - t) / n_files)
    out: dict[str, Any] = {"decode_s": statistics.median(decode),
                           "collate_s": statistics.median(collate)}
    out["D_s"] = out["decode_s"] + out["collate_s"]
    train = {}
    for bs in BATCH_SIZES:
        torch.manual_seed(0)
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.rand(bs, 3, 256 // SUB, 256 // SUB)
        y = torch.randint(0, 10, (bs,))
        steps = max(8, cfg["measure_steps"] * 32 // bs)

        def step(model=model, optimizer=optimizer, x=x, y=y) -> None:
            loss = model(x, y)["loss"]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            float(loss.detach())

        for _ in range(5):
            step()
        passes = []
        for _ in range(cfg["measure_passes"]):
            t = time.process_time()
            for _ in range(steps):
                step()
            passes.append((time.process_time() - t) / (steps * bs))
        train[str(bs)] = statistics.median(passes)
    out["T_s"] = train
    out["T_trainer_s"] = trainer_cost(cfg)
    print(json.dumps(out))


def in_memory(n: int):
    """N samples of the dataset's shape already in memory (no loading cost)."""
    import torch
    from torch.utils.data import Dataset

    images = torch.rand(n, 3, 256 // SUB, 256 // SUB)

    class InMemory(Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict:
            return {"pixel_values": images[i], "labels": i % 10, "index": i}

    return InMemory()


def plain_trainer(cfg: dict, folder: str, epochs: int, batch_size: int, dataset: Any):
    """transformers' Trainer over `dataset` in this process (num_workers=0),
    dropping the index as the search's trainers do."""
    import transformers
    from transformers import TrainingArguments

    class Plain(transformers.Trainer):
        def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                         **kwargs: Any) -> Any:
            inputs.pop("index")
            out = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
            float((out[0] if return_outputs else out).detach())
            return out

    args = TrainingArguments(
        output_dir=os.path.join(cfg["tmp"], folder), num_train_epochs=epochs,
        per_device_train_batch_size=batch_size, learning_rate=1e-3, use_cpu=True, report_to=[],
        save_strategy="no", logging_strategy="no", eval_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, remove_unused_columns=False, seed=0)
    return Plain(model_init=make_model, args=args, train_dataset=dataset)


def warm_up(cfg: dict, trainer: bool) -> None:
    """What the first use imports (torch's optimizers import torch._dynamo, ~5 s
    here; the Trainer's first train() more), done before anything is timed."""
    import torch

    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.rand(2, 3, 256 // SUB, 256 // SUB), torch.tensor([0, 1]))["loss"].backward()
    optimizer.step()
    if trainer:
        plain_trainer(cfg, "warm-up", 1, 32, in_memory(64)).train()


def trainer_cost(cfg: dict) -> dict:
    """CPU per sample of transformers' Trainer training one trial of E epochs
    of N samples already in memory (num_workers=0), per batch size."""
    n = cfg["images"]
    dataset = in_memory(n)
    warm_up(cfg, trainer=True)
    costs = {}
    for bs in BATCH_SIZES:
        trainer = plain_trainer(cfg, f"measure-{bs}", cfg["epochs"], bs, dataset)
        t = time.process_time()
        trainer.train()
        costs[str(bs)] = (time.process_time() - t) / (n * cfg["epochs"])
    return costs


# ---- the driver ---------------------------------------------------------------------------
def run(part: str, system: str, cfg: dict, repeat: int, k: int) -> dict:
    """One run in a fresh process; its result, or what went wrong."""
    result = os.path.join(cfg["tmp"], f"result-{part}-{system}-{k}-{repeat}.json")
    name = f"search-{part}-{system}-{k}-{repeat}-{os.getpid()}"
    child = {**cfg, "part": part, "system": system, "k": k, "name": name, "result": result,
             "tmp": tempfile.mkdtemp(prefix="run-", dir=cfg["tmp"])}
    stderr_path = os.path.join(cfg["tmp"], f"stderr-{part}-{system}-{k}-{repeat}.txt")
    started = time.monotonic()
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--one", json.dumps(child)],
                                stdout=err, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=cfg["run_timeout"])
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group: it and its workers
            proc.wait()
            rc = None
    res: dict[str, Any] = {"part": part, "system": system, "k": k, "repeat": repeat,
                           "process_s": time.monotonic() - started, "rc": rc, "errors": []}
    if os.path.exists(result):
        res.update(json.loads(Path(result).read_text()))
    if rc is None:
        res["errors"].append(f"timed out after {cfg['run_timeout']:.0f} s")
    elif rc != 0:
        res["errors"].append(f"exit status {rc}")
    tail = Path(stderr_path).read_text(errors="replace")[-3000:]
    if res["errors"] or not os.path.exists(result):
        res["output_tail"] = tail
    trials = res.get("trials") or []
    res["exact"] = bool(trials) and all(t["exact"] for t in trials)
    res["failed"] = bool(res["errors"]) or "wall_s" not in res
    if not res["failed"]:
        res["trials_per_hour"] = k * 3600.0 / res["wall_s"]
        res["cpu_ms_per_sample"] = 1e3 * res["cpu_s"] / max(1, res["samples"])
    return res


def ideal(costs: dict, part: str, system: str, k: int, epochs: int, batch_sizes: list[int],
          trainer: bool = False) -> float:
    """Ideal CPU seconds per sample trained."""
    d = costs["D_s"]
    table = costs["T_trainer_s"] if trainer else costs["T_s"]
    t = statistics.mean(table[str(b)] for b in batch_sizes) if batch_sizes else \
        statistics.mean(table.values())
    if part == "A" and system == "batchcast-cache":
        return d / (epochs * k) + t
    if part == "B" and system == "batchcast":
        return d / k + t
    return d + t


def med(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def cell(values: list, fmt: str = "{:,.1f}") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    return (fmt.format(statistics.median(values)) + " [" + fmt.format(min(values)) + ", "
            + fmt.format(max(values)) + "]")


def environment() -> dict:
    import torch

    def version(module: str) -> str:
        try:
            return __import__(module).__version__
        except Exception:  # noqa: BLE001
            return "not installed"

    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f
                      if line.startswith("model name")), platform.processor())
    try:
        git = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"],
                             check=False, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        git = "?"
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": model,
            "cpus": os.cpu_count(), "cpus_used": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": version("transformers"), "accelerate": version("accelerate"),
            "optuna": version("optuna"), "batchcast": version("batchcast"),
            "pillow": version("PIL"), "git": git or "?"}


def batch_sizes_of(runs: list[dict]) -> list[int]:
    for r in runs:
        if r.get("trials"):
            return [t["batch_size"] for t in r["trials"]]
    return []


def published_per_trained(run: dict) -> float | None:
    """The producer's samples published per sample trained (None: no producer)."""
    published = (run.get("producer_stats") or {}).get("samples_published")
    return published / run["samples"] if published and run.get("samples") else None


def rows(doc: dict, part: str) -> list[dict]:
    """Per (K, system): the summary of its runs."""
    cfg, costs, cpus = doc["config"], doc["costs"], doc["env"]["cpus_used"]
    out = []
    keys = ([(cfg["trials"], s) for s in PART_A] if part == "A"
            else [(k, s) for k in cfg["ks"] for s in PART_B])
    for k, system in keys:
        runs = [r for r in doc["runs"] if r["part"] == part and r["system"] == system
                and r["k"] == k]
        if not runs:
            continue
        good = [r for r in runs if not r["failed"]]
        sizes = batch_sizes_of(good or runs)
        row = {"k": k, "system": system, "runs": len(runs), "failed": len(runs) - len(good),
               "wall": [r["wall_s"] for r in good],
               "tph": [r["trials_per_hour"] for r in good],
               "cpu": [r["cpu_ms_per_sample"] for r in good],
               "cpu_s": [r["cpu_s"] for r in good],
               "exact": all(r["exact"] for r in runs) and not any(r["failed"] for r in runs),
               "batch_sizes": sizes,
               "ideal_ms": 1e3 * ideal(costs, part, system, k, cfg["epochs"], sizes),
               "busy": [r["cpu_s"] / r["wall_s"] for r in good],
               "other": [r.get("other_cpus") for r in good],
               "outside": [r.get("outside_train_s") for r in good],
               "outside_cpu": [1e3 * r["outside_train_cpu_s"] / r["samples"] for r in good
                               if r.get("outside_train_cpu_s") is not None and r["samples"]],
               "published": [published_per_trained(r) for r in good
                             if published_per_trained(r) is not None]}
        if part == "A":
            row["ideal_trainer_ms"] = 1e3 * ideal(costs, part, system, k, cfg["epochs"], sizes,
                                                  trainer=True)
        row["cpus"] = cpus
        out.append(row)
    for row in out:
        base = next((r for r in out if r["k"] == row["k"] and
                     r["system"] in ("trainer-dataloader", "dataloader-no-workers")), None)
        row["speedup"] = (med(row["tph"]) / med(base["tph"])
                          if base and med(row["tph"]) and med(base["tph"]) else None)
        row["cpu_ratio"] = (med(base["cpu"]) / med(row["cpu"])
                            if base and med(row["cpu"]) and med(base["cpu"]) else None)
        row["cpu_ratio_bound"] = base["ideal_ms"] / row["ideal_ms"] if base else None
    return out


def params_line(doc: dict, part: str, k: int) -> str:
    runs = [r for r in doc["runs"] if r["part"] == part and r["k"] == k and r.get("trials")]
    if not runs:
        return ""
    sets = {tuple(sorted((t["batch_size"], round(t["learning_rate"], 10)) for t in r["trials"]))
            for r in runs}
    trials = runs[0]["trials"]
    same = "the same in every run" if len(sets) == 1 else f"{len(sets)} different sets across runs"
    return (", ".join(f"bs {t['batch_size']} lr {t['learning_rate']:.2g}" for t in trials)
            + f" ({same})")


def what_this_shows(doc: dict, a: list[dict], b: list[dict]) -> list[str]:
    """The paragraph: the numbers as measured (medians), and where batchcast
    falls short of the bound, what the measurements say about it."""
    costs, cfg = doc["costs"], doc["config"]
    lines = []
    d_ms = 1e3 * costs["D_s"]
    by_a = {r["system"]: r for r in a}
    by_b = {(r["k"], r["system"]): r for r in b}
    base = by_a.get("trainer-dataloader")
    for system in ("batchcast", "batchcast-cache"):
        r = by_a.get(system)
        if not a or not r or not r["tph"] or not base or not base["tph"]:
            continue
        gap = med(r["cpu"]) - r["ideal_ms"]
        trainer_part = r["ideal_trainer_ms"] - r["ideal_ms"]
        text = (f"Part A, {system}: {med(r['tph']):,.0f} trials/hour against "
                f"{med(base['tph']):,.0f} for trainer-dataloader ({r['speedup']:.2f}x), "
                f"{med(r['cpu']):.2f} CPU ms per sample against {med(base['cpu']):.2f} "
                f"(trainer-dataloader's / its: {r['cpu_ratio']:.2f}x; the bound from D and T: "
                f"{r['cpu_ratio_bound']:.2f}x).")
        if system == "batchcast":
            text += (" One trial at a time, the producer decodes every epoch of every trial as "
                     "a DataLoader per trial does (the same ideal, D + T), so the bound is 1x.")
        else:
            text += (f" Its CPU per sample is {gap:+.2f} ms from the ideal D/(EK) + T "
                     f"({r['ideal_ms']:.2f}): {trainer_part:.2f} ms of that is the Trainer's own "
                     f"cost measured alone (T_trainer − T; D/(EK) + T_trainer is "
                     f"{r['ideal_trainer_ms']:.2f}), and {med(r['outside_cpu']):.2f} ms per sample "
                     "is CPU spent while no trial's train() ran (Optuna, the Trainer between "
                     "trials, the producer's start and stop: "
                     f"{med(base['outside_cpu']):.2f} for trainer-dataloader); "
                     f"the search kept {med(r['busy']):.2f} of "
                     f"{r['cpus']} CPUs busy, against {med(base['busy']):.2f} for "
                     "trainer-dataloader (trials run one at a time, each training in one thread); "
                     f"{med(r['outside']):.1f} s of its {med(r['wall']):.1f} s wall were spent "
                     "outside the trials' train() "
                     f"({med(base['outside']):.1f} s for trainer-dataloader), and its producer "
                     f"published {med(r['published']):.2f} samples per sample trained (it runs "
                     "ahead into its ring; what a trial that ended had not taken, nobody takes).")
        lines.append(text)
    for k in cfg["ks"] if b else []:
        base_b, shared = by_b.get((k, "dataloader-no-workers")), by_b.get((k, "batchcast"))
        if not base_b or not shared or not base_b["tph"] or not shared["tph"]:
            continue
        lines.append(
            f"Part B, K = {k} threads: batchcast {med(shared['tph']):,.0f} trials/hour against "
            f"{med(base_b['tph']):,.0f} for dataloader-no-workers ({shared['speedup']:.2f}x), "
            f"{med(shared['cpu']):.2f} CPU ms per sample against {med(base_b['cpu']):.2f} "
            f"(dataloader-no-workers' / its: {shared['cpu_ratio']:.2f}x; bound "
            f"{shared['cpu_ratio_bound']:.2f}x); CPUs busy "
            f"{med(shared['busy']):.2f} against {med(base_b['busy']):.2f}.")
    other = [x for r in a + b for x in r["other"] if x is not None]
    if other and max(other) > 0.1:
        lines.append(
            f"Other work on the machine ran beside some runs (up to {max(other):.2f} CPUs, the "
            "last column): those runs had fewer CPUs than the bound assumes.")
    lines.append(f"(D = {d_ms:.2f} ms per sample.)")
    bad = [r for r in a + b if not r["exact"]]
    if bad:
        lines.append("NOT every trial took every sample exactly once per epoch: "
                     + ", ".join(f"{r['system']} (K = {r['k']})" for r in bad) + ".")
    else:
        lines.append("Every trial of every run took every sample exactly once per epoch.")
    return lines


def markdown(doc: dict) -> str:
    env, cfg, costs = doc["env"], doc["config"], doc["costs"]
    a, b = rows(doc, "A"), rows(doc, "B")
    t = costs["T_s"]
    tt = costs["T_trainer_s"]
    lines = [
        "# A whole hyperparameter search: one shared loader against a DataLoader per trial",
        "",
        (f"{env['date']}, {env['cpu']}, {env['cpus_used']} CPUs (of {env['cpus']}), Python "
        f"{env['python']}, torch {env['torch']}, transformers {env['transformers']}, accelerate "
        f"{env['accelerate']}, optuna {env['optuna']}, Pillow {env['pillow']}, batchcast "
        f"{env['batchcast']} (git {env['git']})."),
        "",
        f"    {doc['command']}",
        "",
        (f"N = {cfg['images']:,} samples per epoch (sample i decodes file i % {cfg['files']}: "
        "photo-like JPEGs of 500x375, decoded and resized to 256x256, every 4th pixel: float32 "
        f"3x64x64), E = {cfg['epochs']} epochs per trial, a tiny model (conv 5x5/4 to 8 "
        "channels, pool 4x4, linear; AdamW); every trial's batch size from 16, 32, 64 and "
        "learning rate from 1e-4..1e-2 (log) drawn by RandomSampler(seed=0). The producer: "
        f"DataLoader(batch_size={PRODUCER_BATCH}, shuffle=True, num_workers={PRODUCER_WORKERS}) in "
        "a thread of the search's process, epochs=None. "
        f"{cfg['repeats']} repeat(s), systems alternated; cells are median [min, max]. CPU: user "
        "+ system of the search's process and all its children (loader workers), per sample "
        "trained (K × E × N), from just before the producer is made (or the search starts) to "
        "the end of the search."),
        "",
        f"Measured alone (one thread, CPU per sample): **D = {1e3 * costs['D_s']:.2f} ms** "
        f"(decode + resize + 64x64 crop {1e3 * costs['decode_s']:.2f}, collate "
        f"{1e3 * costs['collate_s']:.3f}); **T** (a training step, per sample) = "
        + ", ".join(f"{1e3 * t[str(bs)]:.3f} ms at batch {bs}" for bs in BATCH_SIZES)
        + "; **T_trainer** (transformers' Trainer training one such trial from samples in "
        "memory, num_workers=0: T + the Trainer's own cost) = "
        + ", ".join(f"{1e3 * tt[str(bs)]:.3f} ms at batch {bs}" for bs in BATCH_SIZES)
        + ". A run's T is the mean over its trials' batch sizes.",
        "",
        (f"## Part A: Trainer.hyperparameter_search(backend=\"optuna\"), K = {cfg['trials']} "
        "trials one after another (n_jobs=1)"),
        "",
        f"Trials: {params_line(doc, 'A', cfg['trials'])}.",
        "",
        ("| system | wall s | of it outside the trials' train(), s | trials/hour | "
        "vs trainer-dataloader | "
        "CPU ms per sample | ideal (T) | "
        "ideal (T_trainer) | CPU per sample, trainer-dataloader's / this one's (bound) | "
        "of it outside the trials' train(), CPU ms per sample | CPU s | CPUs busy | "
        "producer: samples published per sample trained | "
        "each sample once per epoch, every trial | "
        "other work, CPUs |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in a:
        lines.append(
            f"| {r['system']} | {cell(r['wall'])} | {cell(r['outside'])} | "
            f"{cell(r['tph'], '{:,.0f}')} | "
            + (f"{r['speedup']:.2f}x" if r["speedup"] else "–") + " | "
            f"{cell(r['cpu'], '{:.2f}')} | {r['ideal_ms']:.2f} | {r['ideal_trainer_ms']:.2f} | "
            + (f"{r['cpu_ratio']:.2f}x ({r['cpu_ratio_bound']:.2f}x)"
               if r["system"] != "trainer-dataloader" and r["cpu_ratio"] else "–") + " | "
            f"{cell(r['outside_cpu'], '{:.2f}')} | {cell(r['cpu_s'])} | "
            f"{cell(r['busy'], '{:.2f}')} | {cell(r['published'], '{:.2f}')} | "
            + ("yes" if r["exact"] else "**NO**")
            + (f" ({r['failed']} of {r['runs']} runs failed)" if r["failed"] else "")
            + f" | {cell(r['other'], '{:.2f}')} |")
    if b:
        lines += [
            "",
            ("## Part B: study.optimize(objective, n_trials=K, n_jobs=K): K trials as threads "
            "of one process"),
            "",
            ("Each trial a plain PyTorch loop. dataloader-no-workers: each trial its own "
            "DataLoader(num_workers=0); batchcast: one producer (min_consumers=K), each trial a "
            "bc.Consumer at its own batch size."),
            "",
        ]
        for k in cfg["ks"]:
            lines.append(f"- K = {k}: {params_line(doc, 'B', k)}")
        lines += [
            "",
            ("| K | system | wall s | trials/hour | vs dataloader-no-workers | CPU ms per sample | "
            "ideal | CPU per sample, dataloader-no-workers' / this one's (bound) | CPU s | "
            "CPUs busy | each sample once per epoch, every trial | "
            "producer: samples published per sample trained | other work, CPUs |"),
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in b:
            lines.append(
                f"| {r['k']} | {r['system']} | {cell(r['wall'])} | {cell(r['tph'], '{:,.0f}')} | "
                + (f"{r['speedup']:.2f}x" if r["speedup"] else "–") + " | "
                f"{cell(r['cpu'], '{:.2f}')} | {r['ideal_ms']:.2f} | "
                + (f"{r['cpu_ratio']:.2f}x ({r['cpu_ratio_bound']:.2f}x)"
                   if r["system"] != "dataloader-no-workers" and r["cpu_ratio"] else "–") + " | "
                f"{cell(r['cpu_s'])} | {cell(r['busy'], '{:.2f}')} | "
                + ("yes" if r["exact"] else "**NO**")
                + (f" ({r['failed']} of {r['runs']} runs failed)" if r["failed"] else "")
                + f" | {cell(r['published'], '{:.2f}')} | {cell(r['other'], '{:.2f}')} |")
    lines += ["", "## What this shows", "", " ".join(what_this_shows(doc, a, b))]
    notes = list(doc.get("notes") or [])
    discarded = doc.get("discarded") or []
    if discarded:
        notes.append(f"{len(discarded)} run(s) were run again because other work on the machine "
                     f"took more than {cfg['max_other']} CPUs during them ("
                     + ", ".join(f"part {r['part']} K={r['k']} {r['system']} #{r['repeat']}: "
                                 f"{r.get('other_cpus', 0):.2f}" for r in discarded)
                     + "); the JSON keeps them under \"discarded\".")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {x}" for x in notes]
    errors = [f"part {r['part']} K={r['k']} {r['system']} #{r['repeat']}: {x}"
              for r in doc["runs"] for x in r["errors"]]
    wrong = [f"part {r['part']} K={r['k']} {r['system']} #{r['repeat']} trial "
             f"{i}: {t['why']}" for r in doc["runs"] for i, t in enumerate(r.get("trials") or [])
             if not t["exact"]]
    logged = sorted({f"{r['system']}: {x}" for r in doc["runs"] for x in r.get("log") or []})
    if errors or wrong:
        lines += ["", "## Errors", ""] + [f"- {x.splitlines()[0]}" for x in errors + wrong]
    if logged:
        lines += ["", "## batchcast's warnings", ""] + [f"- {x}" for x in logged]
    lines += ["", f"The whole benchmark took {doc.get('elapsed_s', 0):.0f} s."]
    return "\n".join(lines) + "\n"


def one_line(r: dict) -> str:
    head = f"part {r['part']} K={r['k']} {r['system']:<22} #{r['repeat']}"
    if r["failed"]:
        return head + " FAILED: " + " | ".join(x.splitlines()[0] for x in r["errors"])
    return (head + f" wall {r['wall_s']:6.1f} s, {r['trials_per_hour']:6.0f} trials/h, CPU "
            f"{r['cpu_ms_per_sample']:.2f} ms/sample, busy {r['cpu_s'] / r['wall_s']:.2f}, "
            f"other work {r.get('other_cpus', 0):.2f} CPUs, "
            + ("exact" if r["exact"] else "NOT EXACT: " + "; ".join(
                str(t["why"]) for t in r["trials"] if not t["exact"]))
            + (" (" + "; ".join(r["errors"]) + ")" if r["errors"] else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", choices=["A", "B"], default=["A", "B"])
    ap.add_argument("--trials", type=int, default=None, help="part A: trials (K, default 4)")
    ap.add_argument("--ks", type=int, nargs="+", default=None,
                    help="part B: trials run at once as threads (default 2 4)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per trial (E, default 2)")
    ap.add_argument("--images", type=int, default=None, help="samples per epoch (N, default 1024)")
    ap.add_argument("--files", type=int, default=None,
                    help="distinct JPEG files (sample i decodes file i %% files; default 256)")
    ap.add_argument("--repeats", type=int, default=None, help="runs of each system (default 2)")
    ap.add_argument("--timeout", type=float, default=120.0, help="consumers' timeout, seconds")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds one run may take")
    ap.add_argument("--max-other", type=float, default=0.25,
                    help="a run during which other work on the machine took more CPUs than this "
                         "is run again (kept in the JSON as discarded)")
    ap.add_argument("--reruns", type=int, default=None,
                    help="most times a run is run again (default 2; 0 with --quick)")
    ap.add_argument("--rerun-wait", type=float, default=15.0,
                    help="seconds to wait before running a disturbed run again")
    ap.add_argument("--measure-samples", type=int, default=128)
    ap.add_argument("--measure-passes", type=int, default=3)
    ap.add_argument("--measure-steps", type=int, default=40)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: K = 2 trials, threads K = 2, 2 epochs, 128 images, 1 "
                         "repeat, into benchmarks/.cache/quick/")
    ap.add_argument("--out", default=None,
                    help="markdown file (default benchmarks/results/search.md); the JSON beside it")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        one_run(json.loads(args.one))
        return
    if args.measure is not None:
        measure(json.loads(args.measure))
        return
    if args.quick:
        defaults = {"trials": 2, "ks": [2], "epochs": 2, "images": 128, "files": 32, "repeats": 1,
                    "reruns": 0}
        args.measure_samples, args.measure_passes, args.measure_steps = 32, 2, 10
        args.run_timeout = min(args.run_timeout, 300.0)
    else:
        defaults = {"trials": 4, "ks": [2, 4], "epochs": 2, "images": 1024, "files": 256,
                    "repeats": 2, "reruns": 2}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.epochs < 1 or args.trials < 1 or min(args.ks) < 1:
        sys.exit("--epochs, --trials and --ks must be >= 1")
    out = Path(args.out) if args.out else (
        HERE / ".cache" / "quick" / "search.md" if args.quick else HERE / "results" / "search.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out_json = out.with_suffix(".json")
    try:
        import optuna  # noqa: F401
        import PIL  # noqa: F401
        import psutil  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        sys.exit(f"search.py needs transformers, accelerate, optuna, Pillow and psutil: {exc}")
    import _augment_ops as ops

    folder = ops.ensure_photos(HERE / ".cache", args.files)
    tmp = tempfile.mkdtemp(prefix="search-bench-")
    os.environ["BATCHCAST_RUNTIME_DIR"] = os.path.join(tmp, "runtime")  # (the runs inherit it)
    cfg = {"folder": str(folder), "images": args.images, "files": args.files,
           "epochs": args.epochs, "trials": args.trials, "ks": args.ks, "tmp": tmp,
           "timeout": args.timeout, "run_timeout": args.run_timeout,
           "measure_samples": args.measure_samples, "measure_passes": args.measure_passes,
           "measure_steps": args.measure_steps}
    command = " ".join(["python", "benchmarks/search.py", *sys.argv[1:]])
    env = environment()
    doc: dict[str, Any] = {"env": env, "command": command,
                           "config": {**vars(args), "out": str(out), "folder": str(folder)},
                           "notes": [], "runs": [], "discarded": []}
    started = time.monotonic()
    try:
        print("measuring D (decode + resize + crop + collate), T and T_trainer, one thread ...",
              flush=True)
        measured = subprocess.run([sys.executable, __file__, "--measure", json.dumps(cfg)],
                                  check=False, capture_output=True, text=True)
        if measured.returncode != 0:
            sys.exit(f"measuring failed:\n{measured.stdout[-2000:]}\n{measured.stderr[-4000:]}")
        costs = json.loads(measured.stdout.strip().splitlines()[-1])
        doc["costs"] = costs
        print(f"D = {1e3 * costs['D_s']:.2f} ms; T = "
              + ", ".join(f"{1e3 * v:.3f}" for v in costs["T_s"].values()) + " ms; T_trainer = "
              + ", ".join(f"{1e3 * v:.3f}" for v in costs["T_trainer_s"].values())
              + f" ms per sample at batch {BATCH_SIZES}", flush=True)
        plan = []
        for r in range(args.repeats):
            if "A" in args.parts:
                plan += [("A", s, r, args.trials) for s in PART_A]
            if "B" in args.parts:
                plan += [("B", s, r, k) for k in args.ks for s in PART_B]
        for part, system, r, k in plan:
            for attempt in range(args.reruns + 1):
                res = run(part, system, cfg, r, k)
                other = res.get("other_cpus") or 0.0
                if res["failed"] or other <= args.max_other or attempt == args.reruns:
                    break
                res["discarded"] = (f"other work on the machine took {other:.2f} CPUs during it "
                                    f"(> {args.max_other}): run again")
                doc["discarded"].append(res)
                print(f"[{len(doc['runs']) + 1}/{len(plan)} {time.monotonic() - started:5.0f}s] "
                      f"{one_line(res)}: discarded, {res['discarded']}", flush=True)
                time.sleep(args.rerun_wait)
            doc["runs"].append(res)
            print(f"[{len(doc['runs'])}/{len(plan)} {time.monotonic() - started:5.0f}s] "
                  f"{one_line(res)}", flush=True)
            if res["failed"] and res.get("output_tail"):
                print(res["output_tail"], flush=True)
            out_json.write_text(json.dumps(doc, indent=1, default=str))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc["elapsed_s"] = time.monotonic() - started
    out_json.write_text(json.dumps(doc, indent=1, default=str))
    text = markdown(doc)
    out.write_text(text)
    print("\n" + text)
    print(f"written: {out}, {out_json} ({doc['elapsed_s']:.0f} s)")
    bad = [r for r in doc["runs"] if r["failed"] or not r["exact"]]
    if bad:
        sys.exit(f"{len(bad)} run(s) failed or did not train on every sample exactly once per "
                 "epoch: " + "; ".join(f"part {r['part']} K={r['k']} {r['system']} #{r['repeat']}"
                                       for r in bad))


if __name__ == "__main__":
    main()
