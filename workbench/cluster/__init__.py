"""Cluster-scale what-if: replay measured rollouts (a trace of per-request lengths and
per-step costs) on N virtual workers and predict a synchronous RL step's makespan, idle
fraction, tail share, SD benefit, drafter steps and GPU-hours (docs/trace_format.md).
``cluster.validation`` checks it against real rollouts (it alone runs a model: a layer of its
own, docs/architecture.md); ``cluster.whatif`` sweeps it over N; ``cluster.remedies`` replays
the long-tail remedies (over-provisioning, APRIL, partial rollouts, tail batching) over a
run's steps, ``cluster.composed`` what TLT's decoding, a stale update and one-step async
change in such a replay, and ``cluster.remedy_check`` checks them on a notebook 11 run;
``cluster.dispatch`` places requests when a worker frees (Seer's scheduling and divided
rollout beside TLT at every N), ``cluster.seer_check`` checks it on a Seer run, and
``cluster.seer_run`` asks both of a finished notebook 11 run."""
from .cost import StepCost, UpdateCost
from .fit import LengthModel, fit_lengths, layout_from_model
from .importers import trace_from_csv, trace_from_run, trace_from_timeline
from .simulate import Layout, Prediction, layout, simulate, simulate_rollout
from .trace import Trace, load_trace

__all__ = ["Trace", "load_trace", "trace_from_run", "trace_from_timeline", "trace_from_csv",
           "StepCost", "UpdateCost", "Layout", "layout", "simulate_rollout", "simulate",
           "Prediction", "LengthModel", "fit_lengths", "layout_from_model"]
