"""The one training loop of the workbench: one optimizer step at a time, and around it a
budget or a stop signal, an LR schedule, clipping, a progress bar, a history table, and atomic
checkpoints that resume exactly.

Every recipe trains through :class:`Trainer`: the default policy and its small-LM drafter
(``zoo``, ``lm_train``), the EAGLE head (``speculative.train``), GRPO's policy updates
(``rl.grpo``) and distillation (``compress.distill``). The caller brings the model and a loss
function; the trainer owns the optimizer, the step counter and its own random generator.
:meth:`Trainer.step` takes exactly one optimizer step on the batch it is given; callers whose
data changes between steps (GRPO's minibatches, the spot trainer's harvest) call it in their
own loop, and :meth:`Trainer.run` is the recipes' loop over a batch source indexed by step.
So that

- an interrupted run resumed from its checkpoint ends with bitwise the same weights as an
  uninterrupted one (the batch source is indexed by step, the LR is a pure function of the step,
  and the generator's state travels in the checkpoint);
- ``run(batches, steps=n)`` twice is ``run(batches, steps=2n)`` once, so training can go on a
  few steps at a time between rollouts (the spot trainer, the EAGLE head during RL);
- the caller's model keeps its flags: ``requires_grad`` and train/eval mode are set once when
  a training session starts (``with trainer.training():``) and restored when it ends,
  exceptions included;
- the global RNGs are neither reseeded nor drawn from: randomness a loss needs (EAGLE's input
  noise, sampling) comes from the generator passed to it.

Layering: this module sits beside ``rollout/`` and imports only ``atomic`` and its config
(``train_config``) from the workbench.
"""
from __future__ import annotations

import math
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pandas as pd
import torch
from .progress import tqdm

from .atomic import atomic_dir, load_torch_file, recover_dir
from .checks import check_int
from .train_config import TrainConfig, lr_at

__all__ = ["TrainConfig", "Trainer"]

CHECKPOINT_FILE = "trainer.pt"
_FORMAT = 1
# Fields that decide the arithmetic of a step: a checkpoint only resumes under equal values.
_ARITHMETIC = ("lr", "schedule", "warmup", "lr_floor", "betas", "weight_decay", "eps",
               "clip_norm", "seed", "train_mode")


@contextmanager
def isolated_rng(seed: int) -> Iterator[None]:
    """Run a block (a model's initialisation) with the CPU RNG seeded to ``seed``, then put the
    caller's RNG state back: seeded initialisation without touching anyone else's stream."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield


def train_state_dir(out_dir: str | os.PathLike) -> Path:
    """Where a recipe that writes ``out_dir`` keeps its resumable train state (a sibling)."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + ".train_state")


def _arithmetic(config: TrainConfig) -> dict:
    out = {k: getattr(config, k) for k in _ARITHMETIC}
    out["betas"] = [float(b) for b in config.betas]
    if config.schedule == "cosine":  # the horizon shapes every step's LR
        out["steps"] = config.horizon
    return out


def batch_source(batches: Callable | Sequence) -> Callable[[int], Any]:
    """The batch of step ``s`` (0-based): ``batches(s)`` if callable, else
    ``batches[s % len(batches)]``; indexed by step, so a resumed run sees the same data."""
    if callable(batches):
        return batches
    if not (hasattr(batches, "__getitem__") and hasattr(batches, "__len__") and len(batches)):
        raise ValueError(f"batches must be a callable step -> batch or a non-empty "
                         f"sequence, got {type(batches).__name__}")
    return lambda step: batches[step % len(batches)]


class Trainer:
    """Trains ``model`` by AdamW on ``loss_fn``, one :meth:`step` at a time; keeps its
    optimizer, step counter and generator between steps and runs.

    Args:
        model: the module whose parameters are trained; its ``state_dict`` is checkpointed.
        loss_fn: ``loss_fn(batch, generator) -> loss`` or ``(loss, metrics)``: a scalar tensor
            and a dict of scalars (they become history columns). Draw any randomness from
            ``generator`` (a CPU ``torch.Generator``): it is the trainer's, and checkpointed.
        config: a :class:`TrainConfig`.
        params: the parameters to train (all belong to ``model``); default: those of ``model``
            that require grad now. The others are held frozen during training.
        frozen: other modules the loss uses but must not train (a policy, a teacher): eval
            mode and no grad during training, their flags restored afterwards.
        on_step: ``on_step(trainer)`` after every step of :meth:`run` (snapshots, logging).
    """

    def __init__(self, model: torch.nn.Module, loss_fn: Callable,
                 config: TrainConfig | None = None, *, params=None, frozen=(),
                 on_step: Callable[["Trainer"], Any] | None = None):
        self.config = config if config is not None else TrainConfig()
        self.config.validate()
        self.model, self.loss_fn, self.on_step = model, loss_fn, on_step
        self.frozen = list(frozen)
        self.params = self._trainable(model, params)
        c = self.config
        self.optimizer = torch.optim.AdamW(self.params, lr=lr_at(0, c), betas=tuple(c.betas),
                                           weight_decay=c.weight_decay, eps=c.eps)
        self.generator = torch.Generator().manual_seed(c.seed)
        self.steps_done = 0       # optimizer steps taken so far
        self.stop_reason = None   # why the last run ended: "steps", "stop" or "time"
        self._rows: list[dict] = []
        self._saved_step = None
        self._sessions = 0        # nesting depth of training(): flags are set by the outermost
        self._elapsed_closed = 0.0  # seconds of the sessions that ended (resumed runs' too)
        self._session_start = 0.0
        if c.checkpoint_dir is not None and c.resume and self.has_checkpoint(c.checkpoint_dir):
            self.load_checkpoint(c.checkpoint_dir)

    @staticmethod
    def _trainable(model, params) -> list:
        if params is None:
            params = [p for p in model.parameters() if p.requires_grad]
        params = list(params)
        if not params:
            raise ValueError("nothing to train: the model has no parameter that requires grad "
                             "and no params were given")
        own = {id(p) for p in model.parameters()}
        if any(id(p) not in own for p in params):
            raise ValueError("params must belong to the model (the checkpoint saves the "
                             "model's state_dict)")
        return params

    @property
    def elapsed_s(self) -> float:
        """Seconds spent in training sessions so far, resumed runs included (the clock of
        ``max_minutes``): the gaps between sessions (rollouts) do not count."""
        live = time.perf_counter() - self._session_start if self._sessions else 0.0
        return self._elapsed_closed + live

    @property
    def history(self) -> pd.DataFrame:
        """One row per step: step, loss, lr, grad_norm, the loss's metrics, elapsed_s."""
        if not self._rows:
            return pd.DataFrame(columns=["step", "loss", "lr", "grad_norm", "elapsed_s"])
        return pd.DataFrame(self._rows)

    # -- one step -------------------------------------------------------------------------

    @contextmanager
    def training(self) -> Iterator["Trainer"]:
        """A training session: train mode (``config.train_mode``) and grads for the trained
        parameters, eval mode and no grad for the rest of the model and for ``frozen``; every
        module's and parameter's flags come back on exit, exceptions included. Sessions nest
        (only the outermost sets and restores), and the clock runs while one is open."""
        if self._sessions:
            self._sessions += 1
            try:
                yield self
            finally:
                self._sessions -= 1
            return
        roots = [self.model, *self.frozen]
        grads = [(p, p.requires_grad) for r in roots for p in r.parameters()]
        modes = [(m, m.training) for r in roots for m in r.modules()]
        try:
            self.model.train(self.config.train_mode).requires_grad_(False)
            for f in self.frozen:  # after the model: a frozen submodule stays frozen
                f.eval().requires_grad_(False)
            for p in self.params:
                p.requires_grad_(True)
            self._session_start = time.perf_counter()
            self._sessions = 1
            yield self
        finally:
            if self._sessions:
                self._elapsed_closed += time.perf_counter() - self._session_start
            self._sessions = 0
            for p, flag in grads:
                p.requires_grad_(flag)
            for m, flag in modes:
                m.training = flag

    def step(self, batch) -> dict:
        """Exactly one optimizer step on ``batch``: LR of this step, zero grads, loss,
        backward, clipping, AdamW. Returns (and records) its history row. Runs inside
        ``with trainer.training():``, which sets the flags once for all its steps."""
        if not self._sessions:
            raise RuntimeError("Trainer.step runs inside a training session: "
                               "`with trainer.training(): trainer.step(batch)` (the session "
                               "sets train mode and grads once and restores them)")
        lr = lr_at(self.steps_done, self.config)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss, metrics = self._loss(batch)
        loss.backward()
        clip = self.config.clip_norm if self.config.clip_norm is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
        self.optimizer.step()
        self.steps_done += 1
        row = {"step": self.steps_done, "loss": loss.item(), "lr": lr,
               "grad_norm": grad_norm.item(), **metrics, "elapsed_s": self.elapsed_s}
        self._rows.append(row)
        return row

    def _loss(self, batch):
        out = self.loss_fn(batch, self.generator)
        loss, metrics = out if isinstance(out, tuple) else (out, {})
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TypeError(f"loss_fn must return a scalar tensor (or (loss, metrics)), got "
                            f"{type(loss).__name__} of shape {getattr(loss, 'shape', None)}")
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {self.steps_done}; the "
                                     "weights were not updated (lower lr, or check the batch)")
        return loss, {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}

    # -- the recipes' loop ----------------------------------------------------------------

    def run(self, batches: Callable | Sequence, steps: int | None = None,
            stop: Callable[[int], bool] | None = None) -> pd.DataFrame:
        """Train ``steps`` more steps on ``batches`` (see :func:`batch_source`; default: up to
        ``config.horizon`` in all); returns the history.

        ``stop(step)`` is asked before every step (``step`` = steps taken so far); ``True``
        ends the run there, as the spot trainer does when rollout needs the worker. The run
        also ends at the wall-clock cap. Either way it checkpoints (with ``checkpoint_dir``)
        and can be continued or resumed later; ``stop_reason`` says why it ended.
        """
        source = batch_source(batches)
        budget = self._budget(steps)
        self.stop_reason = "steps"
        bar = tqdm(total=self.steps_done + budget, initial=self.steps_done,
                   desc=self.config.desc, disable=not self.config.progress)
        try:
            with self.training():
                self._loop(source, budget, stop, bar)
        finally:
            bar.close()
        if self.config.checkpoint_dir is not None and self._saved_step != self.steps_done:
            self.save_checkpoint()
        return self.history

    def _budget(self, steps) -> int:
        steps = check_int("run(steps=...)", steps, 0, optional=True)
        if steps is not None:
            return steps
        if self.config.horizon is None:
            raise ValueError("run() without steps trains up to TrainConfig.horizon, which is "
                             "None (open-ended training): pass steps=, or set a horizon")
        return max(0, self.config.horizon - self.steps_done)

    def _loop(self, source, budget: int, stop, bar) -> None:
        last_ckpt = self.elapsed_s
        for _ in range(budget):
            reason = self._stop_reason(stop)
            if reason:
                self.stop_reason = reason
                return
            row = self.step(source(self.steps_done))
            bar.update(1)
            self._report(row, bar)
            if self.on_step is not None:
                self.on_step(self)
            if self._checkpoint_due(last_ckpt):
                self.save_checkpoint()
                last_ckpt = self.elapsed_s

    def _stop_reason(self, stop) -> str | None:
        if self.elapsed_s >= self.config.max_minutes * 60:
            if self.config.progress or self.config.log_every:
                print(f"wall-clock cap of {self.config.max_minutes:.1f} min reached "
                      f"at step {self.steps_done}", flush=True)
            return "time"
        if stop is not None and stop(self.steps_done):
            return "stop"
        return None

    def _report(self, row: dict, bar) -> None:
        every = self.config.log_every or 20
        if self.steps_done % every:
            return
        recent = self._rows[-every:]
        mean = sum(r["loss"] for r in recent) / len(recent)
        bar.set_postfix(loss=f"{mean:.4f}")
        if self.config.log_every:
            print(f"{self.config.desc} step {self.steps_done} loss {mean:.4f} "
                  f"lr {row['lr']:.3g} elapsed {self.elapsed_s:.0f}s", flush=True)

    def _checkpoint_due(self, last_ckpt_s: float) -> bool:
        c = self.config
        if c.checkpoint_dir is None:
            return False
        by_steps = c.checkpoint_every and self.steps_done % c.checkpoint_every == 0
        return bool(by_steps) or self.elapsed_s - last_ckpt_s >= c.checkpoint_every_s

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue exactly where this one is."""
        return {"format": _FORMAT, "step": self.steps_done, "elapsed_s": self.elapsed_s,
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(), "history": list(self._rows),
                "config": _arithmetic(self.config)}

    def load_state_dict(self, state: dict, where: str = "the checkpoint") -> None:
        if state.get("format") != _FORMAT:
            raise ValueError(f"{where} has format {state.get('format')!r}; this trainer "
                             f"reads format {_FORMAT}")
        mine = _arithmetic(self.config)
        for key, value in state["config"].items():
            if mine.get(key) != value:
                raise ValueError(f"{where} was written with {key}={value!r}, this config has "
                                 f"{key}={mine.get(key)!r}; resuming would not reproduce the "
                                 "run. Use the same config or another checkpoint_dir")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.steps_done = int(state["step"])
        self._elapsed_closed = float(state["elapsed_s"])
        if self._sessions:  # loaded inside a session (a preempted step undone): the clock goes on
            self._elapsed_closed -= time.perf_counter() - self._session_start
        self._rows = list(state["history"])
        self._saved_step = self.steps_done

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        """Write the checkpoint folder atomically: an interruption leaves the previous one."""
        path = Path(path if path is not None else self.config.checkpoint_dir)
        state = self.state_dict()
        with atomic_dir(path) as tmp:
            torch.save(state, tmp / CHECKPOINT_FILE)
        self._saved_step = self.steps_done
        return path

    @staticmethod
    def has_checkpoint(path: str | os.PathLike) -> bool:
        recover_dir(path)  # an interrupted folder swap leaves the last checkpoint aside
        return (Path(path) / CHECKPOINT_FILE).is_file()

    def load_checkpoint(self, path: str | os.PathLike | None = None) -> None:
        """Continue from the checkpoint in ``path`` (default: ``config.checkpoint_dir``)."""
        path = Path(path if path is not None else self.config.checkpoint_dir)
        if not self.has_checkpoint(path):
            raise FileNotFoundError(f"no trainer checkpoint in {str(path)!r}: expected "
                                    f"{CHECKPOINT_FILE} (Trainer.save_checkpoint writes it)")
        state = load_torch_file(path / CHECKPOINT_FILE, "the trainer checkpoint",
                                f"delete the folder {str(path)!r} to train from the start, or "
                                "restore the file from a copy")
        self.load_state_dict(state, where=f"the checkpoint in {str(path)!r}")
        if self.config.progress:
            print(f"resuming from {path} at step {self.steps_done}", flush=True)

    def discard_checkpoint(self) -> None:
        """Delete the checkpoint folder (a finished recipe's train state has served)."""
        if self.config.checkpoint_dir is not None:
            recover_dir(self.config.checkpoint_dir)
            shutil.rmtree(self.config.checkpoint_dir, ignore_errors=True)
            self._saved_step = None
