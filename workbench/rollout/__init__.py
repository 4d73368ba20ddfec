"""Batched rollout: the decode engine, forwards, sampling, step schedules, workers and their
backends, timelines."""
from .backend import Backend, LocalBackend
from .failures import WorkerFailed
from .backends import make_backend
from .config import RolloutConfig
from .engine import RolloutEngine, RolloutResult
from .request import RequestOutput
from .sampling import Stream
from .schedule import PlainSchedule, StaticSchedule, StepPlan, StepReport, ThresholdSchedule
from .timeline import Timeline

__all__ = ["RolloutEngine", "RolloutConfig", "RolloutResult", "RequestOutput", "Stream",
           "Timeline", "StepPlan", "StepReport", "PlainSchedule", "StaticSchedule",
           "ThresholdSchedule", "Backend", "LocalBackend", "RayBackend", "WorkerFailed",
           "make_backend"]


def __getattr__(name: str):
    """``RayBackend`` on first use: importing Ray takes seconds, which a run without it
    should not pay."""
    if name == "RayBackend":
        from .ray_backend import RayBackend
        return RayBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
