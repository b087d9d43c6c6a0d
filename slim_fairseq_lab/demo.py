"""`make demo`: what the plugin is for, in about 7 minutes on 2 idle cores, the first
run's data preparation (1 minute) included (make setup first on a fresh clone).

  1. binarize the bundled corpora: WikiText-2 (word level, vocabulary capped at 5,000) and
     en-de (Moses + 8,000 joint BPE merges), with slim_fairseq_lab.data (first run only);
  2. language modelling on WikiText-2: fairseq's transformer_lm and slim models side by side,
     each trained for the same number of updates of the same batches, with two seeds each
     (scripts/quality.py, two runs at a time, one thread each). Printed: parameters, valid
     perplexity, training tokens/s and, per model, whether its difference from the baseline is
     larger than the spread between seeds. Plots: params_vs_quality.png, valid_loss_wikitext.png;
  3. the translation pipeline: train a small anthe_base on en-de, score the test set with
     fairseq-generate (--scoring sacrebleu on its Moses-detokenized output and references),
     then translate a few test sentences with fairseq-interactive (Moses + BPE applied and
     removed by fairseq itself).

Resumable: finished runs are reused by the next call (delete DEMO_DIR to start over). Each
stage logs what it starts; the training runs write their progress to DEMO_DIR/lm.log and
DEMO_DIR/mt.log. At the end the demo says whether its language-model table is the one in
docs/GUIDE.md ("What `make demo` shows"); with the default settings, --update-docs writes it
there, with the time the run took, into docs/demo.json, which tests/test_demo.py holds the
guide, the README and this help to.

usage: bash scripts/demo.sh [--help] [--update-docs]     (or: make demo)

Settings (environment variables):
  DEMO_DIR        build directory                                (default: build/demo)
  DEMO_LM_UPDATES updates per language model                     (default: 200)
  DEMO_MT_UPDATES updates of the translation model               (default: 200)
  DEMO_SEEDS      seeds of every language model                  (default: 1,2)
  DEMO_JOBS       training runs at a time                        (default: 2)
"""
import json
import os
import re
import subprocess
import sys
import time

from slim_fairseq_lab.paths import plugin_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUALITY = os.path.join(REPO, "scripts", "quality.py")
USER_DIR = os.path.join(REPO, "slim_fairseq")
GUIDE = os.path.join(REPO, "docs", "GUIDE.md")
RECORD = os.path.join(REPO, "docs", "demo.json")
#: where docs/GUIDE.md holds the table: the fenced block after this line
GUIDE_ANCHOR = "<!-- the table of `make demo`, written by `bash scripts/demo.sh --update-docs` -->"

DEFAULTS = {"DEMO_LM_UPDATES": "200", "DEMO_MT_UPDATES": "200", "DEMO_SEEDS": "1,2", "DEMO_JOBS": "2"}

# Same width (128), depth (4), batches, updates and learning rate for all; dropout off (well under
# one epoch: nothing to regularise). The baseline is fairseq's transformer_lm with tied
# input/output embeddings and pre-norm, its strongest setting at this size (post-norm learns much
# more slowly in the first few hundred updates); transformer_lm_d96 is the same at width 96, with
# fewer parameters than either slim model.
LM_MODELS = [
    "transformer_lm=transformer_lm --share-decoder-input-output-embed --decoder-normalize-before",
    "transformer_lm_d96=transformer_lm --share-decoder-input-output-embed --decoder-normalize-before "
    "--decoder-embed-dim 96 --decoder-input-dim 96 --decoder-output-dim 96 --decoder-ffn-embed-dim 384",
    "anthe_lm=anthe_lm_gpt2_small --tc-min-bond 8 --hsoftpos-min-token-dim 64",
    "sandwich_gated_glu=slim_lm --decoder-normalize-before --share-decoder-input-output-embed "
    "--sandwich --self-attn-gate qgv --ffn-glu",
]
LM_SETTINGS = ["--dim", "128", "--layers", "4", "--heads", "4", "--lr", "3e-3",
               "--validate-interval", "100", "--max-valid-steps", "30", "--max-tokens", "2048",
               "--tokens-per-sample", "128", "--dropout", "0"]
MT_MODEL = "anthe_base=anthe_base"
MT_SETTINGS = ["--dim", "128", "--layers", "3", "--heads", "4", "--lr", "3e-3",
               "--validate-interval", "50", "--max-tokens", "2048"]


def refuse(message):
    """A refusal: one line, exit status 2, before anything is written."""
    print(f"demo.sh: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def fail(message):
    """A step that failed: one line, exit status 1."""
    print(f"demo.sh: error: {message}", file=sys.stderr)
    raise SystemExit(1)


def log(start, message):
    print(f"[demo {time.monotonic() - start:4.0f}s] {message}", flush=True)


def settings_from(environ):
    """The demo's budget from the environment (DEMO_*), each checked: one line naming the
    variable and what it allows."""
    values = {name: environ.get(name, default) for name, default in DEFAULTS.items()}
    errors = plugin_module("option_errors")
    for name in ("DEMO_LM_UPDATES", "DEMO_MT_UPDATES", "DEMO_JOBS"):
        try:
            errors.check_kind(name, values[name], "count",
                              allowed=f"a whole number >= 1 (default {DEFAULTS[name]})")
        except errors.OptionError as error:
            refuse(str(error))
    if not re.fullmatch(r"[0-9]+(,[0-9]+)*", values["DEMO_SEEDS"]):
        refuse(f"DEMO_SEEDS={values['DEMO_SEEDS']}: not a list of seeds; "
                         f"allowed: whole numbers separated by commas (default {DEFAULTS['DEMO_SEEDS']})")
    return values


def lm_argv(python, out, lm_bin, settings):
    """scripts/quality.py's command line of the language-model stage."""
    models = [arg for spec in LM_MODELS for arg in ("--lm-model", spec)]
    return [python, QUALITY, "--out", out, "--corpus", "wikitext", "--lm-data", lm_bin,
            *LM_SETTINGS, "--seeds", settings["DEMO_SEEDS"], "--max-update",
            settings["DEMO_LM_UPDATES"], "--no-baseline", "--frontier-baseline", "transformer_lm",
            "--jobs", settings["DEMO_JOBS"], "--threads", "1", *models]


def mt_argv(python, out, mt_bin, codes, settings):
    """scripts/quality.py's command line of the translation stage."""
    return [python, QUALITY, "--out", out, "--corpus", "ende", "--ende-data", mt_bin,
            "--bpe-codes", codes, *MT_SETTINGS, "--seeds", "1", "--max-update",
            settings["DEMO_MT_UPDATES"], "--no-baseline", "--keep-checkpoints", "--threads",
            settings["DEMO_JOBS"], "--model", MT_MODEL]


def section(table_md, title):
    """The lines of the **bold** section of quality.py's table.md whose heading holds ``title``."""
    lines, keep = [], False
    for line in table_md.splitlines():
        if line.startswith("**"):
            keep = title in line
        if keep:
            lines.append(line)
    return lines


def aligned(rows):
    """Markdown table rows (``| a | b |``, the ``|---|`` line dropped) with padded columns."""
    cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in rows
             if row.startswith("|") and not row.startswith("|---")]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]


def comparison_table(table_md, baseline="transformer_lm"):
    """The demo's table, as ``make demo`` prints it: each model against the baseline, then the
    baseline's own parameters and valid perplexity (from the table of every run)."""
    rows = [[c.strip() for c in row.strip().strip("|").split("|")]
            for row in section(table_md, "every run") if row.startswith("| ")]
    head = rows[0]
    base = next(row for row in rows[1:] if row[0] == f"{baseline} (baseline)" or row[0] == baseline)
    return aligned(section(table_md, f"each model against `{baseline}`")) + [
        f"baseline: {baseline}, {base[head.index('params')]} parameters, valid PPL "
        f"{base[head.index('valid PPL')]}"]


def without_speed(table):
    """The table without its tokens/s column, which depends on the machine."""
    head = [c.strip() for c in table[0].strip("|").split("|")]
    drop = [i for i, name in enumerate(head) if "tok/s" in name]
    rows = [[c.strip() for c in row.strip("|").split("|")] if row.startswith("|") else [row]
            for row in table]
    return [[c for i, c in enumerate(row) if i not in drop] for row in rows]


def guide_table(text=None):
    """The table that docs/GUIDE.md gives (the fenced block after GUIDE_ANCHOR)."""
    text = open(GUIDE, encoding="utf-8").read() if text is None else text
    after = text.split(GUIDE_ANCHOR, 1)[1]
    block = after.split("```\n", 2)[1]
    return block.rstrip("\n").splitlines()


def write_guide_table(table):
    text = open(GUIDE, encoding="utf-8").read()
    head, after = text.split(GUIDE_ANCHOR, 1)
    _, old, rest = after.split("```\n", 2)
    with open(GUIDE, "w", encoding="utf-8") as f:
        f.write(head + GUIDE_ANCHOR + "\n```\n" + "\n".join(table) + "\n```\n" + rest)


def minutes(seconds):
    """How the docs give the demo's time: whole minutes, rounded up."""
    return -(-int(seconds) // 60)


def time_said(record):
    """The demo's time as the README, the guide and its help give it, from docs/demo.json."""
    data = minutes(record["stage_seconds"]["data"])
    return (f"about {minutes(record['seconds'])} minutes on 2 idle cores, the first run's data "
            f"preparation ({data} minute{'s' if data > 1 else ''}) included")


def run(settings, demo_dir, python, update_docs):
    start = time.monotonic()
    bin_dir = os.path.dirname(python)
    env = dict(os.environ, PYTHONWARNINGS=os.environ.get("PYTHONWARNINGS", "ignore"))
    os.makedirs(demo_dir, exist_ok=True)
    times = {}

    log(start, "stage 1: binarize the bundled WikiText-2 (5,000 words) and en-de (Moses + 8,000 "
               "joint BPE merges)")
    from slim_fairseq_lab.data import binarize_ende, binarize_wikitext, ende_paths
    data = os.path.join(demo_dir, "data")
    lm_bin = binarize_wikitext(data, nwords=5000)
    mt_bin = binarize_ende(data, eval_subset=300)
    codes = ende_paths(data, eval_subset=300)["codes"]
    times["data"] = time.monotonic() - start

    log(start, f"stage 2: WikiText-2 language models, {settings['DEMO_LM_UPDATES']} updates each, "
               f"seeds {settings['DEMO_SEEDS']}, {settings['DEMO_JOBS']} at a time")
    lm_out = os.path.join(demo_dir, "lm")
    _quality(lm_argv(python, lm_out, lm_bin, settings), os.path.join(demo_dir, "lm.log"), env)
    times["lm"] = time.monotonic() - start - times["data"]

    log(start, f"stage 3: en-de translation pipeline: anthe_base (d 128, 3+3 layers), "
               f"{settings['DEMO_MT_UPDATES']} updates")
    mt_out = os.path.join(demo_dir, "mt")
    _quality(mt_argv(python, mt_out, mt_bin, codes, settings), os.path.join(demo_dir, "mt.log"), env)
    samples = _translate_samples(bin_dir, mt_out, mt_bin, codes, demo_dir, env)
    times["mt"] = time.monotonic() - start - times["data"] - times["lm"]

    table_md = open(os.path.join(lm_out, "table.md"), encoding="utf-8").read()
    table = comparison_table(table_md)
    print()
    print(f"== WikiText-2 language models (valid: first 30 batches of 2,048 tokens; "
          f"{settings['DEMO_LM_UPDATES']} updates each) ==")
    print("\n".join(section(table_md, "every run")))
    print("\n".join(section(table_md, "frontier")))
    print("\n".join(table))
    print(f"""
What this shows: at width 128, depth 4 and the same {settings['DEMO_LM_UPDATES']} updates of the same
batches, how far each model's valid perplexity is from fairseq's transformer_lm, with how many
parameters, and whether the gap is larger than the spread between seeds; transformer_lm_d96 shows
what a plain transformer with fewer parameters than the slim models does. Both slim models use a
GLU feed-forward and gated attention; this run does not separate which technique the gain comes
from. What it does not show: quality after convergence, at paper sizes, or on a GPU; tokens/s
were measured with {settings['DEMO_JOBS']} runs sharing the machine, so read them as rough ratios.
Plots: {lm_out}/params_vs_quality.png, {lm_out}/valid_loss_wikitext.png
""")
    print(f"== en-de translation pipeline (anthe_base, d 128, {settings['DEMO_MT_UPDATES']} "
          "updates: far from trained) ==")
    print("\n".join(section(open(os.path.join(mt_out, "table.md"), encoding="utf-8").read(), "every run")))
    print("A few test sentences (fairseq-interactive, beam 5):")
    for source, hypothesis, reference in samples:
        print(f"  source    {source}\n  anthe     {hypothesis}\n  reference {reference}\n")
    seconds = time.monotonic() - start
    log(start, f"finished in {seconds:.0f} s; outputs under {demo_dir}")
    _compare_with_guide(table, settings, seconds, times, lm_out, update_docs)


def _quality(argv, log_path, env):
    with open(log_path, "w", encoding="utf-8") as f:
        proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    with open(log_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if proc.returncode != 0:
        sys.stderr.write("\n".join(lines[-30:]) + "\n")
        fail(f"{argv[3]}: scripts/quality.py failed (exit "
                         f"{proc.returncode}); allowed: see {log_path}")
    for line in lines:
        if line.startswith("[quality] ["):
            print("    " + line)


def _translate_samples(bin_dir, mt_out, mt_bin, codes, demo_dir, env):
    """Three test sentences through fairseq-interactive: (source, hypothesis, reference)."""
    def head(path):
        with open(path, encoding="utf-8") as f:
            return [next(f).rstrip("\n") for _ in range(3)]
    sources, references = head(os.path.join(REPO, "data", "ende", "test.en")), \
        head(os.path.join(REPO, "data", "ende", "test.de"))
    checkpoint = os.path.join(mt_out, "runs", "ende_anthe_base_s1", "checkpoint_best.pt")
    proc = subprocess.run(
        [os.path.join(bin_dir, "fairseq-interactive"), mt_bin, "--user-dir", USER_DIR, "--path",
         checkpoint, "--cpu", "--source-lang", "en", "--target-lang", "de", "--tokenizer", "moses",
         "--bpe", "subword_nmt", "--bpe-codes", codes, "--beam", "5", "--max-len-a", "1.2",
         "--max-len-b", "10"], input="\n".join(sources) + "\n", capture_output=True, text=True,
        env=env)
    if proc.returncode != 0:
        err = os.path.join(demo_dir, "interactive.err")
        with open(err, "w", encoding="utf-8") as f:
            f.write(proc.stderr)
        fail(f"fairseq-interactive: failed (exit {proc.returncode}); "
                         f"allowed: see {err}")
    hypotheses = [line.split("\t")[2] for line in proc.stdout.splitlines() if line.startswith("D-")]
    return list(zip(sources, hypotheses, references))


def _compare_with_guide(table, settings, seconds, times, lm_out, update_docs):
    """Say whether the table is docs/GUIDE.md's (tokens/s aside); with --update-docs, write it
    there and the run's record into docs/demo.json."""
    if settings != DEFAULTS:
        print("docs/GUIDE.md gives the table of the default settings; this run changed "
              f"{', '.join(k for k in DEFAULTS if settings[k] != DEFAULTS[k])}, so it is not compared.")
        return
    if update_docs:
        write_guide_table(table)
        with open(os.path.join(lm_out, "results.json"), encoding="utf-8") as f:
            results = json.load(f)
        # the recorded command line with the paths of this checkout made relative to it
        results["argv"] = [os.path.relpath(a, REPO) if a.startswith(REPO + os.sep) else a
                           for a in results["argv"]]
        record = {"seconds": round(seconds), "stage_seconds": {k: round(v) for k, v in times.items()},
                  "lm_argv": lm_argv("python", "OUT", "LM_BIN", DEFAULTS)[2:],
                  "results": results, "fingerprint": fingerprint()}
        with open(RECORD, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        print(f"wrote the table into docs/GUIDE.md and the run ({seconds:.0f} s, "
              f"{minutes(seconds)} minutes) into docs/demo.json")
        return
    if without_speed(table) == without_speed(guide_table()):
        print("docs/GUIDE.md gives this table (tokens/s aside).")
    else:
        print("docs/GUIDE.md gives another table: the code or the settings changed since it was made. "
              "On an idle 2-core machine, `bash scripts/demo.sh --update-docs` from a fresh DEMO_DIR "
              "writes this run's table and time into the docs.")


# ---------------------------------------------------------------------------- fingerprint


def fingerprint(steps=3):
    """What the demo's models compute, cheaply: each language model and the translation model,
    built as the demo builds them (its options, width and seed 1) on the tests' small binarized
    corpora, gives its loss on a fixed batch before and after ``steps - 1`` Adam steps at the
    demo's rate. A change of the code that changes these numbers changes the demo's table;
    tests/test_demo.py compares them with the ones docs/demo.json recorded with the table. It
    does not see fairseq's training loop, the order of the batches or quality.py's own options."""
    import torch
    from slim_fairseq_lab import contract, gpu_check, specs
    ende, wikitext = gpu_check.prepare_data()
    out = {}
    cases = [(spec, True) for spec in LM_MODELS] + [(MT_MODEL, False)]
    for spec, lm in cases:
        label, arch, overrides = specs.parse_model_spec(spec)
        shape = specs.shape_overrides(arch, lm, 128, 4 if lm else 3, 4, 512)
        task_argv = ([wikitext, "--task", "language_modeling", "--sample-break-mode", "none",
                      "--tokens-per-sample", "128"] if lm else
                     [ende, "--task", "translation", "--source-lang", "en", "--target-lang", "de"])
        args, task, model = contract.build(arch, [*shape, *overrides, "--dropout", "0"], task_argv)
        sample = contract.training_sample(task, lm)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
        model.train()
        losses = []
        for _ in range(steps):
            logits = model(**sample["net_input"])[0]
            loss = torch.nn.functional.cross_entropy(
                logits.view(-1, logits.size(-1)).float(), sample["target"].view(-1),
                ignore_index=task.target_dictionary.pad())
            losses.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        out[label] = {"params": sum(p.numel() for p in model.parameters()), "losses": losses}
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.rstrip("\n"))
        return
    unknown = [a for a in argv if a != "--update-docs"]
    if unknown:
        refuse(f"{unknown[0].split('=')[0]}: not an option of this recipe; "
                         "allowed: the options of --help")
    update_docs = "--update-docs" in argv
    settings = settings_from(os.environ)
    if update_docs and settings != DEFAULTS:
        refuse("--update-docs: the docs give the default settings' table; "
                         "allowed: --update-docs without DEMO_LM_UPDATES, DEMO_MT_UPDATES, DEMO_SEEDS "
                         "or DEMO_JOBS")
    demo_dir = os.environ.get("DEMO_DIR", os.path.join(REPO, "build", "demo"))
    python = os.environ.get("PYTHON") or sys.executable
    run(settings, os.path.abspath(demo_dir), python, update_docs)


if __name__ == "__main__":
    main()
