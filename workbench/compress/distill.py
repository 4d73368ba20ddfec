"""Retraining a pruned model on the training harness: Minitron knowledge distillation
(``mode="kd"``, :func:`kd_loss` against a frozen teacher) and plain cross-entropy (``mode="ce"``:
the CE baseline, or training from scratch with a :func:`scratch_like` student) through one entry
point, with one data pipeline, optimizer and evaluation, and a history that counts the target
tokens seen, so notebooks compare them at equal token budgets. :func:`correct_teacher` first
fine-tunes a copy of the teacher on the distillation data. The student and its projections train
as one module (:class:`DistillModule`), so the harness's atomic checkpoint holds both and an
interrupted run resumes to bitwise the same weights. Batches are ``(ids, mask)`` pairs, or
``(ids, mask, scored)`` whose third tensor marks the tokens the losses count (a task's
responses and stop tokens, ``compress.data.distill_data``).

A retraining cannot hurt a good student: the learning rate warms up then decays by a cosine
(the default), and with held-out batches the weights of the best evaluation by held-out LM
loss, the starting point included, are kept and restored when the run reaches its horizon
(:mod:`.best`), so a student ends no worse on that set than it started.
"""
from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Sequence

import pandas as pd
import torch
from torch import nn

from ..models import save_model
from ..scalar_log import check_report_to, scalar_log
from ..train import Trainer, batch_source, isolated_rng, train_state_dir
from .best import BestWeights
from .data import distill_data, lm_loss
from .distill_config import DistillConfig, check_layer_pairs
from .kd_loss import forward_kl, kd_loss, token_ce

__all__ = ["DistillConfig", "Distiller", "correct_teacher", "scratch_like", "spread_layer_pairs",
           "distill"]


def spread_layer_pairs(student, teacher, count: int = 3) -> tuple[tuple[int, int], ...]:
    """``count`` (student, teacher) hidden-state pairs spread evenly over the student's depth,
    each student index matched to the teacher's at the same relative depth: the intermediate
    states of a model of any depth (``[(2, 2), (4, 4), (6, 6)]`` for two 6-layer models, fewer
    pairs when the student has fewer layers)."""
    s_layers = student.config.num_hidden_layers
    t_layers = teacher.config.num_hidden_layers
    picks = sorted({round(s_layers * (i + 1) / count) for i in range(count)} - {0})
    return tuple((s, round(s * t_layers / s_layers)) for s in picks)


def _check_models(student, teacher, config: DistillConfig) -> None:
    """What KD needs of the two models: a teacher, other than the student, with its vocabulary."""
    if teacher is None:
        raise ValueError("mode='kd' needs a teacher; pass one, or use mode='ce'")
    if teacher is student:
        raise ValueError("the teacher is the student itself; pass a copy (copy.deepcopy)")
    vocab_student, vocab_teacher = student.config.vocab_size, teacher.config.vocab_size
    if vocab_student != vocab_teacher:
        raise ValueError(f"vocabulary mismatch: the student has {vocab_student} tokens, the "
                         f"teacher {vocab_teacher}; KD needs one tokenizer for both")
    check_layer_pairs(config.layer_pairs, student, teacher)


def _projections(student, teacher, pairs, seed: int) -> nn.ModuleList:
    """One ``Linear(student hidden -> teacher hidden)`` per layer pair, drawn from ``seed``; the
    identity when the widths agree (a depth-pruned student's states are compared as they are)."""
    if not pairs:
        return nn.ModuleList()
    width_in, width_out = student.config.hidden_size, teacher.config.hidden_size
    weight = student.get_input_embeddings().weight
    with isolated_rng(seed):  # on the CPU: the draw does not depend on the device
        layers = [nn.Linear(width_in, width_out, bias=False) for _ in pairs]
    if width_in == width_out:
        for layer in layers:
            nn.init.eye_(layer.weight)
    return nn.ModuleList(layers).to(dtype=weight.dtype, device=weight.device)


class DistillModule(nn.Module):
    """What the harness optimizes and checkpoints: the student, its projections, and as extra
    state the evaluation rows and the best evaluated weights, so a resumed run also keeps the
    rows written and the best weights seen before."""

    def __init__(self, student: nn.Module, projections: nn.ModuleList):
        super().__init__()
        self.student, self.projections = student, projections
        self.evals: list[dict] = []
        self.best = BestWeights()

    def get_extra_state(self) -> dict:
        return {"evals": list(self.evals), "best": self.best.state()}

    def set_extra_state(self, state: dict) -> None:
        self.evals = list(state["evals"])
        self.best.load(state.get("best"))


def _device(model) -> torch.device:
    return model.get_input_embeddings().weight.device


@contextmanager
def _eval_mode(*models: nn.Module | None) -> Iterator[None]:
    """Eval mode for a measurement, in a run or not; each module's mode comes back."""
    modes = [(m, m.training) for model in models if model is not None for m in model.modules()]
    for module, _ in modes:
        module.training = False
    try:
        yield
    finally:
        for module, flag in modes:
            module.training = flag


@torch.no_grad()
def kl_to_teacher(student, teacher, batches, temperature: float = 1.0) -> float:
    """Token-mean KL(teacher || student) of next-token distributions over ``(ids, mask)``
    batches: how far the student still is from what it imitates."""
    total, count = 0.0, 0
    for ids, mask, *scored in batches:
        valid = (scored[0] if scored else mask)[:, 1:].to(_device(student))
        student_logits = _forward(student, ids, mask)[0]
        teacher_logits = _forward(teacher, ids, mask)[0].to(student_logits.device)
        tokens = int(valid.sum())
        total += float(forward_kl(student_logits, teacher_logits, valid, temperature)) * tokens
        count += tokens
    if count == 0:
        raise ValueError("no tokens to score: every sequence has at most one token")
    return total / count


def _forward(model, ids, mask, hidden: bool = False) -> tuple[torch.Tensor, tuple]:
    """``(logits, hidden states)`` on the model's device: logits at all positions but the last
    (its next token is not in the batch); states only when ``hidden`` (they cost memory)."""
    device = _device(model)
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                output_hidden_states=hidden)
    return out.logits[:, :-1], (out.hidden_states if hidden else ())


class Distiller:
    """Retrains ``student`` on ``batches`` by KD from ``teacher`` (or by CE), on the harness.

    Args:
        student: the HF model to train in place (with the projections of ``layer_pairs``).
        teacher: the HF model to imitate, frozen (eval mode, no grad) during every run; ignored
            (may be ``None``) when ``config.mode == "ce"``.
        batches: ``(ids, mask)`` of each step: a sequence (cycled) or a callable ``step ->
            batch``, as :class:`workbench.train.Trainer` takes them.
        config: a :class:`DistillConfig`.
        eval_batches: held-out ``(ids, mask)`` batches for :meth:`evaluate`, run before
            training, every ``eval_every`` steps and at the horizon; with
            ``config.keep_best`` the weights of the evaluation with the lowest LM loss are
            restored at the horizon (:attr:`restored` says which step; the ``best`` column
            of :attr:`evals` marks it). Empty: no evaluation, and the student ends with its
            last weights.
        checkpoint_dir: the harness's checkpoint folder; a run resumes from it when it holds one.
        desc: the progress bar's label.
        report_to: ``"none"`` or ``"tensorboard"`` (``workbench.scalar_log``): every step's
            numeric columns (loss and its terms, lr, grad_norm, tokens) and every evaluation
            (``eval/eval_loss``, ``eval/eval_kl``) as scalars, in ``run_dir/tensorboard``; a
            resumed run writes no step twice.
        run_dir: the run's folder, where its log goes (required with ``"tensorboard"``).
    """

    def __init__(self, student, teacher, batches, config: DistillConfig | None = None,
                 eval_batches: Sequence = (), checkpoint_dir: str | os.PathLike | None = None,
                 desc: str | None = None, report_to: str = "none",
                 run_dir: str | os.PathLike | None = None):
        self.config = config if config is not None else DistillConfig()
        self.config.validate()
        self.report_to, self.run_dir = check_report_to(report_to, run_dir), run_dir
        self._log = None  # opened by run(), where the resumed run stands
        kd = self.config.mode == "kd"
        if kd:
            _check_models(student, teacher, self.config)
        self.teacher = teacher if kd else None
        self.eval_batches = list(eval_batches)
        projections = _projections(student, teacher, self.config.layer_pairs,
                                   self.config.train.seed)
        self.module = DistillModule(student, projections)
        self.student, self.projections = self.module.student, self.module.projections
        self.batches = batch_source(batches)
        train = replace(self.config.train, checkpoint_dir=checkpoint_dir,
                        desc=desc or f"distill ({self.config.mode})")
        self.trainer = Trainer(self.module, self._loss, train,
                               frozen=[teacher] if kd else [], on_step=self._on_step)

    def _loss(self, batch, generator):
        """The harness's loss on one ``(ids, mask)`` batch; ``tokens`` counts its targets."""
        ids, mask, *scored = batch
        valid = (scored[0] if scored else mask)[:, 1:].to(_device(self.student))
        targets = ids[:, 1:].to(valid.device)
        tokens = int(valid.sum())
        c = self.config
        student_logits, student_states = _forward(self.student, ids, mask, bool(c.layer_pairs))
        if self.teacher is None:
            ce = token_ce(student_logits, targets, valid)
            return ce, {"ce": ce.detach(), "tokens": tokens}
        with torch.no_grad():
            teacher_logits, teacher_states = _forward(self.teacher, ids, mask,
                                                      bool(c.layer_pairs))
        loss, metrics = kd_loss(
            student_logits, teacher_logits.to(valid.device), valid, c.temperature,
            targets=targets, ce_weight=c.ce_weight,
            student_hidden=[student_states[s][:, :-1] for s, _ in c.layer_pairs],
            teacher_hidden=[teacher_states[t][:, :-1].to(valid.device) for _, t in c.layer_pairs],
            projections=self.projections)
        return loss, {**metrics, "tokens": tokens}

    def _on_step(self, trainer: Trainer) -> None:
        every = self.config.eval_every
        done = trainer.steps_done
        evaluated = None
        if done == self.config.train.horizon or (every and done % every == 0):
            evaluated = self.evaluate()
        if done == self.config.train.horizon:
            self._restore_best()
        if self.report_to != "none":
            self._log_step(trainer.history.iloc[-1].to_dict(), evaluated)

    def _log_step(self, row: dict, evaluated: dict | None) -> None:
        """One step's row to the run's log, with its evaluation when one ran after it (one
        write per step), and ``step_s`` (its share of the harness's wall seconds) for the
        log's time axis."""
        step_s = row["elapsed_s"] - self._elapsed_s
        self._elapsed_s = row["elapsed_s"]
        self._log.row(int(row["step"]), {**row, "step_s": step_s, "clock": "wall",
                                         **_eval_columns(evaluated)})

    def _restore_best(self) -> None:
        """Put back the best evaluated weights (the run is over), and say so when they are
        not the last ones."""
        best = self.module.best
        if best.restore(self.module) is None or best.step == self.trainer.steps_done:
            return
        if self.config.train.progress:
            last = self.module.evals[-1]
            print(f"{self.trainer.config.desc}: kept the step-{best.step} weights (held-out LM "
                  f"loss {best.loss:.4f}), the best of {len(self.module.evals)} evaluations; "
                  f"step {last['step']} had {last['eval_loss']:.4f}", flush=True)

    @property
    def restored(self) -> int | None:
        """The step whose weights the student holds after a finished run (the best evaluation
        by held-out LM loss); None before the horizon or without held-out batches."""
        if self.trainer.steps_done != self.config.train.horizon:
            return None
        return self.module.best.step

    def evaluate(self) -> dict | None:
        """Measure the student on the held-out batches now (LM loss; in KD also its KL to the
        teacher) and add the row to :attr:`evals`."""
        if not self.eval_batches:
            return None
        with _eval_mode(self.student, self.teacher):
            row = {"step": self.trainer.steps_done, "tokens_seen": self._tokens_seen(),
                   "eval_loss": lm_loss(self.student, self.eval_batches)}
            if self.teacher is not None:
                row["eval_kl"] = kl_to_teacher(self.student, self.teacher, self.eval_batches)
        self.module.evals.append(row)
        if self.config.keep_best:
            self.module.best.offer(self.module, row["step"], row["eval_loss"])
        return row

    def _tokens_seen(self) -> int:
        history = self.trainer.history
        return int(history["tokens"].sum()) if "tokens" in history else 0

    def run(self, steps: int | None = None, stop=None) -> pd.DataFrame:
        """Train ``steps`` more steps (default: up to ``config.train.horizon`` in all);
        ``stop(step)`` ends the run early (it checkpoints). Returns :attr:`history`."""
        done = self.trainer.steps_done  # rows are numbered from 1: step ``done`` is kept
        self._elapsed_s = self.trainer.elapsed_s
        self._log = scalar_log(self.report_to, self.run_dir, done + 1 if done else 0,
                               self._elapsed_s)
        try:
            if done == 0 and not self.module.evals:
                start = self.evaluate()  # the starting point of every curve
                if start is not None:
                    self._log.row(0, {"clock": "wall", **_eval_columns(start)})
            self.trainer.run(self.batches, steps, stop)
        finally:
            self._log.close()
        return self.history

    @property
    def history(self) -> pd.DataFrame:
        """One row per step: the harness's columns, the loss terms, ``tokens`` of the step and
        ``tokens_seen``, the target tokens trained on so far."""
        history = self.trainer.history
        if "tokens" in history:
            history["tokens_seen"] = history["tokens"].cumsum()
        return history

    @property
    def evals(self) -> pd.DataFrame:
        """One row per evaluation: step, tokens_seen, eval_loss (nats/token), eval_kl in KD,
        and ``best``: True on the evaluation with the lowest eval_loss so far, whose weights
        a finished run ends with."""
        columns = ["step", "tokens_seen", "eval_loss"]
        columns += ["eval_kl"] if self.teacher is not None else []
        table = pd.DataFrame(self.module.evals, columns=columns)
        table["best"] = table["step"] == self.module.best.step
        return table


def _eval_columns(row: dict | None) -> dict:
    """An evaluation's figures as log columns (``eval/eval_loss``, ``eval/eval_kl``)."""
    return {f"eval/{k}": v for k, v in (row or {}).items() if k.startswith("eval_")}


def correct_teacher(teacher, batches, steps: int = 20, lr: float = 1e-4,
                    config: DistillConfig | None = None,
                    checkpoint_dir: str | os.PathLike | None = None) -> nn.Module:
    """A copy of ``teacher`` fine-tuned for ``steps`` steps by plain LM cross-entropy on the
    distillation ``batches`` (Minitron's teacher correction: the teacher first adapts to the
    data it will teach on); ``teacher`` itself is left untouched. ``config`` gives the other
    optimisation fields (its mode and layer pairs are ignored)."""
    base = config if config is not None else DistillConfig.flat(progress=False)
    correction = base.updated(mode="ce", layer_pairs=(), horizon=steps, lr=lr)
    corrected = copy.deepcopy(teacher)
    Distiller(corrected, None, batches, correction, checkpoint_dir=checkpoint_dir,
              desc="correct teacher").run()
    return corrected


def scratch_like(model, seed: int = 0) -> nn.Module:
    """A freshly initialised model of ``model``'s architecture, dtype and device (drawn from
    ``seed``, the caller's RNG untouched): the from-scratch baseline for ``mode="ce"``."""
    weight = model.get_input_embeddings().weight
    with isolated_rng(seed):
        fresh = type(model)(copy.deepcopy(model.config))
    return fresh.to(dtype=weight.dtype, device=weight.device)


def distill(student, teacher, tokenizer, source: str | os.PathLike = "running_sum",
            num: int = 256, config: DistillConfig | None = None,
            out_dir: str | os.PathLike | None = None, eval_num: int = 32,
            max_len: int | None = None, report_to: str = "none",
            run_dir: str | os.PathLike | None = None
            ) -> tuple[nn.Module, pd.DataFrame, pd.DataFrame]:
    """Retrain ``student`` on ``num`` texts of ``source`` (:func:`distill_data`) by
    ``config.mode``; returns ``(student, history, evals)`` (:class:`Distiller`'s tables).

    With ``out_dir`` the student is saved there (``save_pretrained`` with the tokenizer,
    ``history.csv`` and ``evals.csv``) atomically at the end; ``<out_dir>.train_state`` holds
    the checkpoint an interrupted run resumes from, removed once the student is saved.
    ``report_to="tensorboard"`` logs every step (:class:`Distiller`'s) in ``run_dir``
    (default: ``<out_dir>.runs``, beside the student, whose folder is replaced whole).
    """
    config = config if config is not None else DistillConfig()
    config.validate()
    if out_dir is not None and Path(out_dir).is_file():
        raise FileExistsError(f"out_dir {str(out_dir)!r} is an existing file; pass a folder")
    if run_dir is None and out_dir is not None:
        run_dir = Path(out_dir).with_name(Path(out_dir).name + ".runs")
    check_report_to(report_to, run_dir)
    train, held_out = distill_data(tokenizer, source, num, eval_num, config.batch_size,
                                   config.train.seed, max_len)
    state = train_state_dir(out_dir) if out_dir is not None else None
    distiller = Distiller(student, teacher, train, config, held_out, checkpoint_dir=state,
                          report_to=report_to, run_dir=run_dir)
    distiller.run()
    history, evals = distiller.history, distiller.evals
    if out_dir is not None:
        save_model(student, tokenizer, out_dir,
                   extra_files={"history.csv": history.to_csv(index=False),
                                "evals.csv": evals.to_csv(index=False)})
        distiller.trainer.discard_checkpoint()
    return student, history, evals
