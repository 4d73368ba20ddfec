"""Importance scores by name: the seam through which a researcher's own ranking of heads,
neurons and channels enters the pruning studies, beside the built-in ones.

An importance score is a class with the hooks of :class:`ImportanceScore` (its one required
hook, ``scores``, returns the :class:`~.scores.UnitScores` that :func:`~.prune.prune` keeps the
best of), registered in :data:`IMPORTANCE` by its decorator. Built in: ``activation``
(Minitron's activation importance, one variant per (batch, sequence) aggregation),
``weight_magnitude`` and ``random``. A plugin file registers more (docs/extending.md,
"An importance score"); every parameter that takes a ranking then accepts its name.

A *ranking* is a registered name, optionally with a variant after a colon:
``"activation:var/mean"``; ``"activation:*"`` stands for every variant in the score's order,
and the bare name for its first. :func:`check_rankings` checks a list of them before anything
runs and :func:`resolve` makes one ready to score.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

from ..registry import PluginError, Registry
from .importance import AGGREGATIONS, Aggregation, importance_from_batches, magnitude_scores, \
    random_scores
from .scores import UnitScores

__all__ = ["ImportanceScore", "IMPORTANCE", "importance_score", "check_rankings",
           "check_ranking", "resolve", "Ranking", "DEFAULT_RANKINGS"]


class ImportanceScore:
    """The protocol of an importance score: subclass it, define :meth:`scores`, and override
    any of the other hooks whose default does not fit.

    Hooks (class attributes; the code reads nothing else):

    - ``scores(self, teacher, calibration, seed) -> UnitScores`` (required): higher = keep.
      ``calibration`` is the list of ``(ids [batch, seq], mask [batch, seq])`` batches the
      study was given (``None`` when ``needs_calibration`` is False); ``seed`` is the draw's
      seed (the study's first seed unless ``draws_randomly``); ``self.variant`` is the variant
      asked for (``None`` for a score without ``variants``).
    - ``label`` (default ``None``: the registered name): the score's name in tables and
      figures; a variant follows it after a space (``activation l2/mean``).
    - ``draws_randomly`` (default False): the scores depend on ``seed``, so a study draws them
      once per seed and reports the mean and sd of what it measures.
    - ``needs_calibration`` (default True): False for a score read off the weights alone.
    - ``variants`` (default ``()``): the variants a ranking may ask for after a colon, the
      first the default.
    """

    label: str | None = None
    draws_randomly: bool = False
    needs_calibration: bool = True
    variants: tuple[str, ...] = ()
    variant: str | None = None  # set on the instance by resolve(); not a hook

    def scores(self, teacher, calibration, seed: int) -> UnitScores:
        raise NotImplementedError


HOOKS = ("scores",)
OPTIONAL_HOOKS = ("label", "draws_randomly", "needs_calibration", "variants")


def _check_score(name: str, plugin) -> None:
    """Beyond the hooks' presence: a class whose ``scores`` is its own, a ``label`` that is a
    string or None, flags that are booleans, ``variants`` a tuple of strings without ':'."""
    if not inspect.isclass(plugin):
        raise PluginError(f"importance score {name!r} ({plugin!r}) is not a class; accepted a "
                          "class with the hooks of workbench.compress.rankings.ImportanceScore")
    if getattr(plugin, "scores", None) is ImportanceScore.scores:
        raise PluginError(f"importance score {name!r} ({plugin.__qualname__}) lacks the "
                          f"required hook(s) ['scores']; an importance score defines "
                          f"{list(HOOKS)} and may define {list(OPTIONAL_HOOKS)}")
    if not callable(plugin.scores):
        raise PluginError(f"importance score {name!r}: 'scores' is {plugin.scores!r}; accepted "
                          "a method scores(self, teacher, calibration, seed) -> UnitScores")
    label = getattr(plugin, "label", None)
    if label is not None and (not isinstance(label, str) or not label.strip()):
        raise PluginError(f"importance score {name!r}: label {label!r}; accepted a non-empty "
                          "string or None (the registered name)")
    for flag in ("draws_randomly", "needs_calibration"):
        value = getattr(plugin, flag, getattr(ImportanceScore, flag))
        if not isinstance(value, bool):
            raise PluginError(f"importance score {name!r}: {flag} {value!r}; accepted True or "
                              "False")
    variants = getattr(plugin, "variants", ())
    if not isinstance(variants, tuple) or not all(
            isinstance(v, str) and v and ":" not in v and v != "*" for v in variants):
        raise PluginError(f"importance score {name!r}: variants {variants!r}; accepted a tuple "
                          "of non-empty strings without ':' (and not '*')")


IMPORTANCE: Registry[type] = Registry("importance score", "workbench.importance",
                                      required=HOOKS, optional=OPTIONAL_HOOKS,
                                      check=_check_score)
"""The registry of importance scores: the built-in ones and plugins' (entry-point group
`workbench.importance`)."""


def importance_score(name: str, *, builtin: bool = False):
    """Decorator: register an :class:`ImportanceScore` class under ``name`` (checked at once:
    a missing or misspelled hook is refused, naming it)."""
    return IMPORTANCE.register(name, builtin=builtin)


# ---- the built-ins -------------------------------------------------------------------------
SEQUENCE_AGGREGATIONS = ("mean", "l2")
ACTIVATION_VARIANTS = ("l2/mean",) + tuple(
    f"{b}/{s}" for b in AGGREGATIONS for s in SEQUENCE_AGGREGATIONS if (b, s) != ("l2", "mean"))


@importance_score("activation", builtin=True)
class Activation(ImportanceScore):
    """Minitron's activation importance over the calibration set; the variant is the
    ``batch/sequence`` aggregation (L2 over the batch of the sequence mean first: the
    paper's best)."""

    variants = ACTIVATION_VARIANTS

    def scores(self, teacher, calibration, seed: int) -> UnitScores:
        batch, sequence = (self.variant or self.variants[0]).split("/")
        return importance_from_batches(teacher, calibration, Aggregation(batch, sequence),
                                       progress=False).scores


@importance_score("weight_magnitude", builtin=True)
class WeightMagnitude(ImportanceScore):
    """The weight-magnitude baseline (:func:`~.importance.magnitude_scores`)."""

    label = "weight magnitude"
    needs_calibration = False

    def scores(self, teacher, calibration, seed: int) -> UnitScores:
        return magnitude_scores(teacher)


@importance_score("random", builtin=True)
class Random(ImportanceScore):
    """Chance: uniform draws seeded with ``seed`` (:func:`~.importance.random_scores`)."""

    draws_randomly = True
    needs_calibration = False

    def scores(self, teacher, calibration, seed: int) -> UnitScores:
        return random_scores(teacher, seed)


DEFAULT_RANKINGS = ("activation:*", "weight_magnitude", "random")  # ranking_ablation's set
"""The rankings `ranking_ablation` compares by default: activation importance (every
aggregation), weight magnitude and random."""


# ---- rankings: a name and a variant ---------------------------------------------------------
@dataclass(frozen=True)
class Ranking:
    """One ranking ready to score: the registered ``name``, its ``variant`` (None for a score
    without variants), the table ``label``, and the score instance whose hooks it calls."""

    name: str
    variant: str | None
    label: str
    score: ImportanceScore

    @property
    def draws_randomly(self) -> bool:
        return bool(getattr(self.score, "draws_randomly", False))

    @property
    def needs_calibration(self) -> bool:
        return bool(getattr(self.score, "needs_calibration", True))

    def scores(self, teacher, calibration, seed: int) -> UnitScores:
        """The score's ``scores`` hook, checked: ``UnitScores`` shaped for ``teacher``
        (``ValueError`` naming the ranking otherwise)."""
        got = self.score.scores(teacher, calibration if self.needs_calibration else None, seed)
        if not isinstance(got, UnitScores):
            raise ValueError(f"importance score {self.name!r} returned {type(got).__name__}; "
                             "accepted UnitScores(heads, neurons, channels) "
                             "(workbench.compress.scores)")
        try:
            got.check(teacher.config)
        except ValueError as exc:
            raise ValueError(f"importance score {self.name!r}: {exc}") from None
        return got


def _split(spec) -> tuple[str, str | None]:
    if not isinstance(spec, str):
        raise ValueError(f"ranking {spec!r}: accepted a registered name (one of "
                         f"{IMPORTANCE.names()}), optionally ':<variant>'")
    name, _, variant = spec.partition(":")
    return IMPORTANCE.check(name, "ranking"), (variant or None)


def _variants_of(name: str, variant: str | None) -> list[str | None]:
    """The variants ``variant`` asks for of score ``name``: all for '*', the first for none."""
    declared = tuple(getattr(IMPORTANCE[name], "variants", ()))
    if variant is None:
        return [declared[0] if declared else None]
    if variant == "*":
        return list(declared) or [None]
    if variant not in declared:
        accepted = (f"one of {list(declared)} or '*'" if declared else
                    "no variant (the score declares none)")
        raise ValueError(f"ranking '{name}:{variant}': variant {variant!r} of {name!r}; "
                         f"accepted {accepted}")
    return [variant]


def check_rankings(rankings=DEFAULT_RANKINGS) -> list[str]:
    """``rankings`` (a name or a list of them) expanded to one ``name`` or ``name:variant``
    each, checked before anything runs: an unknown name is refused listing the registered
    ones, an unknown variant listing the score's, and two rankings of one label (``activation``
    and ``activation:l2/mean``) naming both."""
    if isinstance(rankings, str):
        rankings = [rankings]
    if not isinstance(rankings, (list, tuple)) or not rankings:
        raise ValueError(f"rankings {rankings!r}: accepted a non-empty list of registered "
                         f"importance scores (one of {IMPORTANCE.names()}), optionally "
                         "':<variant>' or ':*'")
    out, labels = [], {}
    for spec in rankings:
        name, variant = _split(spec)
        for v in _variants_of(name, variant):
            full = name if v is None else f"{name}:{v}"
            label = _label(name, v)
            if label in labels:
                raise ValueError(f"rankings {list(rankings)!r}: {labels[label]!r} and {spec!r} "
                                 f"are the same ranking ({label!r}) twice; name it once")
            labels[label] = spec
            out.append(full)
    return out


def check_ranking(ranking) -> str:
    """One ranking (``name`` or ``name:variant``), checked before anything runs as
    :func:`resolve` checks it; returned as given."""
    resolve(ranking)
    return ranking


def _label(name: str, variant: str | None) -> str:
    base = getattr(IMPORTANCE[name], "label", None) or name
    return base if variant is None else f"{base} {variant}"


def resolve(ranking: str) -> Ranking:
    """The :class:`Ranking` of ``name`` or ``name:variant`` (checked as
    :func:`check_rankings` does; a bare name takes the score's first variant)."""
    name, variant = _split(ranking)
    if variant == "*":
        raise ValueError(f"ranking {ranking!r}: one ranking is one variant; '*' is for a list "
                         "of rankings (check_rankings)")
    (variant,) = _variants_of(name, variant)
    score = IMPORTANCE[name]()
    score.variant = variant
    return Ranking(name, variant, _label(name, variant), score)
