"""Batched rollout: the decode engine, sampling, workers and timelines."""
from .engine import RequestOutput, RolloutConfig, RolloutEngine, RolloutResult
from .sampling import SamplingParams, make_uid, split_uid
from .timeline import Timeline
from .workers import Backend, LocalBackend

__all__ = ["RolloutEngine", "RolloutConfig", "RolloutResult", "RequestOutput",
           "SamplingParams", "make_uid", "split_uid", "Timeline", "Backend", "LocalBackend"]
