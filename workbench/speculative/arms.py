"""Decoding arms by name: the registry ``ARMS`` of the step strategies the adaptive engine
chooses among, and the strategy strings that name them (``speculative/strategies.py``).

An arm *kind* is registered under a name (``chain``); an *arm* is one kind with its
parameters, written ``kind:name=value,...`` (``chain:k=4``), and is a frozen dataclass of the
kind whose fields are those parameters. Its ``plan()`` is the :class:`StepPlan` a decode step
runs. The built-in kinds are ``plain``, ``chain``, ``tree`` and ``sibling``, whose plans are
the built-in shapes (the plan's fields name them), and ``suffix``, whose plans carry the arm
as a plugin's do (its depth follows a budget rule at each step). A plugin kind's plans carry
the arm (``StepPlan.arm``), so that tables, figures and the bandit's state name it by its own
string and the step drafts as its ``propose`` says (``rollout.plan.Arm``: the protocol and its
defaults). A plugin registers a kind in one file::

    @ARMS.register("confident")
    @dataclass(frozen=True)
    class ConfidentChain(Arm):
        k: int = 6
        p: float = 0.5

        def plan(self) -> StepPlan:
            return StepPlan("speculative", self.k)

        def propose(self, drafter, ctx, plan, k): ...

Installed distributions register kinds under the entry-point group ``workbench.arms``
(docs/extending.md, "A decoding arm").
"""
from __future__ import annotations

import dataclasses
import inspect

from ..registry import PluginError, Registry, parse_settings
from ..rollout.plan import PLAIN, Arm, StepPlan

__all__ = ["ARMS", "Arm", "arm_of", "arm_name", "arm_forms", "plan_of"]


def _check_arm(name: str, plugin) -> None:
    """An arm kind is a frozen dataclass (its fields its parameters; hashable, so that plans
    holding it stay frozen) subclassing :class:`Arm` (whose defaults the drafting code calls)."""
    label = f"{getattr(plugin, '__module__', '?')}.{getattr(plugin, '__qualname__', plugin)!s}"
    if not (inspect.isclass(plugin) and issubclass(plugin, Arm)):
        raise PluginError(f"decoding arm {name!r} ({label}) must be a class subclassing "
                          "workbench.speculative.arms.Arm (the protocol and its defaults)")
    if not (dataclasses.is_dataclass(plugin) and plugin.__dataclass_params__.frozen):
        raise PluginError(f"decoding arm {name!r} ({label}) must be a frozen dataclass whose "
                          f"fields are its parameters ('{name}:k=3,...'): decorate it with "
                          "@dataclass(frozen=True) under @ARMS.register(...)")


ARMS: Registry[type[Arm]] = Registry("decoding arm", "workbench.arms", required=("plan",),
                                     optional=("propose",), check=_check_arm)
"""The registry of decoding arms: the built-in kinds and plugins' (entry-point group
`workbench.arms`)."""


# ---- the built-in kinds -------------------------------------------------------------------
@ARMS.register("plain", builtin=True)
@dataclasses.dataclass(frozen=True)
class Plain(Arm):
    """Plain decoding, no drafts: an arm of every adaptive engine."""

    def plan(self) -> StepPlan:
        return PLAIN


@ARMS.register("chain", builtin=True)
@dataclasses.dataclass(frozen=True)
class Chain(Arm):
    """A chain of ``k`` drafts per row by the rollout's main drafter."""

    k: int

    def plan(self) -> StepPlan:
        return StepPlan("speculative", self.k)


@ARMS.register("tree", builtin=True)
@dataclasses.dataclass(frozen=True)
class Tree(Arm):
    """A tree ``k`` deep, ``b`` tokens per node, ``n`` nodes verified per row (all: None), by
    the main drafter."""

    k: int
    b: int
    n: int | None = None

    def plan(self) -> StepPlan:
        return StepPlan("speculative", self.k, self.b, self.n)


@ARMS.register("sibling", builtin=True)
@dataclasses.dataclass(frozen=True)
class Sibling(Arm):
    """A chain of ``k`` drafts by the drafter set's ``"sibling"`` member
    (``speculative.sibling.SiblingDrafter``), which drafts from a row's siblings."""

    k: int

    def plan(self) -> StepPlan:
        return StepPlan("speculative", self.k, drafter="sibling")


@ARMS.register("suffix", builtin=True)
@dataclasses.dataclass(frozen=True)
class SuffixBudget(Arm):
    """Drafts by the drafter set's ``"suffix"`` member (``speculative.suffix.SuffixDrafter``)
    with DAS's length-aware budget: each step drafts as deep as its rows' response lengths
    and recent acceptance say (``speculative.suffix.length_aware_budget``), at most ``k_max``
    and cut where no row found more; a chain, or with ``b`` (and ``n``) a tree ``b`` wide
    with ``n`` nodes verified per row. Arms of several ``k_max`` let the bandit choose among
    budgets."""

    k_max: int
    b: int | None = None
    n: int | None = None

    def plan(self) -> StepPlan:
        # the plan carries the arm, so that the step drafts as propose says (rollout.drafts)
        return StepPlan("speculative", self.k_max, self.b or 1, self.n, drafter="suffix",
                        arm=self)

    def propose(self, drafter, ctx, plan: StepPlan, k: int):
        if not callable(getattr(drafter, "propose_budgeted", None)):
            raise ValueError(f"arm {arm_name(self)!r} drafts with the budget of "
                             "workbench.speculative.suffix.SuffixDrafter, but the rollout's "
                             f"'suffix' member is {type(drafter).__name__}, which has no "
                             "propose_budgeted(ctx, k_max, branch, verify_budget)")
        return drafter.propose_budgeted(ctx, k, plan.branch, plan.verify_budget)


BUILTIN_FORMS = ("'plain', 'chain:k=K' or 'tree:k=K,b=B[,n=N]' (integers K, B, N >= 1), "
                 "'sibling:k=K' (a chain by the drafter set's 'sibling' member), or "
                 "'suffix:k_max=K[,b=B,n=N]' (the 'suffix' member, DAS's length-aware budget "
                 "up to K)")


# ---- strings to arms and back ---------------------------------------------------------------
def arm_forms() -> str:
    """Every accepted strategy form, for messages: the built-ins', each plugin kind's
    (``kind:field=FIELD,...``), and the registered kind names."""
    plugins = [_form(name, ARMS.get(name)) for name in ARMS.plugin_names()]
    return (BUILTIN_FORMS + (f", or a plugin arm {' or '.join(plugins)}" if plugins else "")
            + f" (registered arm kinds: {ARMS.names()})")


def _form(name: str, kind) -> str:
    fields = dataclasses.fields(kind)
    return f"'{name}" + (":" + ",".join(f"{f.name}={f.name.upper()}" for f in fields)
                         if fields else "") + "'"


def arm_of(text: str) -> Arm:
    """The arm a strategy string names (spaces ignored): its kind looked up in :data:`ARMS`,
    its parameters (integers, numbers or words) given to the kind by name. ``ValueError``
    saying what is wrong; the caller adds the accepted forms."""
    kind_name, _, params = text.replace(" ", "").partition(":")
    if kind_name not in ARMS:
        raise ValueError(f"no decoding arm kind {kind_name!r}")
    kind = ARMS.get(kind_name)
    values = parse_settings(params, what="parameter", booleans=False)
    names = [f.name for f in dataclasses.fields(kind)]
    try:
        arm = kind(**values)
    except TypeError as e:  # a missing or unknown parameter
        raise ValueError(f"{kind_name} takes the parameters {names} ({e})") from None
    return arm


def plan_of(arm: Arm) -> StepPlan:
    """The plan of ``arm``'s steps: a built-in kind's plan as it is (its shape names it), a
    plugin kind's carrying the arm (:data:`StepPlan.arm`)."""
    plan = arm.plan()
    if not isinstance(plan, StepPlan):
        raise ValueError(f"arm {arm!r}.plan() gave {plan!r}; accepted a StepPlan")
    builtin = kind_name_of(arm) not in ARMS.plugin_names()
    return plan if builtin or plan.arm is arm else dataclasses.replace(plan, arm=arm)


def kind_name_of(arm: Arm) -> str:
    """The name ``arm``'s kind is registered under (its class, or a class of the same name in
    the same module: a plugin file loaded again defines its classes anew)."""
    kind = type(arm)
    names = ARMS.names()
    for name in names:
        if ARMS.get(name) is kind:
            return name
    for name in names:
        other = ARMS.get(name)
        if (other.__module__, other.__qualname__) == (kind.__module__, kind.__qualname__):
            return name
    raise ValueError(f"arm {arm!r} is of no registered kind; registered arm kinds: {names}")


def arm_name(arm: Arm) -> str:
    """The canonical string of ``arm`` (what :func:`arm_of` reads back): its kind's name and
    every field that is not None, in field order (``tree:k=4,b=3``)."""
    params = ",".join(f"{name}={value}" for name, value in dataclasses.asdict(arm).items()
                      if value is not None)
    return kind_name_of(arm) + (f":{params}" if params else "")
