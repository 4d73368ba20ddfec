"""TLT with the suffix drafter (the RL variant ``tlt_suffix``, ``workbench.rl.tlt_suffix``): a
built-in that speculates without the pre-RL EAGLE head, lossless against the baseline token for
token in float64 (coupled), drafting from the group's siblings and the prompt's earlier
responses, which it remembers after each step and keeps in its checkpoint; TLT beside a remedy
still drafts with the EAGLE head; notebook 11's reading compares TLT's two drafters."""
import pytest
import torch

from workbench.rl import GRPOConfig
from workbench.rl.ablation.runner import Ablation
from workbench.rl.remedies.compare import reading
from workbench.rl.setup import rl_setup
from workbench.rl.tlt import TLTConfig, first_divergence
from workbench.rl.tlt_suffix import SuffixTLTTrainer
from workbench.rl.variants import VariantRun, get_variant, speculates, tlt_config, variant_names
from workbench.tasks import Problem

from .helpers.models import tiny_model
from .helpers.rl import CHAINS, length_reward
from .test_remedies_compare import _tables

# two prompts that come back every step (a small pool: multi-epoch RL), so that the memory
# of a prompt's earlier responses has something to draft from
PROBLEMS = [Problem(prompt=p, answer="a", uid=i) for i, p in enumerate(["ab ab ab?", "xy?"])]
GRPO = GRPOConfig.flat(prompts_per_step=2, samples_per_prompt=3, max_new_tokens=16, lr=1e-2,
                       workers=2, max_batch_size=3, temperature=1.0, spec_mode="coupled",
                       seed=1)


def _trainer(tokenizer, variant, peak=1.0, **kw):
    """``variant``'s trainer on a tiny float64 policy whose output logits are scaled by ``peak``
    (a large one makes it repeat itself: a repetitive task), built as an ablation builds it,
    without a head (none is loaded for the baseline and ``tlt_suffix``)."""
    policy = tiny_model("llama", tokenizer)
    with torch.no_grad():
        policy.get_output_embeddings().weight.mul_(peak)
    run = VariantRun(seed=1, policy=policy, tokenizer=tokenizer, problems=PROBLEMS,
                     reward=length_reward, grpo=GRPO,
                     tlt_kw={"arms": CHAINS, "spec_k": 3, "explore_budget": 0.5}, **kw)
    return get_variant(variant).build(run)


def _lossless(tokenizer, peak, steps=3):
    """The baseline's and ``tlt_suffix``'s trainers after ``steps`` RL steps, checked token for
    token and weight for weight."""
    base, suffix = _trainer(tokenizer, "baseline", peak), _trainer(tokenizer, "tlt_suffix", peak)
    hb, hs = base.run(steps, progress=False), suffix.run(steps, progress=False)
    assert first_divergence(hb, hs) == -1
    assert hb["tokens_digest"].tolist() == hs["tokens_digest"].tolist()
    for a, b in zip(base.model.state_dict().values(), suffix.model.state_dict().values()):
        assert torch.equal(a, b)
    return base, suffix


def _kept(trainer) -> list[int]:
    """Per RL step: the drafts its verify steps kept (tokens emitted beyond one a row)."""
    verify = [t.steps[t.steps["kind"] == "verify"] for t in trainer.record.timelines.values()]
    return [int(v["tokens"].sum() - v["batch_size"].sum()) for v in verify]


def test_tlt_suffix_is_a_built_in_that_needs_no_eagle_head():
    assert "tlt_suffix" in variant_names()
    v = get_variant("tlt_suffix")
    assert v.speculative and not v.needs_head()
    assert not speculates(["baseline", "tlt_suffix"])
    assert speculates(["tlt_suffix", "tlt"]) and speculates(["tlt_suffix", "tlt+april"])
    cfg = tlt_config("tlt_suffix", GRPO)
    assert (cfg.drafter, cfg.adaptive_drafter, cfg.adaptive_engine) == ("suffix", False, True)
    # TLT beside a remedy is TLT's own: the EAGLE head and the spot trainer
    assert tlt_config("tlt", GRPO).drafter == "eagle"
    assert get_variant("tlt+april").needs_head() and get_variant("tlt").needs_head()


def test_rl_setup_loads_no_head_for_tlt_suffix_alone():
    s = rl_setup("default", "running_sum", 2, 2, variants=["baseline", "tlt_suffix"],
                 drafter="none")
    assert s.drafter_head is None


def test_tlt_suffix_is_lossless_in_float64(tokenizer, tick_clock):
    """A policy that learns (its groups' rewards differ): every step's tokens and the weights
    equal the baseline's, and it speculated (the tick clock decides the bandit's choices)."""
    base, suffix = _lossless(tokenizer, peak=1.0)
    assert isinstance(suffix, SuffixTLTTrainer) and suffix.spot is None
    assert base.history["reward"].std() > 0
    assert len(_kept(suffix)) == 3 and (suffix.history["accept_len"] >= 1).all()
    assert base.history["accept_len"].isna().all()


def test_on_a_repetitive_task_it_drafts_from_the_rollout_history(tokenizer, tick_clock):
    """A policy that repeats itself: the drafts the suffix drafter proposes from the siblings
    and the prompt's remembered responses are kept, losslessly; every step's responses are
    remembered (the latest ``max_per_prompt`` per prompt)."""
    _, suffix = _lossless(tokenizer, peak=30.0)
    assert sum(_kept(suffix)) > 0 and suffix.history["accept_len"].max() > 1
    assert suffix.history["suffix_prompts"].tolist() == [2, 2, 2]
    assert sorted(len(r) for r in suffix.drafter.memory.values()) == [9, 9]  # 3 steps x G


def test_tlt_suffix_resumes_with_its_memory(tokenizer, tmp_path):
    straight = _trainer(tokenizer, "tlt_suffix")
    straight.run(2, progress=False)
    first = _trainer(tokenizer, "tlt_suffix", checkpoint_dir=tmp_path)
    first.run(1, progress=False)
    resumed = _trainer(tokenizer, "tlt_suffix", checkpoint_dir=tmp_path)
    assert resumed.rl_step == 1 and resumed.drafter.memory == first.drafter.memory
    resumed.run(1, progress=False)
    assert resumed.history["tokens_digest"].tolist() == straight.history["tokens_digest"].tolist()
    assert resumed.drafter.memory == straight.drafter.memory


def test_the_suffix_trainer_refuses_another_drafter(tokenizer):
    model = tiny_model("llama", tokenizer)
    for cfg in (TLTConfig(grpo=GRPO, adaptive_drafter=False, drafter="sibling"),
                TLTConfig(grpo=GRPO, speculative=False, drafter="suffix")):
        with pytest.raises(ValueError, match=rf"drafter '{cfg.drafter}' with speculative="
                                             rf"{cfg.speculative}; accepted: .*'suffix'"):
            SuffixTLTTrainer(model, tokenizer, PROBLEMS, length_reward, cfg)


def test_the_reading_says_whether_the_suffix_drafter_pays_against_the_eagle_head():
    """Notebook 11's reading, on hand-made tables (tests/test_remedies_compare.py's, the
    variants renamed): TLT's two drafters compared per step, and tlt_suffix read as lossless."""
    def lines(names):
        history, evals = _tables(names)
        return reading(Ablation(history, evals).remedy_metrics())

    text = lines({"async": "tlt", "overprovision": "tlt_suffix"})  # 2x and 3x per step
    assert ("TLT's drafter: with the suffix drafter (tlt_suffix) 3.00x per step, with the EAGLE "
            "head (tlt) 2.00x (both over the baseline): the suffix drafter pays against the "
            "EAGLE head here (1.50x), and pays against plain decoding.") in text
    assert any(t.startswith("tlt_suffix (lossless SD): final training reward 0.100 against "
                            "baseline's 0.400") for t in text)
    swapped = lines({"async": "tlt_suffix", "overprovision": "tlt"})
    assert any("suffix drafter does not pay against the EAGLE head here (0.67x)" in t
               for t in swapped)
    assert not any(t.startswith("TLT's drafter") for t in lines({"async": "tlt"}))
