"""``workbench ablation merge|status``: an RL ablation's checkpoint folders, read and joined
without loading a model."""
from __future__ import annotations

import sys

__all__ = ["add"]


def add(sub) -> None:
    ablation = sub.add_parser("ablation", help="an RL ablation's checkpoint folders")
    asub = ablation.add_subparsers(dest="ablation_command", required=True)
    am = asub.add_parser("merge", help="join the folders of one ablation's seeds run apart "
                         "(each its own process or machine) into one")
    am.add_argument("sources", nargs="+", help="the runs' checkpoint_dir folders")
    am.add_argument("--into", required=True, help="the merged folder (must not exist)")
    am.set_defaults(func=merge)
    st = asub.add_parser("status", help="how far a running or finished ablation has got: its "
                         "RL steps checkpointed and held-out accuracy so far, over the folders "
                         "of its seeds (read from their progress files; loads no model)")
    st.add_argument("folders", nargs="+", help="the runs' checkpoint_dir folders")
    st.set_defaults(func=status)


def merge(args) -> int:
    """Exit 0 with the merged folder written, 2 when the folders cannot be merged (nothing
    written)."""
    from ..rl.ablation.store import merge_ablations
    try:
        path = merge_ablations(args.sources, args.into)
    except (ValueError, OSError) as exc:
        print(f"workbench ablation merge: error: {exc}", file=sys.stderr)
        return 2
    print(f"merged {len(args.sources)} ablation folders into {path}; run the ablation with "
          "every seed and this checkpoint_dir")
    return 0


def status(args) -> int:
    """Print how far each folder has got and the held-out accuracy so far; exit 2 when a
    folder is not an ablation's."""
    from ..rl.ablation.store import ablation_progress
    try:
        steps, accuracy = ablation_progress(args.folders)
    except (ValueError, OSError) as exc:
        print(f"workbench ablation status: error: {exc}", file=sys.stderr)
        return 2
    for folder, done in steps.items():
        print(f"{folder}: {done} RL steps checkpointed")
    if accuracy.empty:
        print("no held-out evaluation yet")
        return 0
    cells = accuracy.assign(cell=[
        f"{a:.3f}" + ("" if n < 2 else f" ± {sd:.3f}") + f" ({n})"
        for a, sd, n in zip(accuracy["accuracy"], accuracy["accuracy_sd"], accuracy["seeds"])])
    table = cells.pivot(index="variant", columns="step", values="cell")
    table = table.reindex(list(dict.fromkeys(accuracy["variant"]))).fillna("")
    print("held-out accuracy after each evaluated RL step: mean ± sd (seeds)")
    print(table.rename_axis(index=None, columns="step").to_string())
    return 0
