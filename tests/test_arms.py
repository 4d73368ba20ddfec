"""Decoding arms by name (``workbench.speculative.arms``) and the schedule protocol
(``workbench.rollout.schedule.Schedule``): the worked plugin arm (tests/plugins/
confident_chain.py) decodes token for token as plain decoding does while drafting its own
way, is named in the bandit's state and the steps table like a built-in, and survives a
pickled schedule; an arm that misspells a hook, lacks ``plan`` or is no frozen dataclass is
refused at registration naming what is wrong; an unknown arm is refused listing the
registered kinds; a schedule that is not a ``Schedule`` is refused before the first step."""
import dataclasses
import pickle
from pathlib import Path

import pytest
import torch

from workbench.plugins import load_plugins
from workbench.registry import PluginError
from workbench.rl import GRPOConfig
from workbench.rl.variants import tlt_config
from workbench.rollout import RolloutConfig, RolloutEngine, StepPlan
from workbench.rollout.drafts import ChainDraft
from workbench.rollout.schedule import PLAIN, Decision, PlainSchedule, Schedule
from workbench.speculative import EagleDrafter, EagleHead
from workbench.speculative.arms import ARMS, Arm
from workbench.speculative.bandit import AdaptiveSchedule, parse_strategy, strategy_name

from .helpers.models import PROMPTS, tiny_model
from .helpers.speculative import Always

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "tests" / "plugins" / "confident_chain.py"
ARM = "confident:k=3,p=0.5"


@pytest.fixture
def confident():
    """The plugin's module, loaded (``"confident"`` registered), forgotten after the test so
    that other tests see the built-in kinds only."""
    (module,) = load_plugins([str(PLUGIN)])
    yield module
    ARMS.unregister("confident")


def rollout(model, tokenizer, temperature, schedule=None, drafter=None):
    cfg = RolloutConfig(max_new_tokens=32, temperature=temperature, seed=2, max_batch_size=3)
    return RolloutEngine(model, tokenizer).rollout(PROMPTS, cfg, schedule=schedule,
                                                   drafter=drafter, progress=False)


# ---- the worked plugin decodes losslessly, its own way ----------------------------------
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_plugin_arm_decodes_token_identical_to_plain_decoding(confident, tokenizer,
                                                                  temperature):
    """Greedy and coupled sampling: the plugin's chains, cut where the drafter is unsure,
    give plain decoding's tokens. Its own draft logic runs: sure of nothing (p=1), every
    step verifies one draft per row; sure of everything (p tiny), the whole chain."""
    model = tiny_model("llama", tokenizer, seed=5)
    plain = rollout(model, tokenizer, temperature)
    torch.manual_seed(0)
    drafter = EagleDrafter(EagleHead(model))
    for p, per_step in ((1.0, 1), (1e-9, 3)):
        plan = parse_strategy(f"confident:k=3,p={p}")
        res = rollout(model, tokenizer, temperature, Always(plan), drafter)
        assert res.tokens == plain.tokens, p
        for r in res.requests:
            assert r.drafted == per_step * len(r.accepted_per_step) > 0, p


def test_the_plugin_arm_cuts_its_chains_in_speculative_sampling_too(confident, tokenizer):
    """Rejection sampling reads the drafter's distributions: the cut chain keeps its own."""
    model = tiny_model("llama", tokenizer, seed=5)
    cfg = RolloutConfig(max_new_tokens=32, temperature=1.0, seed=2, max_batch_size=3,
                        spec_mode="speculative")
    torch.manual_seed(0)
    res = RolloutEngine(model, tokenizer).rollout(
        PROMPTS, cfg, schedule=Always(parse_strategy("confident:k=3,p=1")),
        drafter=EagleDrafter(EagleHead(model)), progress=False)
    for r in res.requests:
        assert r.drafted == len(r.accepted_per_step) > 0 and set(r.accepted_per_step) <= {0, 1}


def test_the_bandit_names_the_plugin_arm_in_its_state_and_the_steps_table(confident,
                                                                          tokenizer):
    model = tiny_model("llama", tokenizer, seed=5)
    plain = rollout(model, tokenizer, 1.0)
    torch.manual_seed(0)
    schedule = AdaptiveSchedule(arms=["chain:k=2", ARM], explore_budget=1.0, seed=1)
    res = rollout(model, tokenizer, 1.0, schedule, EagleDrafter(EagleHead(model)))
    assert res.tokens == plain.tokens
    assert ARM in set(res.timeline.steps["arm"].dropna())
    assert ARM in set(schedule.table()["arm"])
    # a checkpoint (a pickled schedule) keeps the plugin arm, its plan and its state
    again = pickle.loads(pickle.dumps(schedule))
    assert again.bandit.arms == ["plain", "chain:k=2", ARM]
    assert again.plans[ARM] == schedule.plans[ARM]
    assert again.plans[ARM].arm == confident.ConfidentChain(3, 0.5)
    assert again.table().equals(schedule.table())


def test_a_plugin_arm_is_named_and_parsed_like_a_built_in(confident):
    plan = parse_strategy("confident: k=3, p=0.5")
    assert plan == StepPlan("speculative", 3, arm=confident.ConfidentChain(3, 0.5))
    assert strategy_name(plan) == ARM and parse_strategy(ARM) == plan
    assert strategy_name(parse_strategy("confident")) == "confident:k=6,p=0.5"  # defaults
    assert parse_strategy(confident.ConfidentChain(2)) == parse_strategy("confident:k=2")
    assert plan != parse_strategy("chain:k=3")  # same shape, another arm
    assert ARMS.names() == ["plain", "chain", "tree", "sibling", "suffix", "confident"]
    with pytest.raises(ValueError, match=r"unknown SD strategy 'confident:k=3,p=2'.*"
                                         r"probability in \(0, 1\], got 2"):
        parse_strategy("confident:k=3,p=2")
    with pytest.raises(ValueError, match=r"confident takes the parameters \['k', 'p'\]"):
        parse_strategy("confident:k=3,q=1")


# ---- refusals -------------------------------------------------------------------------------
def test_an_unknown_arm_is_refused_listing_the_registered_kinds(confident):
    listed = (r"registered arm kinds: \['plain', 'chain', 'tree', 'sibling', 'suffix', "
              r"'confident'\]")
    with pytest.raises(ValueError, match=rf"unknown SD strategy 'confidnt:k=3'.*{listed}"):
        parse_strategy("confidnt:k=3")
    with pytest.raises(ValueError, match=r"plugin arm 'confident:k=K,p=P'"):
        AdaptiveSchedule(arms=["chain:k=2", "beam:k=4"])
    with pytest.raises(ValueError, match=listed):  # what notebook 04 checks up front
        tlt_config("tlt", GRPOConfig(), arms=["confidnt:k=3"])


def test_an_arm_with_a_misspelled_hook_is_refused_naming_the_hook():
    with pytest.raises(PluginError, match=r"defines 'propse', .* looks like the hook 'propose'"):
        @ARMS.register("typo")
        @dataclasses.dataclass(frozen=True)
        class Typo(Arm):
            k: int = 2

            def plan(self):
                return StepPlan("speculative", self.k)

            def propse(self, drafter, ctx, plan, k):  # meant propose: the default would stay
                return None
    assert "typo" not in ARMS


def test_an_arm_without_plan_or_not_a_frozen_dataclass_is_refused():
    with pytest.raises(PluginError, match=r"lacks the required hook\(s\) \['plan'\]"):
        @ARMS.register("planless")
        @dataclasses.dataclass(frozen=True)
        class Planless(Arm):
            k: int = 2
    with pytest.raises(PluginError, match=r"must be a frozen dataclass"):
        @ARMS.register("mutable")
        @dataclasses.dataclass
        class Mutable(Arm):
            def plan(self):
                return StepPlan()
    with pytest.raises(PluginError, match=r"subclassing workbench.speculative.arms.Arm"):
        @ARMS.register("loose")
        @dataclasses.dataclass(frozen=True)
        class Loose:
            def plan(self):
                return StepPlan()
    assert not {"planless", "mutable", "loose"} & set(ARMS.names())


def test_a_proposal_without_drafts_is_refused_naming_the_arm(tokenizer):
    @dataclasses.dataclass(frozen=True)
    class Empty(Arm):
        def plan(self):
            return StepPlan("speculative", 2)

        def propose(self, drafter, ctx, plan, k):
            tokens, logq = drafter.draft(ctx, k)
            return ChainDraft(tokens[:, :0], None)
    ARMS.add("empty", Empty)
    try:
        model = tiny_model("llama", tokenizer, seed=5)
        with pytest.raises(ValueError, match=r"arm .*Empty\(\) proposed .* 1 to 2 drafts"):
            rollout(model, tokenizer, 0.0, Always(parse_strategy("empty")),
                    EagleDrafter(EagleHead(model)))
    finally:
        ARMS.unregister("empty")


# ---- the schedule protocol ----------------------------------------------------------------
def test_a_schedule_that_is_not_a_schedule_is_refused_before_the_first_step(tokenizer):
    class LooksLikeOne:
        needs_drafter = False

        def plan(self, batch_size, worker):
            return StepPlan()

        def observe(self, report):
            pass
    model = tiny_model("llama", tokenizer, seed=5)
    with pytest.raises(TypeError, match=r"LooksLikeOne .* is not a workbench.rollout.schedule"
                                        r".Schedule: subclass it"):
        rollout(model, tokenizer, 0.0, LooksLikeOne())


def test_the_schedule_protocol_gives_every_optional_hook_a_default():
    s = PlainSchedule()
    assert (s.needs_drafter, s.needs_trees, s.drafter_names) == (False, False, frozenset())
    assert s.decide(3, 0) == Decision(PLAIN) and s.learned() is None and s.absorb(None) is None
    assert Always(StepPlan("speculative", 2)).needs_drafter  # a schedule speculates
    with pytest.raises(TypeError, match="abstract"):
        Schedule()
