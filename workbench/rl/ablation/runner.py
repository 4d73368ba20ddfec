"""The TLT ablation: every variant over several seeds, run in lockstep (its result and measures:
``rl.ablation.result``).

Variants advance one RL step at a time in a rotating order (baseline, static SD, adaptive
drafter, TLT, then the next seed...), so that a machine that slows down for a while slows
every variant alike, the way the SD benchmarks alternate their systems inside each repeat.

Backends. ``"local"``: each run on a local backend of its own, its workers sharing its policy.
``"ray"`` or a backend object: one backend serves every run, so that one Ray and one set of
actors serve the whole ablation (the runs take turns, one step at a time): its workers hold a
copy of the policy, and each run's weights go to them before its step. A backend object
already started with ``grpo.rollout.workers`` workers that run on copies (``runs_copies``: Ray
actors, whose policies no caller holds) is used as it is, so that several ablations share its
actors; any other is started here. A backend made from a name is closed at the end; an object
stays the caller's. Runs on local backends of their own go side by side, one per torch thread
the process has (``workbench.side_by_side``): each run's sim seconds are its own thread's CPU
time, so its figures are those of the runs one at a time, in less wall time.

Resuming (``rl.ablation.store``). A call with the same arguments and ``checkpoint_dir`` goes on
where the last stopped, redoing no evaluation; a finished one returns without stepping, and a
folder of other settings is refused before anything runs. Every argument (:func:`check_ablation`,
the folder's settings) is checked, and every run built, before a file is written or Ray
started: a refused call leaves ``checkpoint_dir`` as it was (not made, when it was missing), so
that the corrected call runs there.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd

from ...checks import check_int, check_list
from ...clock import sim_seconds, sim_seconds_kind
from ...rollout import make_backend
from ...rollout.backend import check_capacity
from ...scalar_log import check_report_to
from ...side_by_side import width_for
from ...tasks import exact_match_reward
from ..grpo import GRPOConfig
from ..setup import DEFAULT_VARIANTS, RLSetup
from ..tlt import first_divergence
from ..variants import check_variants, tlt_config
from .result import Ablation
from .runs import Turns, build_run, evaluate_runs, evaluation_due, lockstep
from .store import AblationStore, ablation_settings, run_folder, saved_sim_seconds

__all__ = ["Ablation", "run_ablation", "check_ablation", "coupled_first_divergence",
           "notebook_backend", "close_backend"]

SEED_MAX = 2 ** 63 - 1  # a seed seeds a torch.Generator (TrainConfig.seed's range)


def run_ablation(policy, tokenizer, problems, grpo: GRPOConfig, steps: int,
                 variants=DEFAULT_VARIANTS, seeds=(0,), drafter_head=None,
                 reward=exact_match_reward, eval_problems=None, eval_max_new_tokens=None,
                 eval_every: int | None = None, progress: bool = True, backend="local",
                 ray_address: str | None = None, run_dir=None, checkpoint_dir=None,
                 checkpoint_every: int | None = None, report_to: str = "none",
                 **tlt_kw) -> Ablation:
    """Run ``variants`` x ``seeds`` for ``steps`` RL steps each, in lockstep.

    ``variants``: registered RL variants (``rl.variants.variant_names``): TLT's (``baseline``,
    ``static_sd``, ``adaptive_drafter``, ``tlt``), the long-tail remedies' (each at
    ``rl.variants.remedy_config``'s defaults), a plugin's (docs/extending.md), and
    ``tlt+<remedy>`` (TLT's SD, drafter and engine in the remedy's rollouts). Every run starts
    from its own copy of ``policy`` (and of ``drafter_head``); seed ``s`` sets the GRPO seed
    (prompt order, sampling). ``tlt_kw`` go to every ``TLTConfig`` (threshold, arms, spec_k,
    spot, ...). With ``eval_problems`` the held-out greedy accuracy of each run is measured
    before the first step, after the last, and after every ``eval_every`` steps when set.
    ``backend``: ``"local"``, ``"ray"`` (``ray_address`` as ``GRPO``'s) or a backend object
    (module docstring); ``run_dir``: the run's folder, where a local Ray keeps its logs
    (``run_dir/ray``). ``report_to="tensorboard"``: each run's per-step scalars
    (``workbench.scalar_log``) in ``<folder>/<variant>-seed<seed>/tensorboard`` under
    ``checkpoint_dir`` (else ``run_dir``); a resumed ablation writes no step twice.
    ``checkpoint_dir``: each run checkpoints there every ``checkpoint_every`` steps (None: at
    each evaluation and the end only), and a call with the same arguments resumes there.
    """
    # 1. check every argument and the backend's capacity: nothing written or started yet
    variants, seeds = _check_runs(steps, variants, seeds, eval_every)
    logs = checkpoint_dir if checkpoint_dir is not None else run_dir
    check_report_to(report_to, logs)
    made = _backend_for(backend, ray_address, grpo.rollout.workers, run_dir)
    shared = None if isinstance(backend, str) and backend == "local" else made
    max_new = eval_max_new_tokens or grpo.rollout.max_new_tokens
    # a folder saved on wall-time sim seconds resumes on them (workbench.clock)
    with sim_seconds(saved_sim_seconds(checkpoint_dir) or sim_seconds_kind()):
        # 2. open the checkpoint folder, its settings checked against this call's
        store = _open_store(checkpoint_dir, checkpoint_every, steps, ablation_settings(
            variants, seeds, grpo, problems, reward, eval_problems, eval_every, max_new, backend,
            tlt_kw))
        # 3. build every run, then restore what the folder holds (the first write)
        runs = _build_runs(variants, seeds, store, logs, report_to, policy=policy,
                           tokenizer=tokenizer, problems=problems, reward=reward, grpo=grpo,
                           drafter_head=drafter_head, shared=shared, tlt_kw=tlt_kw)
        evals = _resume(store, runs)
        # 4. step the runs in lockstep, evaluating them when due
        width = width_for(sim_seconds_kind(), shared is not None)
        evaluate = partial(evaluate_runs, runs, evals, eval_problems, tokenizer, max_new,
                           width=width)
        due = partial(evaluation_due, steps=steps, eval_every=eval_every)
        try:
            lockstep(runs, Turns(runs, shared, grpo.rollout.workers, policy), steps, due,
                     evaluate, store, progress, width)
        finally:  # 5. close the runs' logs, and a backend made here from a name
            _close(runs, shared if isinstance(backend, str) else None)
        return _ablation_of(runs, evals, sim_seconds_kind())


def _build_runs(variants: list, seeds: list, store, logs, report_to: str, **common) -> dict:
    """Every run, ``(variant, seed)`` -> its trainer, seed by seed in variant order
    (``runs.build_run`` with ``common``: the policy, tokenizer, problems, reward, grpo,
    drafter head, shared backend and ``tlt_kw``), each checkpointing in its folder of
    ``store`` and logging under ``logs``."""
    return {(v, seed): build_run(
                v, seed, **common, report_to=report_to,
                checkpoint_dir=store.state_dir((v, seed)) if store is not None else None,
                run_dir=None if logs is None else Path(logs) / run_folder((v, seed)))
            for seed in seeds for v in variants}


def _resume(store, runs: dict) -> list[dict]:
    """Restore every run from ``store`` and write its settings (the ablation's first write);
    the evaluations saved there, which the ablation appends to (none without a store)."""
    if store is None:
        return []
    store.restore(runs)
    store.save_settings()
    return store.evals


def _close(runs: dict, made_here) -> None:
    """Close every run's scalar log, and ``made_here``, the shared backend this ablation made
    from a name (None: none, or it is the caller's)."""
    for run in runs.values():
        run.close_log()
    if made_here is not None:
        made_here.close()


def _ablation_of(runs: dict, evals: list[dict], sim_seconds: str) -> Ablation:
    """The ablation's tables from its ``runs`` (``(variant, seed)`` -> trainer, in run
    order): every run's step rows, and the evaluations by step, then in run order."""
    order = list(runs)
    evals.sort(key=lambda e: (e["step"], order.index((e["variant"], e["seed"]))))
    rows = [{"variant": v, "seed": seed, **row} for (v, seed), tr in runs.items()
            for row in tr.record.rows]
    return Ablation(pd.DataFrame(rows), pd.DataFrame(evals), runs, sim_seconds)


def check_ablation(steps: int, variants, seeds, grpo: GRPOConfig, *,
                   eval_every: int | None = None, backend="local",
                   ray_address: str | None = None, checkpoint_every: int | None = None,
                   **tlt_kw) -> None:
    """Refuse the arguments of an ablation (:func:`run_ablation`'s) that no model is needed to
    check, each with a ValueError naming the value and what is accepted, before anything is
    written or started: ``steps``, ``variants`` and ``seeds`` (non-empty lists, each item
    once), ``eval_every``, ``checkpoint_every``, TLT's arguments ``tlt_kw``, the backend and
    its capacity: ``grpo``'s workers of one Ray CPU each (``threads_per_worker``) against the
    CPUs of the Ray they would run on, where known without starting it (this process's Ray,
    or a local one yet to start: the machine's CPU count; a cluster at an address is checked
    once attached, when the first step starts the workers). ``run_ablation`` checks the same
    before it writes; an RL notebook calls this in the cell after its parameters, so that a
    bad one stops it before its setup reads it, loads a model or writes its folder."""
    _check_runs(steps, variants, seeds, eval_every)
    check_int("checkpoint_every", checkpoint_every, 1, optional=True)
    tlt_config("tlt", grpo, **tlt_kw)  # refuses bad engine and drafter arguments
    _backend_for(backend, ray_address, grpo.rollout.workers)


def _check_runs(steps: int, variants, seeds, eval_every: int | None) -> tuple[list, list]:
    """The variants and seeds as lists, after checking them, ``steps`` and ``eval_every``."""
    check_int("steps", steps, 0)
    variants = check_variants(variants)
    seeds = check_list("seeds", seeds, lambda name, seed: check_int(name, seed, 0, SEED_MAX),
                       f"integers in [0, {SEED_MAX}]")
    if eval_every is not None:
        check_int("eval_every", eval_every, 1)
    return variants, seeds


def _backend_for(backend, ray_address: str | None, workers: int, run_dir=None):
    """The backend the runs share (``make_backend``: made, not started), checked to hold
    ``workers`` workers (``rollout.backend.check_capacity``) before anything starts."""
    made = make_backend(backend, ray_address, run_dir=run_dir)
    check_capacity(made, check_int("workers", workers, 1))
    return made


def _open_store(checkpoint_dir, checkpoint_every, steps: int, settings: dict):
    """The ablation's :class:`AblationStore` in ``checkpoint_dir`` (None without one), its
    settings and ``steps`` checked against what the folder holds; nothing written yet."""
    if checkpoint_dir is None:
        if checkpoint_every is not None:
            raise ValueError(f"checkpoint_every={checkpoint_every!r} without checkpoint_dir; "
                             "accepted: None, or a checkpoint_dir to checkpoint into")
        return None
    store = AblationStore(checkpoint_dir, settings, checkpoint_every)
    store.check_steps(steps)
    return store


def notebook_backend(backend="local", ray_address: str | None = None,
                     run_dir: str | Path | None = None):
    """The rollout backend every ablation of one notebook shares: ``"local"`` as it is (each
    run on a local backend of its own), any other made here once (``make_backend``: a local
    Ray keeps its logs in ``run_dir/ray``), so that the ablation and the coupled pair after
    it run on one set of actors, started by the first call and used as it is by the next
    (``run_ablation``: an object stays the caller's). :func:`close_backend` ends it."""
    if isinstance(backend, str) and backend == "local":
        make_backend(backend, ray_address)  # refuses a Ray address given with "local"
        return backend
    return make_backend(backend, ray_address, run_dir=run_dir)


def close_backend(backend) -> None:
    """Close what :func:`notebook_backend` made (nothing to close for ``"local"``)."""
    if not isinstance(backend, str):
        backend.close()


def coupled_first_divergence(setup: RLSetup, grpo: GRPOConfig, steps: int, seed: int = 0,
                             **tlt_kw) -> int | None:
    """Run the baseline and TLT side by side for ``steps`` RL steps with coupled sampling
    and return the first step whose tokens differ (-1: none; in float64 there is none, in
    float32 a verify pass may round differently). ``None`` when not measured: ``steps`` is 0,
    or the setup has no drafter head (every variant it was made for is the baseline).
    ``tlt_kw`` go to :func:`run_ablation` (``backend`` and ``ray_address`` too).
    """
    check_int("steps", steps, 0)
    check_int("seed", seed, 0, SEED_MAX)  # checked even where the pair is skipped
    if steps == 0 or setup.drafter_head is None:
        return None
    pair = run_ablation(setup.policy, setup.tokenizer, setup.pool,
                        grpo.updated(spec_mode="coupled"), steps, variants=["baseline", "tlt"],
                        seeds=[seed], drafter_head=setup.drafter_head, reward=setup.reward,
                        progress=False, **tlt_kw)
    h = pair.history
    return first_divergence(h[h["variant"] == "baseline"], h[h["variant"] == "tlt"])
