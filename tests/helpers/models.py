"""Tiny random models of the supported architectures, the prompts the tests decode, and
references (HF greedy decoding, a fresh recompute of the KV cache) to check the engine against."""
import time

import pytest
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
from transformers import DynamicCache

from workbench.rollout.forward import HFForward, LeanForward


ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}, 0.3),                       # GQA 4/2, untied
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"tie_word_embeddings": True}, 2.0),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM,                                  # q/k norms, MQA
              {"num_key_value_heads": 1, "head_dim": 16}, 0.3),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": 8}, 0.3),
    "qwen2_sw": (Qwen2Config, Qwen2ForCausalLM,                               # full + sliding
                 {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1,
                  "tie_word_embeddings": True}, 2.0),
    "llama_odd": (LlamaConfig, LlamaForCausalLM,                      # head_dim 22 (4x22 != 64), MQA
                  {"head_dim": 22, "num_key_value_heads": 1}, 0.3),
}

PROMPTS = ["a1 b2?", "a12 b33 c4 d5 e6 f7 g8 h9?", "x", "hello world, a longer prompt?",
           "a5?", "q1 r2 s3?", "zz top", "a99 b1?"]

MANY = [f"a{i} b{i * 7 % 10} c{i % 3}?" * (1 + i % 3) for i in range(14)]


def busy_for(seconds: float) -> None:
    """Work (a busy loop) for ``seconds`` of this thread's CPU time: a slower step as every
    clock sees it (a sleep passes unseen by the sim clock's CPU time: ``workbench.clock``)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


# name -> (config class, model class, config overrides, EOS scale): Llama-family variants
# the engine claims to support. Tied embeddings need a stronger EOS.


def tiny_model(arch: str, tokenizer, seed: int = 0, context: int = 256, layers: int = 2,
               dtype=torch.float64):
    """A random model of ``arch`` (see ARCHS; 4 query heads) whose EOS is likely enough that
    some rows stop early and others run to the length cap: EOS's output row reads one hidden
    dimension, so EOS wins whenever that dimension is large."""
    cls_cfg, cls_model, overrides, eos_scale = ARCHS[arch]
    kw = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
              num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=context, eos_token_id=tokenizer.eos_token_id,
              pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
              tie_word_embeddings=False)
    cfg = cls_cfg(**{**kw, **overrides})
    torch.manual_seed(seed)
    model = cls_model(cfg).to(dtype).eval()
    with torch.no_grad():
        w = model.get_output_embeddings().weight
        w[tokenizer.eos_token_id] = 0
        w[tokenizer.eos_token_id, 1] = eos_scale
    return model


def python_wrapped(model):
    """``model``, its compiled step (``RolloutConfig.compile=True``) set to inductor's wrapper
    in Python: the kernels are the same, and a graph's cold compile skips the g++ of the C++
    wrapper (~3.5 s a graph on a machine of the project's kind). The default C++ wrapper runs
    in test_compiled_tokens_equal_eager_with_rows_leaving_and_joining and tests/test_few_rows.py."""
    from workbench.rollout.compiled import compiled_decode_for
    from workbench.rollout.forward import policy_forward
    compiled_decode_for(policy_forward(model), True).cpp_wrapper = False
    return model


def visible_cache_equals_fresh_recompute(model, dec, atol: float = 1e-10):
    """Every live row's visible cache columns equal a fresh forward of its fed tokens, within
    ``atol`` (float64 eager: to the rounding; a compiled step sums in another order)."""
    b = dec.batch
    for row, i in enumerate(b.request_ids):
        fed = dec.reqs[i].prompt_ids + dec.reqs[i].tokens[:-1]  # the last token is not fed
        fresh = DynamicCache()
        with torch.no_grad():
            model(torch.tensor([fed]), cache=fresh, use_cache=True)
        visible = b.mask[row].bool()
        assert int(visible.sum()) == len(fed) == int(b.next_pos[row])
        assert b.col_pos[row, visible].tolist() == list(range(len(fed)))
        for mine, ref in zip(b.cache.layers, fresh.layers):
            torch.testing.assert_close(mine.keys[row][:, visible], ref.keys[0], atol=atol, rtol=0)
            torch.testing.assert_close(mine.values[row][:, visible], ref.values[0], atol=atol,
                                       rtol=0)


def hf_greedy(model, tokenizer, prompts, max_new_tokens):
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    responses = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        if tokenizer.eos_token_id in row:
            row = row[:row.index(tokenizer.eos_token_id) + 1]
        responses.append(row)
    return responses


@pytest.fixture
def forwards(monkeypatch):
    """Every forward call of any model (policy or drafter LM), by forward class."""
    calls = []
    for cls in (LeanForward, HFForward):
        def counted(self, *args, _inner=cls.__call__, **kwargs):
            calls.append(type(self).__name__)
            return _inner(self, *args, **kwargs)
        monkeypatch.setattr(cls, "__call__", counted)
    return calls


class StepClock:
    """A timer double for ``RolloutConfig.compile="auto"``: every read is 1 s after the last,
    plus the seconds the step in between charged (``pending``), so a test decides which path
    is slower without timing anything."""

    def __init__(self):
        self.t, self.pending = 0.0, 0.0

    def __call__(self):
        self.t += 1.0 + self.pending
        self.pending = 0.0
        return self.t
