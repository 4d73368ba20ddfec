"""The one training loop of the workbench: a loss, a budget or a stop signal, an LR schedule,
clipping, a progress bar, a history table, and atomic checkpoints that resume exactly.

Every recipe trains through :class:`Trainer`: the default policy and its small-LM drafter
(``zoo``), the EAGLE head (``speculative.train``), and later GRPO and distillation. The caller
brings the model, a loss function and a batch source; the trainer owns the optimizer, the step
counter and its own random generator, so that

- an interrupted run resumed from its checkpoint ends with bitwise the same weights as an
  uninterrupted one (the batch source is indexed by step, the LR is a pure function of the step,
  and the generator's state travels in the checkpoint);
- ``run(steps=n)`` twice is ``run(steps=2n)`` once, so training can go on a few steps at a time
  between rollouts (the spot trainer, the EAGLE head during RL);
- the caller's model keeps its flags: ``requires_grad`` and train/eval mode are set for the
  run and restored on the way out, exceptions included;
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

from .atomic import atomic_dir, recover_dir
from .train_config import SCHEDULES, TrainConfig, lr_at

__all__ = ["TrainConfig", "Trainer", "lr_at", "isolated_rng", "train_state_dir", "SCHEDULES",
           "CHECKPOINT_FILE"]

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
        out["steps"] = config.steps
    return out


class Trainer:
    """Trains ``model`` by AdamW on ``loss_fn``; keeps its optimizer between :meth:`run` calls.

    Args:
        model: the module whose parameters are trained; its ``state_dict`` is checkpointed.
        loss_fn: ``loss_fn(batch, generator) -> loss`` or ``(loss, metrics)``: a scalar tensor
            and a dict of scalars (they become history columns). Draw any randomness from
            ``generator`` (a CPU ``torch.Generator``): it is the trainer's, and checkpointed.
        batches: the batch of step ``s`` (0-based): ``batches(s)`` if callable, else
            ``batches[s % len(batches)]``. Indexed by step, so a resumed run sees the same data.
            Assign ``trainer.batches`` to train on new data (new rollouts) from the next step.
        config: a :class:`TrainConfig`.
        params: the parameters to train (all belong to ``model``); default: those of ``model``
            that require grad now. The others are held frozen during a run.
        frozen: other modules the loss uses but must not train (a policy, a teacher): eval
            mode and no grad during a run, their flags restored afterwards.
        on_step: ``on_step(trainer)`` after every step (snapshots, logging).
    """

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, batches: Callable | Sequence,
                 config: TrainConfig | None = None, *, params=None, frozen=(),
                 on_step: Callable[["Trainer"], Any] | None = None):
        self.config = config if config is not None else TrainConfig()
        self.config.validate()
        self.model, self.loss_fn, self.on_step = model, loss_fn, on_step
        self.batches = batches
        self.frozen = list(frozen)
        self.params = self._trainable(model, params)
        c = self.config
        self.optimizer = torch.optim.AdamW(self.params, lr=lr_at(0, c), betas=tuple(c.betas),
                                           weight_decay=c.weight_decay, eps=c.eps)
        self.generator = torch.Generator().manual_seed(c.seed)
        self.step = 0             # optimizer steps taken so far
        self.elapsed_s = 0.0      # training seconds so far, resumed runs included
        self.stop_reason = None   # why the last run ended: "steps", "stop" or "time"
        self._rows: list[dict] = []
        self._saved_step = None
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
    def batches(self):
        return self._batches

    @batches.setter
    def batches(self, source) -> None:
        if not callable(source) and not (hasattr(source, "__getitem__") and len(source) > 0):
            raise ValueError(f"batches must be a callable step -> batch or a non-empty "
                             f"sequence, got {type(source).__name__}")
        self._batches = source

    def _batch(self, step: int):
        if callable(self._batches):
            return self._batches(step)
        return self._batches[step % len(self._batches)]

    @property
    def history(self) -> pd.DataFrame:
        """One row per step: step, loss, lr, grad_norm, the loss's metrics, elapsed_s."""
        if not self._rows:
            return pd.DataFrame(columns=["step", "loss", "lr", "grad_norm", "elapsed_s"])
        return pd.DataFrame(self._rows)

    # -- the loop -------------------------------------------------------------------------

    def run(self, steps: int | None = None,
            stop: Callable[[int], bool] | None = None) -> pd.DataFrame:
        """Train ``steps`` more steps (default: up to ``config.steps`` in all); returns the history.

        ``stop(step)`` is asked before every step (``step`` = steps taken so far); ``True``
        ends the run there, as the spot trainer does when rollout needs the worker. The run
        also ends at the wall-clock cap. Either way it checkpoints (with ``checkpoint_dir``)
        and can be continued or resumed later; ``stop_reason`` says why it ended.
        """
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or steps < 0):
            raise ValueError(f"run(steps=...) must be an integer >= 0 or None, got {steps!r}")
        budget = max(0, self.config.steps - self.step) if steps is None else steps
        self.stop_reason = "steps"
        bar = tqdm(total=self.step + budget, initial=self.step, desc=self.config.desc,
                   disable=not self.config.progress)
        try:
            with self._flags():
                self._loop(budget, stop, bar)
        finally:
            bar.close()
        if self.config.checkpoint_dir is not None and self._saved_step != self.step:
            self.save_checkpoint()
        return self.history

    def _loop(self, budget: int, stop, bar) -> None:
        # the clock counts this run's time on top of earlier runs', not the gaps between runs
        self._t0 = time.perf_counter() - self.elapsed_s
        last_ckpt = self.elapsed_s
        for _ in range(budget):
            reason = self._stop_reason(stop)
            if reason:
                self.stop_reason = reason
                return
            row = self._one_step()
            bar.update(1)
            self._report(row, bar)
            if self.on_step is not None:
                self.on_step(self)
            if self._checkpoint_due(last_ckpt):
                self.save_checkpoint()
                last_ckpt = self.elapsed_s
            self.elapsed_s = time.perf_counter() - self._t0

    def _stop_reason(self, stop) -> str | None:
        if self.elapsed_s >= self.config.max_minutes * 60:
            if self.config.progress or self.config.log_every:
                print(f"wall-clock cap of {self.config.max_minutes:.1f} min reached "
                      f"at step {self.step}", flush=True)
            return "time"
        if stop is not None and stop(self.step):
            return "stop"
        return None

    def _one_step(self) -> dict:
        lr = lr_at(self.step, self.config)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss, metrics = self._loss(self._batch(self.step))
        loss.backward()
        clip = self.config.clip_norm if self.config.clip_norm is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
        self.optimizer.step()
        self.step += 1
        self.elapsed_s = time.perf_counter() - self._t0
        row = {"step": self.step, "loss": loss.item(), "lr": lr, "grad_norm": grad_norm.item(),
               **metrics, "elapsed_s": self.elapsed_s}
        self._rows.append(row)
        return row

    def _loss(self, batch):
        out = self.loss_fn(batch, self.generator)
        loss, metrics = out if isinstance(out, tuple) else (out, {})
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TypeError(f"loss_fn must return a scalar tensor (or (loss, metrics)), got "
                            f"{type(loss).__name__} of shape {getattr(loss, 'shape', None)}")
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {self.step}; the weights "
                                     "were not updated (lower lr, or check the batch)")
        return loss, {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}

    def _report(self, row: dict, bar) -> None:
        every = self.config.log_every or 20
        if self.step % every:
            return
        recent = self._rows[-every:]
        mean = sum(r["loss"] for r in recent) / len(recent)
        bar.set_postfix(loss=f"{mean:.4f}")
        if self.config.log_every:
            print(f"{self.config.desc} step {self.step} loss {mean:.4f} lr {row['lr']:.3g} "
                  f"elapsed {self.elapsed_s:.0f}s", flush=True)

    def _checkpoint_due(self, last_ckpt_s: float) -> bool:
        c = self.config
        if c.checkpoint_dir is None:
            return False
        by_steps = c.checkpoint_every and self.step % c.checkpoint_every == 0
        return bool(by_steps) or self.elapsed_s - last_ckpt_s >= c.checkpoint_every_s

    @contextmanager
    def _flags(self) -> Iterator[None]:
        """Train mode and grads for the run; every module's and parameter's flags come back."""
        roots = [self.model, *self.frozen]
        grads = [(p, p.requires_grad) for r in roots for p in r.parameters()]
        modes = [(m, m.training) for r in roots for m in r.modules()]
        try:
            self.model.train(self.config.train_mode).requires_grad_(False)
            for f in self.frozen:  # after the model: a frozen submodule stays frozen
                f.eval().requires_grad_(False)
            for p in self.params:
                p.requires_grad_(True)
            yield
        finally:
            for p, flag in grads:
                p.requires_grad_(flag)
            for m, flag in modes:
                m.training = flag

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue exactly where this one is."""
        return {"format": _FORMAT, "step": self.step, "elapsed_s": self.elapsed_s,
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
        self.step, self.elapsed_s = int(state["step"]), float(state["elapsed_s"])
        self._rows = list(state["history"])
        self._saved_step = self.step

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        """Write the checkpoint folder atomically: an interruption leaves the previous one."""
        path = Path(path if path is not None else self.config.checkpoint_dir)
        state = self.state_dict()
        with atomic_dir(path) as tmp:
            torch.save(state, tmp / CHECKPOINT_FILE)
        self._saved_step = self.step
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
        state = torch.load(path / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
        self.load_state_dict(state, where=f"the checkpoint in {str(path)!r}")
        if self.config.progress:
            print(f"resuming from {path} at step {self.step}", flush=True)

    def discard_checkpoint(self) -> None:
        """Delete the checkpoint folder (a finished recipe's train state has served)."""
        if self.config.checkpoint_dir is not None:
            recover_dir(self.config.checkpoint_dir)
            shutil.rmtree(self.config.checkpoint_dir, ignore_errors=True)
            self._saved_step = None
