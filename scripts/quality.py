#!/usr/bin/env python3
"""Quality per parameter on the bundled corpora: equal-budget training runs of model specs
against fairseq's transformer, over learning rates, widths and seeds, and each model's distance
to the baseline's frontier.

Every run is one fairseq-train of a model spec at one width (--dim), one learning rate (--lr)
and one seed, under the same budget (--max-update updates of --max-tokens tokens, optionally
capped by --time-budget), then evaluated at its best checkpoint (lowest valid loss, as fairseq
keeps checkpoint_best.pt): valid NLL and perplexity (base 2, padding excluded), and for en-de
(--corpus ende) test BLEU (fairseq-generate beam 5, detokenized sacreBLEU). WikiText-2
(--corpus wikitext) gives valid perplexity.

For every model and width the learning rate with the lowest valid loss is kept (compared on the
seeds every rate has); each model's best points form its frontier, and the report gives each
point's valid-loss difference to the baseline's frontier (--frontier-baseline, default fairseq's
transformer / transformer_lm; the lower convex hull of its best points over log parameters) at
equal parameters, and the baseline's parameters at equal loss, with the seed spread.
--lr-sweep-dim, --lr-extend, --lr-width-check and --confirm-seeds plan the rates and seeds of
the other widths from the finished runs.

Runs are resumable: each finished run leaves runs/<tag>/run.json, reused by a later call with
the same settings; a run stopped half-way goes on from its last validation's checkpoint.
--jobs N trains N runs at a time. --dry-run lists what the command would train next;
--report-only rewrites the report from results.json.

Output (--out, default results/<name>): results.json (every run, every validation), table.md
(rewritten after every finished run), valid_loss_<corpus>.png and params_vs_quality.png.

Example:

    python scripts/quality.py --name q256 --corpus both --dim 256 --layers 3 --heads 4 \\
        --seeds 1,2 --max-update 300 --model anthe_base --model sandwich_base \\
        --lm-model stlm_tied --lm-model skipless_lm

--model specs (en-de) and --lm-model specs (WikiText-2) are '[LABEL=]ARCH [fairseq overrides...]';
{d}, {2d}, {d/2} in the overrides become numbers for each width. The library behind this
command is slim_fairseq_lab.study (planner, scheduler, report, plot).
"""
import json
import os
import sys

from slim_fairseq_lab import command, specs
from slim_fairseq_lab.paths import output_dir
from slim_fairseq_lab.study import options, planner, report
from slim_fairseq_lab.study.runs import corpus_data, log
from slim_fairseq_lab.study.scheduler import Scheduler
from slim_fairseq_lab.study.summary import with_checkpoint_metrics


def main(argv=None):
    """Run (or --dry-run, or --report-only) the study of the command line ``argv``; returns the
    report's summary rows (--dry-run: the runs still to train)."""
    command_line = list(sys.argv) if argv is None else ["scripts/quality.py", *argv]
    parser = options.get_parser(__doc__)
    args = parser.parse_args(argv)
    options.check_args(parser, args)
    out_dir = output_dir(args.name, args.out)
    os.makedirs(out_dir, exist_ok=True)
    if args.report_only:
        return report_only(parser, args, out_dir)

    specs.load_plugin()
    plan = planner.study_plan(args)
    if not plan:
        raise SystemExit("quality.py: nothing to run (give --model / --lm-model, or drop --no-baseline)")
    options.check_frontier_labels(parser, args, [entry[1] for entry in plan])
    planner.check_specs(plan, args)
    if args.dry_run:  # nothing trains: no data is read
        data = {corpus: "DATA" for corpus in ("ende", "wikitext")}
    else:
        data = {corpus: corpus_data(corpus, args) for corpus in dict.fromkeys(entry[0] for entry in plan)}
    scheduler = Scheduler(plan, args, data, out_dir)
    if args.dry_run:
        pending = scheduler.dry_run()
        print(report.dry_run_report(scheduler.jobs, pending, plan, scheduler.runs, args, data))
        return pending

    baseline_label = planner.baseline_labels(args)

    def save(runs, plots):  # a stopped study keeps every finished run and its table
        report.save_results(out_dir, command_line, runs)
        report.write_report(runs, args, baseline_label, out_dir, plots=plots)
    scheduler.train(on_progress=save)
    rows, table = report.write_report(scheduler.runs, args, baseline_label, out_dir)
    print(table)
    log(f"wrote {out_dir}/results.json, table.md, valid_loss_*.png, params_vs_quality.png")
    return rows


def report_only(parser, args, out_dir):
    """table.md and the plots again from <out>/results.json, with the settings it was run with."""
    with open(os.path.join(out_dir, "results.json")) as f:
        saved = json.load(f)
    runs = [with_checkpoint_metrics(run) for run in saved["runs"]]
    options.check_frontier_labels(parser, args, [r["label"] for r in runs])
    options.use_recorded_settings(parser, args, saved["argv"])
    rows, table = report.write_report(runs, args, planner.baseline_labels(args), out_dir)
    print(table)
    log(f"wrote {out_dir}/table.md, valid_loss_*.png, params_vs_quality.png")
    return rows


if __name__ == "__main__":
    sys.exit(command.run(main))
