"""The lean forward (rollout.lean) computes what HF's forward computes, holes and padding too."""
import pytest
import torch
from transformers import DynamicCache

from workbench.rollout.batch import DecodeBatch, PolicyForward
from workbench.rollout.lean import LeanForward, supports_lean

from .conftest import PROMPTS, tiny_model


def same_where_visible(outs, visible):
    """Logits and hidden states agree at every real token (padding computes nothing used)."""
    (logits_hf, hidden_hf), (logits_lean, hidden_lean) = outs
    torch.testing.assert_close(logits_lean[visible], logits_hf[visible])
    torch.testing.assert_close(hidden_lean[:, -visible.shape[1]:][visible],
                               hidden_hf[:, -visible.shape[1]:][visible])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lean_forward_equals_hf_forward_with_padding_and_holes(arch, tokenizer):
    model = tiny_model(arch, tokenizer)
    with torch.no_grad():  # peaked attention, so positions and masks decide the outputs
        for layer in model.get_decoder().layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    hf, lean = PolicyForward.of(model), LeanForward(model)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    batch, ids, pos = DecodeBatch.from_prompts(prompts, range(3), tokenizer.pad_token_id, "cpu")
    caches = DynamicCache(), DynamicCache()
    outs = [f(ids, batch.mask, pos, c, logits_from=0) for f, c in zip((hf, lean), caches)]
    same_where_visible(outs, batch.mask.bool())
    g = torch.Generator().manual_seed(0)
    for width in (3, 1, 2, 1):  # verify-like blocks, then holes where drafts were rejected
        batch.append_columns(width)
        new = torch.randint(3, len(tokenizer), (3, width), generator=g)
        pos = batch.next_pos[:, None] + torch.arange(width)
        outs = [f(new, batch.mask, pos, c, logits_from=0) for f, c in zip((hf, lean), caches)]
        same_where_visible(outs, batch.mask[:, -width:].bool())
        batch.mask[0, -1] = 0
        batch.next_pos += width


def test_lean_forward_refuses_models_it_does_not_cover(tokenizer):
    model = tiny_model("llama", tokenizer)
    model.config.model_type = "gemma"
    assert not supports_lean(model.config, model.get_decoder().layers[0])
    with pytest.raises(ValueError, match="no lean forward for model type 'gemma'"):
        LeanForward(model)
