"""Heavy-tailed models of response lengths: a log-normal or a Pareto fitted to recorded
lengths by maximum likelihood, with the fit's error (the Kolmogorov-Smirnov distance to the
data), and the layouts of requests they draw, for what-ifs beyond the recorded tail.

Glossary: *log-normal* log(length) ~ Normal(mu, sigma); *Pareto* P(length > x) =
(x_min / x)^alpha for x >= x_min (smaller alpha: heavier tail); *KS distance* the largest gap
between the model's CDF and the data's empirical CDF (0: identical). Lengths at a length cap
are fitted as if they had ended there (no censoring model): a fit to a capped rollout
understates its tail beyond the cap, which draws are clipped to anyway.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..checks import check_choice, check_int, check_positive
from .simulate import Layout

__all__ = ["LengthModel", "fit_lengths", "layout_from_model"]

FAMILIES = ("lognormal", "pareto")
_erf = np.vectorize(math.erf, otypes=[float])


@dataclass(frozen=True)
class LengthModel:
    """A fitted length distribution: ``family``, its ``params`` (lognormal: mu, sigma;
    pareto: x_min, alpha), ``ks`` (the KS distance to the data it was fitted on), ``n`` (how
    many lengths) and ``cap`` (draws are clipped to it; None: no cap)."""

    family: str
    params: dict
    ks: float
    n: int
    cap: int | None = None

    @property
    def tail(self) -> float:
        """The parameter that sets the tail: sigma of a log-normal (larger: heavier), alpha
        of a Pareto (smaller: heavier)."""
        return self.params["sigma" if self.family == "lognormal" else "alpha"]

    def with_tail(self, tail: float) -> "LengthModel":
        """This model with its tail parameter (``tail``) set to ``tail``, the rest kept: a
        what-if on how heavy the tail is (its ``ks`` still the fitted model's)."""
        tail = check_positive(f"tail ({'sigma' if self.family == 'lognormal' else 'alpha'})",
                              tail)
        key = "sigma" if self.family == "lognormal" else "alpha"
        return replace(self, params={**self.params, key: tail})

    def cdf(self, x) -> np.ndarray:
        """P(length <= x) under the model (the cap not applied)."""
        x = np.asarray(x, dtype=float)
        if self.family == "lognormal":
            mu, sigma = self.params["mu"], self.params["sigma"]
            z = (np.log(np.maximum(x, 1e-300)) - mu) / (sigma * math.sqrt(2))
            return np.where(x > 0, 0.5 * (1 + _erf(z)), 0.0)
        x_min, alpha = self.params["x_min"], self.params["alpha"]
        return np.where(x >= x_min, 1 - (x_min / np.maximum(x, x_min)) ** alpha, 0.0)

    def sample(self, size, rng: np.random.Generator) -> np.ndarray:
        """Lengths drawn from the model, rounded up to whole tokens, in [1, cap]: int64 of
        shape ``size``."""
        if self.family == "lognormal":
            x = rng.lognormal(self.params["mu"], self.params["sigma"], size)
        else:  # numpy's pareto is the Lomax: shift and scale it to the classical Pareto
            x = self.params["x_min"] * (1 + rng.pareto(self.params["alpha"], size))
        x = np.ceil(np.minimum(x, self.cap if self.cap is not None else np.inf))
        return np.maximum(x, 1).astype(np.int64)


def ks_distance(model: LengthModel, lengths) -> float:
    """The largest gap between ``model.cdf`` and the empirical CDF of ``lengths``."""
    x = np.sort(np.asarray(lengths, dtype=float))
    n = len(x)
    f = model.cdf(x)
    above = np.arange(1, n + 1) / n - f
    below = f - np.arange(n) / n
    return float(max(above.max(), below.max()))


def fit_lengths(lengths, family: str = "lognormal", cap: int | None = None) -> LengthModel:
    """The maximum-likelihood ``family`` fit of ``lengths`` (integers >= 1; at least two
    different values), its KS distance to them, draws clipped to ``cap``."""
    family = check_choice("family", family, FAMILIES)
    cap = check_int("cap", cap, 1, optional="no cap")
    x = np.asarray(lengths, dtype=float)
    if x.ndim != 1 or len(x) < 2 or not np.all(x >= 1) or len(np.unique(x)) < 2:
        raise ValueError(f"fit_lengths needs lengths >= 1 with at least two different values, "
                         f"got {len(x)} values" + (f" from {x.min():g} to {x.max():g}"
                                                   if len(x) else ""))
    if family == "lognormal":
        logs = np.log(x)
        params = {"mu": float(logs.mean()), "sigma": float(logs.std())}
    else:
        x_min = float(x.min())
        params = {"x_min": x_min, "alpha": float(len(x) / np.log(x / x_min).sum())}
    model = LengthModel(family, params, 0.0, len(x), cap)
    return LengthModel(family, params, ks_distance(model, x), len(x), cap)


def layout_from_model(model: LengthModel, workers: int, per_worker: int,
                      prompt_tokens: int = 0, seed: int = 0) -> Layout:
    """``workers`` x ``per_worker`` requests with lengths drawn from ``model`` (seeded;
    independent draws: a group's shared difficulty is not modelled), each with
    ``prompt_tokens``."""
    n = check_int("workers", workers, 1)
    per = check_int("per_worker", per_worker, 1)
    prompt = check_int("prompt_tokens", prompt_tokens, 0)
    response = model.sample((n, per), np.random.default_rng(seed))
    return Layout(response, np.full((n, per), prompt, np.int64))
