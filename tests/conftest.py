"""Shared fixtures: tiny random models built in the test, in float64 where equality matters."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from workbench.zoo.tokenizer import build_char_tokenizer

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tokenizer():
    return build_char_tokenizer()


def tiny_model(arch: str, tokenizer, seed: int = 0, context: int = 256, layers: int = 2,
               dtype=torch.float64):
    """A random GQA model (4 query heads over 2 KV heads) whose EOS is likely enough that
    some rows stop early and others run to the length cap: EOS's output row reads one hidden
    dimension, so EOS wins whenever that dimension is large."""
    cls_cfg, cls_model = {"llama": (LlamaConfig, LlamaForCausalLM),
                          "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    cfg = cls_cfg(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=context, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                  tie_word_embeddings=arch == "qwen2")
    torch.manual_seed(seed)
    model = cls_model(cfg).to(dtype).eval()
    with torch.no_grad():
        w = model.get_output_embeddings().weight
        w[tokenizer.eos_token_id] = 0
        w[tokenizer.eos_token_id, 1] = EOS_SCALE[arch]
    return model


EOS_SCALE = {"llama": 0.3, "qwen2": 2.0}  # tied embeddings (qwen2) need a stronger EOS


@pytest.fixture(params=["llama", "qwen2"])
def tiny_gqa(request, tokenizer):
    return tiny_model(request.param, tokenizer)


PROMPTS = ["a1 b2?", "a12 b33 c4 d5 e6 f7 g8 h9?", "x", "hello world, a longer prompt?",
           "a5?", "q1 r2 s3?", "zz top", "a99 b1?"]
