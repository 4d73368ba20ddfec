"""Tables built by hand: rollout timelines, SD sweeps, prune plans, cluster traces."""
import numpy as np
import pandas as pd
import torch
from transformers import LlamaConfig

from workbench.cluster import Trace
from workbench.compress.plan import PrunePlan
from workbench.compress.scores import UnitScores
from workbench.rollout.timeline import Timeline


PLAN = PrunePlan((0, 2), hidden_size=4, intermediate_size=3, heads_per_group=1)


STEPS = [(0, "prefill", 0.0, 0.1, 4), (0, "decode", 0.1, 0.5, 4), (0, "decode", 0.5, 1.0, 2),
         (0, "decode", 1.0, 2.0, 1),
         (1, "prefill", 0.0, 0.1, 3), (1, "decode", 0.1, 0.6, 3), (1, "decode", 0.6, 0.8, 2)]


def lognormal_trace(n=2000, seed=0) -> Trace:
    rng = np.random.default_rng(seed)
    return Trace(pd.DataFrame({"prompt_tokens": rng.integers(10, 100, n),
                               "response_tokens": rng.lognormal(5, 1, n).astype(int) + 1,
                               "group": (np.arange(n) // 8).astype(str)}))


def make_timeline(steps=STEPS, workers=3, clock="sim") -> Timeline:
    rows = [{"worker": w, "step": i, "kind": kind, "start_s": a, "end_s": b, "batch_size": n,
             "tokens": n, "forward_s": b - a} for i, (w, kind, a, b, n) in enumerate(steps)]
    req = [{"worker": 0, "uid": 0, "prompt_id": 0, "sample_idx": 0, "start_s": 0.0,
            "end_s": 2.0, "prompt_tokens": 3, "response_tokens": 9, "finish": "eos",
            "verify_steps": 0, "drafted": 0, "accepted": 0, "reward": float("nan")}]
    return Timeline.from_records(rows, req, num_workers=workers, clock=clock)


def make_sweep() -> pd.DataFrame:
    """eagle k=4 at T=0: 2.0 at batch 1, 1.5 at batch 4, 1.0 at batch 8; ngram k=2 at T=0
    measured at batch 2 only; eagle k=4 at T=1 a flat 3.0."""
    rows = [("eagle", 4, 0.0, 1, 2.0), ("eagle", 4, 0.0, 4, 1.5), ("eagle", 4, 0.0, 8, 1.0),
            ("ngram", 2, 0.0, 2, 1.2), ("eagle", 4, 1.0, 1, 3.0), ("eagle", 4, 1.0, 4, 3.0)]
    return pd.DataFrame(rows, columns=["drafter", "k", "temperature", "batch_size", "speedup"]
                        ).assign(tau=2.0)


def tiny_config():
    """3 layers, hidden 8, MLP 6, 4 query heads in 2 KV groups (head_dim 2)."""
    return LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=6, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)


def hand_scores():
    heads = torch.tensor([[1., 2., 3., 4.], [1., 1., 1., 1.], [4., 0., 0., 2.]])
    neurons = torch.tensor([[1., 2., 3., 4., 5., 6.], [1.] * 6, [6., 0., 0., 0., 0., 3.]])
    channels = torch.tensor([8., 7., 6., 5., 4., 3., 2., 1.])
    return UnitScores(heads, neurons, channels)


# (worker, kind, start, end, batch_size): worker 0's batch shrinks 4 -> 2 -> 1, worker 1's 3 -> 2
