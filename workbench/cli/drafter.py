"""``workbench drafter train``: fit a drafter to any model and task on the spot."""
from __future__ import annotations

import sys

from .arguments import positive_minutes

__all__ = ["add"]


def add(sub) -> None:
    drafter = sub.add_parser("drafter", help="fit a drafter to any model and task")
    dsub = drafter.add_subparsers(dest="drafter_command", required=True)
    dt = dsub.add_parser("train", help="fit an EAGLE head or a small-LM drafter on the spot "
                         "(the policy's own outputs on the task's training prompts)")
    dt.add_argument("--model", required=True, help="'default' or a local HF model folder")
    dt.add_argument("--task", required=True,
                    help="embedded task name or a .jsonl file of {\"prompt\", \"answer\"} lines")
    dt.add_argument("--out", required=True, help="folder the drafter is saved into")
    dt.add_argument("--minutes", type=positive_minutes, required=True,
                    help="wall-clock budget of harvesting and training together")
    dt.add_argument("--kind", choices=["eagle", "lm"], default="eagle",
                    help="an EAGLE head (default) or a small LM")
    dt.add_argument("--seed", type=int, default=0)
    dt.set_defaults(func=train)


def train(args) -> int:
    """Exit 0 with the drafter saved and its tau printed, 2 for arguments that cannot work
    (one message; nothing loaded, trained or written)."""
    from pathlib import Path

    from ..models import load_model, resolve_model_path
    from ..speculative.cache import task_key
    from ..speculative.fit import FitConfig, fit_drafter_lm, fit_eagle, split_prompts
    config = FitConfig(minutes=args.minutes, seed=args.seed)
    try:
        config.validate()
        resolve_model_path(args.model)
        task_key(args.task)
        split_prompts(args.task, config.train_prompts, config.heldout_prompts, config.seed)
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise FileExistsError(f"--out {args.out!r} is an existing file; pass a folder")
    except (ValueError, OSError) as exc:
        print(f"workbench drafter train: error: {exc}", file=sys.stderr)
        return 2
    policy, tokenizer = load_model(args.model)
    fitter = fit_eagle if args.kind == "eagle" else fit_drafter_lm
    fitted = fitter(policy, tokenizer, args.task, args.out, config)
    print(f"tau {fitted.tau:.3f} (acceptance length, greedy, k={config.k}) on "
          f"{fitted.provenance['heldout_prompts']} held-out prompts of {args.task}; "
          f"{args.kind} drafter saved to {fitted.path}")
    return 0
