"""Width and depth importance (Minitron) on tiny random float64 models: the scores are the
activations the paper names, aggregated as asked, with padding left out."""
import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from tests.helpers.models import tiny_model
from workbench.compress.depth import (block_importance, block_removal_scan, depth_scores,
                                      layer_removal)
from workbench.compress.importance import (Aggregation, BatchAggregate, activation_importance,
                                           aggregate_sequences, calibration_batches,
                                           importance_from_batches, magnitude_scores,
                                           random_scores)

TEXTS_NUM = 6


@pytest.fixture(scope="module")
def batches(tokenizer):
    return calibration_batches(tokenizer, num=TEXTS_NUM, batch_size=4, max_len=24)


def _hand_aggregate(per_token: torch.Tensor, batches) -> torch.Tensor:
    """Minitron's default written out: mean over each sequence's valid tokens, L2 over all."""
    rows = []
    for (_, mask), values in zip(batches, per_token):
        for r in range(len(mask)):
            rows.append(values[r][mask[r].bool()].mean(dim=0))
    return torch.stack(rows).norm(dim=0)


def _manual_head_outputs(model, layer_idx: int, ids, mask) -> torch.Tensor:
    """``[batch, seq, heads]`` norms of each head's attention output, recomputed by hand from
    the layer's input (causal + padding mask, RoPE, q/k norms where the model has them)."""
    hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                   use_cache=False).hidden_states[layer_idx]
    layer, config = model.model.layers[layer_idx], model.config
    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    (b, t, _), h, k = x.shape, config.num_attention_heads, config.num_key_value_heads
    q = attn.q_proj(x).view(b, t, h, attn.head_dim)
    key = attn.k_proj(x).view(b, t, k, attn.head_dim)
    value = attn.v_proj(x).view(b, t, k, attn.head_dim).transpose(1, 2)
    if hasattr(attn, "q_norm"):
        q, key = attn.q_norm(q), attn.k_norm(key)
    cos, sin = model.model.rotary_emb(x, torch.arange(t)[None])
    q, key = apply_rotary_pos_emb(q.transpose(1, 2), key.transpose(1, 2), cos, sin)
    key, value = key.repeat_interleave(h // k, dim=1), value.repeat_interleave(h // k, dim=1)
    allowed = torch.ones(t, t).tril().bool() & mask[:, None, None, :].bool()
    logits = (q @ key.transpose(-1, -2) * attn.scaling).masked_fill(~allowed, float("-inf"))
    return (logits.softmax(dim=-1) @ value).norm(dim=-1).transpose(1, 2)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "llama_odd"])
def test_head_scores_equal_hand_recompute(arch, tokenizer, batches):
    model = tiny_model(arch, tokenizer)
    scores = importance_from_batches(model, batches, progress=False).scores
    scores.check(model.config)
    with torch.no_grad():
        for i in range(model.config.num_hidden_layers):
            per_token = [_manual_head_outputs(model, i, ids, mask) for ids, mask in batches]
            torch.testing.assert_close(scores.heads[i], _hand_aggregate(per_token, batches))


class _Recorder(nn.Module):
    """Wraps a module and keeps what goes in and comes out, without any hook."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.inputs, self.outputs = inner, [], []

    def forward(self, x):
        self.inputs.append(x)
        self.outputs.append(self.inner(x))
        return self.outputs[-1]


def _record(model, batches, layer_idx: int) -> dict[str, _Recorder]:
    layer = model.model.layers[layer_idx]
    names = {"down": (layer.mlp, "down_proj"), "input": (layer, "input_layernorm"),
             "post": (layer, "post_attention_layernorm")}
    recorders = {}
    for name, (parent, attr) in names.items():
        recorders[name] = _Recorder(getattr(parent, attr))
        setattr(parent, attr, recorders[name])
    with torch.no_grad():
        for ids, mask in batches:
            model(input_ids=ids, attention_mask=mask, use_cache=False)
    for name, (parent, attr) in names.items():
        setattr(parent, attr, recorders[name].inner)
    return recorders


def test_neuron_and_channel_scores_equal_hand_recompute(tokenizer, batches):
    model = tiny_model("qwen2", tokenizer)
    scores = importance_from_batches(model, batches, progress=False).scores
    channels = 0
    for i in range(model.config.num_hidden_layers):
        rec = _record(model, batches, i)
        neurons = _hand_aggregate([x.abs() for x in rec["down"].inputs], batches)
        torch.testing.assert_close(scores.neurons[i], neurons)
        for where in ("input", "post"):
            channels = channels + _hand_aggregate([y.abs() for y in rec[where].outputs], batches)
    torch.testing.assert_close(scores.channels, channels)


def test_padding_does_not_count(tokenizer, batches):
    model = tiny_model("mistral", tokenizer)
    unpadded = [(ids[r:r + 1, :int(mask[r].sum())], mask[r:r + 1, :int(mask[r].sum())])
                for ids, mask in batches for r in range(len(ids))]
    for aggregation in (Aggregation(), Aggregation(batch="var", sequence="l2")):
        padded = importance_from_batches(model, batches, aggregation, progress=False).scores
        alone = importance_from_batches(model, unpadded, aggregation, progress=False).scores
        for name in ("heads", "neurons", "channels"):
            torch.testing.assert_close(getattr(padded, name), getattr(alone, name))


def test_sequence_aggregations_on_a_known_tensor():
    values = torch.tensor([[[1.0], [3.0], [100.0]], [[2.0], [4.0], [6.0]]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    expected = {"mean": [[2.0], [4.0]], "l2": [[10 ** 0.5], [56 ** 0.5]],
                "var": [[1.0], [8 / 3]]}
    for how, want in expected.items():
        got = aggregate_sequences(values, mask, how)
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


def test_batch_aggregations_streamed_match_hand():
    per_sequence = torch.tensor([[1.0, 0.0], [2.0, -3.0], [4.0, 5.0], [7.0, 1.0]],
                                dtype=torch.float64)
    expected = {"mean": [3.5, 0.75], "l2": [70 ** 0.5, 35 ** 0.5],
                "var": [70 / 4 - 3.5 ** 2, 35 / 4 - 0.75 ** 2]}
    for how, want in expected.items():
        aggregate = BatchAggregate(how)
        aggregate.add(per_sequence[:1])
        aggregate.add(per_sequence[1:])
        torch.testing.assert_close(aggregate.result(), torch.tensor(want, dtype=torch.float64))


def _rank(scores: torch.Tensor, unit: int) -> int:
    """0 for the highest score."""
    return int((scores > scores[unit]).sum())


def test_scaled_up_row_raises_the_neuron_and_zero_values_silence_the_heads(tokenizer,
                                                                           batches):
    model = tiny_model("llama", tokenizer)
    before = importance_from_batches(model, batches, progress=False).scores
    neuron = int(before.neurons[0].argmin())
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[neuron] *= 10
        head_dim = model.model.layers[1].self_attn.head_dim
        model.model.layers[1].self_attn.v_proj.weight[:head_dim] = 0  # KV group 0: heads 0, 1
    after = importance_from_batches(model, batches, progress=False).scores
    assert _rank(after.neurons[0], neuron) < _rank(before.neurons[0], neuron)
    torch.testing.assert_close(after.neurons[0, neuron], 10 * before.neurons[0, neuron])
    assert after.heads[1, :2].tolist() == [0.0, 0.0]
    assert (after.heads[1, 2:] > 0).all()


def test_baselines_have_the_shape_of_activation_scores(tokenizer):
    model = tiny_model("qwen3", tokenizer)
    magnitude = magnitude_scores(model)
    magnitude.check(model.config)
    o_proj = model.model.layers[1].self_attn.o_proj.weight.detach()
    head_dim = model.model.layers[1].self_attn.head_dim
    assert magnitude.heads[1, 2] == pytest.approx(float(o_proj[:, 2 * head_dim:3 * head_dim]
                                                        .norm()))
    random_scores(model, seed=3).check(model.config)
    assert torch.equal(random_scores(model, seed=3).neurons, random_scores(model, 3).neurons)
    assert not torch.equal(random_scores(model, seed=3).heads, random_scores(model, 4).heads)


def test_tables_are_tidy(tokenizer, batches):
    model = tiny_model("llama", tokenizer)
    importance = importance_from_batches(model, batches, progress=False)
    tables = importance.tables()
    assert list(tables["heads"].columns) == ["layer", "head", "score"]
    assert list(tables["neurons"].columns) == ["layer", "neuron", "score"]
    assert list(tables["channels"].columns) == ["channel", "score"]
    heads = tables["heads"].set_index(["layer", "head"])["score"]
    assert heads[(1, 3)] == float(importance.scores.heads[1, 3])
    assert len(tables["neurons"]) == 2 * 128 and len(tables["channels"]) == 64
    assert importance.sequences == TEXTS_NUM
    assert importance.tokens == sum(int(mask.sum()) for _, mask in batches)


def _make_identity(model, layer_idx: int) -> None:
    with torch.no_grad():
        model.model.layers[layer_idx].self_attn.o_proj.weight.zero_()
        model.model.layers[layer_idx].mlp.down_proj.weight.zero_()


def test_identity_layer_is_unimportant(tokenizer, batches):
    model = tiny_model("qwen2_sw", tokenizer, layers=3)
    _make_identity(model, 1)
    table = depth_scores(model, batches, progress=False)
    assert list(table.columns) == ["layer", "lm_loss", "increase", "block_importance"]
    assert table.loc[1, "increase"] == 0.0
    assert table.loc[1, "block_importance"] == pytest.approx(0.0, abs=1e-12)
    assert (table.loc[[0, 2], "block_importance"] > 1e-3).all()


def test_block_scan_rows_and_single_layer_rows(tokenizer, batches):
    model = tiny_model("llama", tokenizer, layers=4)
    singles = layer_removal(model, batches, progress=False)
    scan = block_removal_scan(model, batches, length=1, progress=False)
    assert scan["lm_loss"].tolist() == singles["lm_loss"].tolist()
    assert scan["increase"].tolist() == singles["increase"].tolist()
    pairs = block_removal_scan(model, batches, length=3, progress=False)
    assert pairs["start"].tolist() == [0, 1] and set(pairs["length"]) == {3}
    assert len(model.model.layers) == 4  # every layer is back
    assert all(type(layer).__name__ == "LlamaDecoderLayer" for layer in model.model.layers)


def test_block_importance_is_one_minus_cosine(tokenizer, batches):
    model = tiny_model("llama", tokenizer)
    ids, mask = batches[0]
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                       use_cache=False).hidden_states
    cosine = torch.nn.functional.cosine_similarity(hidden[0], hidden[1], dim=-1)
    expected = float((1 - cosine)[mask.bool()].mean())
    got = block_importance(model, batches[:1], progress=False)["block_importance"][0]
    assert got == pytest.approx(expected, rel=1e-10)


def test_bad_input_is_refused(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer)
    with pytest.raises(ValueError, match="empty calibration set"):
        importance_from_batches(model, [], progress=False)
    with pytest.raises(ValueError, match="empty calibration set"):
        layer_removal(model, [], progress=False)
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match="empty"):
        activation_importance(model, tokenizer, source=tmp_path / "empty.txt", progress=False)
    with pytest.raises(ValueError, match=r"Aggregation\.batch must be one of 'mean', 'l2', 'var', got 'median'"):
        Aggregation(batch="median")
    for length in (0, 2):
        with pytest.raises(ValueError, match=rf"block length \(the model has 2 layers\) must be an integer in \[1, 1\], got {length}"):
            block_removal_scan(model, [], length=length)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer)))
    for score in (magnitude_scores, lambda m: importance_from_batches(m, [], progress=False)):
        with pytest.raises(ValueError, match="model_type 'gpt2'.*llama, qwen2, qwen3, mistral"):
            score(gpt2)


def test_hooks_and_mode_are_restored_after_a_failure(tokenizer, batches):
    model = tiny_model("llama", tokenizer).train()
    bad = [(torch.full((1, 4), 10_000), torch.ones(1, 4, dtype=torch.long))]  # id past vocab
    with pytest.raises(IndexError):
        importance_from_batches(model, bad, progress=False)
    with pytest.raises(IndexError):
        block_importance(model, bad, progress=False)
    assert model.training
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
