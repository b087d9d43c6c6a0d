"""`make demo` and what the docs say of it: docs/GUIDE.md gives the table of the run recorded in
docs/demo.json, in the demo's own output format; the demo's models still compute what they
computed in that run; the README, the guide and the demo's help give the time it took.

When the code or the demo's settings change the numbers, these tests fail until
`bash scripts/demo.sh --update-docs` (an idle 2-core machine, a fresh DEMO_DIR) writes the new
table and time.
"""
import json
import math
import os
import subprocess
import sys

import pytest

from helpers import REPO, load_script
from slim_fairseq_lab import demo

RERUN = ("run `bash scripts/demo.sh --update-docs` on an idle 2-core machine with a fresh "
         "DEMO_DIR and commit docs/GUIDE.md and docs/demo.json")


@pytest.fixture(scope="module")
def record():
    with open(demo.RECORD, encoding="utf-8") as f:
        return json.load(f)


def test_guide_gives_the_table_of_the_recorded_run(record, tmp_path):
    """quality.py's report of the recorded runs, in the demo's format, is the guide's table."""
    with open(tmp_path / "results.json", "w", encoding="utf-8") as f:
        json.dump(record["results"], f)
    load_script("quality").main(["--report-only", "--out", str(tmp_path)])
    table = demo.comparison_table((tmp_path / "table.md").read_text(encoding="utf-8"))
    assert demo.guide_table() == table


def test_the_demo_runs_the_recorded_command(record):
    assert demo.lm_argv("python", "OUT", "LM_BIN", demo.DEFAULTS)[2:] == record["lm_argv"], RERUN


def test_the_demo_models_compute_what_they_computed_for_the_table(record):
    """Each model of the demo, built as the demo builds it, gives the losses the recorded run's
    code gave (relative 1e-4: a change of the code's numbers, not of the machine's rounding)."""
    now = demo.fingerprint()
    assert sorted(now) == sorted(record["fingerprint"]), RERUN
    for label, then in record["fingerprint"].items():
        assert now[label]["params"] == then["params"], (label, RERUN)
        for a, b in zip(now[label]["losses"], then["losses"]):
            assert math.isclose(a, b, rel_tol=1e-4), (label, now[label]["losses"], then["losses"], RERUN)


def test_the_docs_give_the_recorded_time(record):
    """The README, the guide, scripts/demo.sh and the demo's --help state the measured minutes
    (rounded up) and what the first run's data preparation adds."""
    said = demo.time_said(record)
    places = {"README.md": os.path.join(REPO, "README.md"), "docs/GUIDE.md": demo.GUIDE,
              "scripts/demo.sh": os.path.join(REPO, "scripts", "demo.sh")}
    for name, path in places.items():
        text = " ".join(open(path, encoding="utf-8").read().split())
        assert said in text.replace("# ", ""), (name, said)
    assert said in " ".join(demo.__doc__.split())


def test_demo_help_and_refusals_start_nothing(tmp_path):
    """--help prints the demo's docstring; an unknown option or a bad setting is one line with
    exit status 2; neither creates the demo's folder."""
    env = dict(os.environ, DEMO_DIR=str(tmp_path / "demo"))
    run = [sys.executable, "-m", "slim_fairseq_lab.demo"]
    proc = subprocess.run(run + ["--help"], env=env, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout == demo.__doc__.rstrip("\n") + "\n"
    for argv, extra, line in [
            (["--nope"], {}, "--nope: not an option of this recipe; allowed: the options of --help"),
            ([], {"DEMO_JOBS": "0"}, "DEMO_JOBS=0: not a whole number >= 1; allowed: a whole number "
                                     ">= 1 (default 2)"),
            (["--update-docs"], {"DEMO_SEEDS": "1"}, "--update-docs: the docs give the default "
             "settings' table; allowed: --update-docs without DEMO_LM_UPDATES, DEMO_MT_UPDATES, "
             "DEMO_SEEDS or DEMO_JOBS")]:
        proc = subprocess.run(run + argv, env=dict(env, **extra), capture_output=True, text=True, cwd=REPO)
        assert (proc.returncode, proc.stderr) == (2, f"demo.sh: error: {line}\n")
    assert not (tmp_path / "demo").exists()


def test_the_demo_table_is_aligned_markdown_with_the_baseline_line():
    table_md = "\n".join([
        "**WikiText-2 (bundled): every run**", "",
        "| model | d | lr | params | seeds | valid PPL | x |", "|---|---|---|---|---|---|---|",
        "| a | 128 | 3e-3 | 10 | 2 | 5.00 ± 0.10 | 1 |",
        "| transformer_lm (baseline) | 128 | 3e-3 | 1,000 | 2 | 7.50 ± 0.20 | 1 |", "",
        "**WikiText-2 (bundled): each model against `transformer_lm` (best learning rates)**", "",
        "A difference is claimed only when the seed ranges of valid NLL do not overlap.", "",
        "| model | params | train tok/s × baseline |", "|---|---|---|", "| a | 10 | 0.93 |", "",
        "**WikiText-2 (bundled): each model against the transformer_lm frontier**", "",
        "| model | widths |", "|---|---|", "| a | 128 |", ""])
    table = demo.comparison_table(table_md)
    assert table == ["| model | params | train tok/s × baseline |", "| a     | 10     | 0.93                   |",
                     "baseline: transformer_lm, 1,000 parameters, valid PPL 7.50 ± 0.20"]
    assert demo.without_speed(table) == [["model", "params"], ["a", "10"],
                                         ["baseline: transformer_lm, 1,000 parameters, valid PPL 7.50 ± 0.20"]]
    text = f"before\n{demo.GUIDE_ANCHOR}\n```\nold\n```\nafter\n"
    assert demo.guide_table(text) == ["old"]
