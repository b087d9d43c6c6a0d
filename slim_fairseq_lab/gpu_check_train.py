"""Short ``fairseq-train`` runs of the device check (docs/GPU.md), one per family and precision
flag, and what they must show: no NaN, no endless loss-scale overflow, a falling loss, and a
loss after N updates close to fp32's.

A run is fairseq-train's own code path (``fairseq_cli.train.main`` behind fairseq's parser, as
its console script calls it); one worker process runs several in turn, so that fairseq and
torch are imported once per worker (``python -m slim_fairseq_lab.gpu_check_train SPECS.json``).
The per-update losses, loss scales and overflow notices come from fairseq's own log
(``--log-format json --log-interval 1``).
"""
import json
import logging
import os
import sys
import time
import traceback

# precision flag -> fairseq-train flags
PRECISIONS = {
    "fp32": [],
    "fp16": ["--fp16"],
    "bf16": ["--bf16"],
    "memory-efficient-fp16": ["--memory-efficient-fp16"],
    "amp": ["--amp"],
}
# the loss after N updates (mean of the last LAST_UPDATES) may differ from fp32's by this share
LOSS_TOLERANCE = 0.03
LAST_UPDATES = 3
# a run may skip this many steps for loss-scale overflow (each one halves the scale: 128 -> 0.5)
MAX_OVERFLOWS = 8
# the loss must fall by this share from the first update to the mean of the last ones
MIN_FALL = 0.02
# fairseq 0.12.3's parser turns --bf16 into --tpu (fairseq/options.py), whose trainer asks
# torch_xla for its device: on a GPU or CPU without torch_xla this is the error it ends with
BF16_IS_TPU_ONLY = ("fairseq 0.12.3 makes --bf16 imply --tpu (fairseq/options.py), so its trainer "
                    "needs torch_xla: --bf16 trains on TPUs only "
                    "(https://github.com/facebookresearch/fairseq/issues/4696)")


class _FairseqLog(logging.Handler):
    """Collects fairseq's per-update JSON records and its overflow notices."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.updates, self.overflows = [], 0

    def emit(self, record):
        message = record.getMessage()
        if record.name == "train_inner" and message.startswith("{"):
            stats = json.loads(message)
            self.updates.append({"num_updates": int(stats["num_updates"]), "loss": float(stats["loss"]),
                                 "loss_scale": float(stats["loss_scale"]) if "loss_scale" in stats else None})
        elif ("gradient overflow detected" in message or "AMP: skipping this batch" in message
              or "AMP: overflow" in message):
            self.overflows += 1


def run_training(argv):
    """Run fairseq-train with ``argv`` (no program name) in this process; returns
    {"updates": [{"num_updates", "loss", "loss_scale"}], "overflows": n, "error": str or None,
    "seconds": s}."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train

    log = _FairseqLog()
    root = logging.getLogger()
    root.addHandler(log)
    start = time.perf_counter()
    error = None
    try:
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, input_args=list(argv))
        distributed_utils.call_main(convert_namespace_to_omegaconf(args), train.main)
    except BaseException as e:  # noqa: BLE001 -- a failed run is a result; KeyboardInterrupt is re-raised
        if isinstance(e, KeyboardInterrupt):
            raise
        lines = traceback.format_exception_only(type(e), e)
        error = " ".join(line.strip() for line in lines)[:500]
    finally:
        root.removeHandler(log)
    return {"updates": log.updates, "overflows": log.overflows, "error": error,
            "seconds": time.perf_counter() - start}


def judge(run, fp32_run, updates):
    """Verdict of one run against its family's fp32 run: {"status": ok|failed|unsupported,
    "problems": [...], "final_loss": float or None, "vs_fp32": relative difference or None}."""
    problems = []
    if run.get("error"):
        status = "unsupported" if "--bf16" in run["argv"] and "xla" in run["error"].lower() else "failed"
        why = BF16_IS_TPU_ONLY if status == "unsupported" else run["error"]
        return {"status": status, "problems": [why], "final_loss": None, "vs_fp32": None}
    losses = [u["loss"] for u in run["updates"]]
    done = run["updates"][-1]["num_updates"] if run["updates"] else 0
    if done < updates:
        problems.append(f"stopped after {done} of {updates} updates")
    if not losses or any(loss != loss or loss in (float("inf"), float("-inf")) for loss in losses):
        problems.append("NaN or infinite loss")
        return {"status": "failed", "problems": problems, "final_loss": None, "vs_fp32": None}
    if run["overflows"] > MAX_OVERFLOWS:
        problems.append(f"{run['overflows']} loss-scale overflows (at most {MAX_OVERFLOWS})")
    final = sum(losses[-LAST_UPDATES:]) / len(losses[-LAST_UPDATES:])
    if final > losses[0] * (1 - MIN_FALL):
        problems.append(f"loss did not fall: {losses[0]:.3f} -> {final:.3f}")
    vs_fp32 = None
    if fp32_run is not None and fp32_run is not run and fp32_run.get("updates") and not fp32_run.get("error"):
        reference = [u["loss"] for u in fp32_run["updates"]][-LAST_UPDATES:]
        reference = sum(reference) / len(reference)
        vs_fp32 = (final - reference) / reference
        if abs(vs_fp32) > LOSS_TOLERANCE:
            problems.append(f"loss after {updates} updates {final:.3f} vs fp32 {reference:.3f} "
                            f"({100 * vs_fp32:+.1f} %, tolerance ±{100 * LOSS_TOLERANCE:.0f} %)")
    return {"status": "failed" if problems else "ok", "problems": problems, "final_loss": final,
            "vs_fp32": vs_fp32}


def main(argv=None):
    """Worker: run every spec of SPECS.json ({"name", "argv", "out"} each) in turn and write each
    result to its "out" as soon as it is done."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m slim_fairseq_lab.gpu_check_train SPECS.json")
    with open(argv[0]) as f:
        specs = json.load(f)
    for spec in specs:
        print(f"[gpu-check] train {spec['name']}", file=sys.stderr, flush=True)
        result = run_training(spec["argv"])
        result.update(name=spec["name"], argv=spec["argv"])
        tmp = spec["out"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, spec["out"])


if __name__ == "__main__":
    main()
