"""Values the hand-written checks let through and the shared checks (workbench.checks) now
refuse at their sites: bools where a count or an amount is expected, NaN and infinity."""
import math

import pandas as pd
import pytest

from workbench.adapt import DrafterBuffer, SpotConfig
from workbench.rollout import RolloutConfig, ThresholdSchedule, Timeline
from workbench.rollout.sampling import SamplingParams, make_uid
from workbench.rollout.timeline import REQUEST_COLUMNS, STEP_COLUMNS
from workbench.speculative.bandit import AdaptiveSchedule, BucketedBandit
from workbench.speculative.drafters import SlowedDrafter


@pytest.mark.parametrize("value", [True, math.inf, math.nan])
def test_a_temperature_is_a_finite_number(value):
    for build in (lambda: SamplingParams(temperature=value),
                  lambda: RolloutConfig(temperature=value)):
        with pytest.raises(ValueError, match=r"temperature \(0: greedy\) must be a finite "
                                             rf"number >= 0, got {value!r}"):
            build()


def test_top_p_refuses_a_bool():
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\], got True"):
        SamplingParams(top_p=True)


@pytest.mark.parametrize("field, value", [("carry_fraction", True), ("max_items", True),
                                          ("history_steps", False)])
def test_the_drafter_buffer_refuses_bools(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be .*, got {value!r}$"):
        DrafterBuffer(**{field: value})


@pytest.mark.parametrize("field, value", [("carry_fraction", 1.5), ("history_steps", -1),
                                          ("history_steps", True)])
def test_spot_config_checks_its_buffer_fields_when_built(field, value):
    with pytest.raises(ValueError, match=rf"SpotConfig\.{field} must be .*, got {value!r}"):
        SpotConfig(**{field: value})


@pytest.mark.parametrize("value", [math.inf, math.nan, True])
def test_a_drafter_delay_is_a_finite_number_of_seconds(value):
    with pytest.raises(ValueError, match=rf"delay_s \(seconds\) must be a finite number >= 0, "
                                         rf"got {value!r}"):
        SlowedDrafter(None, value)


def test_a_threshold_schedule_refuses_a_bool_batch():
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1, got True"):
        ThresholdSchedule(2, True)


@pytest.mark.parametrize("value", [True, 1.0])
def test_a_timeline_counts_its_workers_with_an_integer(value):
    steps, requests = pd.DataFrame(columns=STEP_COLUMNS), pd.DataFrame(columns=REQUEST_COLUMNS)
    with pytest.raises(ValueError, match=rf"Timeline\.num_workers must be an integer >= 1, "
                                         rf"got {value!r}"):
        Timeline(steps, requests, value)


@pytest.mark.parametrize("field", ["prompt_id", "sample_idx", "rl_step"])
def test_a_uid_is_made_of_integers(field):
    with pytest.raises(ValueError, match=f"{field} must be an integer in .*, got True"):
        make_uid(**{"prompt_id": 0, field: True})


@pytest.mark.parametrize("seed", [True, -1, 1.5])
def test_a_bandit_seed_is_an_integer_ge_0(seed):
    with pytest.raises(ValueError, match=f"seed must be an integer >= 0, got {seed!r}"):
        BucketedBandit(["a"], seed=seed)
    with pytest.raises(ValueError, match=f"seed must be an integer >= 0, got {seed!r}"):
        AdaptiveSchedule(arms=["chain:k=2"], seed=seed)


def test_bucket_edges_must_be_integers():
    with pytest.raises(ValueError, match=r"each bucket edge \(of \(1, 2\.5\)\) must be an "
                                         r"integer >= 1, got 2\.5"):
        BucketedBandit(["a"], edges=(1, 2.5))
