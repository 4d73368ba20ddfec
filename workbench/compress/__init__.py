"""Minitron compression: activation-based importance, structured pruning of HF models into
smaller HF models, architecture search, and knowledge distillation (see README's "Compression")."""

# Nothing re-exported: each module is imported by its path (README, "Every public name").
__all__ = []
