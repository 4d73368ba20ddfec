"""What an RL notebook starts from (:func:`rl_setup`): the policy, the pre-RL drafter head,
the RL pool, the held-out problems and the reward, each named by a string and checked before
the model loads. The ablation (``rl.ablation``) and the staleness study (``rl.staleness``)
both start here."""
from __future__ import annotations

from dataclasses import dataclass

from .variants import check_variants, speculates, variant_names

__all__ = ["RLSetup", "rl_setup"]

DEFAULT_VARIANTS = ("baseline", "static_sd", "adaptive_drafter", "tlt")  # TLT's ablation


@dataclass
class RLSetup:
    """What an RL notebook starts from: the policy, its tokenizer, the pre-RL drafter head
    (None when no variant speculates), the RL prompt pool, the held-out problems and the
    reward."""

    policy: object
    tokenizer: object
    drafter_head: object
    pool: list
    held_out: list
    reward: object


def rl_setup(model: str = "default", task: str = "running_sum", rl_problems: int = 4000,
             eval_problems: int = 200, reward: str = "exact", *, drafter="auto",
             variants=DEFAULT_VARIANTS, fit=None) -> RLSetup:
    """Load ``model``, draw the RL pool (``RL_SEED``) and held-out problems (``HELDOUT_SEED``)
    of ``task``, pick the reward by name (``tasks.REWARDS``), and the pre-RL EAGLE head that
    ``drafter`` names (``speculative.resolve.resolve_head``: ``"auto"``, the shipped head of
    the default model and for any other one a head fitted on the spot with ``fit``, a
    ``FitConfig``, and cached; or a head's folder).

    When no variant of ``variants`` (any RL variant's name: ``rl.variants``) speculates
    (``["baseline"]``) no head is needed: none is loaded or trained and ``drafter`` may be
    ``"none"``. Every argument is checked before the model loads.
    """
    from ..models import load_model
    from ..speculative.resolve import check_head_spec, drafter_form, resolve_head
    from ..tasks import HELDOUT_SEED, RL_SEED, get_problems, get_reward
    if isinstance(variants, str):
        raise ValueError(f"variants {variants!r}: accepted a list of {variant_names()}")
    variants = check_variants(variants)
    scorer = get_reward(reward, task)
    speculative = speculates(variants)
    if speculative:
        check_head_spec(drafter)
    else:
        drafter_form(drafter)  # a bad name is an error even where no head is needed
    pool = get_problems(task, rl_problems, seed=RL_SEED)
    held_out = get_problems(task, eval_problems, seed=HELDOUT_SEED)
    policy, tokenizer = load_model(model)
    head = resolve_head(drafter, policy, tokenizer, task, fit) if speculative else None
    return RLSetup(policy, tokenizer, head, pool, held_out, scorer)
