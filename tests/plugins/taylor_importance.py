"""A worked example of an importance-score plugin (docs/extending.md, "An importance score"):
first-order Taylor importance, |w * dL/dw| summed over a unit's weights, with the gradient of
the LM loss on the calibration set. It estimates how much the loss would move if the unit's
weights were zeroed (Molchanov et al., 2019), where activation importance reads only how large
the unit's output is.

Load it as a plugin, then name it like a built-in ranking:

    papermill notebooks/05_pruning.ipynb out.ipynb \
        -p plugins '["tests/plugins/taylor_importance.py"]' \
        -p rankings '["activation", "weight_magnitude", "random", "taylor"]'
"""
from __future__ import annotations

import torch

from workbench.compress.rankings import ImportanceScore, importance_score
from workbench.compress.scores import UnitScores


@importance_score("taylor")
class Taylor(ImportanceScore):
    """|w * grad| per head (its q_proj rows and o_proj columns), neuron (its gate/up rows and
    down_proj column) and channel (its embedding column and every norm's weight)."""

    def scores(self, teacher, calibration, seed: int) -> UnitScores:
        grads = _loss_gradients(teacher, calibration)
        saliency = {name: (p.detach() * grads[name]).abs().double().cpu()
                    for name, p in teacher.named_parameters() if name in grads}
        return _unit_scores(teacher, saliency)


def _loss_gradients(model, calibration) -> dict[str, torch.Tensor]:
    """``{parameter name: dL/dw}`` of the mean next-token loss over the valid tokens of the
    ``(ids [batch, seq], mask [batch, seq])`` batches; the model's mode and ``.grad`` stay
    untouched (``torch.autograd.grad``)."""
    names, params = zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad])
    total = [torch.zeros_like(p) for p in params]
    was_training = model.training
    model.eval()
    try:
        for ids, mask, *_ in calibration:
            device = params[0].device
            ids, mask = ids.to(device), mask.to(device)
            labels = ids.masked_fill(mask == 0, -100)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
            for acc, g in zip(total, torch.autograd.grad(loss, params, allow_unused=True)):
                if g is not None:
                    acc += g / len(calibration)
    finally:
        model.train(was_training)
    return dict(zip(names, total))


def _unit_scores(model, s: dict[str, torch.Tensor]) -> UnitScores:
    """Sum each unit's saliencies ``s`` (by parameter name) into the shape prune() takes."""
    config, prefix = model.config, model.base_model_prefix
    heads, neurons = [], []
    channels = s[f"{prefix}.embed_tokens.weight"].sum(dim=0)  # [hidden]
    for i in range(config.num_hidden_layers):
        at = f"{prefix}.layers.{i}"
        n_heads = config.num_attention_heads
        q = s[f"{at}.self_attn.q_proj.weight"].unflatten(0, (n_heads, -1)).sum(dim=(1, 2))
        o = s[f"{at}.self_attn.o_proj.weight"].unflatten(1, (n_heads, -1)).sum(dim=(0, 2))
        heads.append(q + o)
        neurons.append(s[f"{at}.mlp.gate_proj.weight"].sum(dim=1)
                       + s[f"{at}.mlp.up_proj.weight"].sum(dim=1)
                       + s[f"{at}.mlp.down_proj.weight"].sum(dim=0))
        channels = channels + s[f"{at}.input_layernorm.weight"] \
            + s[f"{at}.post_attention_layernorm.weight"]
    return UnitScores(torch.stack(heads), torch.stack(neurons), channels)
