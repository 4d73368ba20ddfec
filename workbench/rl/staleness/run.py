"""Does a drafter go stale during RL? One GRPO trajectory, several drafters measured on it.

SD is lossless, so the policy's trajectory does not depend on the drafter: one plain GRPO run
serves every drafter, and each is measured on every step's own rollout
(:mod:`workbench.rl.acceptance`: a few of the step's prompt groups decoded again with the
drafter, coupled at the rollout's temperature, the tokens checked against the trajectory's).
The drafters (:mod:`workbench.rl.staleness.drafters`) are ``frozen`` (the pre-RL EAGLE head),
``adaptive`` (TLT's spot trainer on every idle worker), ``ceiling`` (trained to convergence on
each step's whole harvest), ``sibling`` (model-free: the row's group on its worker, and its
prompt's earlier responses) and ``suffix`` (model-free, the same sources counted in a suffix
trie per prompt: DAS/SuffixDecoding). Each learns from a step after its tau on that step is
measured, so it serves from the next step, as in TLT. Measured on one worker, every row of a
measured group is there for the sibling and suffix drafters: the group-affine placement, not
the trajectory's (requests are dealt round-robin to the workers, so with G = N a worker holds
one row of each group, and no sibling).

One RL step (:meth:`StalenessRun.step`):

1. **rollout**: the trajectory's own plain rollout (coupled draws), harvested;
2. **measure**: each drafter's tau on this step's rollout, and its tau by response position;
3. **the drafters learn** from this step, on the policy that sampled it (TLT's drafter
   trains in the rollout's idle windows, before the update);
4. **update** the policy (GRPO), the step's row recorded with 2) and 3) in it;
5. **record and checkpoint**: held-out greedy accuracy when due, the checkpoint every
   ``checkpoint_every`` steps.

Steps 2) and 3) are :meth:`~workbench.rl.staleness.observer.StalenessObserver.observe`.
Nothing in them changes the trajectory: they run with the global RNG seeded per step and put
back after (``train.isolated_rng``), the drafters train on copies of their own and hold the
policy frozen, and measuring decodes on an engine of its own. So the two halves can also run
side by side on two cores, with the same rows (:mod:`workbench.rl.staleness.split`: the
trajectory in one process, the observer in another, joined by step).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import pandas as pd

from ...adapt import SpotConfig
from ...checks import check_choice, check_int
from ...evaluate import evaluate_policy
from ...nested_config import NestedConfig
from ...progress import tqdm
from ...rollout import RolloutEngine
from ...scalar_log import check_report_to
from ...speculative.eagle import EagleHead
from ...tasks import Problem, exact_match_reward
from ...train import isolated_rng
from ..checkpoint import load_state, saved_config
from ..config import GRPOConfig
from ..grpo import GRPO
from ..loop import RLLoop, check_checkpoint_dir
from ..setup import rl_setup
from .drafters import CeilingConfig
from .observer import StalenessObserver, rng_seed

__all__ = ["StalenessConfig", "StalenessRun", "DRAFTERS", "staleness_setup", "lead_grpo",
           "held_out_accuracy", "check_same_config"]

DRAFTERS = ("frozen", "adaptive", "ceiling", "sibling", "suffix")
"""The drafters whose tau a staleness run measures on every step."""
DIVERGENCE = ("auto", "raise", "count")
STATE_FILE = "staleness_state.pt"


def lead_grpo() -> GRPOConfig:
    """The lead GRPO setting, the one whose 400-step runs (two seeds) met issue #9's
    held-out accuracy target (RESULTS.md, ``grpo_heldout_400``): P 16 x G 16, 256 tokens,
    T 1, lr 5e-4, k3 KL 0.05 to the start, 16 workers."""
    return GRPOConfig.flat(prompts_per_step=16, samples_per_prompt=16, max_new_tokens=256,
                           temperature=1.0, lr=5e-4, kl_coef=0.05, workers=16)


def _spot() -> SpotConfig:
    # the buffer of the last 4 steps' harvests: one step's alone is narrow enough that
    # training on it cost acceptance on other prompts (RESULTS.md, drafter_narrow_harvest)
    return SpotConfig(history_steps=4)


@dataclass
class StalenessConfig(NestedConfig):
    """Arguments of a staleness run; checked when built. A
    :class:`~workbench.nested_config.NestedConfig`, as ``TLTConfig`` and ``RemedyConfig``.

    Args:
        grpo: the trajectory (default: the lead setting, :func:`lead_grpo`); its
            ``rollout.spec_k`` is the draft tokens per speculative step, every drafter alike.
        spot: the adaptive drafter's spot trainer (default: every idle worker, the last 4
            steps' harvests in its buffer).
        ceiling: the ceiling drafter's training to convergence.
        drafters: which of :data:`DRAFTERS` to measure.
        measure_groups: prompt groups of each step decoded again per drafter (the first ones;
            the step's prompts are a seeded random draw).
        position_bucket: response tokens per bucket of tau against position.
        eval_every: held-out greedy accuracy every this many steps (also before the first
            and after the last; None: those two only). Needs held-out problems.
        checkpoint_every: steps between checkpoints (and one after the last step run).
        divergence: what a measured row whose tokens differ from the trajectory's does:
            ``"raise"`` (:class:`~workbench.rl.acceptance.NotLosslessError`), ``"count"``
            (the row's ``diverged_<drafter>``), ``"auto"``: raise for a float64 policy, count
            otherwise (docs/design.md: exact in float64; in float32 a verify pass may round
            a near-tie differently).
    """

    grpo: GRPOConfig = field(default_factory=lead_grpo)
    spot: SpotConfig = field(default_factory=_spot)
    ceiling: CeilingConfig = field(default_factory=CeilingConfig)
    drafters: tuple = DRAFTERS
    measure_groups: int = 4
    position_bucket: int = 16
    eval_every: int | None = None
    checkpoint_every: int = 10
    divergence: str = "auto"

    def __post_init__(self):
        for name, cls in (("grpo", GRPOConfig), ("spot", SpotConfig),
                          ("ceiling", CeilingConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"StalenessConfig.{name} must be a {cls.__name__}, got "
                                 f"{type(getattr(self, name)).__name__} (StalenessConfig.flat "
                                 "takes flat parameters)")
        self.drafters = tuple(self.drafters) if isinstance(self.drafters, (list, tuple)) \
            else self.drafters
        if (not isinstance(self.drafters, tuple) or not self.drafters
                or len(set(self.drafters)) != len(self.drafters)):
            raise ValueError(f"StalenessConfig.drafters must be a non-empty list of distinct "
                             f"names from {list(DRAFTERS)}, got {self.drafters!r}")
        for name in self.drafters:
            check_choice("StalenessConfig.drafters[]", name, DRAFTERS)
        for name in ("position_bucket", "checkpoint_every"):
            check_int(f"StalenessConfig.{name}", getattr(self, name), 1)
        P = self.grpo.prompts_per_step
        check_int(f"StalenessConfig.measure_groups (at most P = {P})", self.measure_groups, 1,
                  P)
        check_int("StalenessConfig.eval_every", self.eval_every, 1, optional=True)
        check_choice("StalenessConfig.divergence", self.divergence, DIVERGENCE)
        if "ceiling" in self.drafters and P < 2:
            raise ValueError(f"the ceiling drafter holds back prompt groups: prompts_per_step "
                             f"must be at least 2, got {P}")


def check_run_inputs(config, held_out, checkpoint_dir) -> StalenessConfig:
    """``config`` (None: the default) once it, ``held_out`` and ``checkpoint_dir`` are what a
    run of the trajectory takes (one process's ``StalenessRun``, or the two-process run's
    trajectory); each bad one named before anything is built."""
    c = config if config is not None else StalenessConfig()
    if not isinstance(c, StalenessConfig):
        raise ValueError(f"config must be a StalenessConfig, got {type(c).__name__}")
    if held_out is not None and (not held_out
                                 or not all(isinstance(p, Problem) for p in held_out)):
        raise ValueError("held_out must be a non-empty list of workbench.tasks.Problem or None")
    if c.eval_every is not None and held_out is None:
        raise ValueError(f"eval_every={c.eval_every} needs held_out problems")
    check_checkpoint_dir(checkpoint_dir)
    return c


def staleness_setup(config: StalenessConfig, model: str = "default",
                    task: str = "running_sum", rl_problems: int = 4000,
                    eval_problems: int = 200, reward: str = "exact", *, drafter="auto",
                    fit=None, checkpoint_dir: str | os.PathLike | None = None,
                    report_to: str = "none", run_dir: str | os.PathLike | None = None
                    ) -> "StalenessRun":
    """A :class:`StalenessRun` of ``config`` on ``model`` and ``task`` (``rl_setup``: the RL
    pool, ``eval_problems`` held-out problems, the reward by name, the pre-RL head that
    ``drafter`` names), resuming from ``checkpoint_dir`` when it holds a checkpoint. Every
    argument is checked before the model loads; ``report_to`` and ``run_dir`` are the run's
    log (:class:`~workbench.rl.loop.RLLoop`'s)."""
    if not isinstance(config, StalenessConfig):
        raise ValueError(f"config must be a StalenessConfig, got {type(config).__name__}")
    check_checkpoint_dir(checkpoint_dir)
    check_int("eval_problems", eval_problems, 1)
    check_report_to(report_to, run_dir if run_dir is not None else checkpoint_dir)
    s = rl_setup(model, task, rl_problems, eval_problems, reward, drafter=drafter,
                 variants=["static_sd"], fit=fit)  # a speculative variant: the head
    return StalenessRun(s.policy, s.tokenizer, s.pool, s.drafter_head, s.reward, config,
                        held_out=s.held_out, checkpoint_dir=checkpoint_dir,
                        report_to=report_to, run_dir=run_dir)


def check_same_config(state: dict, config: StalenessConfig, checkpoint_dir) -> None:
    """Refuse a checkpoint ``state`` made with another configuration than ``config``."""
    if saved_config(state["config"]) != repr(config):
        raise ValueError(f"the checkpoint in {str(checkpoint_dir)!r} was made with another "
                         f"configuration:\n  {state['config']}\nthis run's:\n  {config!r}\n"
                         "run with the same one, or delete the folder to start over")


def held_out_accuracy(policy, tokenizer, held_out: list[Problem], config: StalenessConfig,
                      step: int) -> dict:
    """``{"step", "accuracy"}``: held-out greedy accuracy of ``policy`` after ``step`` RL
    steps, with the global RNG seeded for that step and put back after."""
    with isolated_rng(rng_seed(config, step)):
        report = evaluate_policy(policy, tokenizer, held_out,
                                 max_new_tokens=config.grpo.rollout.max_new_tokens,
                                 progress=False)
    return {"step": step, "accuracy": report.summary()["accuracy"]}


def record_step(run) -> None:
    """After a step's update: held-out accuracy and the checkpoint when they are due
    (``config.eval_every``, ``config.checkpoint_every``), for a one-process run and the
    two-process run's trajectory alike."""
    c, done = run.config, run.rl_step
    if run.held_out is not None and c.eval_every and done % c.eval_every == 0:
        run._evaluate()
    if run.checkpoint_dir is not None and done % c.checkpoint_every == 0:
        run.save_checkpoint()


def run_steps(run, steps: int, progress: bool = False, on_step=None) -> None:
    """``run.step()`` until ``run`` has done ``steps`` RL steps (``on_step(row)`` after each),
    with held-out accuracy before the first step and after the last, and a checkpoint at the
    end: the loop of a one-process run and of the two-process run's trajectory alike (``run``
    has ``step``, ``rl_step``, ``held_out``, ``_evals``, ``_evaluate``, ``checkpoint_dir``
    and ``save_checkpoint``)."""
    if run.held_out is not None and not run._evals:
        run._evaluate()
    for _ in tqdm(range(steps - run.rl_step), desc="staleness", disable=not progress):
        row = run.step()
        if on_step is not None:
            on_step(row)
    done = [e["step"] for e in run._evals]
    if run.held_out is not None and (not done or done[-1] != run.rl_step):
        run._evaluate()
    if run.checkpoint_dir is not None:
        run.save_checkpoint()


class StalenessRun(RLLoop):
    """One GRPO trajectory and ``config.drafters`` measured on every step (module docstring),
    in the RL loop shell (:class:`~workbench.rl.loop.RLLoop`: history, timelines, log; its
    step checkpoints every ``config.checkpoint_every`` steps, :func:`record_step`).

    Args:
        policy, tokenizer, problems, reward: as :class:`~workbench.rl.grpo.GRPO`'s.
        drafter_head: the pre-RL EAGLE head for ``policy``; every drafter starts from a copy.
        config: a :class:`StalenessConfig`.
        held_out: problems of the held-out greedy accuracy (None: not measured).
        checkpoint_dir: the run's checkpoint folder; a run resumes from it (it must have been
            made with the same config).
        report_to, run_dir: the per-step scalars' log and the run's folder (``RLLoop``'s).
    """

    STATE_FILE = STATE_FILE

    def __init__(self, policy, tokenizer, problems: list[Problem], drafter_head,
                 reward=exact_match_reward, config: StalenessConfig | None = None,
                 held_out: list[Problem] | None = None,
                 checkpoint_dir: str | os.PathLike | None = None, report_to: str = "none",
                 run_dir: str | os.PathLike | None = None):
        self.config = c = check_run_inputs(config, held_out, checkpoint_dir)
        if not isinstance(drafter_head, EagleHead):
            raise ValueError(f"drafter_head must be the pre-RL EagleHead, got "
                             f"{type(drafter_head).__name__} (rl_setup(...).drafter_head)")
        drafter_head.config.check(policy.config)
        self.tokenizer, self.held_out = tokenizer, held_out
        self.observer = StalenessObserver(policy, tokenizer, drafter_head, c)
        self._evals: list[dict] = []
        super().__init__(GRPO(policy, tokenizer, problems, reward, c.grpo), checkpoint_dir,
                         report_to, run_dir)

    @property
    def policy(self):
        return self.grpo.model

    # ---- one step -----------------------------------------------------------------------
    def _step(self) -> dict:
        """One RL step (module docstring); returns its row."""
        grpo = self.grpo
        # 1) rollout: the trajectory's own, plain (coupled draws), harvested for the drafters
        rl = grpo.rollout(harvest=True)
        self.timelines[rl.step] = rl.result.timeline
        # 2) measure each drafter on this step's rollout, 3) the drafters learn from it
        extra = self.observer.observe(rl, grpo.engine.backend)
        # 4) update the policy; the step's row holds 2) and 3)
        row = grpo.update(rl, extra)
        # 5) record and checkpoint
        record_step(self)
        return row

    def _checkpoint_due(self) -> bool:
        """Never after :meth:`run`'s steps: the step checkpoints itself when due."""
        return False

    def _evaluate(self) -> None:
        """Held-out greedy accuracy of the policy as it is now (after ``rl_step`` steps)."""
        self._evals.append(held_out_accuracy(self.policy, self.tokenizer, self.held_out,
                                             self.config, self.rl_step))

    def run_to(self, steps: int, progress: bool = True, on_step=None) -> pd.DataFrame:
        """Run until ``steps`` RL steps are done (a resumed run goes on from its checkpoint);
        held-out accuracy before the first step and after the last; ``on_step(row)`` after
        each step (a log line). Returns the history."""
        check_int("steps", steps, 0)
        if steps < self.rl_step:
            raise ValueError(f"steps={steps}, but the checkpoint in "
                             f"{str(self.checkpoint_dir)!r} already holds {self.rl_step} steps")
        try:
            run_steps(self, steps, progress, on_step)
        finally:
            self.close_log()
        return self.history

    # ---- tables -------------------------------------------------------------------------
    @property
    def history(self) -> pd.DataFrame:
        """One row per RL step: GRPO's (reward, ``kl_start``, accuracy, lengths, times) with
        ``tau_<drafter>``, ``diverged_<drafter>``, the adaptive drafter's ``adaptive_*``
        and the ceiling's ``ceiling_*`` figures, ``measure_s`` and ``learn_s`` (wall)."""
        return self.grpo.history

    @property
    def drafters(self) -> dict:
        """The measured drafters by name (:class:`StalenessObserver`'s)."""
        return self.observer.drafters

    @property
    def measurer(self) -> RolloutEngine:
        """The engine that measures the drafters (one worker, on the policy)."""
        return self.observer.measurer

    @property
    def positions(self) -> pd.DataFrame:
        """tau against response position (:attr:`StalenessObserver.positions`)."""
        return self.observer.positions

    @property
    def evals(self) -> pd.DataFrame:
        """Held-out greedy accuracy: ``step`` (RL steps done), ``accuracy``."""
        return pd.DataFrame(self._evals, columns=["step", "accuracy"])

    # ---- checkpoints (``RLLoop``'s, with the config, the drafters and the evaluations) --
    def _own_state(self) -> dict:
        return {"config": repr(self.config), **self.observer.state_dict(),
                "evals": list(self._evals)}

    def load_checkpoint(self, path: str | os.PathLike | None = None) -> None:
        """Resume from ``path`` (default: :attr:`checkpoint_dir`); refused when its config
        differs from this run's (a damaged file is a ``DamagedFileError`` naming it)."""
        path = path if path is not None else self.checkpoint_dir
        self.load_state_dict(load_state(path, STATE_FILE), path)

    def load_state_dict(self, state: dict, source="the state") -> None:
        """Take a checkpoint's ``state`` (:meth:`save_checkpoint`'s, or a two-core run's
        joined: ``staleness_split.split_state``), made with this run's config."""
        check_same_config(state, self.config, source)
        super().load_state_dict(state)

    def _load_own_state(self, state: dict) -> None:
        self.observer.load_state_dict(state)
        self._evals = list(state["evals"])
