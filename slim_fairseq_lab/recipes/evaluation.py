"""What the two evaluation recipes share: the checkpoint they evaluate (a file, a folder's
checkpoint_best.pt, or the average of a folder's last N checkpoints) and what its saved
configuration says (its kind of model, its languages, its positions)."""
import os
import re

from slim_fairseq_lab import checkpoints
from slim_fairseq_lab.recipes.cli import OptionError, log, refuse


def folder_of(ckpt):
    """The folder an evaluation of CKPT writes next to: CKPT itself, or the file's folder."""
    return ckpt if os.path.isdir(ckpt) else (os.path.dirname(ckpt) or ".")


def checkpoint_name(ckpt, avg, out_dir):
    """The file :func:`resolve` will evaluate (before any check or averaging): where an
    evaluation's outputs and results are named from."""
    if os.path.isdir(ckpt) and avg != 1:
        return os.path.join(out_dir, f"average_last{avg}.pt")
    if os.path.isdir(ckpt):
        return os.path.join(ckpt, "checkpoint_best.pt")
    return ckpt


class Resolved:
    """The model to evaluate: ``path`` (where it is, or will be once averaged), ``averaged``
    (the files of an average, oldest first; empty otherwise), ``state`` (its saved
    configuration, read without its weights)."""

    def __init__(self, path, averaged=(), mode=None, state=None):
        self.path, self.averaged, self.mode, self.state = path, list(averaged), mode, state

    def write_average(self, target):
        """Average the checkpoints into ``target`` (the staged file of :attr:`path`)."""
        import torch
        state = checkpoints.average(list(reversed(self.averaged)))
        torch.save(state, target)
        folder = os.path.dirname(self.averaged[0])
        log(f"--avg {len(self.averaged)}: {self.path} is the average of "
            f"{' '.join(os.path.basename(p) for p in self.averaged)} (in {folder})")


def resolve(ckpt, avg, out_dir):
    """The checkpoint CKPT names: a file, or a folder's checkpoint_best.pt, or with AVG > 1 the
    average of its last AVG update checkpoints (checkpoint_E_U.pt, by update number; epoch
    checkpoints checkpointE.pt, by epoch number, when there are not enough), to be written to
    OUT_DIR. Everything is checked, and the configuration read, before anything is written."""
    avg = int(avg)
    if os.path.isfile(ckpt):
        if avg != 1:
            raise refuse(f"--avg={avg}", f"needs a checkpoint folder, got the file {ckpt}",
                         f"--avg 1, or the folder of {os.path.basename(ckpt)}")
        return Resolved(ckpt, state=read(ckpt))
    if os.path.isdir(ckpt) and avg == 1:
        model = os.path.join(ckpt, "checkpoint_best.pt")
        if not os.path.isfile(model):
            raise refuse(f"CKPT={ckpt}", "a folder without checkpoint_best.pt",
                         "a checkpoint file, or --avg N to average the folder's last N")
        return Resolved(model, state=read(model))
    if os.path.isdir(ckpt):
        names = os.listdir(ckpt)
        updates = sum(bool(checkpoints.UPDATE_PATTERN.match(n)) for n in names)
        epochs = sum(bool(checkpoints.EPOCH_PATTERN.match(n)) for n in names)
        if updates >= avg:
            pattern = checkpoints.UPDATE_PATTERN
        elif epochs >= avg:
            pattern = checkpoints.EPOCH_PATTERN
        else:
            most = max(updates, epochs)
            raise refuse(f"--avg={avg}", f"{ckpt} holds {updates} update checkpoints (checkpoint_E_U.pt) "
                         f"and {epochs} epoch checkpoints (checkpointE.pt), fewer than {avg}",
                         (f"--avg {most} or less, or " if most > 1 else "") + "a checkpoint file")
        newest_first = checkpoints.last_checkpoints(ckpt, avg, pattern)
        states = [read(path) for path in newest_first]  # every one is complete
        check_one_run(avg, newest_first, states)
        return Resolved(os.path.join(out_dir, f"average_last{avg}.pt"), reversed(newest_first), pattern,
                        states[0])
    raise refuse(f"CKPT={ckpt}", "no such file or folder", "a checkpoint file, or the --save-dir of a run")


def check_one_run(avg, paths, states):
    """The checkpoints of an average belong to one run (each records its run; independently
    trained models do not average to a model)."""
    runs = [(path, checkpoints.run_of(path, state)) for path, state in zip(paths, states)]
    runs = [(path, run) for path, run in runs if run]
    other = next(((path, run) for path, run in runs if run != runs[0][1]), None)
    if other:
        raise refuse(f"--avg={avg}", f"{other[0]} is a checkpoint of another run than {runs[0][0]} "
                     f"(run {other[1][:8]}, and {runs[0][1][:8]}): independently trained models do not "
                     "average to a model", "--avg 1 (one checkpoint), or a folder of one run's checkpoints")


def check_data(model, data):
    """The data-bin's dictionaries are those the checkpoint was trained with (what the checkpoint,
    or the recipe beside it, records; slim_fairseq/data_record.py): another one, even a shuffled
    dict.txt of the same size, would give a wrong score without a word."""
    where = model.averaged[-1] if model.averaged else model.path
    problem = checkpoints.data_mismatch(where, model.state, data)
    if problem:
        raise OptionError(problem)


def read(path):
    """The saved configuration of a checkpoint (its tensors mapped, not read); a damaged file is
    a one-line refusal naming a complete checkpoint beside it."""
    try:
        return checkpoints.load(path, mmap=True)
    except checkpoints.OptionError as error:
        other = checkpoints.complete_neighbour(path)
        allowed = (f"CKPT={other} (a complete checkpoint in the same folder)" if other else
                   f"a checkpoint fairseq saved completely (none other in {os.path.dirname(path) or '.'} loads)")
        raise refuse(f"CKPT={path}", re.sub(r"^\S+: ", "", str(error)), allowed) from None


def describe(state):
    """``arch, task NAME``: what a checkpoint holds, in words."""
    return f"{checkpoints.arch(state)}, task {checkpoints.task_name(state)}"
