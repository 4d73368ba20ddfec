"""The runs of an ablation: each (variant, seed) built on its own copy of the policy, stepped in
turns on one shared backend or on local ones of their own, and evaluated on held-out problems
when an evaluation is due. ``rl.ablation.runner.run_ablation`` drives them in lockstep; here is what
one run is and what one turn of it does, so that a resumed ablation (a run restored from its
checkpoint) goes through the same doors as a fresh one."""
from __future__ import annotations

import copy
from functools import partial

from ...evaluate import evaluate_policy
from ...memory import MemoryReleaser
from ...progress import tqdm
from ...side_by_side import side_by_side
from ..variants import VariantRun, get_variant

__all__ = ["build_run", "steps_done", "evaluation_due", "evaluate_runs", "Turns", "lockstep"]


def build_run(variant, seed, policy, tokenizer, problems, reward, grpo, drafter_head, shared,
              tlt_kw, checkpoint_dir=None, report_to: str = "none", run_dir=None):
    """One run of the ablation: RL variant ``variant`` (``rl.variants``: its ``build``) on its
    own copy of ``policy`` (and of the head, where it speculates), on the ``shared`` backend
    or a local one of its own, with the GRPO seed ``seed`` (``tlt_kw`` are TLT's). With
    ``checkpoint_dir`` the trainer resumes from the checkpoint there, if any; its per-step
    scalars go where ``report_to`` says, in ``run_dir`` (``rl.loop.RLLoop``)."""
    run = VariantRun(seed, copy.deepcopy(policy), tokenizer, problems, reward,
                     grpo.updated(seed=seed), drafter_head,
                     shared if shared is not None else "local", dict(tlt_kw), checkpoint_dir,
                     report_to, run_dir)
    return get_variant(variant).build(run)


def steps_done(trainer) -> int:
    """The RL steps ``trainer`` has run (one history row each, with or without an update)."""
    return trainer.rl_step


def evaluation_due(step: int, steps: int, eval_every: int | None) -> bool:
    """Whether held-out accuracy is measured after ``step`` of ``steps`` RL steps: before the
    first, after the last, and after every ``eval_every`` steps when set."""
    return step in (0, steps) or bool(eval_every) and step % eval_every == 0


def evaluate_runs(runs: dict, evals: list[dict], problems, tokenizer, max_new_tokens: int,
                  step: int, width: int = 1) -> bool:
    """Append the held-out greedy accuracy after ``step`` steps of every run that stands at
    ``step`` and has none there yet to ``evals``, in run order (nothing without
    ``problems``); whether any was measured. At step 0 every run starts from one policy:
    measured once (or taken from a run measured there before a resume). The runs' policies
    are evaluated ``width`` at a time (``workbench.side_by_side``)."""
    if problems is None:
        return False
    have = {(e["variant"], e["seed"]) for e in evals if e["step"] == step}
    start = next((e for e in evals if e["step"] == 0), None)
    todo = [(key, tr) for key, tr in runs.items() if key not in have and steps_done(tr) == step]
    if step == 0 and todo:  # one policy: measured once, on the first run to need it
        if start is None:
            (v, seed), first = todo[0]
            start = {"variant": v, "seed": seed, "step": 0,
                     "accuracy": _accuracy(first.model, tokenizer, problems, max_new_tokens)}
        evals.extend({**start, "variant": v, "seed": seed} for (v, seed), _ in todo)
        return True
    accuracies = side_by_side([partial(_accuracy, tr.model, tokenizer, problems, max_new_tokens)
                               for _, tr in todo], width)
    evals.extend({"variant": v, "seed": seed, "step": step, "accuracy": accuracy}
                 for ((v, seed), _), accuracy in zip(todo, accuracies))
    return bool(todo)


def _accuracy(model, tokenizer, problems, max_new_tokens: int) -> float:
    report = evaluate_policy(model, tokenizer, problems, progress=False,
                             max_new_tokens=max_new_tokens)
    return report.summary()["accuracy"]


class Turns:
    """The runs' steps, on their own local backends or taking turns on one ``shared``
    backend: started at the first step (none when a finished ablation takes no step), its
    workers holding one copy of ``policy``; before a run steps after another, its weights go
    to the workers (the run's ``policy_changed``)."""

    def __init__(self, runs: dict, shared, workers: int, policy):
        self.runs, self.shared, self.last = runs, shared, None
        self.start = shared is not None and bool(runs) and not _apart(shared, workers)
        self.workers, self.policy = workers, policy

    def step(self, key) -> None:
        run = self.runs[key]
        if self.start:
            holder = copy.deepcopy(self.policy)  # never a run's own: runs push their weights in
            run.start_workers(self.workers, lambda w: holder)
            self.start = False
        if self.shared is not None and key != self.last:
            run.policy_changed()
        run.step()
        self.last = key


def lockstep(runs: dict, turns: Turns, steps: int, evaluation_due, evaluate, store,
             progress: bool = True, width: int = 1) -> None:
    """Every run from the step it stands at up to ``steps``: one step of each in an order
    that rotates by one each step (a machine that slows for a while slows every run alike),
    then at the boundary after the step held-out accuracy where ``evaluation_due(step)`` and
    ``evaluate(step)`` measures one, and, with a ``store`` (``AblationStore``), the
    evaluations and the checkpoint where due. A run restored from a later checkpoint than
    the others (a save interrupted between runs) waits for them at its step; one past
    ``steps`` is refused before any step. After each run's step the freed memory goes back
    to the system once the process has grown by 256 MB (``workbench.memory.MemoryReleaser``),
    so that it holds one update's peak, not a fragment of every run's. With ``width`` > 1
    the runs of a step go ``width`` at a time, side by side (``workbench.side_by_side``:
    runs on local backends of their own, whose sim seconds are thread CPU time, so that no
    figure moves), in the same rotated order."""
    order, done = list(runs), {key: steps_done(tr) for key, tr in runs.items()}
    if max(done.values(), default=0) > steps:
        raise ValueError(f"steps={steps}, but restored runs have done more: {done}; accepted: "
                         f"steps >= {max(done.values())}")
    start = min(done.values(), default=0)
    release = MemoryReleaser()

    def boundary(step: int, first: bool) -> None:
        due = evaluation_due(step)
        if due and evaluate(step) and store is not None:
            store.save_evals()
        if store is not None and not first and store.due(step, due, steps):
            store.checkpoint(runs, step)

    boundary(start, first=True)  # no checkpoint: just restored
    for step in tqdm(range(start, steps), desc="RL steps (all variants)", initial=start,
                     total=steps, disable=not progress):
        shift = step % len(order)
        due = [key for key in order[shift:] + order[:shift] if steps_done(runs[key]) == step]
        for at in range(0, len(due), width):
            side_by_side([partial(turns.step, key) for key in due[at:at + width]], width)
            release()  # the updates' peak back to the system (workbench.memory)
        boundary(step + 1, first=False)


def _apart(backend, workers: int) -> bool:
    """Whether ``backend`` runs ``workers`` workers on copies (``Backend.runs_copies``: in
    other processes, holding copies of a policy that no caller holds)."""
    return backend.runs_copies and backend.num_workers == workers
