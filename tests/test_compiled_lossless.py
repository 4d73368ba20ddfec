"""The engine's lossless checks on both paths (``RolloutConfig.compile`` ``False`` and
``True``), float64: greedy tokens equal HF's ``generate``, coupled tokens the plain eager
rollout's, speculative steps (chains, trees, and a schedule switching between plain, chain
and tree) the plain rollout's, over ragged prompts with rows joining a running batch, on
Llama (GQA), Qwen2 (full and sliding layers), Qwen3 (q/k norms, MQA), Mistral (sliding
window) and Llama with an odd head dim (MQA).

Cold compiles are the cost here (inductor's take seconds each on a CPU): every family's
model is built once for the module, so its graphs serve every case; Qwen3, whose q/k norms
are the newest arithmetic of the compiled step, compiles with inductor, the others through
dynamo and AOTAutograd with eager kernels (``aot_eager``: the same traced graph, static
buffers, masks and buckets; inductor's kernels are tested on Llama, Mistral and Qwen2 in
tests/test_compiled_decode.py)."""
import numpy as np
import pytest

from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.compiled import compiled_decode_for
from workbench.rollout.forward import LeanForward, policy_forward

from .helpers.models import PROMPTS, hf_greedy, tiny_model

# compiled and eager float64 logprobs agree to ~1e-8 (tests/test_compiled_decode.py)
STATES_ATOL = 1e-6


@pytest.fixture(scope="module")
def inductor_qwen3(tokenizer):
    """A Qwen3 whose compiled step is inductor's, shared by this module's cases."""
    model = tiny_model("qwen3", tokenizer, seed=2)
    assert isinstance(policy_forward(model), LeanForward)  # q/k norms: the lean forward
    return model


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_qwen3_compiled_equals_eager_and_hf_generate(tokenizer, inductor_qwen3, temperature):
    """Qwen3 on the lean forward, eager and compiled (inductor): greedy tokens equal HF's
    ``generate``, coupled ones the eager rollout's; 2 slots for 3 ragged prompts, so a row
    joins the running batch and the batch crosses row buckets 2 and 1."""
    model = inductor_qwen3
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=16, max_batch_size=2, refill_slots=1,
                        temperature=temperature, seed=3)
    prompts = PROMPTS[:3]
    eager = engine.rollout(prompts, cfg, progress=False)
    comp = engine.rollout(prompts, cfg, compile=True, progress=False)
    assert comp.tokens == eager.tokens
    np.testing.assert_allclose(np.concatenate(comp.logprobs), np.concatenate(eager.logprobs),
                               atol=STATES_ATOL, rtol=0)
    if temperature == 0:
        assert eager.tokens == hf_greedy(model, tokenizer, prompts, 16)
    c = compiled_decode_for(policy_forward(model), True)
    assert c.steps["eager"] == 0 and c.steps["compiled"] > 0
    assert {key[0] for key in c.compiles} <= {1, 2}
