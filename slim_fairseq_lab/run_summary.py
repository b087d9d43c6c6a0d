"""The table of the shell comparisons (examples/*/..._vs_*.sh): one row per fairseq run, read from
its logs with :mod:`slim_fairseq_lab.fairseq_logs`."""
import os

from slim_fairseq_lab import fairseq_logs

COLUMNS = ["model", "params", "valid loss", "valid nll", "valid ppl", "train tok/s", "test BLEU",
           "gen tok/s"]


def train_log_row(text):
    """{params, loss, nll, ppl, wps} of a fairseq-train log: the last validation's loss / nll /
    perplexity as logged, and the mean training tokens/s of the epoch records (else of the
    ``train_inner`` records); None where the log does not have the value (LMs log no nll)."""
    params = fairseq_logs.parameter_count(text)
    valid = [r for r in fairseq_logs.records(text, "valid") if "loss" in r]
    last = valid[-1] if valid else {}
    wps = ([float(r["wps"]) for r in fairseq_logs.records(text, "train") if "wps" in r]
           or [float(r["wps"]) for r in fairseq_logs.records(text, "train_inner") if "wps" in r])
    return {"params": None if params is None else f"{params:,}", "loss": last.get("loss"),
            "nll": last.get("nll_loss"), "ppl": last.get("ppl"),
            "wps": sum(wps) / len(wps) if wps else None}


def generate_log_row(text):
    """{bleu, gen_tps} of a fairseq-generate log."""
    bleu = fairseq_logs.bleu(text)
    return {"bleu": None if bleu is None else f"{bleu:.2f}",
            "gen_tps": fairseq_logs.generation_tokens_per_second(text)}


def _read(path):
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def summarize(out_dir, names):
    """Formatted table lines for the runs ``names`` under ``out_dir``: a run's logs are
    ``NAME/train.log`` and ``NAME/generate.log`` (translation) or ``NAME.log`` (language models);
    "?" where a log lacks a value."""
    first = max([11] + [len(name) for name in names])
    lines = [f"{COLUMNS[0]:<{first}}  " + "  ".join(f"{c:>11}" for c in COLUMNS[1:])]
    for name in names:
        run_dir = os.path.join(out_dir, name)
        if os.path.isdir(run_dir):
            row = train_log_row(_read(os.path.join(run_dir, "train.log")))
            row.update(generate_log_row(_read(os.path.join(run_dir, "generate.log"))))
        else:
            row = train_log_row(_read(os.path.join(out_dir, name + ".log")))
            row.update(bleu=None, gen_tps=None)
        cells = [row["params"], row["loss"], row["nll"], row["ppl"],
                 None if row["wps"] is None else f"{row['wps']:.0f}", row["bleu"],
                 None if row["gen_tps"] is None else f"{row['gen_tps']:.0f}"]
        lines.append(f"{name:<{first}}  " + "  ".join(f"{'?' if c is None else c:>11}" for c in cells))
    return lines
