"""Where a recipe's results go: written in a folder of their own while the run goes on, moved to
their places only when every step succeeded, never over one of the run's inputs.

A refused run writes nothing; a failed run leaves the results of an earlier run where they were
(its own log stays in its staging folder, which the failure line names); an interrupted run
leaves nothing behind.
"""
import os
import shutil
import tempfile

from slim_fairseq_lab.recipes.cli import OptionError, refuse


def same_path(a, b):
    """Whether ``a`` and ``b`` name the same file or folder (links and relative paths resolved)."""
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def within(path, folder):
    """Whether ``path`` is ``folder`` or lies inside it."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def refuse_overwrite(flag, output, inputs, what="file"):
    """A refusal when writing ``output`` (the value of ``flag``) would replace one of ``inputs``
    or a folder holding one."""
    for given in inputs:
        if given and (same_path(output, given) or (os.path.isdir(output) and within(given, output))):
            raise refuse(f"{flag}={output}", f"would overwrite the input {given}",
                         f"another {what}, not an input of this run")


class Staged:
    """A temporary folder for a run's outputs (in ``near``, a folder on the file system of their
    final places, else the system's temporary folder); :meth:`install` moves them into place.
    It is removed at the end, except after a failure when ``keep_on_failure`` (its logs)."""

    def __init__(self, prog, near=None, keep_on_failure=True):
        if near is not None:
            os.makedirs(near, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix=f".{prog}.", dir=near)
        self.keep_on_failure = keep_on_failure
        self.kept = False

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def install(self, name, final):
        """Move the staged ``name`` to ``final``, replacing a file or folder there."""
        source = self.path(name)
        parent = os.path.dirname(os.path.abspath(final))
        os.makedirs(parent, exist_ok=True)
        old = None
        if os.path.lexists(final):
            old = tempfile.mkdtemp(prefix=".replaced.", dir=parent)
            os.rename(final, os.path.join(old, "x"))
        shutil.move(source, final)
        if old is not None:
            shutil.rmtree(old)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        from slim_fairseq_lab.recipes.tools import Interrupted
        failed = error is not None and not isinstance(error, Interrupted) and (
            not isinstance(error, OptionError) or error.status == 1)
        if failed and self.keep_on_failure:
            self.kept = True  # its logs tell why (the failure line names them)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        return False
