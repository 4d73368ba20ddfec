"""The drafter protocol and the registry of named drafters: anything that proposes ``k``
tokens per row for the policy to verify.

:class:`Drafter` is the protocol: it declares every hook the code calls, with its default, so
the engine reads a hook directly and a drafter overrides only what it needs. ``DRAFTERS`` is
the registry of named drafters (``workbench.registry``): the built-ins ``"ngram"`` and
``"sibling"``, and whatever a plugin registers (``@DRAFTERS.register("name")``, the
entry-point group ``workbench.drafters``; docs/extending.md). Every parameter that takes a
drafter name accepts every registered one (``speculative.resolve``). The engine's calls:

- ``check_compatible(policy, tokenizer)`` before a rollout: vocabulary and tokenizer match.
- ``begin()`` at the start of each worker's rollout: forget all per-row state.
- ``draft(ctx, k) -> (tokens [B, k], logq [B, k, V] or None)``: read the rows' committed
  sequences from ``ctx`` (a frozen :class:`~workbench.rollout.drafts.DraftInput` the decoder
  builds for the step: ``sequences``, the unconsumed policy states ``hidden`` for a drafter
  with ``needs_hidden``, ``admitted`` every request of the worker's rollout for a drafter
  that drafts from other rows: ``speculative.sibling``), catch up on what is new, and
  propose; it reads the decoder through nothing else. ``logq`` is the drafter's adjusted
  distribution at each draft (one-hot for deterministic drafters); only speculative sampling
  reads it, so it is ``None`` unless ``ctx.needs_logq`` (greedy and coupled verification
  compare tokens only). ``ctx.choose(logits, depth)`` picks a draft the way verification
  needs.
- ``draft_tree(ctx, k, branch) -> DraftTree`` (``rollout.tree``), only for drafters with
  ``supports_trees``: a tree of depth ``k`` grown EAGLE-2 style, ``branch`` candidates per
  node and per depth, ranked by cumulative ``ctx.tree_logprobs``.
- ``keep_rows(rows)`` when finished rows leave the batch, ``add_rows(n)`` when ``n`` new
  rows join it at the bottom (continuous batching).

``build(policy, tokenizer)`` (a classmethod, default ``cls()``) makes a registered drafter
for a policy when its name is resolved. ``module`` is the drafter's trainable ``nn.Module``
(``None`` for model-free drafters): what a backend's ``update_weights`` loads new weights
into. Several drafters serve one rollout as a ``speculative.DrafterSet`` (``members``,
``main``), whose plans pick the member that drafts (``StepPlan.drafter``).
"""
from __future__ import annotations

import torch

from ..registry import PluginError, Registry
from ..rollout.tree import DraftTree

__all__ = ["Drafter", "DRAFTERS", "REQUIRED_HOOKS", "OPTIONAL_HOOKS", "RESERVED_NAMES",
           "one_hot_logq", "output_vocab_size"]


def one_hot_logq(tokens: torch.Tensor, vocab_size: int, dtype=torch.float32) -> torch.Tensor:
    """log of a one-hot distribution on ``tokens``: a deterministic proposal, as ``logq``."""
    out = torch.full((*tokens.shape, vocab_size), float("-inf"), dtype=dtype,
                     device=tokens.device)
    return out.scatter_(-1, tokens[..., None], 0.0)


def output_vocab_size(model) -> int:
    """The size of ``model``'s output vocabulary (its LM head's rows)."""
    return int(model.get_output_embeddings().weight.shape[0])


class Drafter:
    """The drafter protocol: every hook the engine, the backends and the trainers call, each
    with its default. A drafter subclasses it and overrides ``draft`` (required) and what
    else it needs; the code reads the hooks directly (no ``getattr`` with a fallback), so a
    hook exists on every drafter and a misspelled override is refused when it registers
    (``DRAFTERS``). When the engine calls each one is in the module docstring.

    Attributes (hooks read, not called):
        name: the drafter's name in tables, figures and plans (``StepPlan.drafter``); set to
            the registered name when a class registers without its own.
        needs_hidden: True when the engine must keep the policy's hidden states for it.
        supports_trees: True when :meth:`draft_tree` drafts trees.
        module: the trainable ``nn.Module`` (None: model-free): what a backend's
            ``update_weights`` loads new weights into, and what checkpoints hold.
        head: the EAGLE head, for the spot trainer (``adapt.spot``); None for any other.
        members, main: a drafter set's ``{name: drafter}`` and the name of its main member
            (``speculative.DrafterSet``); None for one drafter.
    """

    name = "drafter"
    needs_hidden = False
    supports_trees = False
    module = None
    head = None
    members = None
    main = None

    vocab_size: int = 0

    @classmethod
    def build(cls, policy, tokenizer) -> "Drafter":
        """The drafter a registered name resolves to for ``policy`` and ``tokenizer``
        (``speculative.resolve.resolve_drafter``); default ``cls()``."""
        return cls()

    def check_compatible(self, policy, tokenizer) -> None:
        """Before a rollout: refuse a policy whose vocabulary or tokenizer this drafter cannot
        serve; the default records the vocabulary size and the dtype of ``logq``."""
        self.vocab_size = output_vocab_size(policy)
        self.dtype = policy.get_output_embeddings().weight.dtype
        if self.dtype in (torch.float16, torch.bfloat16):
            self.dtype = torch.float32

    def begin(self) -> None:
        """At the start of each worker's rollout: forget every row's state."""

    def keep_rows(self, rows: list[int]) -> None:
        """Finished rows left the batch: keep the state of ``rows`` (old indices, in order)."""

    def add_rows(self, n: int) -> None:
        """``n`` new rows joined the batch at the bottom."""

    def draft(self, ctx, k: int):
        """``(tokens [B, k], logq [B, k, V] or None)`` for the rows of ``ctx``; required."""
        raise NotImplementedError(f"{type(self).__name__} defines no draft(ctx, k)")

    def draft_tree(self, ctx, k: int, branch: int) -> DraftTree:
        """A tree ``k`` deep, ``branch`` candidates per node and depth; called only when
        ``supports_trees``."""
        raise NotImplementedError(f"{type(self).__name__} drafts chains only "
                                  "(supports_trees is False)")

    def proposal(self, ctx, tokens: torch.Tensor):
        """``(tokens, logq)`` of a deterministic drafter: logq one-hot, built only if read."""
        return tokens, one_hot_logq(tokens, self.vocab_size, self.dtype) if ctx.needs_logq else None

    @staticmethod
    def stacked(tokens: list[torch.Tensor], logqs: list[torch.Tensor | None]):
        """``(tokens [B, k], logq [B, k, V] or None)`` from per-depth lists."""
        return torch.stack(tokens, 1), None if logqs[0] is None else torch.stack(logqs, 1)


# the protocol's hooks: a registered drafter must define ``draft``; the others have defaults
REQUIRED_HOOKS = ("draft",)
OPTIONAL_HOOKS = ("build", "check_compatible", "begin", "keep_rows", "add_rows", "draft_tree",
                  "name", "needs_hidden", "supports_trees", "module", "head", "members", "main")
# names that ``speculative.resolve`` gives another meaning: a plugin may not take them
RESERVED_NAMES = ("auto", "none", "eagle", "small_lm", "lm")


def _check_drafter(name: str, plugin) -> None:
    """The drafter registry's own checks (the hooks' presence and spelling are the
    registry's): a class, not a reserved name, ``draft`` overridden, trees drafted where
    claimed; a structural drafter (no :class:`Drafter` subclass) defines every hook. A class
    without a ``name`` of its own takes the registered one."""
    if name in RESERVED_NAMES:
        raise PluginError(f"drafter name {name!r} is reserved (it means something else to "
                          f"speculative.resolve: {list(RESERVED_NAMES)}); register under another")
    if not isinstance(plugin, type):
        raise PluginError(f"drafter {name!r}: registered {plugin!r}, accepted a class (a "
                          "subclass of workbench.speculative.drafters.Drafter, or one defining "
                          f"every hook: {list(REQUIRED_HOOKS + OPTIONAL_HOOKS)})")
    if issubclass(plugin, Drafter):
        if plugin.draft is Drafter.draft:
            raise PluginError(f"drafter {name!r} ({plugin.__qualname__}) lacks the required hook "
                              "'draft'; it inherits Drafter's, which drafts nothing")
        trees = plugin.__dict__.get("supports_trees", None)
        if trees is True and plugin.draft_tree is Drafter.draft_tree:
            raise PluginError(f"drafter {name!r} ({plugin.__qualname__}) says supports_trees but "
                              "defines no draft_tree(ctx, k, branch)")
    else:
        missing = [h for h in REQUIRED_HOOKS + OPTIONAL_HOOKS if not hasattr(plugin, h)]
        if missing:
            raise PluginError(f"drafter {name!r} ({plugin.__qualname__}) is no Drafter subclass "
                              f"and lacks the hook(s) {missing}; subclass workbench.speculative."
                              "drafters.Drafter for their defaults")
    own = plugin.__dict__.get("name")
    if own is None:
        plugin.name = name
    elif isinstance(own, str) and own != name:
        raise PluginError(f"drafter {name!r} ({plugin.__qualname__}) has name {own!r}; register "
                          f"it as {own!r}, or drop its name (registering sets it)")


DRAFTERS: Registry = Registry("drafter", "workbench.drafters", required=REQUIRED_HOOKS,
                              optional=OPTIONAL_HOOKS, check=_check_drafter)
"""The registry of drafters: the built-in ones and plugins' (entry-point group
`workbench.drafters`)."""
