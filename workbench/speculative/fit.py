"""Drafters fitted to any policy on the spot: harvest its outputs, train within a wall-clock
budget, measure tau on held-out prompts, save with provenance.

Why: SD needs a drafter that predicts *this* policy on *this* task, and a user's model comes
without one. Both kinds learn the policy's own outputs on the task's training prompts: greedy
answers (what greedy SD must predict) and temperature-1 samples (what sampled SD must).

- :func:`fit_eagle`: an EAGLE head (``EagleTrainer`` on ``harvest_pairs`` of rollouts run with
  ``harvest=True``), saved with ``EagleHead.save_pretrained``.
- :func:`fit_drafter_lm`: a small Llama with the policy's tokenizer, trained on the responses
  (``workbench.lm_train``), saved with ``save_pretrained``.

``FitConfig.minutes`` bounds harvesting and training together (tau is measured after, outside
it). The zoo recipes of the default policy's drafters are these functions with the shipped
settings; ``speculative.resolve`` calls them for any other model and caches what they save.
Each folder holds ``provenance.json`` (model fingerprint, task, minutes, steps, tau), written
in the same atomic folder swap as the weights.
"""
from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..checks import check_fraction, check_int, check_positive
from ..lm_train import final_loss, length_batches, lm_train_config, small_llama, train_lm
from ..models import save_model
from ..progress import tqdm
from ..rollout import RolloutConfig, RolloutEngine
from ..tasks import HELDOUT_SEED, TASKS, TRAIN_SEED, get_problems
from ..train import train_state_dir
from .cache import model_fingerprint, task_key
from .drafters import EagleDrafter, LMDrafter
from .measure import acceptance_length
from .train import EagleTrainConfig, EagleTrainer, harvest_pairs

__all__ = ["FitConfig", "DrafterLMConfig", "Fitted", "split_prompts", "fit_eagle",
           "fit_drafter_lm"]

FIT_KINDS = ("eagle", "lm")
KIND_LABELS = {"eagle": "EAGLE head", "lm": "small-LM drafter"}  # what printed lines call them
# the drafters' prompt stream of a generated task: apart from the policy's pool and from RL's
DRAFTER_STREAM = 7919


@dataclass
class FitConfig:
    """How a drafter is fitted on the spot.

    Args:
        minutes: wall-clock budget of harvesting and training together; training stops when
            it is spent. Tau is measured afterwards, outside the budget.
        train_prompts: training prompts of the task the policy answers (first half greedy,
            second half at temperature 1).
        heldout_prompts: held-out prompts tau is measured on.
        max_new_tokens: response cap, harvest and measurement alike.
        max_batch_size: rows decoded together (harvest chunks are this many prompts).
        k: draft tokens per verify step when tau is measured (greedy).
        harvest_share: at most this share of the budget goes to answering prompts, the rest
            to training; ``None``: every prompt is answered whatever the time (the zoo recipes:
            the same data every run, so an interrupted run resumes exactly).
        seed: the prompt stream, sampling, initialisation and batch order.
    """

    minutes: float = 5.0
    train_prompts: int = 1000
    heldout_prompts: int = 32
    max_new_tokens: int = 256
    max_batch_size: int = 64
    k: int = 4
    harvest_share: float | None = 0.5
    seed: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field, its value and what is accepted."""
        check_positive("FitConfig.minutes", self.minutes)
        for name, low in (("train_prompts", 1), ("heldout_prompts", 1), ("max_new_tokens", 1),
                          ("max_batch_size", 1), ("k", 1), ("seed", 0)):
            check_int(f"FitConfig.{name}", getattr(self, name), low)
        check_fraction("FitConfig.harvest_share", self.harvest_share, low_open=True,
                       optional="no time cap on harvesting")


@dataclass
class DrafterLMConfig:
    """The small-LM drafter: a GQA Llama with tied embeddings and the policy's tokenizer,
    trained on response tokens with AdamW (constant LR after warm-up, weight decay 0)."""

    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 256
    tokens_per_batch: int = 4096
    steps: int = 900
    lr: float = 2e-3
    warmup: int = 50


@dataclass
class Fitted:
    """A drafter fitted on the spot (or found in the cache): its folder and what it measured."""

    kind: str            # "eagle" or "lm"
    path: Path
    tau: float           # acceptance length, greedy, k = provenance["k"], held-out prompts
    steps: int
    provenance: dict
    reused: bool = False


def split_prompts(task, train: int, heldout: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``(training prompts, held-out prompts)`` of ``task`` for a drafter.

    A generated task: ``train`` problems of the drafters' own stream (``TRAIN_SEED + 7919 +
    seed``) and ``heldout`` of ``HELDOUT_SEED``, the problems every notebook measures on. A
    JSONL file: notebooks read their prompts from the top of the file, so its first half is
    held out (tau on its first ``heldout`` lines) and the drafter learns from the second half.
    """
    if isinstance(task, str) and task in TASKS:
        learn = get_problems(task, train, seed=TRAIN_SEED + DRAFTER_STREAM + seed)
        held = get_problems(task, heldout, seed=HELDOUT_SEED)
    else:
        problems = get_problems(task)
        if len(problems) < 2:
            raise ValueError(f"task {str(task)!r} holds {len(problems)} problem; a drafter "
                             "needs at least 2 (the first half is held out)")
        half = (len(problems) + 1) // 2
        held, learn = problems[:half][:heldout], problems[half:][:train]
    return [p.prompt for p in learn], [p.prompt for p in held]


def policy_outputs(policy, tokenizer, prompts, config: FitConfig, harvest: bool = False,
                   deadline: float | None = None, progress: bool = True) -> list:
    """The policy's answers to ``prompts``: greedy for the first half, temperature 1 for the
    second, in chunks of ``config.max_batch_size`` prompts taken from both halves in turn.

    With ``deadline`` (a ``time.perf_counter()`` value) no chunk starts that the last one's
    duration says would end after it; the first always runs. Each chunk is its own
    ``rl_step``, so no two chunks share coupled draws. Returns the chunks' rollout results.
    """
    half, size = len(prompts) // 2, config.max_batch_size
    greedy, sampled = prompts[:half], prompts[half:]
    chunks = _interleave([(0.0, greedy[s:s + size]) for s in range(0, len(greedy), size)],
                         [(1.0, sampled[s:s + size]) for s in range(0, len(sampled), size)])
    engine = RolloutEngine(policy, tokenizer)
    bar = tqdm(total=len(prompts), desc="policy outputs", unit="prompt", disable=not progress)
    results, last_s = [], 0.0
    for step, (temperature, chunk) in enumerate(chunks):
        if results and deadline is not None and time.perf_counter() + last_s > deadline:
            bar.total = bar.n  # the budget's share is spent: the bar ends where harvest did
            break
        started = time.perf_counter()
        cfg = RolloutConfig(max_new_tokens=config.max_new_tokens, temperature=temperature,
                            max_batch_size=size, seed=config.seed)
        results.append(engine.rollout(chunk, cfg, progress=False, rl_step=step,
                                      harvest=harvest))
        last_s = time.perf_counter() - started
        bar.update(len(chunk))
    bar.close()
    return results


def _interleave(a: list, b: list) -> list:
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out


def heldout_tau(policy, tokenizer, drafter, prompts, config: FitConfig) -> float:
    """Acceptance length tau (docs/design.md) of ``drafter`` on ``prompts``: greedy, a chain of
    ``config.k`` drafts per verify step."""
    cfg = RolloutConfig(max_new_tokens=config.max_new_tokens, spec_k=config.k,
                        max_batch_size=config.max_batch_size)
    result = RolloutEngine(policy, tokenizer).rollout(prompts, cfg, drafter=drafter,
                                                      progress=False)
    return acceptance_length(result)


class _Fit:
    """One fit's shared steps: checks, prompts, harvest within the budget, the training bar,
    the provenance record."""

    def __init__(self, kind, policy, tokenizer, task, out_dir, config: FitConfig | None):
        self.config = config if config is not None else FitConfig()
        self.config.validate()
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise FileExistsError(f"out_dir {str(self.out_dir)!r} is an existing file; pass a "
                                  "folder (it is created if missing)")
        self.kind, self.policy, self.tokenizer, self.task = kind, policy, tokenizer, task
        self.task_key = task_key(task)  # an unknown task fails here, before any work
        self.train_prompts, self.heldout = split_prompts(
            task, self.config.train_prompts, self.config.heldout_prompts, self.config.seed)
        self.fingerprint = model_fingerprint(policy)

    def harvest(self, hidden: bool, progress: bool) -> list:
        c = self.config
        self.start = time.perf_counter()
        deadline = (None if c.harvest_share is None
                    else self.start + c.harvest_share * c.minutes * 60)
        runs = policy_outputs(self.policy, self.tokenizer, self.train_prompts, c, hidden,
                              deadline, progress)
        self.harvest_s = time.perf_counter() - self.start
        return runs

    def remaining_minutes(self) -> float:
        """What harvesting left of the budget (at least a few milliseconds: one step)."""
        return max(1e-3, self.config.minutes - (time.perf_counter() - self.start) / 60)

    def budget_bar(self, desc: str, progress: bool):
        """The training budget (what harvesting left) and a bar over its seconds, advanced by
        the trainer's ``on_step``: ``(minutes, bar, on_step)``."""
        minutes = self.remaining_minutes()
        self.train_budget_s = seconds = minutes * 60
        bar = tqdm(total=seconds, desc=desc, unit="s", disable=not progress,
                   bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s{postfix}")

        def on_step(trainer):
            bar.update(min(seconds, trainer.elapsed_s) - bar.n)
            bar.set_postfix_str(f"step {trainer.steps_done}", refresh=False)
        return minutes, bar, on_step

    def record(self, trainer, responses: int, tau: float, extra: dict) -> dict:
        """The provenance record, as ``provenance.json`` holds it (tuples read back as lists),
        so the record a fit returns equals the one a later run reads from the folder."""
        c = self.config
        record = {"kind": self.kind, "model_fingerprint": self.fingerprint,
                  "model": str(getattr(self.policy.config, "_name_or_path", "")),
                  "task": str(self.task), "task_key": self.task_key, "minutes": c.minutes,
                  "harvest_s": round(self.harvest_s, 2), "train_budget_s": self.train_budget_s,
                  "train_s": trainer.elapsed_s, "steps": trainer.steps_done,
                  "stop_reason": trainer.stop_reason, "train_sequences": responses,
                  "heldout_prompts": len(self.heldout),
                  "tau": tau, "k": c.k, "temperature": 0.0, "final_loss": final_loss(trainer),
                  "fit": asdict(c), **extra}
        return json.loads(json.dumps(record))

    def report(self, fitted: "Fitted") -> Fitted:
        p = fitted.provenance
        print(f"fitted the {KIND_LABELS[self.kind]} to model {self.fingerprint} on task "
              f"{self.task_key}: {p['steps']} steps in {p['train_s']:.0f} s after "
              f"{p['harvest_s']:.0f} s of harvest ({p['train_sequences']} responses); tau "
              f"{fitted.tau:.2f} (greedy, k={p['k']}, {p['heldout_prompts']} held-out "
              f"prompts) -> {fitted.path}", flush=True)
        return fitted


def fit_eagle(policy, tokenizer, task, out_dir,
              config: FitConfig | None = None, train: EagleTrainConfig | None = None,
              provenance: dict | None = None, progress: bool = True) -> Fitted:
    """Fit an EAGLE head to ``policy`` on ``task`` and save it into ``out_dir``.

    ``train`` sets the head's optimisation (its ``horizon`` is the cosine horizon: training
    ends there or when the budget is spent); its ``seed`` and ``max_minutes`` come from
    ``config``. ``provenance`` adds entries to the saved record. An interrupted fit resumes its
    training from ``<out_dir>.train_state``.
    """
    fit = _Fit("eagle", policy, tokenizer, task, out_dir, config)
    train = (train if train is not None else EagleTrainConfig.flat(horizon=2000)).updated(
        seed=fit.config.seed)
    pairs = [p for run in fit.harvest(True, progress) for p in harvest_pairs(run)]
    minutes, bar, on_step = fit.budget_bar("train eagle head", progress)
    cfg = train.updated(max_minutes=minutes)
    trainer = EagleTrainer(policy, config=cfg, checkpoint_dir=train_state_dir(fit.out_dir))
    trainer.trainer.on_step = on_step
    trainer.train(pairs)
    bar.close()
    head = trainer.head.eval()
    tau = heldout_tau(policy, tokenizer, EagleDrafter(head, policy), fit.heldout, fit.config)
    last = trainer.history.iloc[-20:].mean(numeric_only=True).to_dict()
    record = fit.record(trainer.trainer, len(pairs), tau, {
        "parameters": sum(p.numel() for p in head.parameters()), "train": asdict(cfg),
        "final": {k: round(v, 4) for k, v in last.items() if k not in ("step", "elapsed_s")},
        **(provenance or {})})
    head.save_pretrained(fit.out_dir, extra_files={"provenance.json": json.dumps(record,
                                                                                indent=2)})
    trainer.trainer.discard_checkpoint()
    return fit.report(Fitted("eagle", fit.out_dir, tau, trainer.steps_done, record))


def fit_drafter_lm(policy, tokenizer, task, out_dir,
                   config: FitConfig | None = None, lm: DrafterLMConfig | None = None,
                   save_dtype: torch.dtype | None = None, provenance: dict | None = None,
                   progress: bool = True) -> Fitted:
    """Fit a small-LM drafter to ``policy`` on ``task`` and save it into ``out_dir``.

    The model trains in float32 on the policy's device; ``save_dtype`` (e.g. float16) is what
    ships, and tau is measured on those weights. An interrupted fit resumes its training from
    ``<out_dir>.train_state``.
    """
    lm = lm if lm is not None else DrafterLMConfig()
    fit = _Fit("lm", policy, tokenizer, task, out_dir, config)
    lm_train_config(lm, 0.0, seed=fit.config.seed, max_minutes=1.0)  # bad values fail here
    runs = fit.harvest(False, progress)
    examples = [(r.prompt_ids + r.tokens, len(r.prompt_ids)) for run in runs for r in run.requests]
    weight = policy.get_output_embeddings().weight
    model = small_llama(policy.config.vocab_size, tokenizer, lm.hidden_size, lm.layers, lm.heads,
                        lm.kv_heads, lm.intermediate_size, policy.config.max_position_embeddings,
                        fit.config.seed).to(weight.device)
    minutes, bar, on_step = fit.budget_bar("train drafter LM", progress)
    cfg = lm_train_config(lm, 0.0, train_state_dir(fit.out_dir), desc="train drafter LM",
                          seed=fit.config.seed, max_minutes=minutes, progress=False)
    trainer = train_lm(model, examples, length_batches(examples, lm.tokens_per_batch,
                                                       seed=fit.config.seed),
                       tokenizer.pad_token_id, cfg, on_step=on_step)
    bar.close()
    if save_dtype is not None:
        model = model.to(save_dtype)  # tau is measured on what ships
    drafting = copy.deepcopy(model).to(dtype=weight.dtype).eval()
    tau = heldout_tau(policy, tokenizer, LMDrafter(drafting, tokenizer), fit.heldout, fit.config)
    record = fit.record(trainer, len(examples), tau, {
        "parameters": sum(p.numel() for p in model.parameters()), "lm": asdict(lm),
        **(provenance or {})})
    save_model(model, tokenizer, fit.out_dir, extra_files={"provenance.json": json.dumps(
        record, indent=2)})
    trainer.discard_checkpoint()
    return fit.report(Fitted("lm", fit.out_dir, tau, trainer.steps_done, record))


def fitted_from(path: str | os.PathLike) -> Fitted:
    """The :class:`Fitted` of a folder a fit saved (its ``provenance.json``)."""
    path = Path(path)
    record = json.loads((path / "provenance.json").read_text())
    return Fitted(record["kind"], path, float(record["tau"]), int(record["steps"]), record,
                  reused=True)
