"""Configs that hold configs: flat keywords reach the config that declares them, at any depth,
and a refused value names the part that refused it."""
from dataclasses import dataclass, field

import pytest

from workbench.compress.distill import DistillConfig
from workbench.nested_config import NestedConfig
from workbench.speculative.train import EagleTrainConfig
from workbench.train import TrainConfig


@dataclass
class Holder(NestedConfig):
    """A config two levels deep, as a spot trainer's config holding an EagleTrainConfig."""

    eagle: EagleTrainConfig = field(default_factory=EagleTrainConfig)
    max_steps: int = 400


def test_flat_keywords_reach_every_depth_and_keep_the_rest():
    h = Holder.flat(max_steps=3, batch_size=4, lr=1e-4, horizon=None, schedule="constant")
    assert h.max_steps == 3 and h.eagle.batch_size == 4
    assert (h.eagle.train.lr, h.eagle.train.horizon, h.eagle.train.schedule) == (
        1e-4, None, "constant")
    assert h.eagle.train.desc == "train eagle" and h.eagle.unroll == 2  # defaults kept
    again = h.updated(seed=7)
    assert again.eagle.train.seed == 7 and again.eagle.train.lr == 1e-4 and h.eagle.train.seed == 0


def test_a_whole_part_and_flat_keywords_combine():
    base = TrainConfig(horizon=9, lr=0.5, schedule="cosine")
    d = DistillConfig.flat(train=base, lr=0.25, batch_size=2)
    assert (d.train.horizon, d.train.schedule, d.train.lr, d.batch_size) == (9, "cosine", 0.25, 2)


def test_unknown_and_refused_values_are_named():
    with pytest.raises(ValueError, match=r"Holder has no parameter 'steps'; accepted: "
                                         r"\[.*'horizon'.*'max_steps'.*\]"):
        Holder.flat(steps=10)
    with pytest.raises(ValueError, match=r"Holder\.eagle: EagleTrainConfig\.train: TrainConfig\."
                                         r"schedule='cosine' decays over a horizon"):
        Holder.flat(horizon=None)
    with pytest.raises(ValueError, match=r"Holder\.eagle: EagleTrainConfig\.noise must be a "
                                         r"finite number >= 0, got -1"):
        Holder.flat(noise=-1)


def test_a_flat_keyword_to_a_nested_constructor_names_the_config_that_holds_it_and_flat():
    from workbench.rl import GRPOConfig
    with pytest.raises(TypeError, match=r"'samples_per_prompt' is a field of GRPOConfig.rollout"
                                        r".*GRPOConfig.flat\(samples_per_prompt=\.\.\.\)"):
        GRPOConfig(samples_per_prompt=3)
    with pytest.raises(TypeError, match=r"GRPOConfig.rollout and GRPOConfig.train"):
        GRPOConfig(seed=1)
    with pytest.raises(TypeError, match=r"no parameter 'bogus'; accepted: \[.*'lr'"):
        GRPOConfig(bogus=1)
    assert GRPOConfig.flat(samples_per_prompt=3).rollout.samples_per_prompt == 3
