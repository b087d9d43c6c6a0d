#!/usr/bin/env python3
"""Summary table of the evidence scripts' fairseq runs (one row per run), read from the logs.

    python examples/summarize_runs.py OUT_DIR NAME [NAME ...]

Each run's logs are ``OUT_DIR/NAME/train.log`` and ``OUT_DIR/NAME/generate.log`` (translation),
or ``OUT_DIR/NAME.log`` (language models, no generation). Columns: parameters, last validation
loss / nll / perplexity, mean training tokens/s (epoch lines, else the inner logging lines),
test BLEU and generation tokens/s; "?" where a log does not have the value.
"""
import argparse
import os
import re


def _field(line, key):
    """Value of `` | key VALUE`` in a simple-format log line, or None (LMs log no nll_loss)."""
    match = re.search(rf"\| {key} ([\d.]+)", line)
    return match.group(1) if match else None


def parse_train_log(text):
    """{params, loss, nll, ppl, wps} from a fairseq-train log in the simple format."""
    params = (re.search(r"num\. shared model params: ([\d,]+)", text)
              or re.search(r"num\. model params: ([\d,]+)", text))
    valid = [tuple(_field(line, key) for key in ("loss", "nll_loss", "ppl"))
             for line in text.splitlines() if "| valid |" in line and "| loss " in line]
    wps = [float(x) for x in re.findall(r"\| train \|.*?\| wps ([\d.]+)", text)]
    wps = wps or [float(x) for x in re.findall(r"\| train_inner \|.*?wps=([\d.]+)", text)]
    loss, nll, ppl = valid[-1] if valid else (None, None, None)
    return {"params": params.group(1) if params else None, "loss": loss, "nll": nll, "ppl": ppl,
            "wps": sum(wps) / len(wps) if wps else None}


def parse_generate_log(text):
    """{bleu, gen_tps} from a fairseq-generate log (BLEU4 or sacreBLEU score line)."""
    bleu = re.search(r"BLEU4? = ([\d.]+)", text)
    speed = re.search(r"tokens\) in [\d.]+s \([\d.]+ sentences/s, ([\d.]+) tokens/s\)", text)
    return {"bleu": bleu.group(1) if bleu else None,
            "gen_tps": float(speed.group(1)) if speed else None}


def read(path):
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def summarize(out_dir, names):
    """Formatted table lines for the runs ``names`` under ``out_dir``."""
    columns = ["model", "params", "valid loss", "valid nll", "valid ppl", "train tok/s",
               "test BLEU", "gen tok/s"]
    first = max([11] + [len(name) for name in names])
    lines = [f"{columns[0]:<{first}}  " + "  ".join(f"{c:>11}" for c in columns[1:])]
    for name in names:
        run_dir = os.path.join(out_dir, name)
        if os.path.isdir(run_dir):
            row = parse_train_log(read(os.path.join(run_dir, "train.log")))
            row.update(parse_generate_log(read(os.path.join(run_dir, "generate.log"))))
        else:
            row = parse_train_log(read(os.path.join(out_dir, name + ".log")))
            row.update(bleu=None, gen_tps=None)
        cells = [name, row["params"], row["loss"], row["nll"], row["ppl"],
                 None if row["wps"] is None else f"{row['wps']:.0f}", row["bleu"],
                 None if row["gen_tps"] is None else f"{row['gen_tps']:.0f}"]
        lines.append(f"{name:<{first}}  " + "  ".join(f"{'?' if c is None else c:>11}" for c in cells[1:]))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    print("\n".join(summarize(args.out_dir, args.names)))


if __name__ == "__main__":
    main()
