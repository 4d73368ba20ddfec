"""The step-level parts of notebook 11's composed variants that the remedy replay
(``cluster.remedies``) leaves out: TLT's decoding as a cost curve a replay can run, the
update an off-policy step pays, and one-step async's overlap of the rollout with the update.

Why a module of its own: ``cluster.remedies`` replays which requests a step runs and when
its rollout ends, at any step costs; what TLT changes is the cost of each decode step, and
what async changes is how a step's rollout and update line up in time. Both compose with the
replay without it knowing of them, and the diagnosis and the checks share one definition.

- **TLT at its limit** (:func:`bandit_cost`): TLT's adaptive engine converges to the arm with
  the fewest seconds per emitted token at each live batch (``StepCost.best_arm``); a plain
  curve of those seconds per token is that engine as one token per step, which
  ``remedies.run_rollout`` and so every replayed remedy decode at. The exploration (at most
  the engine's ``explore_budget``) is left out, as ``simulate``'s bandit leaves it.
- **The off-policy update** (:data:`STALE_UPDATE`): the workbench's GRPO computes the old
  log-probs only when a step trains on tokens an older policy sampled (``GRPO.update_data``);
  its on-policy update is the reference's forward, the forward and the backward (two
  forwards' work), so an update on stale tokens does one forward more: 5 forwards' work
  against 4. Other frameworks log their old log-probs' pass apart (veRL's
  ``timing_s/old_log_prob``), so their rest of the step already holds it.
- **One-step async** (:func:`async_step_times`), as ``rl.remedies.RemedyTrainer.clock``
  runs it: step 0 samples its own rollout alone, then every step ``k`` trains on the rollout
  sampled during step ``k - 1`` while the rollout of step ``k + 1`` runs beside its update,
  so step ``k`` lasts ``max(rollout[k + 1], update[k])`` (plus ``rollout[0]`` at step 0).
  The rollout beside the last update samples prompts no logged step ran: it is charged the
  logged rollouts' mean, an unseen draw's expected time (one step in K, so a short run's
  prediction carries that draw's spread). Step 0 trains on its own, fresh tokens; every
  later step on the older policy's.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .cost import StepCost

__all__ = ["STALE_UPDATE", "bandit_cost", "stale_update", "async_step_times"]

STALE_UPDATE = 5 / 4
"""An update on stale tokens over the same update on fresh ones (module docstring): the old
log-probs' forward beside the reference's forward, the forward and the backward."""


def bandit_cost(cost: StepCost) -> StepCost | None:
    """TLT's adaptive engine at its limit as a plain decode curve (module docstring): at
    every batch size a decode kind measured, ``min over arms of seconds / tau``, kind
    ``plain``, tau 1; the other kinds' rows (prefill) as they were. None where ``cost``
    measured no speculative arm."""
    if len(cost.arms) < 2:
        return None
    t = cost.table
    sizes = np.unique(t.loc[t["kind"].isin(cost.arms), "batch_size"].to_numpy(float))
    best = np.min([cost.seconds(k, sizes) / cost.tau(k, sizes) for k in cost.arms], axis=0)
    plain = pd.DataFrame({"batch_size": sizes.astype(int), "kind": "plain", "seconds": best,
                          "tau": 1.0})
    rest = t[~t["kind"].isin(cost.arms)][["batch_size", "kind", "seconds", "tau"]]
    return StepCost(pd.concat([plain, rest], ignore_index=True))


def stale_update(update, stale) -> np.ndarray:
    """Each step's update (seconds) with ``STALE_UPDATE`` charged where the step trains on
    stale tokens (``stale``: a bool or an older policy's share of its tokens, per step)."""
    update = np.asarray(update, float)
    return np.where(np.asarray(stale, float) > 0, update * STALE_UPDATE, update)


def async_step_times(rollout, update, stale: float = STALE_UPDATE) -> np.ndarray:
    """One-step async's step times (module docstring): ``rollout[k]`` the rollout whose data
    step ``k`` trains on, ``update[k]`` step ``k``'s update as it would run on fresh tokens,
    ``stale`` what an update on stale tokens costs over it (1: nothing more, where the logged
    update already computes the old log-probs); step 0 ``rollout[0] + max(rollout[1],
    update[0])``, step ``k`` ``max(rollout[k + 1], stale x update[k])``, the rollout after
    the last the mean of ``rollout``."""
    rollout, update = np.asarray(rollout, float), np.asarray(update, float)
    if rollout.shape != update.shape or rollout.ndim != 1 or not len(rollout):
        raise ValueError(f"rollout and update need one value per step each, at least one "
                         f"step; got shapes {rollout.shape} and {update.shape}")
    if not stale >= 1:
        raise ValueError(f"stale is an update's cost on stale tokens over fresh ones, at "
                         f"least 1; got {stale!r}")
    charged = np.where(np.arange(len(update)) > 0, update * stale, update)
    times = np.maximum(np.append(rollout[1:], rollout.mean()), charged)
    times[0] += rollout[0]
    return times
