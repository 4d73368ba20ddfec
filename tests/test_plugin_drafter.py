"""A drafter plugin in one file (tests/plugins/repeat_ngram_drafter.py, the worked example of
docs/extending.md): it decodes token for token as plain decoding does, its name is accepted
wherever a drafter is named and its rows appear in notebook 02's tables like a built-in's,
and a plugin that misspells a hook, lacks ``draft`` or takes a reserved name is refused at
registration, naming what is wrong."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import papermill
import pytest
import torch

from workbench.plugins import load_plugins
from workbench.registry import PluginError
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative import NGramDrafter
from workbench.speculative.drafter_protocol import OPTIONAL_HOOKS, REQUIRED_HOOKS
from workbench.speculative.drafters import DRAFTERS, Drafter, SlowedDrafter
from workbench.speculative.resolve import comparison_names, drafter_form, resolve_drafter

from .helpers.models import PROMPTS, tiny_model

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "tests" / "plugins" / "repeat_ngram_drafter.py"


@pytest.fixture
def repeat_ngram():
    """The plugin loaded (``"repeat_ngram"`` registered), forgotten after the test so that
    other tests see the built-in names only."""
    module, = load_plugins([str(PLUGIN)])
    yield module.RepeatNGram
    DRAFTERS.unregister("repeat_ngram")


def test_the_plugin_name_is_accepted_wherever_a_drafter_is_named(repeat_ngram, tokenizer):
    assert "repeat_ngram" in DRAFTERS.plugin_names()
    assert drafter_form("repeat_ngram") == "repeat_ngram"
    assert comparison_names("auto", ["repeat_ngram", "ngram"]) == ["eagle", "repeat_ngram",
                                                                     "ngram"]
    drafter = resolve_drafter("repeat_ngram", tiny_model("llama", tokenizer), tokenizer)
    assert isinstance(drafter, repeat_ngram) and drafter.name == "repeat_ngram"
    assert drafter.module is None and drafter.head is None and not drafter.supports_trees
    with pytest.raises(ValueError, match=r"other drafters \['repeat_ngramm'\]: accepted a list "
                                         r"of \['ngram', 'sibling', 'suffix', 'repeat_ngram', "
                                         r"'small_lm'\]"):
        comparison_names("auto", ["repeat_ngramm"])


def test_the_plugin_proposes_what_followed_the_last_ngram(repeat_ngram):
    drafter = repeat_ngram(n=2)
    assert drafter.continuation([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert drafter.continuation([5, 6, 7, 5, 6, 9, 5, 6], 2) == [9, 5]  # the latest occurrence
    assert drafter.continuation([5, 6, 7, 5, 6], 4) == [7, 5, 6, 6]  # padded with its last
    assert drafter.continuation([1, 2, 3], 2) == [3, 3]  # no earlier occurrence
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 0"):
        repeat_ngram(n=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_plugin_drafter_decodes_what_plain_decoding_does(repeat_ngram, tokenizer,
                                                               temperature):
    """Greedy and coupled sampling, float64, a continuous batch refilled as rows finish."""
    engine = RolloutEngine(tiny_model("llama", tokenizer, seed=2), tokenizer)
    cfg = RolloutConfig(max_new_tokens=24, temperature=temperature, seed=3, spec_k=3,
                        samples_per_prompt=2, max_batch_size=3)
    plain = engine.rollout(PROMPTS[:4], cfg, progress=False)
    drafter = resolve_drafter("repeat_ngram", engine.model, tokenizer)
    sd = engine.rollout(PROMPTS[:4], cfg, drafter=drafter, progress=False)
    assert sd.tokens == plain.tokens
    np.testing.assert_allclose(np.concatenate(sd.logprobs), np.concatenate(plain.logprobs),
                               atol=1e-9)
    requests = sd.timeline.requests
    assert requests["drafted"].sum() > 0
    if temperature == 0.0:  # the tiny model repeats itself: drafts are accepted, not only tried
        assert requests["accepted"].sum() > 0


class _Base(Drafter):
    def draft(self, ctx, k):
        return self.proposal(ctx, torch.zeros(len(ctx.sequences), k, dtype=torch.long))


def test_a_misspelled_hook_is_refused_at_registration_naming_it():
    with pytest.raises(PluginError, match=r"defines 'keep_row', which is no hook but looks like "
                                          r"the hook 'keep_rows'"):
        @DRAFTERS.register("typo_drafter")
        class Typo(_Base):
            def keep_row(self, rows):
                pass
    assert "typo_drafter" not in DRAFTERS


def test_a_plugin_without_draft_a_reserved_name_or_missing_hooks_is_refused():
    with pytest.raises(PluginError, match="lacks the required hook 'draft'"):
        DRAFTERS.add("lazy", type("Lazy", (Drafter,), {}))
    with pytest.raises(PluginError, match=r"drafter name 'auto' is reserved"):
        DRAFTERS.add("auto", _Base)
    with pytest.raises(PluginError, match=r"says supports_trees but defines no draft_tree"):
        DRAFTERS.add("treeless", type("Treeless", (_Base,), {"supports_trees": True}))
    with pytest.raises(PluginError, match=r"is no Drafter subclass and lacks the hook\(s\) "
                                          r"\['build', 'check_compatible'"):
        DRAFTERS.add("bare", type("Bare", (), {"draft": lambda self, ctx, k: None}))
    with pytest.raises(PluginError, match=r"has name 'other'; register it as 'other'"):
        DRAFTERS.add("named", type("Named", (_Base,), {"name": "other"}))
    assert not {"lazy", "treeless", "bare", "named"} & set(DRAFTERS.names())
    assert DRAFTERS.names() == ["ngram", "sibling", "suffix"]


def test_notebook_02_compares_the_plugin_drafter_like_a_built_in(tmp_path):
    """Notebook 02 with ``plugins=[the file]`` and the plugin among ``other_drafters``, tiny:
    its rows are in every table it writes, and SD with it reproduced plain decoding in the
    float64 check."""
    out = tmp_path / "02"
    papermill.execute_notebook(
        ROOT / "notebooks" / "02_speculative_decoding.ipynb", tmp_path / "executed.ipynb",
        parameters={"plugins": [str(PLUGIN)], "drafter": "ngram",
                    "other_drafters": ["repeat_ngram"], "num_prompts": 2, "samples_per_prompt": 1,
                    "batch_sizes": [1],
                    "ks": [2], "curve_k": 2, "temperatures": [0.0, 1.0], "repeats": 3,
                    "max_new_tokens": 12, "lossless_prompts": 2, "whatif_workers": 2,
                    "whatif_samples": 2, "out_dir": str(out)},
        kernel_name="python3", language="python", progress_bar=False, cwd=str(ROOT))
    for table in ("drafters", "curve", "lossless"):
        rows = pd.read_csv(out / f"{table}.csv")
        assert set(rows["drafter"]) == {"ngram", "repeat_ngram"}, table
    exact = pd.read_csv(out / "lossless.csv")
    mine = exact[exact["drafter"] == "repeat_ngram"]
    assert sorted(mine["temperature"]) == [0.0, 1.0] and mine["identical"].all()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["lossless"] is True and metrics["accept_len_repeat_ngram"] >= 1.0


def test_a_slowed_drafter_answers_every_hook_with_the_wrapped_drafters():
    """SlowedDrafter is no Drafter subclass: it delegates each hook of the protocol itself
    (``build`` aside: it is never registered), so the engine reads them as on any drafter."""
    assert set(REQUIRED_HOOKS + OPTIONAL_HOOKS) - {"build"} <= set(vars(SlowedDrafter))
    slowed = SlowedDrafter(NGramDrafter(), 0.0)
    assert (slowed.name, slowed.module, slowed.head, slowed.members, slowed.needs_hidden,
            slowed.supports_trees) == ("ngram", None, None, None, False, False)
