"""The Hugging Face Trainer door (batchcast.transformers): a Trainer trains on
a producer's batches with its own batch size and gradient accumulation, its
steps counted from the consumer's len(), and resumes from its checkpoints
where the data was (exactly, or the next pass with a ResumeWarning)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import eventually
from torch.utils.data import DataLoader, Dataset

import batchcast as bc

transformers = pytest.importorskip(
    "transformers", reason="needs transformers (pip install transformers accelerate, torch pinned)")

from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    TrainerCallback,
    TrainingArguments,
)

N = 48  # samples per epoch, in loader batches of 2


class Tokens(Dataset):
    """Pre-tokenized, synthetic samples, each naming itself (sample_id)."""

    def __init__(self, n: int, offset: int = 0):
        self.n, self.offset = n, offset

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.offset + i)
        return {"input_ids": torch.randint(1, 100, (8,), generator=g),
                "attention_mask": torch.ones(8, dtype=torch.long),
                "labels": torch.tensor((self.offset + i) % 2),
                "sample_id": torch.tensor(self.offset + i)}


def shuffled_loader():
    return DataLoader(Tokens(N), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(0))


def tiny_model():
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37))


class Recording(bc.transformers.Trainer):
    """Records the samples of each batch the model is trained on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[list[int]] = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        inputs = dict(inputs)
        if model.training:
            self.seen.append(inputs.pop("sample_id").tolist())
        else:
            inputs.pop("sample_id", None)
        return super().compute_loss(model, inputs, *args, **kwargs)


class Lengths(TrainerCallback):
    """What the Trainer was handed to train on: its len() and its dataset's."""

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.loader = train_dataloader
        self.lengths = (len(train_dataloader), len(train_dataloader.dataset))
        self.rates = []

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        self.rates.append(lr_scheduler.get_last_lr()[0])


class StopAt(TrainerCallback):
    """Ends training after optimizer step `step` (a trial stopped, or crashed)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def arguments(out, **kw):
    base = dict(output_dir=str(out), use_cpu=True, report_to=[], disable_tqdm=True, logging_strategy="no",
                save_strategy="no", seed=0)
    return TrainingArguments(**{**base, **kw})


def flat(batches):
    return [i for b in batches for i in b]


def test_a_trainer_trains_on_the_producers_batches_every_sample_once_per_epoch(runtime_dir, name, tmp_path):
    with bc.Producer(shuffled_loader(), name, epochs=2):
        lengths = Lengths()
        trainer = Recording(model=tiny_model(), producer=name, eval_dataset=Tokens(8, offset=1000),
                            callbacks=[lengths],
                            args=arguments(tmp_path, per_device_train_batch_size=5, gradient_accumulation_steps=2,
                                           num_train_epochs=2, per_device_eval_batch_size=4))
        out = trainer.train()
        # The consumer's len() is the Trainer's epoch: 48 samples in batches of 5 (the last 3), two to a
        # step, so 5 optimizer steps an epoch and 10 in all (the LR schedule's).
        assert lengths.lengths == (10, N)
        assert lengths.loader is trainer.consumer  # the consumer itself: nothing of Accelerate around it
        assert out.global_step == trainer.state.max_steps == 10
        # The LR schedule knows those 10 steps: linear decay to 0 at the last.
        assert lengths.rates == pytest.approx([5e-5 * (10 - k) / 10 for k in range(1, 11)])
        assert [len(b) for b in trainer.seen] == [5] * 9 + [3] + [5] * 9 + [3]
        first, second = flat(trainer.seen[:10]), flat(trainer.seen[10:])
        assert sorted(first) == sorted(second) == list(range(N))
        assert first != second  # the producer's loader shuffles each epoch
        # Evaluation is the trial's own DataLoader over its eval_dataset.
        metrics = trainer.evaluate()
        assert "eval_loss" in metrics
        assert trainer.consumer.stats()["batches"] == 20  # closed when training ended; its counters stay


def test_max_steps_ends_training_within_an_epoch(runtime_dir, name, tmp_path):
    with bc.Producer(shuffled_loader(), name, epochs=None):
        trainer = Recording(model=tiny_model(), producer=name,
                            args=arguments(tmp_path, per_device_train_batch_size=6, max_steps=10))
        assert trainer.train().global_step == 10  # epoch 0 (8 batches of 6), 2 batches of epoch 1
        assert [len(b) for b in trainer.seen] == [6] * 10
        assert sorted(flat(trainer.seen[:8])) == list(range(N))
        assert len(set(flat(trainer.seen[8:]))) == 12


def _train_to_a_checkpoint(name, out):
    """Trains epoch 0 in batches of 3 (16 an epoch, two a step), saving every 2 steps, and stops after
    step 3: checkpoint-2 holds the first 4 batches, the 2 after it a resume must train on again."""
    first = Recording(model=tiny_model(), producer=name, callbacks=[StopAt(3)],
                      args=arguments(out, per_device_train_batch_size=3, gradient_accumulation_steps=2,
                                     num_train_epochs=2, save_strategy="steps", save_steps=2))
    assert first.train().global_step == 3
    checkpoint = os.path.join(out, "checkpoint-2")
    assert os.path.isfile(os.path.join(checkpoint, bc.transformers.STATE_FILE))
    assert [len(b) for b in first.seen] == [3] * 6
    return first, checkpoint


def _resume(name, out, checkpoint, callbacks=()):
    """A new Trainer (a restarted trial) resumed from `checkpoint`: the rest of epoch 0 (12 batches of
    3), then epoch 1 (16)."""
    again = Recording(model=tiny_model(), producer=name, callbacks=list(callbacks),
                      args=arguments(out, per_device_train_batch_size=3, gradient_accumulation_steps=2,
                                     num_train_epochs=2, save_strategy="steps", save_steps=2))
    assert again.train(resume_from_checkpoint=checkpoint).global_step == 16
    assert [len(b) for b in again.seen] == [3] * 28
    return again


class Release(TrainerCallback):
    """Closes a consumer once training has begun (the resumed trainer's consumer has joined)."""

    def __init__(self, consumer):
        self.consumer = consumer

    def on_train_begin(self, args, state, control, **kwargs):
        self.consumer.close()


def test_a_trainer_resumed_from_its_checkpoint_gets_the_rest_of_the_epoch_exactly(runtime_dir, name, tmp_path):
    # Another trial of the producer, still at the epoch's start, keeps the epoch's batches in the ring
    # (it holds up the producer: the ring takes 2 x slots + 1 batches, less than the epoch's 24), so
    # the position the checkpoint was taken at is still held when the trial resumes.
    with bc.Producer(shuffled_loader(), name, epochs=None, min_consumers=2, slots=8):
        other = bc.Consumer(name, batch_size=4)
        iter(other)
        first, checkpoint = _train_to_a_checkpoint(name, tmp_path)
        again = _resume(name, tmp_path, checkpoint, callbacks=[Release(other)])
        assert again.consumer.stats()["resumed"] == "exact"
    # The rest of epoch 0 from the checkpoint on (the 2 batches the stopped trial took after it again,
    # as it had them), then epoch 1 whole: no batch replayed, none lost.
    before, rest, epoch1 = flat(first.seen[:4]), flat(again.seen[:12]), flat(again.seen[12:])
    assert sorted(before + rest) == list(range(N))
    assert rest[:6] == flat(first.seen[4:])
    assert sorted(epoch1) == list(range(N))


def test_a_resume_the_producer_no_longer_holds_is_the_next_pass_with_a_warning(runtime_dir, name, tmp_path):
    # Nobody else is there: once the trial left, the producer holds only its epoch's first loader batch.
    with bc.Producer(shuffled_loader(), name, epochs=None, catch_up_window=1):
        _train_to_a_checkpoint(name, tmp_path)
        with pytest.warns(bc.ResumeWarning, match="epoch 0 at sample 12"):
            again = _resume(name, tmp_path, True)  # the last checkpoint: checkpoint-2
        assert again.consumer.stats()["resumed"] == "next-pass"
    # The rest of epoch 0 is the same positions (12 to 47) of the producer's next pass: nothing twice
    # within it (the samples it had not taken of the interrupted epoch are lost to it); then epoch 1.
    rest, epoch1 = flat(again.seen[:12]), flat(again.seen[12:])
    assert len(set(rest)) == 36
    assert sorted(epoch1) == list(range(N))


def test_a_checkpoint_without_a_batchcast_state_is_refused_mid_epoch(runtime_dir, name, tmp_path):
    with bc.Producer(shuffled_loader(), name, epochs=None):
        _, checkpoint = _train_to_a_checkpoint(name, tmp_path)
        os.remove(os.path.join(checkpoint, bc.transformers.STATE_FILE))
        with pytest.raises(ValueError, match="holds no batchcast state"):
            _resume(name, tmp_path, checkpoint)


def test_what_the_door_sets_itself_is_refused_in_consumer_options(tmp_path):
    with pytest.raises(ValueError, match="may not set batch_size"):
        bc.transformers.Trainer(model=tiny_model(), args=arguments(tmp_path), producer="x",
                                consumer_options={"batch_size": 3})


class PerTrial(Recording):
    """Records each trial's batches apart (hyperparameter_search reuses one Trainer)."""

    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training:
            self.trials.setdefault(self._trial.number, []).append(inputs["sample_id"].tolist())
        return super().compute_loss(model, inputs, *args, **kwargs)


def test_hyperparameter_search_trials_each_train_on_every_sample_once_per_epoch_in_their_batch_size(
        runtime_dir, name, tmp_path):
    optuna = pytest.importorskip("optuna", reason="needs optuna (pip install optuna)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sizes = {}

    def hp_space(trial):
        size = trial.suggest_categorical("per_device_train_batch_size", [5, 7])
        sizes[trial.number] = size
        return {"per_device_train_batch_size": size,
                "learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-3, log=True)}

    with bc.Producer(shuffled_loader(), name, epochs=None):  # beside the search, for all its trials
        trainer = PerTrial(model_init=tiny_model, producer=name, eval_dataset=Tokens(8, offset=1000),
                           args=arguments(tmp_path, num_train_epochs=2, remove_unused_columns=False))
        trainer.trials = {}
        sampler = optuna.samplers.GridSampler({"per_device_train_batch_size": [5, 7],
                                               "learning_rate": [3e-4]}, seed=0)
        best = trainer.hyperparameter_search(hp_space=hp_space, backend="optuna", n_trials=2,
                                             direction="minimize", sampler=sampler)
    assert best.run_id in ("0", "1")
    assert sorted(sizes.values()) == [5, 7] and sorted(trainer.trials) == [0, 1]
    for number, batches in trainer.trials.items():
        size = sizes[number]
        per_epoch = -(-N // size)
        # Each trial joined the producer wherever it was, its own epochs each of every sample once.
        assert [len(b) for b in batches] == ([size] * (per_epoch - 1) + [N - size * (per_epoch - 1)]) * 2
        assert sorted(flat(batches[:per_epoch])) == sorted(flat(batches[per_epoch:])) == list(range(N))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(mode: str, name: str, out: Path) -> subprocess.Popen:
    """tests/python/trainer_ranks.py MODE: a Trainer trial of 2 ranks (gloo on CPU), by torchrun."""
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), str(Path(__file__).with_name("trainer_ranks.py")), mode, name,
         str(out)],
        stdout=open(out / "ranks.out", "w"), stderr=subprocess.STDOUT, cwd=out)


def finish_ranks(ranks: subprocess.Popen, out: Path) -> list[dict]:
    try:
        assert ranks.wait(180) == 0, (out / "ranks.out").read_text()
    finally:
        if ranks.poll() is None:
            ranks.kill()
            ranks.wait()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_data_parallel_trainer_of_two_ranks_is_one_group_beside_a_single_process_trial(
        runtime_dir, name, tmp_path):
    """torchrun of 2 ranks, each a bc.transformers.Trainer of one group: each epoch the ranks together
    train on every sample once, rank r on the r-th batch of each 2 x 4 samples, in step with each other;
    a single-process trial beside them gets every sample itself."""
    # min_consumers=2: the group (it counts once) and the single trial.
    with bc.Producer(shuffled_loader(), name, epochs=2, min_consumers=2):
        ranks = start_ranks("train", name, tmp_path)
        with bc.Consumer(name, batch_size=7) as single:
            alone = [[i for batch in single for i in batch["sample_id"].tolist()] for _ in range(2)]
        got = finish_ranks(ranks, tmp_path)
    for r, rank in enumerate(got):
        assert (rank["rank"], rank["world_size"]) == (r, 2)
        assert rank["wrapped"] == "DistributedDataParallel"  # the model is DDP's; the loader is the consumer
        assert rank["len"] == 6 and rank["steps"] == 12  # 48 samples / (2 ranks x 4) per epoch, 2 epochs
        assert [len(b) for b in rank["seen"]] == [4] * 12
    for epoch in range(2):
        mine = [got[r]["seen"][epoch * 6:(epoch + 1) * 6] for r in range(2)]
        assert sorted(flat(mine[0]) + flat(mine[1])) == list(range(N))
        # Window k of the stream: rank 0's batch k, then rank 1's; the single trial saw the same stream.
        stream = [i for k in range(6) for r in range(2) for i in mine[r][k]]
        assert stream == alone[epoch]
    # Each rank's checkpoints hold its own state.
    for step in (3, 6, 9, 12):
        folder = tmp_path / "run" / f"checkpoint-{step}"
        assert sorted(p.name for p in folder.glob("batchcast_state*.json")) == [
            "batchcast_state_0.json", "batchcast_state_1.json"], step


def test_a_data_parallel_trainer_resumed_from_its_checkpoint_gets_the_rest_of_the_epoch_exactly(
        runtime_dir, name, tmp_path):
    """The 2-rank trial stops after step 3 and is restarted from checkpoint-3: each rank restores its
    own state, and the group trains on the rest of epoch 0 (no window twice, none lost), then epoch 1."""
    with bc.Producer(shuffled_loader(), name, epochs=None, min_consumers=2, slots=8):
        # Another trial at the epoch's start holds the producer there (as in the single-process
        # resume test) until the restarted ranks have begun, so the checkpoint's position is held.
        other = bc.Consumer(name, batch_size=4)
        iter(other)
        ranks = start_ranks("resume", name, tmp_path)
        for r in range(2):
            eventually(lambda r=r: (tmp_path / f"resumed{r}").exists(), f"rank {r}'s restarted Trainer began",
                       timeout=150, watch=[ranks], err=lambda _: (tmp_path / "ranks.out").read_text())
        other.close()
        got = finish_ranks(ranks, tmp_path)
    for rank in got:
        assert [len(b) for b in rank["before"]] == [4] * 3 and [len(b) for b in rank["seen"]] == [4] * 9
        assert rank["steps"] == 12 and rank["resumed"] == "exact"
    before = flat(got[0]["before"]) + flat(got[1]["before"])
    rest = flat(got[0]["seen"][:3]) + flat(got[1]["seen"][:3])
    assert sorted(before + rest) == list(range(N))
    assert sorted(flat(got[0]["seen"][3:]) + flat(got[1]["seen"][3:])) == list(range(N))


def test_the_door_refuses_a_transformers_older_than_its_range_naming_the_extra():
    from batchcast import transformers as door

    door._check_transformers(door.OLDEST_TRANSFORMERS)  # the oldest end of the range is in it
    door._check_transformers(transformers.__version__)  # and the installed one
    with pytest.raises(ImportError) as refused:
        door._check_transformers("5.24.0")
    message = str(refused.value)
    assert "transformers 5.25 or newer" in message and "5.24.0 is installed" in message
    assert "batchcast[transformers]" in message
    # The range's floor is the one pyproject.toml states.
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert f'"transformers>={door.OLDEST_TRANSFORMERS},<6"' in pyproject
