"""Batched rollout: the decode engine, forwards, sampling, step schedules, workers and their
backends, timelines."""
from .backend import Backend, IdleJob, IdleRun, LocalBackend, WorkerFailed
from .config import RolloutConfig
from .engine import RolloutEngine, RolloutResult
from .request import Request, RequestOutput
from .sampling import SamplingParams, Stream, make_uid, split_uid
from .schedule import (PlainSchedule, Schedule, StaticSchedule, StepPlan, StepReport,
                       ThresholdSchedule)
from .timeline import IdleWindow, Timeline
from .worker import IdleClock, Worker, WorkerResult, WorkerTask

__all__ = ["RolloutEngine", "RolloutConfig", "RolloutResult", "Request", "RequestOutput",
           "SamplingParams", "Stream", "make_uid", "split_uid", "Timeline",
           "Schedule", "StepPlan", "StepReport", "PlainSchedule", "StaticSchedule",
           "ThresholdSchedule", "Backend", "LocalBackend", "Worker", "WorkerTask",
           "WorkerResult", "WorkerFailed", "IdleJob", "IdleRun", "IdleWindow", "IdleClock"]
