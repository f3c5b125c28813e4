"""Hugging Face transformers' ``Trainer``, fed by a batchcast producer.

    import batchcast as bc

    trainer = bc.transformers.Trainer(model, args, producer="imdb", eval_dataset=eval_ds)
    trainer.train()                                   # batches of args.per_device_train_batch_size
    trainer.train(resume_from_checkpoint=True)        # the data goes on where the checkpoint was

A ``transformers.Trainer`` whose training batches come from the producer
named: a ``bc.Consumer(producer, batch_size=<the Trainer's batch size>,
drop_last=args.dataloader_drop_last)``, made when training starts and closed
when it ends (``trainer.consumer``; its ``stats()`` answer after that). The producer's loader
collates (its ``collate_fn`` is the data collator), so its batches are the
model's inputs; the Trainer's own ``data_collator`` and column removal apply to
evaluation only. What the door changes of ``Trainer``:

- ``get_train_dataloader()`` returns the consumer itself: Accelerate never
  wraps or re-shards it (``Trainer`` prepares only the loaders it builds), and
  ``len()`` is the consumer's batches per epoch, so ``num_train_epochs``,
  ``max_steps``, gradient accumulation and the LR scheduler's total steps
  count as with a DataLoader.
- Each checkpoint holds the consumer's ``state_dict()`` (``batchcast_state.json``,
  a group's ranks ``batchcast_state_<rank>.json``), and
  ``train(resume_from_checkpoint=...)`` restores it in place of Accelerate's
  ``skip_first_batches`` (which rebuilds a loader from its sampler, and would
  replay the batches): exactly where the checkpoint was taken while the
  producer still holds that position, else the same positions of its next
  pass with a ``batchcast.ResumeWarning`` (``Consumer``'s rules).
  ``args.ignore_data_skip=True`` starts the resumed epoch afresh instead.
- Evaluation is untouched: the trial's own ``eval_dataset`` and DataLoader.

``consumer_options`` are further keywords of ``bc.Consumer`` (``device``,
``pad``, ``transform``, ``join``, ``timeout``, ``group``); a data-parallel
trial (``args.world_size > 1``) needs ``group="<trial name>"``, its ranks a
consumer group. Mix it into another ``Trainer`` subclass by listing it
first: ``class SFT(bc.transformers.Trainer, trl.SFTTrainer)``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import transformers
from packaging.version import Version
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from .consumer import Consumer

# The oldest transformers the door runs with (pyproject.toml's extra
# batchcast[transformers]): the first with Trainer.get_resumed_dataloader,
# which the door overrides so that a resume restores the consumer instead of
# skipping batches (before it, Trainer skips them itself: a resumed epoch
# would be replayed from the producer's stream, the wrong samples).
OLDEST_TRANSFORMERS = "5.25"


def _check_transformers(version: str) -> None:
    if Version(version) < Version(OLDEST_TRANSFORMERS):
        raise ImportError(
            f"batchcast.transformers needs transformers {OLDEST_TRANSFORMERS} or newer (its "
            f"Trainer.get_resumed_dataloader), and transformers {version} is installed: "
            f"pip install 'batchcast[transformers]' (or 'transformers>={OLDEST_TRANSFORMERS}')")


_check_transformers(transformers.__version__)

STATE_FILE = "batchcast_state.json"

# What the door sets itself, from the Trainer's arguments and its checkpoints.
_SET_BY_THE_DOOR = ("name", "batch_size", "drop_last", "state")


def state_file(rank: int | None) -> str:
    """The file of a checkpoint folder holding a consumer's state (a group's
    rank: its own)."""
    return STATE_FILE if rank is None else f"batchcast_state_{rank}.json"


class Trainer(transformers.Trainer):
    """A ``transformers.Trainer`` trained on batches from producer
    ``producer`` (see the module's documentation). All other arguments are
    ``transformers.Trainer``'s; ``train_dataset`` is not needed."""

    def __init__(self, *args: Any, producer: str, consumer_options: Mapping[str, Any] | None = None,
                 **kwargs: Any) -> None:
        if not isinstance(producer, str) or not producer:
            raise ValueError(f"producer= names the batchcast producer to train from, not {producer!r}")
        options = dict(consumer_options or {})
        taken = sorted(set(options) & set(_SET_BY_THE_DOOR))
        if taken:
            raise ValueError(
                f"consumer_options may not set {', '.join(taken)}: the Trainer's arguments give the batch "
                "size (per_device_train_batch_size) and drop_last (dataloader_drop_last), and its "
                "checkpoints the state")
        self.producer = producer
        self.consumer_options = options
        self.consumer: Consumer | None = None
        self._batchcast_checkpoint: str | None = None  # the checkpoint train() resumes from
        self._batchcast_restored = False  # whether the consumer was restored from it
        self._batchcast_batches: list[Any] | None = None  # the last step's batches, to let go of
        super().__init__(*args, **kwargs)
        if self.args.world_size > 1 and options.get("group") is None:
            raise ValueError(
                f"this Trainer runs {self.args.world_size} data-parallel processes: give its ranks one "
                "batchcast group, consumer_options={'group': '<a name for this trial>'}, or each rank "
                "would train on the whole stream")

    # ---- training data -------------------------------------------------------

    def get_train_dataloader(self) -> Any:
        """The consumer of ``producer`` with this Trainer's batch size (one
        process's, as a DataLoader's), restored from the checkpoint being
        resumed if it holds a batchcast state."""
        self._close_consumer()
        state = self._saved_state()
        self._batchcast_restored = state is not None
        self.consumer = Consumer(self.producer, batch_size=self._train_batch_size,
                                 drop_last=self.args.dataloader_drop_last, state=state,
                                 **self.consumer_options)
        return self.consumer

    @property
    def _rank(self) -> int | None:
        """This process's rank in a data-parallel trial (None: it is alone)."""
        return self.args.process_index if self.args.world_size > 1 else None

    def _saved_state(self) -> dict[str, Any] | None:
        folder = self._batchcast_checkpoint
        if folder is None or self.args.ignore_data_skip:
            return None
        path = os.path.join(folder, state_file(self._rank))
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            state: dict[str, Any] = json.load(f)
        return state

    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        """Resuming mid-epoch: the consumer, already restored where the
        checkpoint was taken (no batches replayed)."""
        consumer = self.consumer
        if dataloader is not consumer or consumer is None:
            return super().get_resumed_dataloader(dataloader, num_batches)
        if not self._batchcast_restored:
            raise ValueError(
                f"checkpoint {self._batchcast_checkpoint} was taken {num_batches} batches into an epoch "
                f"but holds no batchcast state ({state_file(self._rank)}): it was not saved by "
                "batchcast.transformers.Trainer, and batches from a producer cannot be skipped. Pass "
                "TrainingArguments(ignore_data_skip=True) to train on with a fresh epoch")
        if consumer.group is None and consumer.batch_size is not None:
            at = int(consumer.state_dict()["position"])
            if at != num_batches * consumer.batch_size:
                raise ValueError(
                    f"checkpoint {self._batchcast_checkpoint}: the Trainer resumes {num_batches} batches "
                    f"into its epoch, but the batchcast state is at sample {at} of it (batch size "
                    f"{consumer.batch_size}); resume with the arguments the checkpoint was saved with")
        return consumer

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        """``Trainer``'s, dropping the batches of the step before: the Trainer
        fetches a step's ``gradient_accumulation_steps`` batches while still
        holding the last step's list of them, which would keep twice as many of
        the producer's ring slots (the list is the Trainer's own, and it is
        done with it)."""
        if self._batchcast_batches is not None:
            self._batchcast_batches.clear()
        batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._batchcast_batches = batches if isinstance(batches, list) else None
        return batches, items

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``transformers.Trainer.train``; a checkpoint resumed from restores
        the consumer's place in the producer's stream. The consumer leaves
        the producer when training ends."""
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)  # type: ignore[no-untyped-call]
        self._batchcast_checkpoint = checkpoint if isinstance(checkpoint, str) else None
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self._batchcast_checkpoint = None
            self._batchcast_batches = None
            self._close_consumer()

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        consumer = self.consumer
        if consumer is None or self._batchcast_closed(consumer):
            return
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, state_file(self._rank))
        with open(path + ".tmp", "w") as f:
            json.dump(consumer.state_dict(), f)
        os.replace(path + ".tmp", path)

    @staticmethod
    def _batchcast_closed(consumer: Consumer) -> bool:
        return consumer._core is None

    def _close_consumer(self) -> None:
        """Leaves the producer (a consumer kept attached but not iterated would
        hold the producer's ring); ``trainer.consumer.stats()`` still answers."""
        if self.consumer is not None:
            self.consumer.close()
