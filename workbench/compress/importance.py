"""Width importance (Minitron): how much each attention head, MLP neuron and embedding channel
of a Llama-family model contributes, read from its activations on a small calibration set.

Forward hooks record, per token, a head's attention output norm (the input of ``o_proj`` split
into heads), a neuron's activation magnitude (the input of ``down_proj``) and a channel's
magnitude after each decoder layer's two norms. Each is reduced over the valid (non-pad) tokens
of a sequence, then over all sequences; Minitron's ablation found L2 over the batch of the
sequence mean best, so that is the default. Weight-magnitude and random scores of the same
shape are the baselines that ablation compares against.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import pandas as pd
import torch
from ..checks import check_choice
from ..progress import tqdm

from .data import CALIBRATION_SEED, pad_id, sequences_from, token_batches
from .plan import check_model_type
from .scores import UnitScores

__all__ = ["Aggregation", "Importance", "calibration_batches", "importance_from_batches",
           "magnitude_scores", "random_scores"]

AGGREGATIONS = ("mean", "l2", "var")


def check_supported(model) -> None:
    """Refuse models whose decoder layers are not reached as ``model.model.layers[i]`` with
    ``self_attn.o_proj`` / ``mlp.down_proj`` / two RMSNorms: the hooks would silently miss
    (:func:`~.plan.check_model_type`, the one family check of ``compress``)."""
    check_model_type(model)


def check_batches(batches) -> list:
    """The batches as a list; an empty calibration set is refused before any model runs."""
    batches = list(batches)
    if not batches:
        raise ValueError("empty calibration set: no (ids, mask) batches given; pass at least "
                         "one batch (see calibration_batches)")
    return batches


@contextmanager
def evaluating(model):
    """Eval mode and no gradients for the duration; the model's own mode comes back after,
    also when the body raises."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


@dataclass(frozen=True)
class Aggregation:
    """How token activations become one score: first over each sequence's valid tokens
    (``sequence``), then over all sequences (``batch``); each one of ``AGGREGATIONS``.
    ``var`` is the population variance, so a single sequence gives 0 rather than NaN."""

    batch: str = "l2"
    sequence: str = "mean"

    def __post_init__(self):
        for name in ("batch", "sequence"):
            check_choice(f"Aggregation.{name}", getattr(self, name), AGGREGATIONS)


def aggregate_sequences(values: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """``[batch, seq, units]`` -> ``[batch, units]`` over the tokens where ``mask`` is 1, so that
    padding never counts."""
    check_choice("sequence aggregation", how, AGGREGATIONS)
    weight = mask.to(values.dtype).unsqueeze(-1)
    count = weight.sum(dim=1)
    mean = (values * weight).sum(dim=1) / count
    if how == "mean":
        return mean
    if how == "l2":
        return (values.square() * weight).sum(dim=1).sqrt()
    return ((values - mean.unsqueeze(1)).square() * weight).sum(dim=1) / count


class BatchAggregate:
    """Running aggregate over sequences, fed one batch at a time: keeps count, mean and the sum
    of squared deviations (Chan's parallel update), so memory does not grow with the
    calibration set and mean, L2 and variance all come from the same three numbers."""

    def __init__(self, how: str):
        check_choice("batch aggregation", how, AGGREGATIONS)
        self.how = how
        self.count = 0
        self.mean: torch.Tensor | None = None
        self.sq_dev: torch.Tensor | None = None

    def add(self, per_sequence: torch.Tensor) -> None:
        """Fold in ``[n, units]`` per-sequence values."""
        values = per_sequence.double()
        n_new = values.shape[0]
        mean_new = values.mean(dim=0)
        sq_dev_new = (values - mean_new).square().sum(dim=0)
        if self.mean is None:
            self.count, self.mean, self.sq_dev = n_new, mean_new, sq_dev_new
            return
        total = self.count + n_new
        delta = mean_new - self.mean
        self.mean = self.mean + delta * (n_new / total)
        self.sq_dev = self.sq_dev + sq_dev_new + delta.square() * (self.count * n_new / total)
        self.count = total

    def result(self) -> torch.Tensor:
        if self.how == "mean":
            return self.mean
        if self.how == "var":
            return self.sq_dev / self.count
        return (self.sq_dev + self.count * self.mean.square()).sqrt()


@dataclass
class Importance:
    """Activation importance of one model: the scores plus how they were made."""

    scores: UnitScores
    sequences: int  # calibration sequences seen
    tokens: int  # valid (non-pad) tokens seen
    aggregation: Aggregation = field(default_factory=Aggregation)

    def tables(self) -> dict[str, pd.DataFrame]:
        """Tidy tables ``heads``, ``neurons``, ``channels`` (see ``score_tables``)."""
        return score_tables(self.scores)


class _Collector:
    """Running aggregates of every hooked activation; hooks read the current batch's mask from
    here, since a module hook never sees the attention mask itself."""

    def __init__(self, aggregation: Aggregation):
        self.aggregation = aggregation
        self.mask: torch.Tensor | None = None
        self.aggregates: dict[tuple, BatchAggregate] = {}

    def add(self, key: tuple, per_token: torch.Tensor) -> None:
        per_token = per_token.to(torch.promote_types(per_token.dtype, torch.float32))
        per_sequence = aggregate_sequences(per_token, self.mask, self.aggregation.sequence)
        aggregate = self.aggregates.setdefault(key, BatchAggregate(self.aggregation.batch))
        aggregate.add(per_sequence)

    def result(self, *key) -> torch.Tensor:
        return self.aggregates[key].result().cpu()


def _head_norms(attn_output: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[.., heads * head_dim]`` (the input of ``o_proj``) -> ``[.., heads]``: each head's
    output norm, before the projection mixes heads together."""
    return attn_output.unflatten(-1, (num_heads, -1)).norm(dim=-1)


def _input_hook(collector: _Collector, key: tuple, per_token):
    return lambda module, args: collector.add(key, per_token(args[0]))


def _output_hook(collector: _Collector, key: tuple, per_token):
    return lambda module, args, output: collector.add(key, per_token(output))


def _register_hooks(model, collector: _Collector, handles: list) -> None:
    """Hook every layer's ``o_proj`` and ``down_proj`` inputs and both norms' outputs; handles
    go into ``handles`` as they are made so that a failure half-way still removes them."""
    num_heads = model.config.num_attention_heads
    head_norms = partial(_head_norms, num_heads=num_heads)
    for i, layer in enumerate(model.model.layers):
        inputs = [(layer.self_attn.o_proj, ("heads", i), head_norms),
                  (layer.mlp.down_proj, ("neurons", i), torch.abs)]
        outputs = [(layer.input_layernorm, ("channels", i, "input"), torch.abs),
                   (layer.post_attention_layernorm, ("channels", i, "post"), torch.abs)]
        for module, key, per_token in inputs:
            handles.append(module.register_forward_pre_hook(
                _input_hook(collector, key, per_token)))
        for module, key, per_token in outputs:
            handles.append(module.register_forward_hook(
                _output_hook(collector, key, per_token)))


@contextmanager
def _hooked(model, collector: _Collector):
    """The importance hooks, for the duration only (removed also on exceptions)."""
    handles: list = []
    try:
        _register_hooks(model, collector, handles)
        yield
    finally:
        for handle in handles:
            handle.remove()


def _unit_scores(collector: _Collector, num_layers: int) -> UnitScores:
    """Stack per-layer aggregates; a channel's score is the sum over all norms' scores."""
    layers = range(num_layers)
    channels = sum(collector.result("channels", i, where)
                   for i in layers for where in ("input", "post"))
    return UnitScores(heads=torch.stack([collector.result("heads", i) for i in layers]),
                      neurons=torch.stack([collector.result("neurons", i) for i in layers]),
                      channels=channels)


def importance_from_batches(model, batches, aggregation: Aggregation | None = None,
                            progress: bool = True) -> Importance:
    """Activation importance of ``model``'s heads, neurons and channels over ``batches`` of
    padded ``(ids, mask)``, as ``compress.data.token_batches`` makes them."""
    check_supported(model)
    batches = check_batches(batches)
    aggregation = aggregation or Aggregation()
    collector = _Collector(aggregation)
    device = model.get_input_embeddings().weight.device
    sequences = tokens = 0
    with evaluating(model), _hooked(model, collector):
        for ids, mask, *_ in tqdm(batches, desc="importance", unit="batch", disable=not progress):
            collector.mask = mask.to(device)
            model.model(input_ids=ids.to(device), attention_mask=collector.mask,
                        use_cache=False)
            sequences += ids.shape[0]
            tokens += int(mask.sum())
    scores = _unit_scores(collector, model.config.num_hidden_layers)
    return Importance(scores, sequences=sequences, tokens=tokens, aggregation=aggregation)


def calibration_batches(tokenizer, source="running_sum", num: int = 1024,
                        batch_size: int = 8, max_len: int | None = 256,
                        seed: int = CALIBRATION_SEED, device=None) -> list:
    """``(ids, mask)`` batches of ``num`` calibration examples from ``source`` (a task's
    prompt then response then stop token, as a rollout feeds them, or a text file's lines;
    see ``compress.data.sequences_from``), each cut to ``max_len`` tokens."""
    seqs, _ = sequences_from(source, num, tokenizer, seed, max_len)
    return token_batches(seqs, batch_size, pad_id(tokenizer), device)


def activation_importance(model, tokenizer, source="running_sum", num: int = 1024,
                          batch_size: int = 8, max_len: int | None = 256,
                          aggregation: Aggregation | None = None,
                          progress: bool = True) -> Importance:
    """Minitron's one-shot width importance on ``num`` calibration texts from ``source``
    (Minitron used 1024 samples)."""
    check_supported(model)
    batches = calibration_batches(tokenizer, source, num, batch_size, max_len)
    return importance_from_batches(model, batches, aggregation, progress)


def _weight_norms(weight: torch.Tensor, dim: int) -> torch.Tensor:
    return weight.detach().double().norm(dim=dim).cpu()


def magnitude_scores(model) -> UnitScores:
    """Weight-magnitude baseline: a head's norm of its ``o_proj`` input columns, a neuron's
    norm of its ``down_proj`` column, a channel's norm of its embedding column."""
    check_supported(model)
    num_heads = model.config.num_attention_heads
    heads, neurons = [], []
    for layer in model.model.layers:
        columns = layer.self_attn.o_proj.weight.unflatten(1, (num_heads, -1))
        heads.append(_weight_norms(columns, dim=(0, 2)))
        neurons.append(_weight_norms(layer.mlp.down_proj.weight, dim=0))
    channels = _weight_norms(model.get_input_embeddings().weight, dim=0)
    return UnitScores(torch.stack(heads), torch.stack(neurons), channels)


def random_scores(model, seed: int = 0) -> UnitScores:
    """Random baseline of the same shape: uniform draws from a generator seeded with ``seed``."""
    check_supported(model)
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    shapes = {"heads": (config.num_hidden_layers, config.num_attention_heads),
              "neurons": (config.num_hidden_layers, config.intermediate_size),
              "channels": (config.hidden_size,)}
    return UnitScores(**{name: torch.rand(shape, generator=generator, dtype=torch.float64)
                         for name, shape in shapes.items()})


def _layer_unit_table(scores: torch.Tensor, unit: str) -> pd.DataFrame:
    layers, units = scores.shape
    return pd.DataFrame({"layer": torch.arange(layers).repeat_interleave(units).numpy(),
                         unit: torch.arange(units).repeat(layers).numpy(),
                         "score": scores.double().flatten().numpy()})


def score_tables(scores: UnitScores) -> dict[str, pd.DataFrame]:
    """Tidy tables of ``scores``: ``heads`` (layer, head, score), ``neurons`` (layer, neuron,
    score) and ``channels`` (channel, score)."""
    channels = scores.channels.double()
    return {"heads": _layer_unit_table(scores.heads, "head"),
            "neurons": _layer_unit_table(scores.neurons, "neuron"),
            "channels": pd.DataFrame({"channel": range(len(channels)),
                                      "score": channels.numpy()})}
