"""workbench: primitives for studying long-tail RL rollouts and compressing LLMs.

The package supplies the pieces; notebooks in ``notebooks/`` compose them and papermill runs
them (``workbench pipeline run``). The public API is the reference generated from the
docstrings (``docs/api/``, ``mkdocs build``).
"""
__version__ = "0.1.0"
