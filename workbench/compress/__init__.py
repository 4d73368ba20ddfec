"""Minitron compression: activation-based importance, structured pruning of HF models into
smaller HF models, architecture search, and knowledge distillation (see README's "Compression")."""
