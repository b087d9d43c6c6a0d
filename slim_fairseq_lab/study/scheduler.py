"""Training the study's runs, ``--jobs`` at a time, each model through its phases on its own.

A model's next phase is planned as soon as its own runs of the previous one have finished, so no
core waits at a phase barrier for the other models' last runs. A free core takes the first ready
run in this order: runs that resume an interrupted attempt, then earlier phases, then the order
of :func:`~slim_fairseq_lab.study.planner.model_phases` (so a partial study has every model's
sweep first, and with ``--jobs 1`` the order is phase by phase). Runs that already finished
(their run.json) are taken at once, without a core.
"""
import concurrent.futures
import heapq

from slim_fairseq_lab.study import planner
from slim_fairseq_lab.study import runs as study_runs
from slim_fairseq_lab.study.runs import fmt_lr, log
from slim_fairseq_lab.study.summary import with_checkpoint_metrics


class Scheduler:
    """The runs of ``plan`` (the study's models, :func:`planner.study_plan`) with the settings
    ``args``; ``data`` maps each corpus to its data-bin. Creating it plans every model's first
    phase and takes the runs that already finished."""

    def __init__(self, plan, args, data, out_dir):
        self.plan, self.args, self.data = plan, args, data
        self.runs = []  # the finished runs, in the order of results.json (phase, seed, width, model, rate)
        self.jobs = []  # every planned run, in the order it was taken
        self.rank = {}  # save_dir -> (phase, seed, width, model, rate)
        self.finished = {}  # save_dir -> run
        self.queue = []  # heap of (not resuming, *rank, job)
        self.phases = {i: planner.model_phases(entry, args, out_dir, lambda: self.runs)
                       for i, entry in enumerate(plan)}
        self.phase_of = {i: -1 for i in self.phases}
        self.unfinished = {i: set() for i in self.phases}  # save_dirs of each model's current phase
        for i in self.phases:
            self._plan_next_phase(i)

    def _plan_next_phase(self, i):
        """Plan model i's next phase that has runs not planned yet. Its runs that already finished
        (their run.json) are taken at once, which may plan the phase after it."""
        while True:
            try:
                what, keyed = next(self.phases[i])
            except StopIteration:
                return
            self.phase_of[i] += 1
            new = [(order, j) for order, j in keyed if j.save_dir not in self.rank]
            if new:
                break
        if self.phase_of[i] and not self.args.dry_run:
            log(f"{self.plan[i][1]}: {what}: {len(new)} more run{'s' if len(new) > 1 else ''}")
        done = []
        for (seed, dim, lr_rank), j in new:
            self.rank[j.save_dir] = (self.phase_of[i], seed, dim, i, lr_rank)
            self.unfinished[i].add(j.save_dir)
            argv = study_runs.job_argv(j, self.data, self.args)
            run = study_runs.recorded_run(j, argv, self.args)
            if run is not None:
                done.append((j, run))
            else:
                resumes = study_runs.resumable(j.save_dir, argv, self.args)
                heapq.heappush(self.queue, (not resumes, *self.rank[j.save_dir], j))
        for j, run in done:
            self.jobs.append(j)
            self._record(j, run, reused=True)

    def _record(self, j, run, reused):
        """Keep a finished run; plan its model's next phase when it was the phase's last one
        (returns whether it was)."""
        self.finished[j.save_dir] = with_checkpoint_metrics(run)
        self.runs = [self.finished[d] for d in sorted(self.finished, key=self.rank.__getitem__)]
        if not self.args.dry_run:
            log(f"[{len(self.finished)}/{len(self.rank)}] {j.corpus} {j.label} d{j.dim} lr {fmt_lr(j.lr)} "
                f"seed {j.seed}: " + ("reused, " if reused else "")
                + f"valid ppl {run['valid_ppl']:.2f} at update {run['best_update']} of {run['updates']}"
                + (f", BLEU {run['test_bleu']}" if run.get("test_bleu") is not None else "")
                + f" ({run['train_seconds']:.0f} s)")
        i = self.rank[j.save_dir][3]  # the model's index in the plan
        self.unfinished[i].discard(j.save_dir)
        if self.unfinished[i]:
            return False
        self._plan_next_phase(i)
        return True

    def dry_run(self):
        """The runs a real call would train next, in order, training nothing (a model's later
        phases wait for these runs' results)."""
        pending = []
        while self.queue:
            j = heapq.heappop(self.queue)[-1]
            self.jobs.append(j)
            pending.append(j)
        return pending

    def train(self, on_progress):
        """Train every run, ``--jobs`` at a time. ``on_progress(runs, plots)`` is called with the
        finished runs once the reused ones are taken and after every finished run (``plots``:
        whether a model finished a phase). A failed or interrupted run stops the study; the
        finished runs are saved and a re-run resumes from them."""
        if self.finished:  # runs reused from an earlier call
            on_progress(self.runs, False)
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.args.jobs) as pool:
            running = {}
            while self.queue or running:
                while self.queue and len(running) < self.args.jobs:
                    j = heapq.heappop(self.queue)[-1]
                    self.jobs.append(j)
                    running[pool.submit(study_runs.execute_run, j, self.data, self.args)] = j
                done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    j = running.pop(future)
                    try:
                        run, reused = future.result()
                    except BaseException:
                        for other in running:
                            other.cancel()
                        raise
                    phase_done = self._record(j, run, reused)
                    on_progress(self.runs, phase_done)
