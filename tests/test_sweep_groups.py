"""sd_sweep with GRPO groups (``samples_per_prompt``) and drafters measured in part of the grid
(``only``): what notebook 02 needs to compare the sibling and suffix drafters beside EAGLE."""
import pandas as pd
import pytest

from workbench.rollout import RolloutEngine
from workbench.speculative import NGramDrafter, SiblingDrafter
from workbench.speculative.sweep import drafter_speedups, sd_sweep

from .helpers.models import PROMPTS, tiny_model


def spied(tokenizer, calls: list) -> RolloutEngine:
    """A tiny float64 engine whose rollouts record (drafter or "plain", k, batch size,
    samples per prompt)."""
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    real = engine.rollout

    def rollout(prompts, config=None, progress=True, drafter=None, **kw):
        calls.append(("plain" if drafter is None else drafter.name,
                      None if drafter is None else config.spec_k, config.max_batch_size,
                      config.samples_per_prompt))
        return real(prompts, config, progress=progress, drafter=drafter, **kw)

    engine.rollout = rollout
    return engine


def test_groups_give_the_sibling_drafter_siblings_where_only_says(tokenizer):
    """Every rollout holds G samples of each prompt; the sibling drafter runs only in the
    cells ``only`` names, while plain decoding and n-gram run in every cell. Greedy samples
    of one prompt are identical, so at batch 1 each later sample drafts from a finished
    sibling: its tau beats prompt lookup's, and the tokens equal plain decoding's."""
    calls = []
    drafters = {"ngram": NGramDrafter(), "sibling": SiblingDrafter()}
    table = sd_sweep(spied(tokenizer, calls), PROMPTS[:2], drafters, ks=(2, 3),
                     batch_sizes=(1, 4), repeats=3, max_new_tokens=12, progress=False,
                     samples_per_prompt=3, only={"sibling": {"batch_sizes": [1], "ks": [3]}})
    assert {c[3] for c in calls} == {3}
    assert sorted({c[:3] for c in calls if c[0] == "sibling"}) == [("sibling", 3, 1)]
    assert {(c[1], c[2]) for c in calls if c[0] == "ngram"} == {(2, 1), (3, 1), (2, 4), (3, 4)}
    assert len(calls) == 3 * (4 + 3)  # repeats x (cell batch 1: 4 systems, batch 4: 3)
    cells = set(zip(table["drafter"], table["k"], table["batch_size"]))
    assert cells == {("ngram", 2, 1), ("ngram", 3, 1), ("ngram", 2, 4), ("ngram", 3, 4),
                     ("sibling", 3, 1)}
    assert table["identical"].all()
    at_1 = table[(table["batch_size"] == 1) & (table["k"] == 3)].set_index("drafter")["tau"]
    assert at_1["sibling"] > at_1["ngram"]


def test_bad_groups_and_narrowings_are_named_before_anything_runs(tokenizer):
    calls = []
    engine = spied(tokenizer, calls)
    drafters = {"ngram": NGramDrafter()}
    kw = dict(ks=(2,), batch_sizes=(1, 4), repeats=3, progress=False)
    cases = [(dict(samples_per_prompt=0), "samples_per_prompt must be an integer >= 1"),
             (dict(only={"suffix": {}}), r"'suffix' is not a drafter of the sweep; accepted: "
                                         r"\['ngram'\]"),
             (dict(only={"ngram": {"batch_sizes": [16]}}),
              r"only\['ngram'\]\['batch_sizes'\] = \[16\]: accepted a non-empty list of the "
              r"sweep's batch_sizes \[1, 4\]"),
             (dict(only={"ngram": {"k": [2]}}), r"accepted a dict with the keys"),
             (dict(only=["ngram"]), "accepted None or a dict")]
    for extra, message in cases:
        with pytest.raises(ValueError, match=message):
            sd_sweep(engine, ["a1?"], drafters, **kw, **extra)
    assert calls == []


def test_drafter_speedups_name_every_measured_cell():
    table = pd.DataFrame({
        "temperature": [0.0, 1.0, 0.0, 0.0, 0.0], "batch_size": [1, 1, 16, 16, 8],
        "drafter": ["suffix", "suffix", "suffix", "eagle", "eagle"], "k": [4, 4, 4, 2, 4],
        "speedup": [1.5, 1.25, 1.0, 2.0, 3.0], "speedup_min": [1.0] * 5,
        "speedup_max": [2.0] * 5})
    out = drafter_speedups(table, k=4)
    assert out == {"speedup_bs1_suffix": 1.5, "speedup_bs1_suffix_min": 1.0,
                   "speedup_bs1_suffix_max": 2.0, "speedup_bs1_t1_suffix": 1.25,
                   "speedup_bs1_t1_suffix_min": 1.0, "speedup_bs1_t1_suffix_max": 2.0,
                   "speedup_bs16_suffix": 1.0, "speedup_bs16_suffix_min": 1.0,
                   "speedup_bs16_suffix_max": 2.0}


def test_narrowed_measures_the_named_drafters_compared_at_batch_1_and_the_grids_sizes():
    from workbench.speculative.sweep import narrowed
    drafters = {"eagle": None, "sibling": None, "suffix": None}
    only = narrowed(["sibling", "suffix", "ngram"], drafters, [16, 64], [1, 2, 16, 32], k=4)
    assert only == {"sibling": {"batch_sizes": [1, 16], "ks": [4]},
                    "suffix": {"batch_sizes": [1, 16], "ks": [4]}}
    assert narrowed([], drafters, [16], [1, 16], k=4) == {}
    with pytest.raises(ValueError, match="narrowed drafters 'suffix': accepted a list"):
        narrowed("suffix", drafters, [16], [1, 16], k=4)


def test_the_sweep_says_its_clock_and_how_much_other_work_disturbed_it(tokenizer):
    """Every row carries the share of its cell's repeats that stayed disturbed
    (``speedup.interleave``) and the clock its makespans were read on (the local backend's:
    sim); notebook 02's metrics pool the shares over both tables' cells."""
    from workbench.speculative.sweep import sweep_metrics
    table = sd_sweep(spied(tokenizer, []), PROMPTS[:1], {"ngram": NGramDrafter()}, ks=(2,),
                     batch_sizes=(1,), repeats=3, max_new_tokens=6, progress=False)
    assert table["clock"].tolist() == ["sim"]
    assert table["disturbed_share"].between(0, 1).all()
    compare = table.assign(disturbed_share=1 / 3)
    curve = pd.concat([table.assign(disturbed_share=0.0), table.assign(disturbed_share=1.0)])
    metrics = sweep_metrics(compare, curve, table[:0], k=2)
    assert metrics["disturbed_share"] == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert metrics["clock"] == "sim"
    assert table["compile"].tolist() == [False] and metrics["compile"] is False  # eager
