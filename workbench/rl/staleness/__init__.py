"""Does a drafter go stale during RL? (notebook 09). Its modules, imported by path:

- ``run``: ``StalenessConfig`` and ``StalenessRun``, one process: GRPO's trajectory, every
  drafter measured and trained on each step's own rollout;
- ``observer``: steps 2) and 3) of a step (measure every drafter, then let it learn);
- ``drafters``: the drafters compared (frozen, adaptive, ceiling, sibling, suffix);
- ``split`` and ``spool``: the same run as two processes side by side, and the spool of one
  observation per step between them;
- ``report``: the byproduct, the sibling drafter's speedups, the run's scalars.
"""

__all__: list[str] = []
