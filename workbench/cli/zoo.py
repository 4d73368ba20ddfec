"""``workbench zoo train``: build an embedded model from its seeded recipe."""
from __future__ import annotations

import sys

from .arguments import positive_minutes

__all__ = ["add"]


def add(sub) -> None:
    zoo = sub.add_parser("zoo", help="build the embedded models from their seeded recipes")
    zsub = zoo.add_subparsers(dest="zoo_command", required=True)
    zt = zsub.add_parser("train", help="train a zoo model")
    zt.add_argument("name", help="recipe name, e.g. 'default'")
    zt.add_argument("--out", default=None, help="output folder (default: the recipe's data/ path)")
    zt.add_argument("--seed", type=int, default=0)
    zt.add_argument("--minutes", type=positive_minutes, default=None,
                    help="wall-clock budget; the recipe's own default when omitted")
    zt.set_defaults(func=train)


def train(args) -> int:
    from ..zoo import RECIPES
    if args.name not in RECIPES:
        print(f"unknown zoo recipe {args.name!r}; accepted: {sorted(RECIPES)}", file=sys.stderr)
        return 2
    RECIPES[args.name](out_dir=args.out, seed=args.seed, minutes=args.minutes)
    return 0
