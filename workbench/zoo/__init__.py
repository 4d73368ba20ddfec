"""Seeded recipes that build the embedded models shipped in ``data/models/``."""
from .drafters import train_drafter_lm, train_eagle_head
from .policy import train_policy

__all__ = ["RECIPES"]

# name -> callable(out_dir=None, seed=0, minutes=None); `workbench zoo train NAME` runs it.
RECIPES = {"default": train_policy, "drafter-lm": train_drafter_lm, "eagle": train_eagle_head}
"""The zoo's recipes by name: `workbench zoo train NAME` calls `RECIPES[NAME](out_dir=None,
seed=0, minutes=None)`."""
