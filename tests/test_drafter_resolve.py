"""One way to name a drafter: 'auto', a saved folder, 'ngram', 'sibling', 'none'; bad names
refused with the accepted forms before anything loads; RL needs no head when only the baseline
runs."""
import pytest
import torch

from workbench.models import DEFAULT_EAGLE, load_model, save_model
from workbench.rl.setup import rl_setup
from workbench.speculative import EagleDrafter, EagleHead, LMDrafter, NGramDrafter, SiblingDrafter
from workbench.speculative import resolve as resolve_mod
from workbench.speculative.cache import CACHE_ENV
from workbench.speculative.resolve import (compared_drafters, drafter_form, drafter_name,
                                           resolve_drafter, resolve_head)
from workbench.train import isolated_rng

from .helpers.models import tiny_model


@pytest.fixture
def no_fitting(tmp_path, monkeypatch):
    """A cache of the test's own, and any fit on the spot is a failure."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))

    def refuse(*args, **kwargs):
        raise AssertionError("nothing should have been fitted")
    monkeypatch.setattr(resolve_mod, "fit_eagle", refuse)
    monkeypatch.setattr(resolve_mod, "fit_drafter_lm", refuse)
    return tmp_path / "cache"


def saved_head(policy, folder):
    with isolated_rng(0):
        EagleHead(policy).save_pretrained(folder)
    return folder


def test_each_accepted_form(tokenizer, tmp_path, no_fitting):
    policy = tiny_model("llama", tokenizer)
    assert resolve_drafter("none", policy, tokenizer) is None
    assert isinstance(resolve_drafter("ngram", policy, tokenizer), NGramDrafter)
    assert isinstance(resolve_drafter("sibling", policy, tokenizer), SiblingDrafter)
    head = resolve_drafter(saved_head(policy, tmp_path / "head"), policy, tokenizer)
    assert isinstance(head, EagleDrafter) and head.head.fc.weight.dtype == torch.float64
    save_model(tiny_model("llama", tokenizer, layers=1, seed=1), tokenizer, tmp_path / "lm")
    lm = resolve_drafter(str(tmp_path / "lm"), policy, tokenizer)
    assert isinstance(lm, LMDrafter) and lm.model.dtype == torch.float64
    assert [drafter_form(s) for s in ("auto", "ngram", "sibling", "none", tmp_path / "head",
                                      tmp_path / "lm")] == ["auto", "ngram", "sibling", "none",
                                                            "eagle", "lm"]
    assert [drafter_name(s) for s in ("auto", tmp_path / "head", tmp_path / "lm", "ngram",
                                      "sibling")] == ["eagle", "eagle", "small_lm", "ngram",
                                                      "sibling"]
    compared = compared_drafters("ngram", policy, tokenizer, others=["sibling"])
    assert list(compared) == ["ngram", "sibling"]
    assert isinstance(compared["sibling"], SiblingDrafter)
    assert not no_fitting.exists()


def test_auto_on_the_default_policy_is_the_shipped_drafters(no_fitting):
    policy, tokenizer = load_model("default", device="cpu")
    drafters = compared_drafters("auto", policy, tokenizer)
    assert list(drafters) == ["eagle", "ngram", "small_lm"]
    shipped = EagleHead.from_pretrained(DEFAULT_EAGLE, policy)
    for a, b in zip(drafters["eagle"].head.state_dict().values(), shipped.state_dict().values()):
        assert torch.equal(a, b)
    assert isinstance(drafters["small_lm"], LMDrafter)
    assert not no_fitting.exists()  # nothing fitted, nothing cached


@pytest.mark.parametrize("spec, message", [
    ("eagel", "'eagel' is not one of ['auto', 'ngram', 'sibling', 'suffix', 'none'], and as a "
              "path it does not exist"),
    (42, "drafter 42 is not a name or a folder"),
    ("", "is not a name or a folder"),
    ("{tmp}/empty", "is a folder without eagle_config.json or config.json"),
    ("{tmp}/file.txt", "as a path it is a file"),
])
def test_bad_names_are_refused_with_the_accepted_forms(spec, message, tmp_path, no_fitting):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    spec = spec.format(tmp=tmp_path) if isinstance(spec, str) else spec
    with pytest.raises(ValueError) as raised:
        resolve_drafter(spec, None, None)  # refused before the (missing) policy is touched
    assert message in str(raised.value)
    assert "accepted: 'auto', 'ngram', 'sibling', 'suffix', 'none', a folder saved by " \
        "EagleHead" \
        in str(raised.value)


def test_where_a_drafter_is_needed_none_and_other_kinds_are_refused(tokenizer, tmp_path,
                                                                   no_fitting):
    with pytest.raises(ValueError, match="this run needs a drafter; accepted here: 'auto', "
                                         "'ngram', 'sibling', 'suffix', a folder"):
        resolve_drafter("none", None, None, allow_none=False)
    with pytest.raises(ValueError, match="need an EAGLE head"):
        resolve_head("ngram", None, None)
    with pytest.raises(ValueError, match=r"other drafters \['tree'\]"):
        compared_drafters("auto", None, None, others=["tree"])
    with pytest.raises(ValueError, match="drafter kind must be one of 'eagle', 'lm', got 'tree'"):
        resolve_drafter("auto", None, None, kind="tree")


def test_rl_setup_with_a_user_model_and_only_the_baseline_needs_no_head(tokenizer, tmp_path,
                                                                       no_fitting):
    save_model(tiny_model("llama", tokenizer, dtype=torch.float32), tokenizer, tmp_path / "m")
    model = str(tmp_path / "m")
    s = rl_setup(model, "running_sum", 8, 4, variants=["baseline"])
    assert s.drafter_head is None and len(s.pool) == 8 and len(s.held_out) == 4
    assert rl_setup(model, "running_sum", 8, 4, drafter="none", variants=["baseline"]) \
        .drafter_head is None
    assert not no_fitting.exists()
    head = saved_head(s.policy, tmp_path / "head")
    with_head = rl_setup(model, "running_sum", 8, 4, drafter=str(head),
                         variants=["baseline", "static_sd"])
    assert isinstance(with_head.drafter_head, EagleHead)
    for drafter, match in (("none", "need an EAGLE head"), ("ngram", "need an EAGLE head"),
                           ("nowhere", "does not exist")):
        with pytest.raises(ValueError, match=match):
            rl_setup("/no/such/model", "running_sum", 8, 4, drafter=drafter,
                     variants=["baseline", "tlt"])
    with pytest.raises(ValueError, match="variants 'tlt': accepted a list of"):
        rl_setup(model, variants="tlt")
