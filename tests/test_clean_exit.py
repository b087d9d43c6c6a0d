"""slim_fairseq.clean_exit: fairseq's prefetching thread is stopped before interpreter shutdown.

Without it, a run that stopped mid-epoch could abort at exit ("terminate called without an active
exception", status 134) after saving its checkpoints; CI once failed that way.
"""
import subprocess
import sys
import textwrap

from helpers import REPO

SCRIPT = textwrap.dedent("""
    import atexit, threading, time
    from fairseq.data.iterators import BackgroundConsumer, BufferedIterator

    def report():  # registered before the plugin's hook, so it runs after it
        alive = [t for t in threading.enumerate() if isinstance(t, BackgroundConsumer) and t.is_alive()]
        print("prefetch threads alive at exit:", len(alive), flush=True)

    atexit.register(report)
    if IMPORT_PLUGIN:
        import slim_fairseq  # noqa: F401

    class SlowBatches:  # like a data loader in the middle of an epoch
        def __len__(self):
            return 10000

        def __iter__(self):
            for i in range(10000):
                time.sleep(0.002)
                yield i

    batches = BufferedIterator(4, SlowBatches())
    assert next(batches) == 0  # training stops here (e.g. --max-update) and fairseq-train returns
""")


def _alive_at_exit(import_plugin):
    code = f"IMPORT_PLUGIN = {import_plugin}\n" + SCRIPT
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def test_prefetch_thread_is_stopped_before_shutdown():
    assert _alive_at_exit(True) == "prefetch threads alive at exit: 0"


def test_without_the_plugin_the_thread_is_still_running_at_exit():
    """The situation the hook exists for (if fairseq ever stops it itself, the hook can go)."""
    assert _alive_at_exit(False) == "prefetch threads alive at exit: 1"
