"""RL variants by name (``workbench.rl.variants``) and the worked plugin, shortest-predicted-first
scheduling (tests/plugins/shortest_first.py): the built-ins are registered and compose as
``tlt+<remedy>``; a plugin's variant runs through ``run_ablation`` beside the baseline with its
requests shortest-predicted first, composes with TLT, goes into the settings a resumed
ablation must share, resumes from its checkpoint as a built-in does, and runs through notebook
11; a variant missing its ``build`` or misspelling a hook is refused at registration, and an
unknown name is refused listing the registered ones."""
import json
from pathlib import Path

import pandas as pd
import papermill
import pytest

from workbench.plugins import load_plugins
from workbench.registry import PluginError
from workbench.rl import GRPOConfig
from workbench.rl.ablation.runner import check_ablation, run_ablation
from workbench.rl.ablation.runs import Turns
from workbench.rl.ablation.store import SETTINGS_FILE
from workbench.rl.setup import rl_setup
from workbench.rl.remedies import RemedyConfig, RemedyTrainer, Sampler
from workbench.rl.variants import (VARIANTS, RemedyVariant, RLVariant, get_variant,
                                   remedy_config, rl_variant, speculates, tlt_config,
                                   variant_names)
from workbench.tasks import Problem

from .helpers.models import tiny_model

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "tests" / "plugins" / "shortest_first.py"
# prompts of three lengths, so that an order by length differs from the order drawn
PROBLEMS = [Problem(prompt=f"q{i}?" + "x" * (i * 7 % 5), answer="a", uid=i) for i in range(32)]
GRPO = GRPOConfig.flat(prompts_per_step=3, samples_per_prompt=2, max_new_tokens=10, lr=5e-2,
                       workers=2, seed=1)
# what does not depend on wall time
COLUMNS = ["variant", "seed", "step", "reward", "loss", "tokens", "tokens_digest",
           "groups_trained", "sampled_version"]
BUILT_INS = ["baseline", "static_sd", "adaptive_drafter", "tlt", "tlt_suffix", "overprovision",
             "april", "partial", "async", "tail_batching"]


def _reward(prompt, completion, answer):
    """A reward that differs inside groups (so the policy really moves)."""
    return float(len(completion) % 3 == 0)


@pytest.fixture(scope="module")
def plugin():
    """The plugin's variant, registered for this module's tests (forgotten after them)."""
    load_plugins([str(PLUGIN)])
    yield "shortest_first"
    VARIANTS.unregister("shortest_first")


def _ablation(tokenizer, steps, variants, folder=None, **kw):
    args = dict(variants=variants, seeds=[0], reward=_reward, progress=False)
    if folder is not None:
        args.update(checkpoint_dir=folder, checkpoint_every=1)
    return run_ablation(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, GRPO, steps,
                        **{**args, **kw})


# ---- the registry ---------------------------------------------------------------------------

def test_the_built_ins_are_registered_and_every_remedy_composes_with_tlt():
    names = variant_names()
    assert names[:len(BUILT_INS)] == BUILT_INS
    assert {f"tlt+{r}" for r in BUILT_INS[5:]} <= set(names)
    assert not {"tlt+baseline", "tlt+tlt", "tlt+tlt_suffix"} & set(names)  # TLT's don't compose
    assert speculates(["baseline", "april"]) is False
    assert speculates(["baseline", "tlt+april"]) and speculates(["static_sd"])
    assert speculates(["baseline", "tlt_suffix"]) is False  # it drafts without the EAGLE head
    assert remedy_config("april", GRPO) == get_variant("april").config(GRPO)
    assert tlt_config("adaptive_drafter", GRPO).adaptive_engine is False


def test_the_plugin_registers_a_variant_that_composes(plugin):
    names = variant_names()
    assert plugin in names and f"tlt+{plugin}" in names
    assert VARIANTS.plugin_names() == [plugin]
    assert get_variant(plugin).speculative is False and get_variant(f"tlt+{plugin}").speculative
    assert remedy_config(plugin, GRPO) == RemedyConfig(grpo=GRPO)  # no remedy switched on


def test_a_variant_without_build_is_refused_naming_the_hook():
    with pytest.raises(PluginError, match=r"lacks the required hook\(s\) \['build'\]"):
        @rl_variant("no_build")
        class NoBuild(RLVariant):
            speculative = False
    assert "no_build" not in VARIANTS


def test_a_misspelled_hook_is_refused_at_registration_naming_it():
    with pytest.raises(PluginError, match=r"defines 'orders', .* looks like the hook 'order'"):
        @rl_variant("typo")
        class Typo(RemedyVariant):
            def orders(self, live):  # meant order: the default order would stay in place
                return None
    with pytest.raises(PluginError, match=r"'\+' composes names"):
        rl_variant("a+b")(type("AB", (RemedyVariant,), {}))
    with pytest.raises(PluginError, match="speculative=1; accepted: True or False"):
        rl_variant("bad_switch")(type("BadSwitch", (RemedyVariant,), {"speculative": 1}))
    assert not {"typo", "a+b", "bad_switch"} & set(VARIANTS.names())


def test_an_unknown_variant_is_refused_listing_the_registered_names(plugin):
    listed = r"one of 'baseline', 'static_sd'.*'shortest_first'.*'tlt\+shortest_first', got "
    with pytest.raises(ValueError, match=r"variants\[1\] must be " + listed + "'shortest_frist'"):
        check_ablation(1, ["baseline", "shortest_frist"], [0], GRPO)
    with pytest.raises(ValueError, match=r"variant must be " + listed + r"'tlt\+tlt'"):
        get_variant("tlt+tlt")
    with pytest.raises(ValueError, match=r"variants\[0\] must be one of .* got 'nope'"):
        rl_setup(variants=["nope"])  # before the model loads
    with pytest.raises(ValueError, match="remedy must be one of 'baseline', .*'shortest_first'"):
        remedy_config("tlt", GRPO)


# ---- the order seam ---------------------------------------------------------------------------

def test_a_bad_order_is_refused_naming_what_it_gave(tokenizer):
    trainer = RemedyTrainer(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, _reward,
                            RemedyConfig(grpo=GRPO), order=lambda live: [0] * len(live))
    with pytest.raises(ValueError, match=r"order gave \[0, 0, 0, 0, 0, 0\] for 6 requests; "
                                         r"accepted: a permutation of range\(6\)"):
        trainer.step()
    assert isinstance(trainer.sampler, Sampler)


# ---- through the ablation -----------------------------------------------------------------------

def test_the_plugin_runs_beside_the_baseline_its_requests_shortest_first(tokenizer, plugin):
    ablation = _ablation(tokenizer, 2, ["baseline", plugin])
    h = ablation.history
    assert list(dict.fromkeys(h["variant"])) == ["baseline", plugin]
    assert h.groupby("variant")["step"].count().to_dict() == {"baseline": 2, plugin: 2}
    assert set(ablation.per_variant()["variant"]) == {"baseline", plugin}
    assert isinstance(ablation.trainers[(plugin, 0)], RemedyTrainer)
    for step, timeline in ablation.trainers[(plugin, 0)].record.timelines.items():
        requests = timeline.requests.sort_values("prompt_id")  # the order the workers got
        assert requests["prompt_tokens"].is_monotonic_increasing, (step, requests)
        assert requests["prompt_tokens"].nunique() > 1  # the order had something to sort
    # the baseline's order is the one drawn: not sorted by length at every step
    base = ablation.trainers[("baseline", 0)].record.timelines.values()
    assert not all(t.requests.sort_values("prompt_id")["prompt_tokens"].is_monotonic_increasing
                   for t in base)


def test_the_plugin_name_is_in_the_settings_and_another_variant_is_refused(tokenizer, plugin,
                                                                          tmp_path):
    folder = tmp_path / "ckpt"
    _ablation(tokenizer, 1, ["baseline", plugin], folder)
    assert json.loads((folder / SETTINGS_FILE).read_text())["variants"] == ["baseline", plugin]
    assert (folder / f"{plugin}-seed0" / "state").is_dir()
    with pytest.raises(ValueError, match=r"other settings:\n  variants: saved \['baseline', "
                                         r"'shortest_first'\], this call \['baseline', 'april'\]"):
        _ablation(tokenizer, 2, ["baseline", "april"], folder)


def test_the_plugin_resumes_from_its_checkpoint_as_if_it_had_run_straight(tokenizer, plugin,
                                                                         tmp_path, monkeypatch,
                                                                         tick_clock):
    variants = ["baseline", plugin]
    whole = _ablation(tokenizer, 3, variants)
    folder = tmp_path / "ckpt"
    real, calls = Turns.step, []

    def dies(self, key):  # interrupted inside step 1: after the baseline's, before the plugin's
        calls.append(key)
        if len(calls) > 3:
            raise KeyboardInterrupt
        real(self, key)
    with monkeypatch.context() as m:
        m.setattr(Turns, "step", dies)
        with pytest.raises(KeyboardInterrupt):
            _ablation(tokenizer, 3, variants, folder)
    resumed = _ablation(tokenizer, 3, variants, folder)
    pd.testing.assert_frame_equal(resumed.history[COLUMNS], whole.history[COLUMNS])
    assert sorted(resumed.trainers[(plugin, 0)].record.timelines) == [0, 1, 2]


# ---- through notebook 11 ------------------------------------------------------------------------

def test_notebook_11_runs_the_plugin_variant_into_its_tables(tmp_path):
    out = tmp_path / "out"
    variants = ["baseline", "april", "shortest_first", "tlt+shortest_first"]
    papermill.execute_notebook(
        ROOT / "notebooks" / "11_long_tail_remedies.ipynb", tmp_path / "executed.ipynb",
        parameters={"plugins": [str(PLUGIN)], "variants": variants, "rl_problems": 32,
                    "eval_problems": 4, "eval_every": 1, "prompts_per_step": 2,
                    "samples_per_prompt": 2, "max_new_tokens": 16, "steps": 1, "seeds": [0],
                    "workers": 2, "explore_budget": 0.5, "out_dir": str(out)},
        kernel_name="python3", language="python", progress_bar=False, cwd=str(ROOT))
    history, table = pd.read_csv(out / "history.csv"), pd.read_csv(out / "remedies.csv")
    assert list(dict.fromkeys(history["variant"])) == variants
    assert list(table["variant"]) == variants
    assert set(pd.read_csv(out / "evals.csv")["variant"]) == set(variants)
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"speedup_shortest_first", "speedup_tlt+shortest_first",
            "accuracy_final_shortest_first"} <= set(metrics)
    assert (out / "step_times.png").is_file()


def test_notebook_11_refuses_an_unknown_variant_before_it_loads_a_model(tmp_path):
    with pytest.raises(papermill.PapermillExecutionError,  # no plugin: the name is unknown
                       match=r"variants\[1\] must be one of .* got 'shortest_first'"):
        papermill.execute_notebook(
            ROOT / "notebooks" / "11_long_tail_remedies.ipynb", tmp_path / "executed.ipynb",
            parameters={"variants": ["baseline", "shortest_first"],
                        "out_dir": str(tmp_path / "out")},
            kernel_name="python3", language="python", progress_bar=False, cwd=str(ROOT))
    assert not (tmp_path / "out").exists()
