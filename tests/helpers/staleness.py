"""The drafter-staleness tests' configs, runs and fixtures (``steady_clock``, ``straight``)."""
import itertools
import types

import pytest
import torch

from workbench.adapt import SpotConfig
from workbench.rl import GRPOConfig
from workbench.rl.staleness.drafters import CeilingConfig
from workbench.rl.staleness.run import StalenessConfig, StalenessRun
from workbench.speculative import EagleHead
from workbench.tasks import Problem

from .models import PROMPTS, tiny_model


# columns of a step's row that the sim clock and the run's logic decide (wall seconds aside)
SAME = ["step", "reward", "kl_start", "tokens", "tau_frozen", "tau_adaptive", "tau_ceiling",
        "tau_sibling", "diverged_frozen", "adaptive_steps", "adaptive_loss", "ceiling_steps",
        "ceiling_kept_steps", "ceiling_loss", "sibling_prompts"]


def staleness_reward(prompt, completion, answer):
    return completion.count("a") / max(1, len(completion))


def staleness_problems(n=8):
    return [Problem(prompt=p, answer="a", uid=i) for i, p in enumerate(PROMPTS[:n])]


def staleness_config(**kw):
    """The test's config; ``kw`` set wherever declared (``spec_k`` is the rollout's)."""
    return StalenessConfig(
        grpo=staleness_grpo(spec_k=3), spot=SpotConfig.flat(batch_size=2, max_steps=1, history_steps=1),
        ceiling=CeilingConfig.flat(batch_size=2, holdout_every=2, check_every=1, patience=1,
                                   max_steps=2),
        measure_groups=1, position_bucket=2).updated(**kw)


def staleness_run(tokenizer, config=None, **kw):
    model = tiny_model("llama", tokenizer)
    torch.manual_seed(1)
    head = EagleHead(model)
    return StalenessRun(model, tokenizer, staleness_problems(), head, staleness_reward,
                        config if config is not None else staleness_config(), **kw)


def hold_clock_steady(mp) -> None:
    """The workers' clocks tick 2**-10 s per reading (exact in binary, so differences of
    readings do not round with the count), whatever this machine's load; and every rollout
    gets a 60 s tail (``helpers.rl.longer_tail``), so that the spot trainer's ``max_steps``
    decides how many steps each idle window takes: the adaptive drafter is the same run
    after run."""
    import workbench.clock as clock
    import workbench.rollout.worker as worker
    from workbench.adapt import SpotTrainer

    from .rl import longer_tail
    ticks = itertools.count()
    tick = lambda: next(ticks) * 2**-10  # noqa: E731
    mp.setattr(clock, "time", types.SimpleNamespace(perf_counter=tick, thread_time=tick))
    mp.setattr(worker, "time", types.SimpleNamespace(time=lambda: 0.0))
    train = SpotTrainer.train_in_idle
    mp.setattr(SpotTrainer, "train_in_idle",
               lambda self, result, backend: train(self, longer_tail(result), backend))


@pytest.fixture
def steady_clock(monkeypatch):
    hold_clock_steady(monkeypatch)


@pytest.fixture(scope="module")
def straight(tokenizer):
    """Three steps of every drafter, uninterrupted, on the steady clock."""
    with pytest.MonkeyPatch.context() as mp:
        hold_clock_steady(mp)
        run = staleness_run(tokenizer)
        run.run_to(3, progress=False)
    return run


def staleness_grpo(**kw):
    return GRPOConfig.flat(**{"prompts_per_step": 2, "samples_per_prompt": 2,
                              "max_new_tokens": 6, "lr": 1e-2, "workers": 2,
                              "temperature": 1.0, **kw})
