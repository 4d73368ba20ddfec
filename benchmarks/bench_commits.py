"""One benchmark at two commits, side by side: did a change make the code slower?

A refactor is judged by the benchmark it might slow, run at the commit before it and at the
commit after, alternating inside each repeat (the order rotating), so that a busy period hits
both. Each commit runs from a worktree of its own (``git worktree``, detached, under
``--worktrees``), with that worktree first on ``PYTHONPATH`` so that its ``workbench`` is the
one imported, whatever the editable install points at; uncommitted edits in this checkout
touch neither. Every run writes its result file (``--result`` of the benchmark, into a
temporary folder); each of its figures is a ratio of the benchmark's own two systems (the
engine over HF ``generate``, TRL's step over ours), so the figure here, the head's figure over
the base's in the same repeat, compares the code of two commits through a fixed yardstick.
The median of those per-repeat ratios is printed with its min-max and spread, per figure,
written so that above 1 the head is faster: head over base for a speed or a ratio, base over
head for seconds (a figure whose name ends in ``_s``).

    python benchmarks/bench_commits.py --base 9ff37e5 --repeats 3 -- \\
        benchmarks/bench_engine.py --batch-sizes 1 8 --prompts 16 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import add_result, record
from workbench.speedup import spread_stats

ROOT = Path(__file__).resolve().parents[1]


def worktree(rev: str, root: Path) -> Path:
    """A detached worktree of ``rev`` under ``root`` (made once, reused); its path."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    path = root / f"workbench-{sha[:12]}"
    if not (path / ".git").exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT,
                       check=True, capture_output=True)
    return path


def run_once(tree: Path, script: str, args: list[str], out: Path) -> dict:
    """``script`` with ``args`` run in ``tree`` (its package imported), its result written to
    ``out``; the result file's contents."""
    env = {**os.environ, "PYTHONPATH": str(tree) + os.pathsep + str(tree / "benchmarks")}
    cmd = [sys.executable, str(tree / script), *args, "--result", "run",
           "--result-folder", str(out)]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed in {tree}:\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-4000:]}")
    return json.loads((out / "run.json").read_text())


def check_imports(tree: Path) -> None:
    """Refuse to measure a worktree whose runs would import another checkout's package."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    where = subprocess.run([sys.executable, "-c", "import workbench; print(workbench.__file__)"],
                           cwd=tree, env=env, capture_output=True, text=True, check=True)
    if not where.stdout.strip().startswith(str(tree)):
        raise RuntimeError(f"a run in {tree} imports workbench from {where.stdout.strip()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit before the change")
    ap.add_argument("--head", default="HEAD", help="the commit after it (default: HEAD)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each commit, alternating")
    ap.add_argument("--worktrees", default=str(Path(tempfile.gettempdir()) / "bench_commits"),
                    help="where the commits' worktrees go")
    ap.add_argument("script", help="the benchmark, relative to the repository root")
    ap.add_argument("script_args", nargs=argparse.REMAINDER,
                    help="its arguments (after --), without --result")
    add_result(ap)
    args = ap.parse_args()
    script_args = [a for a in args.script_args if a != "--"]
    trees = {"base": worktree(args.base, Path(args.worktrees)),
             "head": worktree(args.head, Path(args.worktrees))}
    for tree in trees.values():
        check_imports(tree)
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    results = []
    for r in range(args.repeats):
        order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
        for which in order:
            with tempfile.TemporaryDirectory() as out:
                results.append(run_once(trees[which], args.script, script_args, Path(out)))
            figures = {name: fig["value"] for name, fig in results[-1]["figures"].items()}
            runs[which].append(figures)
            print(f"repeat {r + 1} {which}: " + ", ".join(f"{k} {v:.3f}"
                                                        for k, v in figures.items()), flush=True)
    names = [n for n in runs["head"][0] if n in runs["base"][0]]
    figures, rows = {}, []
    for name in names:
        ratios = [(b[name] / h[name]) if name.endswith("_s") else (h[name] / b[name])
                  for h, b in zip(runs["head"], runs["base"])]
        stats = spread_stats(ratios)
        figures[f"head_speedup_{name}"] = {"value": stats["ratio"], "min": stats["ratio_min"],
                                             "max": stats["ratio_max"], "n": len(ratios)}
        rows.append(f"| {name} | {statistics.median(b[name] for b in runs['base']):.3f} | "
                    f"{statistics.median(h[name] for h in runs['head']):.3f} | "
                    f"{stats['ratio']:.3f} ({stats['ratio_min']:.3f}-{stats['ratio_max']:.3f}) |")
    print(f"\n{args.script} at {args.base} (base) and {args.head} (head), alternating, "
          f"{args.repeats} repeats\n\n| figure | base | head | head faster by (min-max) |\n"
          "|---|---|---|---|\n" + "\n".join(rows))
    shares = [r["disturbed_share"] for r in results if r["disturbed_share"] is not None]
    record(args, f"Is {args.script} as fast at {args.head} as at {args.base}?", figures,
           clock=results[0]["clock"], disturbed_share=max(shares) if shares else None)


if __name__ == "__main__":
    main()
