"""The lab package's shared pieces and the command lines of scripts/: every script's --help, the
launcher's command lines, the fairseq log parser, and the committed studies' completeness."""
import glob
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO, load_script
from slim_fairseq_lab import fairseq_logs, launcher
from slim_fairseq_lab.study import options, planner
from slim_fairseq_lab.study.scheduler import Scheduler

SCRIPTS = (sorted(glob.glob(os.path.join(REPO, "scripts", "*.py")) + glob.glob(os.path.join(REPO, "scripts", "*.sh")))
           + [os.path.join(REPO, "examples", "summarize_runs.py")])


def _description(help_text):
    """The description of an argparse --help: after the usage block, before the first group (a
    shell script's --help is its description)."""
    if not help_text.startswith("usage:"):
        return help_text.strip()
    body = help_text.split("\n\n", 1)[1]
    for heading in ("\npositional arguments:", "\noptions:", "positional arguments:", "options:"):
        body = body.split(heading, 1)[0]
    return body.strip()


def test_every_script_answers_help_with_a_complete_description():
    """``--help`` of every script under scripts/ (and examples/summarize_runs.py) exits 0 and
    describes the tool in whole sentences: its first paragraph ends a sentence."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHON=sys.executable)
    procs = {path: subprocess.Popen(["bash" if path.endswith(".sh") else sys.executable, path, "--help"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for path in SCRIPTS}
    failures = []
    for path, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        name = os.path.relpath(path, REPO)
        if proc.returncode != 0:
            failures.append(f"{name}: exit {proc.returncode}: {err[-300:]}")
            continue
        description = _description(out)
        first_paragraph = " ".join(description.split("\n\n")[0].split())
        if len(description.split()) < 15 or not first_paragraph.endswith("."):
            failures.append(f"{name}: description {first_paragraph[:200]!r}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------- launcher

def test_launcher_builds_the_comparisons_command_lines():
    """The en-de comparison: the same seed, Adam schedule, criterion and batches for both models,
    the model's own options (its --lr among them) after them, the save dir last; generation of
    the test set with the plugin as --user-dir. The WikiText-2 comparison: everything before a
    run's --arch is the same for every run."""
    train = launcher.ende_comparison_train_argv("DATA", 7, 20, 512, 40, 5, ["--arch", "transformer", "--lr", "1e-3"],
                                                "OUT/a")
    assert train == ["DATA", "--task", "translation", "--source-lang", "en", "--target-lang", "de", "--cpu",
                     "--seed", "7", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr-scheduler",
                     "inverse_sqrt", "--warmup-updates", "20", "--criterion", "label_smoothed_cross_entropy",
                     "--label-smoothing", "0.1", "--max-tokens", "512", "--max-update", "40",
                     "--no-epoch-checkpoints", "--save-interval-updates", "40", "--keep-interval-updates", "1",
                     "--log-format", "simple", "--log-interval", "5", "--num-workers", "0",
                     "--skip-invalid-size-inputs-valid-test", "--arch", "transformer", "--lr", "1e-3",
                     "--save-dir", "OUT/a"]
    generate = launcher.ende_comparison_generate_argv("DATA", "OUT/a/checkpoint_last.pt", "PLUGIN", ["--max-len-b", "10"])
    assert generate[:5] == ["DATA", "--user-dir", "PLUGIN", "--path", "OUT/a/checkpoint_last.pt"]
    assert generate[-5:] == ["--batch-size", "64", "--remove-bpe", "--max-len-b", "10"]
    assert {"--gen-subset", "test", "--beam", "5", "--required-batch-size-multiple", "1"} <= set(generate)
    lm = [launcher.lm_comparison_train_argv("DATA", "PLUGIN", 64, 8, 20, 3, "2e-3", ["--arch", arch, "--decoder-layers", "2"])
          for arch in ("stlm_tied", "transformer_lm")]
    assert lm[0][:lm[0].index("--arch")] == lm[1][:lm[1].index("--arch")]
    text = " ".join(lm[0])
    assert "--max-update 20 --seed 3" in text and "--warmup-updates 2 " in text and "--lr 2e-3" in text


# ---------------------------------------------------------------------------------------- log parser

def test_log_parser_reads_the_simple_and_json_formats_alike():
    simple = ("2026-01-01 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.5 | nll_loss 9.1 | "
              "ppl 548.75 | wps 500 | num_updates 40\n"
              "2026-01-01 | INFO | train_inner | epoch 001:     50 / 100 loss=11.2, nll_loss=11.1, wps=90.5, ups=0.5\n")
    json_log = ('2026-01-01 | INFO | valid | {"epoch": 1, "valid_loss": "9.5", "valid_nll_loss": "9.1", '
                '"valid_ppl": "548.75", "valid_wps": "500", "valid_num_updates": "40"}\n'
                '2026-01-01 | INFO | train_inner | {"epoch": 1, "loss": "11.2", "nll_loss": "11.1", '
                '"wps": "90.5", "ups": "0.5"}\n')
    for text in (simple, json_log):
        assert fairseq_logs.valid_points("noise\n" + text) == [(40, 9.5, 9.1, 548.75)]
        assert fairseq_logs.train_tokens_per_second(text) == pytest.approx(90.5)
        assert fairseq_logs.last_valid_ppl(text) == 548.75
    assert fairseq_logs.parameter_count("| num. shared model params: 1,234,567 (num. trained: 1,234,567)") == 1234567
    assert fairseq_logs.parameter_count("| num. model params: 2,064,000 (num. trained: 2,064,000)") == 2064000
    assert fairseq_logs.bleu("Generate test with beam=5: BLEU = 12.34 45.6/20.1/9.8/4.5 (BP = 1.000)") == 12.34
    assert fairseq_logs.bleu("Generate test with beam=5: BLEU4 = 1.00, 20.1/3.4/0.9/0.2") == 1.0
    assert fairseq_logs.bleu("no score") is None


# ---------------------------------------------------------------------------------------- studies

@pytest.mark.parametrize("study", sorted(os.path.relpath(os.path.dirname(p), REPO) for p in
                                         glob.glob(os.path.join(REPO, "docs", "study", "**", "results.json"),
                                                   recursive=True)))
def test_committed_study_has_every_planned_run(study):
    """The command a committed study was run with (results.json's argv) plans runs that are all
    recorded under its runs/: the study's --dry-run trains nothing."""
    with open(os.path.join(REPO, study, "results.json")) as f:
        recorded = json.load(f)["argv"][1:]
    parser = options.get_parser()
    args = parser.parse_args(recorded + ["--out", os.path.join(REPO, study), "--dry-run"])
    options.check_args(parser, args)
    plan = planner.study_plan(args)
    scheduler = Scheduler(plan, args, {"ende": "DATA", "wikitext": "DATA"}, args.out)
    assert scheduler.dry_run() == [] and len(scheduler.runs) == len(scheduler.jobs) > 0


# ---------------------------------------------------------------------------------------- scripts

def test_checkpoint_info_prints_the_positions_a_checkpoint_records(tmp_path, capsys):
    checkpoint_info = load_script("checkpoint_info")
    path = tmp_path / "lm.pt"
    torch.save({"cfg": {"model": {"max_target_positions": None}, "task": {"tokens_per_sample": 96}}}, path)
    assert checkpoint_info.main([str(path), "positions"]) == 0
    assert capsys.readouterr().out.strip() == "96"
    torch.save({"cfg": {"model": {"max_target_positions": 512}, "task": {"tokens_per_sample": 96}}}, path)
    assert checkpoint_info.main([str(path), "positions", "block"]) == 0
    assert capsys.readouterr().out.split() == ["512", "96"]
    torch.save({"cfg": {"model": {"max_target_positions": 512}, "task": {}}}, path)
    assert checkpoint_info.main([str(path), "block"]) == 2
    assert "records no tokens_per_sample" in capsys.readouterr().err
    assert checkpoint_info.main([str(tmp_path / "missing.pt"), "positions"]) == 2
    assert "not found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        checkpoint_info.main([str(path), "vocab"])
    assert stop.value.code == 2 and "invalid choice: 'vocab'" in capsys.readouterr().err


def test_compress_demo_fine_tunes_at_the_fine_tune_rate():
    """The fine-tunes (and the original's control) train at --finetune-lr for --finetune-updates,
    the from-scratch runs at --lr for both budgets together."""
    compress_demo = load_script("compress_demo")
    args = compress_demo.get_parser().parse_args(["--lr", "1e-3", "--finetune-lr", "5e-4", "--max-update", "600",
                                                  "--finetune-updates", "150"])
    original, finetune, scratch = compress_demo.training_settings(args)

    def option(settings, flag):
        argv = launcher.study_train_argv("ende", "DATA", "transformer", [], settings, 1, "OUT")
        return argv[argv.index(flag) + 1]
    assert [option(s, "--lr") for s in (original, finetune, scratch)] == ["0.001", "0.0005", "0.001"]
    assert [option(s, "--max-update") for s in (original, finetune, scratch)] == ["600", "150", "750"]
