"""One rank of a data-parallel Trainer trial (run by torch.distributed.run
with gloo on CPU): bc.transformers.Trainer with the group its ranks share;
writes what it trained on to OUT/rank<r>.json.

    python -m torch.distributed.run --nproc_per_node 2 trainer_ranks.py train|resume NAME OUT

train: 2 epochs in batches of 4 per rank, a checkpoint every 3 steps.
resume: stops after step 3 (checkpoint-3), then a new Trainer (the trial
restarted) resumes from that checkpoint and trains to the end; it writes
OUT/resumed<r> once its training began.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback

from test_transformers import Lengths, Recording, StopAt, arguments, tiny_model


class Began(TrainerCallback):
    def __init__(self, path: Path):
        self.path = path

    def on_train_begin(self, args, state, control, **kwargs):
        self.path.write_text("")


def trainer(name: str, out: Path, callbacks: list) -> Recording:
    return Recording(model=tiny_model(), producer=name, consumer_options={"group": "ddp-trial"},
                     callbacks=callbacks,
                     args=arguments(out / "run", per_device_train_batch_size=4, num_train_epochs=2,
                                    ddp_backend="gloo", save_strategy="steps", save_steps=3))


def main() -> None:
    mode, name, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    torch.set_num_threads(1)
    lengths = Lengths()
    if mode == "train":
        first, last = None, trainer(name, out, [lengths])
        result = last.train()
    else:
        first = trainer(name, out, [StopAt(3)])
        first.train()
        rank = first.args.process_index
        last = trainer(name, out, [lengths, Began(out / f"resumed{rank}")])
        result = last.train(resume_from_checkpoint=str(out / "run" / "checkpoint-3"))
    rank = last.args.process_index
    stats = last.consumer.stats()
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world_size": last.args.world_size, "seen": last.seen,
        "before": first.seen if first is not None else [], "steps": result.global_step,
        "len": lengths.lengths[0], "resumed": stats["resumed"],
        "wrapped": type(last.model_wrapped).__name__}))
    sys.stdout.flush()
    sys.stderr.flush()
    # torch can abort a gloo process at interpreter exit (examples/ddp_trial.py says how): all is
    # written, leave without finalizing.
    os._exit(0)


if __name__ == "__main__":
    main()
