"""The engine's lossless checks on both paths (``RolloutConfig.compile`` ``False`` and
``True``), float64: greedy tokens equal HF's ``generate``, coupled tokens the plain eager
rollout's, speculative steps (chains, trees, and a schedule switching between plain, chain
and tree) the plain rollout's, speculative sampling's the eager path's, over ragged prompts
with rows joining a running batch, on Llama (GQA), Qwen2 (full and sliding layers), Qwen3
(q/k norms, MQA) and Mistral (sliding window); an EAGLE head's compiled draft step drafts
what its eager one drafts.

Cold compiles are the cost here (seconds each on a CPU, inductor's most): every family's
model is built once for the module, so its graphs serve every case, and the suite's compiled
step is dynamo's traced graph run by eager kernels (``backend="eager"``: the graph the
compiled path runs, over the same static buffers, masks, row buckets and verify shapes);
inductor's kernels are tested here on Qwen3, whose q/k norms are the newest arithmetic of the
step, and on Llama, Mistral and Qwen2 in tests/test_compiled_decode.py."""
import pickle
from dataclasses import replace

import numpy as np
import pytest
import torch

from workbench.rollout import RolloutConfig, RolloutEngine, StaticSchedule, StepPlan
from workbench.rollout.compiled import compiled_decode_for
from workbench.rollout.forward import LeanForward, policy_forward
from workbench.rollout.schedule import Schedule
from workbench.speculative import EagleDrafter, EagleHead

from .drafters import ScriptedTreeDrafter
from .helpers.models import PROMPTS, hf_greedy, python_wrapped, tiny_model
from .helpers.speculative import recording

pytestmark = pytest.mark.compiles

# compiled and eager float64 logprobs agree to ~1e-8 (tests/test_compiled_decode.py)
STATES_ATOL = 1e-6


@pytest.fixture(scope="module")
def inductor_qwen3(tokenizer):
    """A Qwen3 whose compiled step is inductor's, shared by the module's cases (its one graph
    serves them all)."""
    return python_wrapped(tiny_model("qwen3", tokenizer, seed=2, layers=1))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_qwen3_compiled_by_inductor_equals_eager(tokenizer, inductor_qwen3, temperature):
    """Qwen3 (q/k norms) on the lean forward, compiled by inductor: greedy and coupled tokens
    and logprobs equal the eager lean rollout's (which equals HF's ``generate``:
    :func:`test_lossless_on_both_paths`). Two rows of one prefill group decoding to the
    cap: one row bucket, so one inductor graph serves both cases."""
    model = inductor_qwen3
    assert isinstance(policy_forward(model), LeanForward)  # q/k norms: the lean forward
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=16, ignore_eos=True, temperature=temperature, seed=3)
    prompts = ["a1 b2?", "a9 b7?"]
    eager = engine.rollout(prompts, cfg, progress=False)
    comp = engine.rollout(prompts, cfg, compile=True, progress=False)
    assert comp.tokens == eager.tokens and all(len(t) == 16 for t in comp.tokens)
    np.testing.assert_allclose(np.concatenate(comp.logprobs), np.concatenate(eager.logprobs),
                               atol=STATES_ATOL, rtol=0)
    c = compiled_decode_for(policy_forward(model), True)
    assert c.backend == "inductor" and c.steps["eager"] == 0 and c.steps["compiled"] > 0
    assert len(c.compiles) == 1


def test_a_whole_chain_compiled_by_inductor_drafts_what_the_eager_head_drafts(tokenizer):
    """An EAGLE head on Qwen3 (q/k norms in its layer too) drafting coupled chains, each
    round one graph compiled by inductor (the catch-up, the policy's norm and head, the
    coupled draws by inverse CDF, the drafts fed back): every round's drafts and the tokens
    equal the eager head's. (The policy's own graphs run on dynamo's eager backend: their
    inductor arithmetic has tests of its own, and a cold compile is seconds.)"""
    model = tiny_model("qwen3", tokenizer, seed=2, layers=1)
    compiled_decode_for(policy_forward(model), True).backend = "eager"
    engine = RolloutEngine(model, tokenizer)
    torch.manual_seed(1)
    drafter = recording(EagleDrafter(EagleHead(model), model))
    drafter.compiled.cpp_wrapper = False  # inductor's Python wrapper: no g++ of a wrapper
    cfg = RolloutConfig(max_new_tokens=8, ignore_eos=True, temperature=1.0, seed=3,
                        spec_k=2)
    prompts = ["a1 b2?"]  # one row bucket: a graph per catch-up width
    eager = engine.rollout(prompts, cfg, drafter=drafter, progress=False)
    eager_rounds, drafter.rounds = drafter.rounds, []
    comp = engine.rollout(prompts, cfg, drafter=drafter, compile=True, progress=False)
    assert comp.tokens == eager.tokens and drafter.rounds == eager_rounds
    (chain,) = drafter.chains.values()
    assert chain.backend == "inductor" and chain.steps["compiled"] > 0
    assert chain.compiles and all(key[3] - key[5] == 1 for key in chain.compiles)  # k - 1


# ---- the lossless suite on both paths ---------------------------------------------------
# name -> (decoder layers, seed): one layer where a family's arithmetic is the same in every
# layer (each layer is traced: fewer is a cheaper compile), two for Qwen2's mix of full and
# sliding layers; seeds whose rows run long enough for speculative steps at 2 rows and past
# the sliding window (8)
FAMILIES = {"llama": (1, 0), "qwen2_sw": (2, 2), "qwen3": (1, 0), "mistral": (1, 2)}
PLANS = (StepPlan(), StepPlan("speculative", 3),
         StepPlan("speculative", 3, branch=2, verify_budget=5))


class CyclingSchedule(Schedule):
    """Plain, a chain of 3 drafts, a tree 3 deep (branch 2, 5 nodes verified), in turn while
    the batch has 2 rows, plain with 1 (so that one row bucket holds the verify graphs): a
    rollout switching between the three shapes, each step's plan counted."""

    needs_trees = True

    def __init__(self):
        self.n, self.kinds = 0, []

    def plan(self, batch_size, worker):
        plan = PLANS[self.n % len(PLANS)] if batch_size > 1 else PLANS[0]
        self.n += 1
        self.kinds.append("tree" if plan.branch > 1 else plan.kind)
        return plan


@pytest.fixture(scope="module")
def family_models(tokenizer):
    """One model per family for the module, its compiled step dynamo's graph run by eager
    kernels (``backend="eager"``, set before its first step), so that each graph is traced
    once for every case."""
    made = {}

    def get(arch):
        if arch not in made:
            layers, seed = FAMILIES[arch]
            made[arch] = tiny_model(arch, tokenizer, seed=seed, layers=layers)
            compiled_decode_for(policy_forward(made[arch]), True).backend = "eager"
        return made[arch]
    return get


def _switching(engine, prompts, cfg, reference, path, accepts: int = 2):
    """A rollout on ``path`` whose steps cycle plain, chain, tree (:class:`CyclingSchedule`),
    drafting the ``reference`` rollout's tokens with a wrong one at depth ``1 + i % 3``
    (row ``i`` accepts up to ``1 + i % 3`` drafts a step; some row ``accepts`` at least so
    many at some step)."""
    drafter = ScriptedTreeDrafter({r.uid: r.tokens for r in reference.requests},
                                  {r.uid: 1 + i % 3 for i, r in enumerate(reference.requests)})
    schedule = CyclingSchedule()
    res = engine.rollout(prompts, cfg, compile=path == "compiled", drafter=drafter,
                         schedule=schedule, progress=False)
    assert set(schedule.kinds) == {"plain", "speculative", "tree"}
    assert max(a for r in res.requests for a in r.accepted_per_step) >= accepts
    return res


@pytest.mark.parametrize("path", ["eager", "compiled"])
@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_lossless_on_both_paths(tokenizer, family_models, arch, path):
    """On ``path``, 2 slots for 4 ragged prompts (rows join the running batch): greedy plain
    and switching (plain, chain, tree) rollouts give HF's ``generate`` tokens; coupled
    (temperature 1) ones the plain eager rollout's, logprobs included; compiled speculative
    sampling the eager path's tokens and accepted counts."""
    model = family_models(arch)
    engine = RolloutEngine(model, tokenizer)
    prompts, compiled = PROMPTS[:4], path == "compiled"
    greedy = RolloutConfig(max_new_tokens=20, max_batch_size=2, refill_slots=1)
    plain = engine.rollout(prompts, greedy, compile=compiled, progress=False)
    assert plain.tokens == hf_greedy(model, tokenizer, prompts, 20)
    assert _switching(engine, prompts, greedy, plain, path).tokens == plain.tokens
    coupled = RolloutConfig(max_new_tokens=20, max_batch_size=2, refill_slots=1,
                            temperature=1.0, seed=7)
    reference = engine.rollout(prompts, coupled, progress=False)  # plain, eager
    runs = [_switching(engine, prompts, coupled, reference, path)]
    if compiled:
        runs.append(engine.rollout(prompts, coupled, compile=True, progress=False))
    for res in runs:
        assert res.tokens == reference.tokens
        np.testing.assert_allclose(np.concatenate(res.logprobs),
                                   np.concatenate(reference.logprobs), atol=STATES_ATOL, rtol=0)
    if compiled:  # speculative sampling (rejection rule): the eager path's draws, step by step
        spec = RolloutConfig(max_new_tokens=20, max_batch_size=2, refill_slots=1,
                             temperature=1.0, seed=7, spec_mode="speculative")
        eager_spec, comp_spec = (_switching(engine, prompts, spec, reference, p, accepts=0)
                                 for p in ("eager", "compiled"))
        assert comp_spec.tokens == eager_spec.tokens
        assert [r.accepted_per_step for r in comp_spec.requests] == \
            [r.accepted_per_step for r in eager_spec.requests]
    c = compiled_decode_for(policy_forward(model), True)
    assert (c.steps["compiled"] > 0) == compiled and c.steps["eager"] == 0


# ---- the EAGLE draft step ---------------------------------------------------------------
def test_the_compiled_eagle_draft_step_drafts_what_the_eager_one_drafts(tokenizer,
                                                                         family_models):
    """An EAGLE head drafting chains (greedy step by step; speculative as one graph a
    round: its own draws and their logprobs in the graph) and trees
    (greedy and coupled) with its drafting compiled: every round's drafts, the rows'
    accepted counts and the tokens equal the eager head's; its graphs (one per row bucket,
    fed tokens and tree: draft steps and a round's catch-up; a whole chain's per row bucket
    and catch-up width) are ``compile`` rows of the timeline, as the policy's are."""
    model = family_models("llama")
    engine = RolloutEngine(model, tokenizer)
    torch.manual_seed(0)
    drafter = recording(EagleDrafter(EagleHead(model), model))
    drafter.compiled.backend = "eager"  # as the module's policies' (set before its first step)
    greedy = RolloutConfig(max_new_tokens=20, max_batch_size=2, refill_slots=1)
    coupled = RolloutConfig(max_new_tokens=20, max_batch_size=2, refill_slots=1,
                            temperature=1.0, seed=5)
    speculative = replace(coupled, spec_mode="speculative")
    policy = compiled_decode_for(policy_forward(model), True)

    def graphs():
        return len(policy.compiles) + sum(len(c.compiles) for c in
                                          (drafter.compiled, *drafter.chains.values()))

    def steps():  # {id: compiled calls} of the draft step's and each chain's graphs
        return {id(c): c.steps["compiled"] for c in (drafter.compiled, *drafter.chains.values())}

    accepted = 0
    for cfg, schedule, whole in [(greedy, StaticSchedule(3), False),
                                 (speculative, StaticSchedule(3), True),
                                 (greedy, StaticSchedule(3, branch=2, verify_budget=5), True),
                                 (coupled, StaticSchedule(3, branch=2, verify_budget=5), True)]:
        drafter.rounds, drafter.whole_chain = [], whole
        eager = engine.rollout(PROMPTS[:4], cfg, drafter=drafter, schedule=schedule,
                               progress=False)
        eager_rounds, drafter.rounds = drafter.rounds, []
        before, ran = graphs(), steps()
        comp = engine.rollout(PROMPTS[:4], cfg, drafter=drafter, schedule=schedule,
                              compile=True, progress=False)
        assert comp.tokens == eager.tokens
        assert drafter.rounds == eager_rounds  # the chains' drafts, round by round
        assert [r.accepted_per_step for r in comp.requests] == \
            [r.accepted_per_step for r in eager.requests]
        accepted += sum(sum(r.accepted_per_step) for r in comp.requests)
        now = steps()  # the drafts ran compiled: as one graph a round where asked to
        one = id(drafter.compiled)
        chains = sum(n - ran.get(c, 0) for c, n in now.items() if c != one)
        assert now[one] > ran[one] or chains > 0
        assert (chains > 0) == (whole and schedule.step.branch == 1)
        kinds = comp.timeline.steps["kind"]
        assert (kinds == "compile").sum() == graphs() - before
    assert accepted > 0  # some drafts were right: verdicts of both kinds
    keys = {key[3:] for key in drafter.compiled.compiles}  # (fed tokens a row, tree)
    assert {(1, False), (2, True)} <= keys  # a chain's draft step, a tree level of 2 nodes
    catch_ups = {fed for fed, tree in keys if not tree and fed > 1}  # 1 to k + 1 pairs a row
    assert catch_ups and catch_ups <= {2, 3, 4}  # a round's catch-up ran compiled too
    assert {m.kind for m in drafter.chains} == {"speculative"}
    for chain in drafter.chains.values():  # (Bb, Tb, stride, w + k - 1, tree, w): k is 3
        assert {key[3] - key[5] for key in chain.compiles} == {2}
    for made in (drafter.compiled, *drafter.chains.values()):  # to a Ray actor: no graphs
        copy = pickle.loads(pickle.dumps(made))
        assert copy.compiles == {} and copy.steps == made.steps and copy._fn is None
