"""One rank of a CPU distributed fairseq-train run (contract check h).

Runs ``fairseq_cli.train`` unchanged, and after every checkpoint save also writes this rank's
model parameters (not buffers) to ``$SLIM_DUMP_DIR/rank{R}.pt`` so the test can compare ranks bit by bit.
"""
import os
import sys

import torch
from fairseq import checkpoint_utils
from fairseq_cli import train

_save_checkpoint = checkpoint_utils.save_checkpoint


def _save_and_dump(cfg, trainer, epoch_itr, val_loss):
    result = _save_checkpoint(cfg, trainer, epoch_itr, val_loss)
    rank = trainer.data_parallel_rank
    # parameters only: some fairseq buffers (AdaptiveSoftmax's _float_tensor) are uninitialised
    state = {k: v.detach().clone() for k, v in trainer.get_model().named_parameters()}
    torch.save({"num_updates": trainer.get_num_updates(), "params": state},
               os.path.join(os.environ["SLIM_DUMP_DIR"], f"rank{rank}.pt"))
    return result


checkpoint_utils.save_checkpoint = _save_and_dump

if __name__ == "__main__":
    sys.argv[0] = "fairseq-train"
    train.cli_main()
