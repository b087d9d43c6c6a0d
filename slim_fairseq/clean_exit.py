"""Stop fairseq's batch-prefetching thread before the interpreter shuts down.

fairseq's ``BufferedIterator`` (``--data-buffer-size``, 10 by default) fills its buffer from a
daemon thread, ``BackgroundConsumer``. When training stops in the middle of an epoch
(``--max-update``, ``--stop-time-hours``) that thread is still building batches when
``fairseq-train`` returns. Python stops daemon threads during finalization; one that is inside
torch's C++ code at that moment aborts the whole process ("terminate called without an active
exception", exit status 134) after the run finished and its checkpoints were saved. We saw it in
about 1 of 15 short runs on a 2-core machine; it fails any script that chains training with
evaluation.

:func:`install` registers an ``atexit`` hook that ends those threads first, while the interpreter is
still fully alive: each is told to stop after the batch it is building (its length limit is set
to 0) and its queue is drained so that it never blocks. Training itself is untouched: the hook
runs only after ``fairseq-train`` has returned.
"""
import atexit
import queue
import threading
import time

_installed = False


def stop_prefetch_threads(timeout=5.0):
    """End every live fairseq ``BackgroundConsumer`` thread; returns how many were stopped."""
    try:
        from fairseq.data.iterators import BackgroundConsumer
    except ImportError:  # pragma: no cover - fairseq is a dependency
        return 0
    stopped = 0
    for thread in threading.enumerate():
        if not isinstance(thread, BackgroundConsumer) or not thread.is_alive():
            continue
        thread._max_len = 0  # its loop breaks after the item it is producing now
        deadline = time.monotonic() + timeout
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                while True:
                    thread._queue.get_nowait()  # room for its last put and its end marker
            except queue.Empty:
                pass
            thread.join(0.01)
        stopped += not thread.is_alive()
    return stopped


def install():
    """Register :func:`stop_prefetch_threads` to run at interpreter exit (once)."""
    global _installed
    if not _installed:
        atexit.register(stop_prefetch_threads)
        _installed = True
