"""workbench: primitives for studying long-tail RL rollouts and compressing LLMs.

The package supplies the pieces; notebooks in ``notebooks/`` compose them and papermill runs
them (``workbench pipeline run``). See README.md for the public API.
"""
__version__ = "0.1.0"
