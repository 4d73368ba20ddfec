"""An HF Llama folder (or a loaded ``LlamaForCausalLM``) written as a float32 GGUF file that
llama.cpp loads, with the ``gguf`` package (``pip install -e '.[peers]'``).

The policy's tokenizer is a 100-token WordLevel, which llama.cpp has no loader for, so the GGUF
carries a synthetic SPM ("llama") vocabulary of the same size (``<t0>`` .. ``<t99>``; the HF
tokenizer's special ids as control tokens, its bos/eos/pad/unk ids as llama.cpp's) and the
benchmark feeds token ids directly: ids, not text, are what both sides share.

Weights: llama.cpp's LLAMA graph applies RoPE to interleaved pairs (x0, x1), (x2, x3), ...,
HF's to the two halves of each head (rotate_half), so q_proj and k_proj rows are permuted as
llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel.permute``) does: per head, rows
[0..d/2) and [d/2..d) interleaved; for k with the KV head count (GQA). Tied embeddings:
``output.weight`` is written as a copy of ``token_embd.weight``.

    python benchmarks/gguf_export.py default /tmp/policy.gguf
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

# HF parameter name (inside model.layers.N.) -> GGUF tensor name (inside blk.N.)
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """HF's half-split RoPE layout of a q/k projection to llama.cpp's interleaved one (the
    rows of each head: [0, d/2, 1, d/2+1, ...]), as llama.cpp's converter does."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def synthetic_vocab(tokenizer, vocab_size: int) -> tuple[list[str], list[float], list[int]]:
    """Token texts ``<t{id}>``, zero scores, and types: control for the tokenizer's special
    ids (pad/bos/eos), unknown for unk, normal otherwise (gguf.TokenType)."""
    import gguf
    special = {getattr(tokenizer, f"{n}_token_id", None) for n in ("pad", "bos", "eos")}
    unk = getattr(tokenizer, "unk_token_id", None)
    types = [int(gguf.TokenType.CONTROL if i in special else gguf.TokenType.UNKNOWN
                 if i == unk else gguf.TokenType.NORMAL) for i in range(vocab_size)]
    return [f"<t{i}>" for i in range(vocab_size)], [0.0] * vocab_size, types


def export_gguf(model, tokenizer, path: str | Path, name: str = "workbench-policy") -> Path:
    """Write ``model`` (an HF ``LlamaForCausalLM``) to ``path`` as an all-float32 GGUF
    (llama architecture, synthetic vocabulary); return the path."""
    import gguf
    cfg = model.config
    if cfg.model_type != "llama":
        raise ValueError(f"only llama models are exported; got model_type={cfg.model_type!r}")
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    if head_dim * n_head != cfg.hidden_size:
        raise ValueError("head_dim * heads != hidden_size: not the LLAMA graph llama.cpp runs")
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type {rope.get('rope_type')!r} is not exported")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    tokens, scores, types = synthetic_vocab(tokenizer, cfg.vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    for key in ("bos", "eos", "pad", "unk"):
        tid = getattr(tokenizer, f"{key}_token_id", None)
        if tid is not None:
            getattr(w, f"add_{key}_token_id")(int(tid))
    w.add_add_bos_token(False)  # ids are fed as the HF tokenizer made them (BOS included)
    w.add_add_eos_token(False)

    sd = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, gg in LAYER_TENSORS.items():
            t = sd[f"model.layers.{i}.{hf}"]
            if hf == "self_attn.q_proj.weight":
                t = permute(t, n_head)
            elif hf == "self_attn.k_proj.weight":
                t = permute(t, n_kv)
            w.add_tensor(f"blk.{i}.{gg}", np.ascontiguousarray(t))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    out = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output.weight", np.ascontiguousarray(out))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="embedded model name (default, default-drafter) or HF folder")
    ap.add_argument("out", help="the .gguf file to write")
    args = ap.parse_args()
    from workbench.models import load_model
    model, tok = load_model(args.model, device="cpu", dtype=torch.float32)
    print(export_gguf(model, tok, args.out))


if __name__ == "__main__":
    main()
