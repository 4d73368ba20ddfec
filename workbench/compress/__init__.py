"""Minitron compression: activation-based importance, structured pruning of HF models into
smaller HF models, architecture search, and knowledge distillation (the API reference's
page ``docs/api/compress.md`` lists its public modules)."""

# Nothing re-exported: each module is imported by its path.
__all__ = []
