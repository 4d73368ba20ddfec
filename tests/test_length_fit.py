"""Fitted length models: maximum likelihood recovers the parameters of drawn data, the KS
distance tells the right family from the wrong one, draws respect the cap and the seed, and
a model's layout feeds the simulator."""
import numpy as np
import pandas as pd
import pytest

from workbench.cluster import StepCost, fit_lengths, layout_from_model, simulate


def test_a_lognormal_fit_recovers_its_parameters_and_fits_closely():
    x = np.random.default_rng(0).lognormal(6.0, 0.8, 20000)
    model = fit_lengths(x)
    assert model.params["mu"] == pytest.approx(6.0, abs=0.02)
    assert model.params["sigma"] == pytest.approx(0.8, abs=0.02)
    assert model.ks < 0.02 and model.n == 20000


def test_the_ks_distance_tells_the_pareto_tail_from_the_lognormal():
    x = 100 * (1 + np.random.default_rng(1).pareto(1.5, 20000))
    pareto, lognormal = fit_lengths(x, "pareto"), fit_lengths(x, "lognormal")
    assert pareto.params["x_min"] == pytest.approx(100, rel=1e-3)
    assert pareto.params["alpha"] == pytest.approx(1.5, rel=0.05)
    assert pareto.ks < 0.02 < lognormal.ks


def test_draws_are_whole_tokens_within_the_cap_and_follow_the_seed():
    model = fit_lengths([3, 10, 40, 200, 900], cap=256)
    a = model.sample(5000, np.random.default_rng(7))
    assert a.dtype == np.int64 and a.min() >= 1 and a.max() == 256
    assert (a == model.sample(5000, np.random.default_rng(7))).all()


def test_a_model_layout_feeds_the_simulator():
    model = fit_lengths(np.random.default_rng(2).lognormal(4, 1, 500), cap=1024)
    lay = layout_from_model(model, workers=8, per_worker=4, prompt_tokens=30, seed=5)
    assert lay.response.shape == (8, 4) and (lay.prompt == 30).all()
    assert (lay.response == layout_from_model(model, 8, 4, 30, seed=5).response).all()
    cost = StepCost(pd.DataFrame({"batch_size": [1], "kind": ["plain"], "seconds": [0.01]}))
    p = simulate(lay, cost)
    # one plain step per token at 0.01 s: the makespan is the longest response's
    assert p.plain.makespan_s == pytest.approx(0.01 * lay.response.max())


@pytest.mark.parametrize("lengths, family, match", [
    ([5, 5, 5], "lognormal", "at least two different values"),
    ([0, 4, 9], "pareto", "lengths >= 1"),
    ([3, 9], "weibull", "family must be one of"),
])
def test_bad_fits_are_named(lengths, family, match):
    with pytest.raises(ValueError, match=match):
        fit_lengths(lengths, family)
