"""The summary table of the shell comparisons (slim_fairseq_lab.run_summary, behind
examples/summarize_runs.py) on fairseq log lines."""
import os
import subprocess
import sys

from helpers import REPO
from slim_fairseq_lab import run_summary

TRAIN_LOG = """\
2026-11-22 01:00:00 | INFO | fairseq_cli.train | num. shared model params: 3,909,448 (num. trained: 3,909,448)
2026-11-22 01:01:00 | INFO | train_inner | epoch 001:     50 / 100 loss=11.2, nll_loss=11.1, ppl=2200, wps=90.5, ups=0.3
2026-11-22 01:02:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.9 | nll_loss 9.5 | ppl 724.1 | wps 500
2026-11-22 01:02:01 | INFO | train | epoch 001 | loss 10.5 | nll_loss 10.2 | ppl 1176 | wps 100 | ups 0.3
2026-11-22 01:03:00 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 9.34 | nll_loss 8.704 | ppl 417.14 | wps 510
2026-11-22 01:03:01 | INFO | train | epoch 002 | loss 9.9 | nll_loss 9.6 | ppl 776 | wps 120 | ups 0.3
"""
GENERATE_LOG = """\
2026-11-22 01:04:00 | INFO | fairseq_cli.generate | Translated 300 sentences (9,000 tokens) in 98.1s (3.06 sentences/s, 91.74 tokens/s)
Generate test with beam=5: BLEU = 1.23 20.1/3.4/0.9/0.2 (BP = 1.000 ratio = 1.0 hyp_len = 9000 ref_len = 9000)
"""
LM_LOG = """\
2026-11-22 01:00:00 | INFO | fairseq_cli.train | num. model params: 2,064,000 (num. trained: 2,064,000)
2026-11-22 01:18:49 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 7.644 | ppl 199.98 | wps 1193.3
2026-11-22 01:18:50 | INFO | train | epoch 001 | loss 7.9 | ppl 238.9 | wps 260.4 | ups 0.25
"""


def test_train_log_takes_last_validation_and_mean_epoch_speed():
    row = run_summary.train_log_row(TRAIN_LOG)
    assert row == {"params": "3,909,448", "loss": "9.34", "nll": "8.704", "ppl": "417.14",
                   "wps": 110.0}


def test_inner_speed_is_used_without_epoch_lines():
    inner_only = "\n".join(line for line in TRAIN_LOG.splitlines() if "| train |" not in line)
    assert run_summary.train_log_row(inner_only)["wps"] == 90.5


def test_generate_log_bleu_and_speed():
    assert run_summary.generate_log_row(GENERATE_LOG) == {"bleu": "1.23", "gen_tps": 91.74}


def test_summary_reads_both_layouts(tmp_path):
    os.makedirs(tmp_path / "anthe")
    (tmp_path / "anthe" / "train.log").write_text(TRAIN_LOG)
    (tmp_path / "anthe" / "generate.log").write_text(GENERATE_LOG)
    (tmp_path / "tied.log").write_text(LM_LOG)
    header, anthe, tied, missing = run_summary.summarize(str(tmp_path), ["anthe", "tied", "missing"])
    assert header.split()[:2] == ["model", "params"]
    assert anthe.split() == ["anthe", "3,909,448", "9.34", "8.704", "417.14", "110", "1.23", "92"]
    assert tied.split() == ["tied", "2,064,000", "7.644", "?", "199.98", "260", "?", "?"]
    assert missing.split() == ["missing"] + ["?"] * 7


def test_command_line_prints_the_table(tmp_path):
    (tmp_path / "tied.log").write_text(LM_LOG)
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", "summarize_runs.py"), str(tmp_path), "tied"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines()[1].split() == ["tied", "2,064,000", "7.644", "?", "199.98", "260", "?", "?"]
