"""The TLT ablation: every RL variant over several seeds, in lockstep. Its modules, imported by
path:

- ``runner``: ``run_ablation``, which runs them and checks its arguments first;
- ``result``: its result ``Ablation``, the runs' tables, and the measures on them;
- ``runs``: building the runs, their lockstep turns and held-out evaluations;
- ``store``: the checkpoint folder a resumed ablation picks up from.
"""

__all__: list[str] = []
