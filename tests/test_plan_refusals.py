"""Plans a drafter cannot serve, and malformed tree shapes, are refused before any work: the
error names the bad value and what is accepted, and no policy or drafter forward has run."""
import re

import pytest
import torch

from workbench.rollout import RolloutConfig, RolloutEngine, StaticSchedule, StepPlan
from workbench.rollout.decoder import BatchDecoder
from workbench.rollout.forward import policy_forward
from workbench.rollout.request import RequestOutput
from workbench.rollout.tree import grow_tree
from workbench.rollout.worker import StepRecorder
from workbench.speculative import EagleDrafter, EagleHead, NGramDrafter
from workbench.speculative.drafters import SlowedDrafter
from workbench.speculative.bandit import AdaptiveSchedule
from workbench.speculative.trees import compare_chain_and_tree

from .helpers.models import PROMPTS, tiny_model
from .helpers.models import forwards  # noqa: F401 (a fixture)

CHAIN_ONLY = "'ngram'.*NGramDrafter.*chains only.*EagleDrafter"


def test_the_forward_counter_sees_a_rollout(tokenizer, forwards):
    RolloutEngine(tiny_model("llama", tokenizer), tokenizer).rollout(
        PROMPTS[:1], max_new_tokens=2, progress=False)
    assert forwards  # so that an empty list below means nothing ran


@pytest.mark.parametrize("spec_mode", ["coupled", "speculative"])
def test_a_tree_schedule_is_refused_for_chain_only_drafters_before_any_forward(
        tokenizer, forwards, spec_mode):
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    for drafter in (NGramDrafter(), SlowedDrafter(NGramDrafter(), 0.0)):
        with pytest.raises(ValueError, match=f"StaticSchedule.*trees.*'ngram' "
                                             f"\\({type(drafter).__name__}\\).*chains only.*EagleDrafter"):
            engine.rollout(PROMPTS[:2], max_new_tokens=8, temperature=1.0, spec_mode=spec_mode,
                           drafter=drafter, progress=False, schedule=StaticSchedule(3, branch=2))
    assert forwards == []


def test_a_tree_plan_handed_to_a_decoder_is_refused_before_drafting(tokenizer, forwards):
    """A schedule without ``needs_trees`` is checked step by step: the tree step refuses
    before the drafter drafts or the policy verifies."""
    model = tiny_model("llama", tokenizer)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=8)
    reqs = [RequestOutput.of(q, 0) for q in engine.make_requests(engine.encode(PROMPTS[:2]), cfg)]
    dec = BatchDecoder(policy_forward(model), cfg, StepRecorder(0, "sim"), engine.eos_id,
                       engine.pad_id, drafter=NGramDrafter())
    dec.admit(reqs)
    before, steps = len(forwards), len(dec.rec.rows)
    plan = StepPlan("speculative", 3, 2)
    with pytest.raises(ValueError, match=rf"the plan {re.escape(repr(plan))}.*{CHAIN_ONLY}"):
        dec.step(plan, 0)
    assert len(forwards) == before and len(dec.rec.rows) == steps


def test_an_adaptive_schedule_with_a_tree_arm_is_refused_before_the_bandit_pulls_it(
        tokenizer, forwards):
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    schedule = AdaptiveSchedule(arms=("chain:k=2", "tree:k=3,b=2"))
    assert schedule.needs_trees
    with pytest.raises(ValueError, match=f"AdaptiveSchedule.*{CHAIN_ONLY}"):
        engine.rollout(PROMPTS[:2], max_new_tokens=8, drafter=NGramDrafter(), progress=False,
                       schedule=schedule)
    assert forwards == [] and schedule.table().empty
    # chains only: the same drafter is served
    chains = AdaptiveSchedule(arms=("chain:k=2",))
    assert not chains.needs_trees and not StaticSchedule(3).needs_trees
    engine.rollout(PROMPTS[:2], max_new_tokens=8, drafter=NGramDrafter(), progress=False,
                   schedule=chains)


@pytest.mark.parametrize("field", ["k", "branch", "verify_budget"])
def test_a_bool_is_not_a_tree_shape(field):
    shape = {"k": 3, "branch": 2, "verify_budget": 4, field: True}
    with pytest.raises(ValueError, match=f"{field}\\b.*>= 1.*got True"):
        StepPlan("speculative", **shape)
    with pytest.raises(ValueError, match=f"{field}\\b.*>= 1.*got True"):
        StaticSchedule(**shape)
    assert StepPlan("speculative", **{**shape, field: 1}).speculative


@pytest.mark.parametrize("field", ["k", "branch"])
def test_grow_tree_refuses_a_bool_or_nonpositive_shape(field):
    def never(*args):
        raise AssertionError("nothing may be drafted")

    for bad in (True, 0, 2.0):
        shape = {"k": 2, "branch": 2, field: bad}
        with pytest.raises(ValueError, match=f"tree's {field} must be an integer >= 1, "
                                             f"got {bad!r}"):
            grow_tree(never, torch.zeros(1, 5), expand=never, **shape)


@pytest.mark.parametrize("shape, named", [
    ({"branch": True}, "branch.*got True"), ({"branch": 0}, "branch.*got 0"),
    ({"verify_budget": 0}, "verify_budget.*got 0"), ({"k": True}, "k .*>= 1, got True"),
    ({"verify_budget": 2.5}, "verify_budget.*got 2.5")])
def test_compare_chain_and_tree_checks_the_tree_before_the_chain_runs(
        tokenizer, forwards, shape, named):
    model = tiny_model("llama", tokenizer)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=named):
        compare_chain_and_tree(model, tokenizer, EagleDrafter(EagleHead(model), model),
                               PROMPTS[:2], max_new_tokens=8, **shape)
    assert forwards == []


def test_compare_chain_and_tree_refuses_a_chain_only_drafter_before_the_chain_runs(
        tokenizer, forwards):
    with pytest.raises(ValueError, match=CHAIN_ONLY):
        compare_chain_and_tree(tiny_model("llama", tokenizer), tokenizer, NGramDrafter(),
                               PROMPTS[:2], max_new_tokens=8)
    assert forwards == []


def test_compare_chain_and_tree_rolls_out_both_shapes_losslessly(tokenizer):
    model = tiny_model("llama", tokenizer)
    torch.manual_seed(0)
    table = compare_chain_and_tree(model, tokenizer, EagleDrafter(EagleHead(model), model),
                                   PROMPTS[:3], k=3, branch=2, verify_budget=4,
                                   max_new_tokens=12)
    assert table["strategy"].tolist() == ["chain", "tree"]
    assert table["same_tokens_as_chain"].all()  # float64: both equal plain greedy decoding
    assert (table["acceptance_length"] >= 1).all()
    assert table.loc[1, "verified_per_step"] <= 4 < 3 * 2
