"""The embedded drafters of the default policy, by name."""
from __future__ import annotations

from ..models import DEFAULT_EAGLE, load_model
from .drafters import EagleDrafter, LMDrafter, NGramDrafter
from .eagle import EagleHead

__all__ = ["default_drafters"]

DRAFTER_NAMES = ("eagle", "ngram", "small_lm")


def default_drafters(policy, tokenizer, names=DRAFTER_NAMES) -> dict:
    """``{name: drafter}`` for the default policy (loaded on its device and dtype).

    ``eagle`` is the shipped EAGLE head (data/models/eagle_head), ``small_lm`` the shipped small
    drafter LM (``"default-drafter"``), ``ngram`` prompt lookup.
    """
    unknown = [n for n in names if n not in DRAFTER_NAMES]
    if unknown:
        raise ValueError(f"unknown drafter(s) {unknown}; accepted: {list(DRAFTER_NAMES)}")
    weight = policy.get_output_embeddings().weight
    out = {}
    for name in names:
        if name == "eagle":
            out[name] = EagleDrafter(EagleHead.from_pretrained(DEFAULT_EAGLE, policy), policy)
        elif name == "ngram":
            out[name] = NGramDrafter()
        else:
            lm, _ = load_model("default-drafter", device=weight.device, dtype=weight.dtype)
            out[name] = LMDrafter(lm, tokenizer)
    return out
