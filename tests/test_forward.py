"""The engine's forwards (rollout.forward) compute what HF computes, padding, holes and sliding
windows included, for every Llama-family variant the engine claims."""
import pytest
import torch
from transformers import DynamicCache

from workbench.rollout.batch import DecodeBatch
from workbench.rollout.forward import (HFForward, LeanForward, attention_mask, policy_forward,
                                       supports_lean)

from .helpers.models import ARCHS, PROMPTS, tiny_model


def peaked(model):
    """Sharpen attention, so that positions and masks decide the outputs."""
    with torch.no_grad():
        for layer in model.get_decoder().layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    return model


def fresh(model, seq):
    """Logits and pre-norm states of HF's own forward on one unpadded sequence."""
    out = model(torch.tensor([seq]), output_hidden_states=True)
    return out.logits[0], out.hidden_states[-1][0]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_forward_equals_hf_on_each_rows_own_sequence_with_padding_and_holes(arch, tokenizer):
    """Ragged prompts, then blocks whose last column some rows reject (a hole), for longer
    than the sliding window: every kept token's logits equal HF's forward of that row alone."""
    model = peaked(tiny_model(arch, tokenizer, seed=1))
    kinds = [HFForward(model)] + ([LeanForward(model)] if LeanForward.covers(model) else [])
    assert len(kinds) == 2  # every variant claimed runs lean too (Qwen3's q/k norms included)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    g = torch.Generator().manual_seed(0)
    for fwd in kinds:
        batch, ids, pos = DecodeBatch.from_prompts(prompts, range(3), tokenizer.pad_token_id,
                                                   "cpu")
        seqs = [list(p) for p in prompts]
        logits, _ = fwd(ids, pos, batch.mask, batch.col_pos, batch.cache, logits_from=0)
        for width in (3, 1, 2, 1, 4, 3, 1, 2):
            new = torch.randint(3, len(tokenizer), (3, width), generator=g)
            pos = batch.append_columns(width)
            logits, _ = fwd(new, pos, batch.mask, batch.col_pos, batch.cache, logits_from=0)
            keep = [width - (r == 0 and width > 1) for r in range(3)]  # row 0 rejects one
            for r in range(3):
                seqs[r] += new[r, :keep[r]].tolist()
                ref, _ = fresh(model, seqs[r])
                torch.testing.assert_close(logits[r, :keep[r]], ref[-keep[r]:])
            batch.mask[0, batch.width - 1] = 0 if width > 1 else 1
            batch.next_pos += torch.tensor(keep)
        assert len(seqs[0]) > 2 * 8 and (batch.mask == 0).any()  # past the window, with holes


def test_attention_mask_counts_positions_not_columns():
    """Two visible tokens four columns apart but adjacent in position are inside a window of 2."""
    mask = torch.tensor([[1, 0, 0, 0, 1, 1]])
    col_pos = torch.tensor([[5, 0, 0, 0, 6, 7]])
    m = attention_mask(mask, col_pos, torch.tensor([[7]]), 2, torch.float64)
    assert (m[0, 0, 0] == 0).tolist() == [False, False, False, False, True, True]
    m = attention_mask(mask, col_pos, torch.tensor([[7]]), None, torch.float64)
    assert (m[0, 0, 0] == 0).tolist() == [True, False, False, False, True, True]
    assert attention_mask(torch.ones(1, 3, dtype=torch.long), torch.tensor([[0, 1, 2]]),
                          torch.tensor([[2]]), None, torch.float64, allow_none=True) is None


def test_policy_forward_picks_lean_where_covered_and_refuses_lean_elsewhere(tokenizer):
    from transformers import GemmaConfig, GemmaForCausalLM
    llama, qwen3 = tiny_model("llama", tokenizer), tiny_model("qwen3", tokenizer)
    assert isinstance(policy_forward(llama), LeanForward)
    assert policy_forward(llama) is policy_forward(llama)  # made once per model
    assert isinstance(policy_forward(llama, lean=False), HFForward)
    assert isinstance(policy_forward(qwen3), LeanForward)  # q/k norms: lean too
    gemma = GemmaForCausalLM(GemmaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, head_dim=8))
    assert isinstance(policy_forward(gemma), HFForward)
    assert not supports_lean(gemma.config, gemma.get_decoder().layers[0])
    with pytest.raises(ValueError, match="no lean forward for model type 'gemma'"):
        LeanForward(gemma)


def test_prenorm_states_equal_hf_hidden_states(tokenizer):
    model = tiny_model("qwen2_sw", tokenizer)
    seq = tokenizer(PROMPTS[1])["input_ids"]
    _, ref_hidden = fresh(model, seq)
    for fwd in (HFForward(model), LeanForward(model)):
        ids = torch.tensor([seq])
        pos = torch.arange(len(seq))[None]
        _, hidden = fwd(ids, pos, torch.ones_like(ids), pos, DynamicCache(), logits_from=0)
        # HF's last hidden state is after the final norm; the engine keeps the one before it
        torch.testing.assert_close(model.get_decoder().norm(hidden[0]), ref_hidden)


def test_lean_forward_sees_weights_changed_in_place(tokenizer):
    """Plans (fused weights) are rebuilt when weights are loaded or trained in place."""
    model, other = tiny_model("llama", tokenizer, seed=0), tiny_model("llama", tokenizer, seed=4)
    seq = tokenizer(PROMPTS[1])["input_ids"]
    ids, pos = torch.tensor([seq]), torch.arange(len(seq))[None]
    lean = LeanForward(model)
    before, _ = lean(ids, pos, torch.ones_like(ids), pos, DynamicCache(), logits_from=0)
    model.load_state_dict(other.state_dict())  # copies into the same tensors
    after, _ = lean(ids, pos, torch.ones_like(ids), pos, DynamicCache(), logits_from=0)
    torch.testing.assert_close(after[0], fresh(other, seq)[0])
    assert not torch.allclose(before, after)
    with torch.no_grad():
        model.get_decoder().layers[1].mlp.up_proj.weight.mul_(2)  # one weight, trained in place
    again, _ = lean(ids, pos, torch.ones_like(ids), pos, DynamicCache(), logits_from=0)
    torch.testing.assert_close(again[0], fresh(model, seq)[0])


def test_rope_table_with_a_bound_reads_the_same_and_refuses_a_position_past_its_table(
        tokenizer):
    """The compiled step passes its width as the positions' bound (no read-back of the
    largest position): the same cos/sin as without it, and a position past the table (a
    wrong bound) is an IndexError, never a value read from elsewhere."""
    model = tiny_model("llama", tokenizer, seed=0).double()
    rope, x = LeanForward(model).rope, torch.zeros(1, dtype=torch.float64)
    pos = torch.tensor([[0, 3, 7]])
    fresh_cos, fresh_sin = rope(x, pos)
    cos, sin = rope(x, pos, 8)
    assert torch.equal(cos, fresh_cos) and torch.equal(sin, fresh_sin)
    size = rope.table[0].shape[1]
    with pytest.raises(IndexError):
        rope(x, torch.tensor([[size + 5]]), 2)
