"""Seer's context-aware scheduling (arXiv 2511.14617) as an RL variant, ``seer_schedule``:
a rollout's requests start in order of predicted length, longest first, across workers.

The requests keep the uids they are drawn with (the order the ``Sampler`` gives is the one
drawn), so every token is the one a run without the variant samples (coupled draws: a pure
hash of seed, uid and position); only where and when each request runs changes. The workers
advance together in sim-time order (``LocalBackend.map_steps``; on Ray in rounds,
``rollout.ray_steps``) under a :class:`SeerDispatch`:

- before the first step the requests are dealt round-robin, longest predicted first, so
  that each worker admits its share longest first;
- before each step of a worker its queue is sorted again, longest predicted first, with
  what the group's siblings on *every* worker show by then.

**Predictors** of a response's length in tokens (:class:`LengthPredictor`), each one's
error recorded per RL step in the run's history (``seer_mae_<predictor>``, the mean
absolute error in tokens over the requests it predicted when they started, and
``seer_n_<predictor>``, how many):

- ``siblings``: the group's other responses in this rollout, on any worker: the first
  finished one's length, and no less than the furthest advanced one's tokens so far (that
  alone while none finished; none before a sibling has a token);
- ``history``: the mean length of the prompt's responses at its earlier RL steps (none for
  a prompt not seen yet);
- ``prompt``: from the prompt alone, a least-squares line of length on prompt tokens fitted
  on every earlier step's responses; before two distinct prompt lengths were seen, the
  prompt's size in tokens.

The order goes by a finished sibling's length where there is one, else by ``history``, else
by ``prompt``, never less than the furthest advanced sibling (``used``). A request moved
mid-generation (``seer_divided``) is not predicted again. Errors are counted for the
responses that ended in the rollout (a partial rollout's cut segment is no length).
"""
from __future__ import annotations

import math
from collections import defaultdict

from ...rollout.dispatch import Dispatch
from .trainer import RemedyTrainer

__all__ = ["LengthPredictor", "SeerDispatch", "SeerTrainer", "PREDICTORS"]

PREDICTORS = ("siblings", "history", "prompt", "used")
"""The predictors whose errors the history records (``seer_mae_<name>``, ``seer_n_<name>``);
``used`` is the prediction the order went by."""


class LengthPredictor:
    """The run's memory of response lengths: per prompt (its token ids) the lengths of its
    responses at earlier steps, and the ``(prompt tokens, length)`` pairs the baseline line
    is fitted on. Picklable (a checkpoint holds it, so a resumed run predicts as a straight
    one)."""

    def __init__(self, keep: int = 4096):
        self.keep = keep
        self.lengths: dict[tuple, list[int]] = defaultdict(list)
        self.pairs: list[tuple[int, int]] = []
        self.line: tuple[float, float] | None = None  # (intercept, slope)

    def history(self, prompt_ids) -> float | None:
        seen = self.lengths.get(tuple(prompt_ids))
        return sum(seen) / len(seen) if seen else None

    def prompt(self, prompt_ids) -> float:
        if self.line is None:
            return float(len(prompt_ids))
        a, b = self.line
        return max(1.0, a + b * len(prompt_ids))

    def learn(self, finished: list[tuple[tuple, int]]) -> None:
        """After a rollout: ``[(prompt ids, response length)]`` of the responses that ended;
        the line is fitted again on the latest ``keep`` pairs."""
        for ids, length in finished:
            self.lengths[tuple(ids)].append(int(length))
            self.pairs.append((len(ids), int(length)))
        self.pairs = self.pairs[-self.keep:]
        xs = [x for x, _ in self.pairs]
        if len(set(xs)) < 2:
            return
        n, mx = len(xs), sum(xs) / len(xs)
        my = sum(y for _, y in self.pairs) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        sxy = sum((x - mx) * (y - my) for x, y in self.pairs)
        slope = sxy / sxx
        self.line = (my - slope * mx, slope)


class SeerDispatch(Dispatch):
    """One rollout's placement by predicted length (module docstring). ``live[i]`` is
    request ``i``'s ``(Group, Response)`` (its ``prompt_id`` is ``i``); ``predictor`` the
    run's :class:`LengthPredictor`; ``errors`` collects, per predictor, the absolute errors
    of this rollout (the trainer's per-step figures)."""

    def __init__(self, live: list, predictor: LengthPredictor, errors: dict | None = None):
        self.live, self.predictor = live, predictor
        self.errors = errors if errors is not None else defaultdict(list)
        self.group = [id(g) for g, _ in live]
        self.members: dict[int, list[int]] = defaultdict(list)
        for i, key in enumerate(self.group):
            self.members[key].append(i)
        self.prior = [self._prior(g, r) for g, r in live]
        self.outputs: dict[int, object] = {}      # prompt_id -> RequestOutput (every run's)
        self.predicted: dict[int, dict] = {}      # prompt_id -> predictions at its start
        self.moves = 0                            # requests moved mid-generation

    def _prior(self, group, response) -> tuple[float | None, float]:
        ids = list(group.prompt_ids)
        return self.predictor.history(ids), self.predictor.prompt(ids)

    # ---- predictions ----------------------------------------------------------------------
    def so_far(self, i: int) -> int:
        """Request ``i``'s response tokens so far (earlier steps' and this rollout's)."""
        out = self.outputs.get(i)
        return len(self.live[i][1].tokens) + (len(out.tokens) if out is not None else 0)

    def siblings(self, i: int) -> float | None:
        """The ``siblings`` predictor (:meth:`sibling_view`'s value)."""
        return self.sibling_view(i)[0]

    def sibling_view(self, i: int) -> tuple[float | None, bool]:
        """``(the first finished sibling's length, no less than the longest sibling's tokens
        so far (finished or running: a lower bound); that lower bound alone while none
        finished; None when no sibling has a token, whether a sibling finished)``."""
        first, furthest = None, 0
        for j in self.members[self.group[i]]:
            if j == i:
                continue
            out = self.outputs.get(j)
            furthest = max(furthest, self.so_far(j))
            if out is not None and out.finish and (first is None or out.end_s < first[0]):
                first = (out.end_s, self.so_far(j))
        for r in self.live[i][0].responses:  # siblings that ended at an earlier step
            if r.done and first is None:
                first = (-math.inf, len(r.tokens))
        if first is not None:
            return float(max(first[1], furthest)), True
        return (float(furthest) if furthest > 0 else None), False

    def predictions(self, i: int) -> dict:
        """Request ``i``'s predicted length by each predictor (None: no value), and the one
        the order uses: a finished sibling's, else the prompt's history, else the line on
        its size, never less than the furthest advanced sibling."""
        history, prompt = self.prior[i]
        siblings, finished = self.sibling_view(i)
        prior = history if history is not None else prompt
        used = siblings if finished else max(prior, siblings or 0.0)
        return {"siblings": siblings, "history": history, "prompt": prompt, "used": used}

    def left(self, out) -> float:
        """Tokens request ``out`` is predicted to have left (at least 1)."""
        return max(1.0, self.predictions(out.prompt_id)["used"] - self.so_far(out.prompt_id))

    def longest_first(self, requests) -> list:
        """``requests`` by predicted length, longest first (ties: as drawn)."""
        used = {r.prompt_id: self.predictions(r.prompt_id)["used"] for r in requests}
        return sorted(requests, key=lambda r: (-used[r.prompt_id], r.prompt_id))

    def note_starts(self, run) -> None:
        """Record the predictions of the requests that join ``run``'s batch at its next step
        (those it admits first from its queue), once each."""
        if not run.refill_due():
            return
        joining = list(run.queue)[:max(1, run.cap - len(run.running))]
        for r in joining:
            if r.prompt_id not in self.predicted and not r.tokens:
                self.predicted[r.prompt_id] = self.predictions(r.prompt_id)

    # ---- the Dispatch hooks -----------------------------------------------------------------
    def begin(self, runs) -> None:
        for run in runs:
            for out in run.outputs:
                self.outputs[out.prompt_id] = out
        everything = [r for run in runs for r in run.take_queued([q.uid for q in run.queue])]
        self.deal(self.longest_first(everything), runs)

    def deal(self, requests, runs) -> None:
        """Queue ``requests`` round-robin on ``runs``, in their order."""
        for k, run in enumerate(runs):
            run.give_queued(requests[k::len(runs)])

    def before(self, run, runs) -> None:
        run.order_queue(self.longest_first(list(run.queue)))
        self.note_starts(run)

    def lost(self, run, requests, runs) -> None:
        """A lost worker's share, from scratch: the predictors read the fresh outputs from
        now on, and the share is dealt as the default deals it (the earliest survivor
        first), longest predicted first."""
        self.adopt(requests)
        super().lost(run, self.longest_first(requests), runs)

    def adopt(self, requests) -> None:
        """Read ``requests`` (outputs run again from scratch) where their uids' old outputs
        were."""
        for out in requests:
            self.outputs[out.prompt_id] = out

    def end(self, runs) -> None:
        """The rollout is over: each predictor's error on the responses that ended, and
        what they teach the predictor."""
        finished = []
        for i, out in self.outputs.items():
            if out.finish != "eos" and not self._at_budget(i, out):
                continue
            length = self.so_far(i)
            finished.append((tuple(self.live[i][0].prompt_ids), length))
            for name, value in self.predicted.get(i, {}).items():
                if value is not None:
                    self.errors[name].append(abs(value - length))
        self.errors["moves"].append(self.moves)
        self.predictor.learn(finished)

    def _at_budget(self, i: int, out) -> bool:
        """Whether request ``i`` ended at its whole length budget (a ``length`` finish that
        is not a partial rollout's segment)."""
        cap = out.max_new_tokens
        return out.finish == "length" and (cap is None or len(out.tokens) >= cap)


def step_figures(errors: dict) -> dict:
    """The history's columns from one step's ``errors`` (:class:`SeerDispatch`)."""
    row = {}
    for name in PREDICTORS:
        values = errors.get(name, [])
        row[f"seer_mae_{name}"] = sum(values) / len(values) if values else float("nan")
        row[f"seer_n_{name}"] = len(values)
    row["seer_moves"] = sum(errors.get("moves", []))
    return row


class SeerTrainer(RemedyTrainer):
    """A ``RemedyTrainer`` whose rollouts run under a Seer dispatch (``dispatch_cls``), with
    the run's :class:`LengthPredictor` kept in its checkpoint and, in each step's row, each
    predictor's error (:func:`step_figures`) and the re-prefills' count and seconds on the
    sim clock (``seer_reprefills``, ``seer_reprefill_s``)."""

    def __init__(self, *args, dispatch_cls=SeerDispatch, **kw):
        self.predictor = LengthPredictor()
        self.dispatch_cls = dispatch_cls
        self._errors: dict = defaultdict(list)
        super().__init__(*args, dispatch=self._dispatch, **kw)

    def _dispatch(self, live):
        return self.dispatch_cls(live, self.predictor, self._errors)

    def _step(self) -> dict:
        self._errors.clear()
        row = super()._step()
        row.update(step_figures(self._errors))
        moved = [s.timeline.steps for s in self.last]
        rows = [t[t["moved_from"].notna()] for t in moved]
        row["seer_reprefills"] = int(sum(len(r) for r in rows))
        row["seer_reprefill_s"] = float(sum((r["end_s"] - r["start_s"]).sum() for r in rows))
        return row

    def _own_state(self) -> dict:
        return {**super()._own_state(), "seer_predictor": self.predictor}

    def _load_own_state(self, state: dict) -> None:
        super()._load_own_state(state)
        self.predictor = state.get("seer_predictor", self.predictor)
