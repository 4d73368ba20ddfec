"""benchmarks/gguf_export.py: a tiny Llama written as GGUF reads back with every tensor's name,
shape and values (q/k permuted as llama.cpp's interleaved RoPE needs), and the permutation is
the one that makes interleaved RoPE equal HF's half-split RoPE. Needs only ``gguf`` (the
``peers`` extra), not llama.cpp; skipped without it."""
import numpy as np
import pytest
import torch

from tests.helpers.models import tiny_model

gguf = pytest.importorskip("gguf")


@pytest.fixture
def export(monkeypatch):
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gguf_export
    return gguf_export


def test_round_trip_names_shapes_values(export, tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer, dtype=torch.float32)  # GQA 4/2, untied head
    cfg = model.config
    path = export.export_gguf(model, tokenizer, tmp_path / "tiny.gguf")
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    expected = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{name}" for i in range(cfg.num_hidden_layers)
        for name in export.LAYER_TENSORS.values()}
    assert set(tensors) == expected
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in tensors.values())
    sd = model.state_dict()

    def read(name):  # GGUF lists dims innermost first; the data is the row-major array
        return np.asarray(tensors[name].data).reshape(tuple(reversed(tensors[name].shape)))

    np.testing.assert_array_equal(read("token_embd.weight"), sd["model.embed_tokens.weight"])
    np.testing.assert_array_equal(read("output.weight"), sd["lm_head.weight"])
    np.testing.assert_array_equal(read("blk.1.ffn_down.weight"),
                                  sd["model.layers.1.mlp.down_proj.weight"])
    np.testing.assert_array_equal(read("blk.0.attn_k.weight"), export.permute(
        sd["model.layers.0.self_attn.k_proj.weight"].numpy(), cfg.num_key_value_heads))
    field = reader.fields["llama.attention.head_count_kv"]
    assert int(field.parts[field.data[0]][0]) == cfg.num_key_value_heads
    field = reader.fields["tokenizer.ggml.eos_token_id"]
    assert int(field.parts[field.data[0]][0]) == tokenizer.eos_token_id


def test_permutation_turns_half_split_rope_into_interleaved(export):
    """q rows permuted, then RoPE on interleaved pairs (llama.cpp's LLAMA graph), equals HF's
    rotate_half RoPE on the original rows, permuted the same way: the dot products attention
    takes (q.k per head) are unchanged."""
    torch.manual_seed(0)
    n_head, d, hidden, pos = 2, 8, 16, 5
    w = torch.randn(n_head * d, hidden, dtype=torch.float64)
    x = torch.randn(hidden, dtype=torch.float64)
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cos(pos * inv), torch.sin(pos * inv)

    q = (w @ x).view(n_head, d)  # HF: halves
    a, b = q[:, :d // 2], q[:, d // 2:]
    hf = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)

    qp = (torch.from_numpy(export.permute(w.numpy(), n_head)) @ x).view(n_head, d // 2, 2)
    e, o = qp[..., 0], qp[..., 1]  # llama.cpp: pairs (x0, x1), (x2, x3), ...
    ggml = torch.stack([e * cos - o * sin, o * cos + e * sin], dim=-1).view(n_head, d)

    order = torch.from_numpy(export.permute(np.arange(n_head * d), n_head))
    torch.testing.assert_close(ggml.reshape(-1), hf.reshape(-1)[order])
