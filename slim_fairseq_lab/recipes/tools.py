"""The programs a recipe runs (fairseq's tools, sacremoses, subword-nmt, sacrebleu), each as a
subprocess in a process group of its own.

* A tool is looked up on PATH, then next to the interpreter running the recipe (a virtual
  environment that is not activated); a missing one is a one-line error.
* SIGINT, SIGTERM and SIGHUP that reach the recipe go to the tool's whole group (fairseq's
  workers and data loaders included) and the recipe waits for it to end, then stops with exit
  status 128 + the signal: no tool outlives a recipe that was stopped.
* Output is streamed: to a log file, or to the recipe's own stdout, keeping its end; a tool that
  fails ends the recipe in one line with the reason (its error line, or the last line of its
  traceback) and where the whole output is.
* Every tool gets glibc's malloc settings of :data:`ALLOCATOR_ENV`
  (docs/TRAINING.md#cpu-memory-allocator); values exported by the caller win.

:func:`run` is the one way the lab starts a program: the recipes call it, and so does
:func:`slim_fairseq_lab.launcher.run_tool` for the studies, benchmarks and the compression demo.
"""
import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from slim_fairseq_lab.paths import plugin_module

_errors = plugin_module("option_errors")  # the one-line error of every command
refuse = _errors.refusal

# glibc's malloc serves a block above its mmap threshold (32 MiB at most) with fresh pages from the
# kernel and hands them back when freed: the logits of a 2,048-token batch over 8,000 types (65 MB)
# then cost a page fault per page at every step, a third of a CPU run's time. Keeping such blocks
# in the heap gives the same results bit for bit, faster (docs/TRAINING.md#cpu-memory-allocator).
# A value in the caller's environment wins.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_running = []       # the tools running now (their process groups get the signals)
_pending = []       # a signal that arrived while a tool ran


class Interrupted(Exception):
    """The recipe received a signal; the tool it ran was sent it too and has ended. No refusal
    (no ``ValueError``, which a signal arriving inside ``except ValueError`` would meet): the
    recipe's edge prints its line and exits with :attr:`status`, 128 + the signal."""

    def __init__(self, signum):
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name}; the tools it ran were stopped too")
        self.signum, self.status = signum, 128 + signum


def _forward(signum, frame):
    if not _running:
        raise Interrupted(signum)
    _pending.append(signum)
    for proc in list(_running):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)


@contextlib.contextmanager
def signals_forwarded():
    """While the block runs, the signals of :data:`FORWARDED` stop the recipe and the tool it
    runs (only in the main thread, where Python delivers signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _forward) for signum in FORWARDED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _pending.clear()


def find(tool):
    """The path of ``tool``: on PATH, else next to this interpreter."""
    path = shutil.which(tool)
    if path is None:
        beside = os.path.join(os.path.dirname(sys.executable), tool)
        if os.path.isfile(beside) and os.access(beside, os.X_OK):
            path = beside
    if path is None:
        raise _errors.OptionError(f"{tool}: not found on PATH nor next to {sys.executable}; "
                                  "allowed: the environment `make setup` built (source "
                                  ".venv/bin/activate)", status=_errors.FAILED)
    return path


def user_dir():
    """The plugin directory for --user-dir: ``SLIM_USER_DIR``, else the installed package's."""
    import slim_fairseq_user_dir
    return os.environ.get("SLIM_USER_DIR") or slim_fairseq_user_dir.user_dir()


def not_options(flags, tool, context="", more=""):
    """The refusal of ``flags`` (as written on the command line) that fairseq's ``tool`` does not
    know (``context``: the options its parser depended on): dropping them is what it proposes."""
    return refuse(flags, f"not options of {tool}{context}",
                  f"drop {flags}, or the options of {tool} --help{more}")


def unknown_fairseq_options(parser, argv):
    """The words of ``argv`` that fairseq's ``parser`` (``fairseq.options.get_*_parser()``) does
    not know, as written ("" when it knows them all), read as the tool reads them with the plugin
    of argv's --user-dir loaded; mistakes of another kind are left to the tool to report."""
    import argparse
    from fairseq import options, utils

    class Other(Exception):
        pass

    if "--user-dir" in argv:
        utils.import_user_module(argparse.Namespace(user_dir=argv[argv.index("--user-dir") + 1]))

    def error(message):
        raise Other(message)

    parser.error = error
    try:
        _, unknown = options.parse_args_and_arch(parser, input_args=list(map(str, argv)), parse_known=True)
    except (Other, SystemExit, ValueError):
        return ""
    return " ".join(unknown)


def environment(extra=None, allocator=True):
    """The environment of a tool: the caller's, :data:`ALLOCATOR_ENV` under it, and ``extra``
    (``allocator=False``: glibc's defaults, every variable of :data:`ALLOCATOR_ENV` removed,
    also one the caller exported)."""
    if allocator:
        env = dict(ALLOCATOR_ENV, **os.environ)
    else:
        env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV}
    env.update(extra or {})
    return env


def failure_reason(text):
    """The line that says why a tool failed: its ``error:`` line (argparse's and the plugin's),
    else the last line of its traceback, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        match = re.search(r"(?:^|\s)error: (.+)$", line)
        if match and not line.startswith("[") and "| ERROR |" not in line:
            return match.group(1)
    for line in reversed(lines):
        match = re.match(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit))(?::\s*(.*))?$", line)
        if match:
            return f"{match.group(1)}: {match.group(2)}" if match.group(2) else match.group(1)
    return lines[-1] if lines else "no output"


def _feed(stream, paths):
    try:
        for path in paths:
            with open(path, "rb") as f:
                shutil.copyfileobj(f, stream, 1 << 20)
    except BrokenPipeError:
        pass
    finally:
        with contextlib.suppress(BrokenPipeError):
            stream.close()


def _relay(stream, out, tail):
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        tail.append(line)
        out.write(line)
        out.flush()


def run(argv, *, log=None, stdout=None, stderr=None, stdin=None, env=None, cwd=None, progress=None,
        interval=None, check=True, name=None, see=None, append=False, allocator=True):
    """Run ``argv`` (``argv[0]``: a tool name, found with :func:`find`) in its own process group.

    Output: ``log`` (a path, continued when ``append``) takes stdout and stderr; else ``stdout``
    / ``stderr`` (paths, or None: streamed to the recipe's stdout / stderr). ``env``: variables
    added to :func:`environment`'s (``allocator``: with :data:`ALLOCATOR_ENV`). ``stdin``: a path, or a list of paths read
    one after the other. ``progress()`` is called every ``interval`` seconds while it runs.
    Returns the exit status; with ``check``, a failure raises a one-line ``OptionError``
    naming the reason and ``see`` (default: the file that holds its errors)."""
    name = name or os.path.basename(argv[0])
    command = [find(argv[0]), *map(str, argv[1:])]
    files = []
    tail = collections.deque(maxlen=200)
    relays = []
    try:
        out = err = None
        if log is not None:
            out = open(log, "ab" if append else "wb")
            files.append(out)
            err = subprocess.STDOUT
        else:
            if stdout is not None:
                out = open(stdout, "wb")
                files.append(out)
            if stderr is not None:
                err = open(stderr, "wb")
                files.append(err)
        relay_out = out is None
        relay_err = err is None and log is None
        paths = [stdin] if isinstance(stdin, (str, os.PathLike)) else stdin
        proc = subprocess.Popen(
            command, cwd=cwd, env=environment(env, allocator), start_new_session=True,
            stdin=subprocess.PIPE if paths else subprocess.DEVNULL,
            stdout=subprocess.PIPE if relay_out else out,
            stderr=subprocess.PIPE if relay_err else err)
        _running.append(proc)
        try:
            if relay_out:
                relays.append(threading.Thread(target=_relay, args=(proc.stdout, sys.stdout, tail),
                                               daemon=True))
            if relay_err:
                relays.append(threading.Thread(target=_relay, args=(proc.stderr, sys.stderr, tail),
                                               daemon=True))
            if paths:
                relays.append(threading.Thread(target=_feed, args=(proc.stdin, paths), daemon=True))
            for thread in relays:
                thread.start()
            every = interval if interval is not None else float(os.environ.get("PROGRESS_INTERVAL", "30"))
            last = time.monotonic()
            while True:
                try:
                    status = proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    if progress is not None and time.monotonic() - last >= every:
                        last = time.monotonic()
                        progress()
            for thread in relays:
                thread.join()
        finally:
            _running.remove(proc)
            if proc.poll() is None:  # an exception while it ran: it goes too
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
    finally:
        for f in files:
            f.close()
    if _pending:
        signum = _pending.pop()
        _pending.clear()
        raise Interrupted(signum)
    if status != 0 and check:
        where = see if see is not None else (log or stderr or stdout)
        raise tool_failed(name, status, where or None, "".join(tail) if tail else None)
    return status


def tool_failed(name, status, where, text=None):
    """The one-line failure of a tool: ``NAME failed (exit N): REASON; see WHERE``."""
    if text is None and where is not None and os.path.exists(where):
        with open(where, encoding="utf-8", errors="replace") as f:
            text = f.read()
    reason = failure_reason(text or "")
    if len(reason) > 400:
        reason = reason[:400] + " ..."
    see = f"; see {where}" if where else " (its output is above)"
    return _errors.OptionError(f"{name} failed (exit {status}): {reason}{see}",
                               status=_errors.FAILED)


def output(argv, **kwargs):
    """The stdout of ``argv`` (small outputs: scores, counts), run as :func:`run` does."""
    import tempfile
    with tempfile.NamedTemporaryFile(prefix="tool-", suffix=".out", delete=False) as f:
        path = f.name
    try:
        run(argv, stdout=path, see="", **kwargs)
        with open(path, encoding="utf-8") as f:
            return f.read()
    finally:
        os.unlink(path)
