"""The TLT ablation: every RL variant over several seeds, in lockstep. Its modules, imported by
path:

- ``runner``: ``run_ablation`` and its result ``Ablation`` with the measures;
- ``runs``: building the runs, their lockstep turns and held-out evaluations;
- ``store``: the checkpoint folder a resumed ablation picks up from.
"""

__all__: list[str] = []
