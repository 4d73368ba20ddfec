"""Dynamic dispatch on the cluster simulator: requests placed when a worker frees, in an order
a policy gives, and Seer's divided rollout (arXiv 2511.14617), against static placement.

Why: ``simulate`` and ``remedies.run_rollout`` deal a step's requests round-robin and each
worker decodes its own share: which worker gets the long requests is luck. Seer's answer to
the tail is placement: the longest predicted requests first, from one shared queue, and a
running request moved to an idle worker. This module replays one rollout under each
placement policy (:data:`POLICIES`), so that the what-if can ask "Seer's scheduling, TLT, or
both?" at any N (:func:`seer_whatif`).

The rollout (one synchronous RL step, an event loop in sim time):

- each worker decodes at most ``max_batch`` rows at once (None: its round-robin share,
  ``ceil(R / N)``, so every request starts at once as ``simulate_rollout`` assumes); a
  finished row's slot is refilled at once with the next waiting request, whose prefill is
  one step of the rows admitted together (``StepCost`` ``prefill`` at their count, which
  emits each row's first token), as ``remedies.run_rollout`` does;
- a step costs ``StepCost.seconds`` at its live batch and emits one token per row
  (``rule="plain"``), or, under TLT's adaptive engine at its limit (``rule="bandit"``), the
  arm with the fewest seconds per token at that batch, emitting its tau per row (tau's
  expected value, as ``simulate`` takes it);
- the workers advance in sim-time order: the worker whose next event (a row finishing, a
  prefill ending) comes first goes next (ties: the lower worker), as ``LocalBackend.
  map_steps`` orders the harness's workers.

The policies (the requests *as drawn* are whole groups in order, request ``i`` the ``i``-th):

- ``static`` (the default): dealt round-robin as drawn (request ``i`` to worker ``i mod
  N``), each worker its own queue: today's layout, the same numbers as ``simulate_rollout``
  (no cap) and ``remedies.run_rollout`` (a cap);
- ``as_drawn``: the first batch of each worker dealt round-robin as drawn, the rest in one
  shared queue: the next request goes to the first worker to free a slot;
- ``longest_first``: the same, the order by predicted length, longest first (Seer's
  context-aware scheduling; the harness's ``seer_schedule`` keeps per-worker queues dealt in
  that order, which ``schedule_queues=True`` replays);
- ``divided``: ``longest_first``, and when a worker holds nothing while the queue is empty,
  it takes running requests of the worker that runs the most (two rows at least): of the
  moves of that worker's ``k`` longest predicted unmoved rows (``k`` up to half its rows),
  the one that ends both workers soonest, when that is sooner than the source alone would
  end (predicted lengths; decode steps at the cost curve; the re-prefill of the moved rows'
  prompts and tokens at ``prefill_per_token`` seconds per context token). The source lets
  them go after its step in flight; the receiving worker re-prefills them from then (that
  step emits no token), and each request moves at most once: the harness's ``seer_divided``
  (``DividedDispatch.worth_moving``).

Predictions (:func:`predicted_lengths`): the true length times log-normal noise
(``oracle``), or the mean of the group's other responses (``siblings``: Seer's observation
that a group's responses run alike; the harness's predictor learns them online as siblings
finish, which this static stand-in knows from the start).

Where each part lives (this module is their one public face; the names below import from
here): the placement (the policies, the predictors, a policy's deal) in ``cluster.placement``,
the event loop (:func:`simulate_dispatch`) in ``cluster.dispatch_loop``, and the what-if
table (:func:`seer_whatif`) in ``cluster.seer_table``.
"""
from .dispatch_loop import DispatchRun, simulate_dispatch
from .placement import POLICIES, PREDICTORS, RULES, predicted_lengths, prefill_per_token
from .seer_table import SEER_SETTINGS, seer_answer, seer_metrics, seer_whatif

__all__ = ["POLICIES", "RULES", "PREDICTORS", "DispatchRun", "predicted_lengths",
           "prefill_per_token", "simulate_dispatch", "SEER_SETTINGS", "seer_whatif",
           "seer_answer", "seer_metrics"]
