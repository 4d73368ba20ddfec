"""Batched rollout: the decode engine, forwards, sampling, step schedules, workers and their
backends, timelines."""
from .backend import Backend, LocalBackend, WorkerFailed
from .config import RolloutConfig
from .engine import RolloutEngine, RolloutResult
from .request import RequestOutput
from .sampling import Stream
from .schedule import PlainSchedule, StaticSchedule, StepPlan, StepReport, ThresholdSchedule
from .timeline import Timeline

__all__ = ["RolloutEngine", "RolloutConfig", "RolloutResult", "RequestOutput", "Stream",
           "Timeline", "StepPlan", "StepReport", "PlainSchedule", "StaticSchedule",
           "ThresholdSchedule", "Backend", "LocalBackend", "WorkerFailed"]
