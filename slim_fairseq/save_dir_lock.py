"""One run per save-dir: a training takes its save-dir for itself.

A second training into a save-dir in use would resume from, and overwrite, the first one's
checkpoints (both exit 0, every checkpoint left is the last writer's). So a training holds an
``fcntl.flock`` on ``SAVE_DIR/run.lock`` (which names its pid, host and start time) while it
runs; another one into the same save-dir is refused in one line naming that process.

* The operating system releases a flock when its process ends, however it ends: a lock file
  left by a killed run is taken over, with a one-line note naming the run that left it.
* A run that ends normally removes its lock file (and the save-dir, when it created it and
  nothing else was written there).
* ``fairseq-train`` with the plugin's architectures takes the lock right after fairseq parses its
  command line (:func:`slim_fairseq.run_checks.check_command_line`); with several GPU workers
  the parent process holds it, and with ``torchrun`` the process of rank 0 (the one that saves
  checkpoints). The train recipes take it before they write to the save-dir and pass it on to
  the ``fairseq-train`` they run (:data:`HOLDER_ENV`).
* flock is a lock of one machine's kernel; on network file systems it depends on the server.
"""
import atexit
import contextlib
import datetime
import fcntl
import os
import socket
import sys

from slim_fairseq.option_errors import option_error

LOCK_NAME = "run.lock"
HOLDER_ENV = "SLIM_FAIRSEQ_SAVE_DIR_HOLDER"  # pid of an ancestor that holds the lock for us

_held = {}  # realpath of the save-dir -> (open lock file, created the save-dir, pid)


class SaveDirInUse(Exception):
    """The save-dir is held by another live process (:attr:`owner`: its lock file's line)."""

    def __init__(self, save_dir, owner):
        super().__init__(owner)
        self.save_dir, self.owner = save_dir, owner


def _owner_text(line):
    """``pid=1 host=h started=t`` -> ``pid 1 on h, started t``."""
    fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
    if "pid" not in fields:
        return "a process that wrote no pid"
    return f"pid {fields['pid']} on {fields.get('host', '?')}, started {fields.get('started', '?')}"


def _owner_pid(line):
    fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
    try:
        return int(fields.get("pid", ""))
    except ValueError:
        return None


def _ancestors():
    """The pids of this process's parents (from /proc where there is one)."""
    found, pid = [], os.getppid()
    while pid > 1 and pid not in found:
        found.append(pid)
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def take(save_dir, note=None):
    """Take ``save_dir`` for this process (creating it): returns the note to print when a dead
    run's lock was taken over (else None); raises :class:`SaveDirInUse` when a live process
    holds it. Taking a save-dir this process holds already does nothing."""
    key = os.path.realpath(save_dir)
    if key in _held:
        return None
    created = not os.path.isdir(save_dir)
    os.makedirs(save_dir, exist_ok=True)
    path = os.path.join(save_dir, LOCK_NAME)
    while True:
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            line = handle.read().strip()
            handle.close()
            holder = os.environ.get(HOLDER_ENV)
            if holder and str(_owner_pid(line)) == holder and int(holder) in _ancestors():
                return None  # the recipe that runs us holds it for this run
            if created:
                with contextlib.suppress(OSError):
                    os.rmdir(save_dir)
            raise SaveDirInUse(save_dir, _owner_text(line))
        try:
            same = os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:  # not a file its last holder removed while we waited for it
            break
        handle.close()
    handle.seek(0)
    previous = handle.read().strip()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid={os.getpid()} host={socket.gethostname()} started={started}\n")
    handle.flush()
    _held[key] = (handle, created, os.getpid())
    if previous:
        return (f"--save-dir={save_dir}: taken over from a training that ended without releasing it "
                f"({_owner_text(previous)})")
    return None


def release(save_dir):
    """Give ``save_dir`` back: its lock file is removed, and the save-dir too when this process
    created it and it holds nothing else."""
    key = os.path.realpath(save_dir)
    entry = _held.get(key)
    if entry is None or entry[2] != os.getpid():
        return
    del _held[key]
    handle, created, _ = entry
    with contextlib.suppress(OSError):
        os.remove(os.path.join(key, LOCK_NAME))
    handle.close()
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(key)


def release_all():
    """Release every save-dir this process holds (at exit)."""
    for key in list(_held):
        release(key)


atexit.register(release_all)


def in_use_error(error, name="--save-dir"):
    """The one-line refusal of a save-dir in use."""
    return option_error(name, error.save_dir, f"in use by another training ({error.owner}), whose "
                        "checkpoints this run would overwrite", "a --save-dir of its own, or the same "
                        "one after that training ends")


def take_for_training(args):
    """``fairseq-train``'s save-dir, taken by the process that saves checkpoints (the parent of
    several GPU workers, rank 0 of ``torchrun``); a note about a lock taken over is printed."""
    save_dir = getattr(args, "save_dir", None)
    if not save_dir or getattr(args, "no_save", False):
        return
    if os.environ.get("RANK", "0") != "0" or (getattr(args, "distributed_rank", 0) or 0) != 0:
        return
    try:
        note = take(save_dir)
    except SaveDirInUse as error:
        raise in_use_error(error) from None
    if note:
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq-train"
        print(f"{prog}: note: {note}", file=sys.stderr, flush=True)
