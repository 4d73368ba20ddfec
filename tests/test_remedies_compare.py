"""The remedies' comparison measures and figures, on hand-made tables: paired speedups,
off-policy shares, final accuracies, the accuracy-against-time curve and who first reaches the
baseline's final accuracy."""
import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from workbench.rl.ablation.runner import Ablation  # noqa: E402
from workbench.rl.remedies.compare import (accuracy_vs_time, reading,  # noqa: E402
                                           remedy_metrics, remedy_table, time_to_accuracy)
from workbench.viz import remedies as remviz  # noqa: E402

# variant -> (step seconds of seeds 0 and 1, held-out accuracy after 0, 2, 4 steps per seed,
#             off-policy share per step)
RUNS = {"baseline": ([2.0, 4.0], [[0.1, 0.2, 0.4], [0.1, 0.4, 0.6]], None),
        "async": ([1.0, 2.0], [[0.1, 0.5, 0.5], [0.1, 0.5, 0.5]], 1.0),
        "overprovision": ([1.0, 1.0], [[0.1, 0.1, 0.2], [0.1, 0.1, 0.2]], 0.0),
        "tlt+partial": ([0.5, 1.0], [[0.1, 0.2, 0.3], [0.1, 0.2, 0.3]], 0.25)}
# variant -> training reward of seeds 0 and 1 (every step)
REWARDS = {"baseline": [0.3, 0.5], "async": [0.35, 0.45], "overprovision": [0.1, 0.1],
           "tlt+partial": [0.2, 0.2]}


def _tables(names=None):
    """The runs' tables; ``names`` renames variants (the same numbers under other names)."""
    rows, evals = [], []
    for v, (secs, acc, share) in RUNS.items():
        reward, v = REWARDS[v], (names or {}).get(v, v)
        for seed, s in enumerate(secs):
            for step in range(4):
                step_s = s * (2 if step == 3 and v == "async" else 1)
                row = {"variant": v, "seed": seed, "step": step, "step_s": step_s,
                       "rollout_s": 0.75 * step_s, "idle_fraction": 0.4,
                       "reward": reward[seed], "response_len": 10.0 * secs[seed]}
                if share is not None:
                    row.update(offpolicy_token_share=share, mean_staleness=share,
                               max_staleness=int(share > 0), groups_trained=2 - step % 2)
                rows.append(row)
            evals += [{"variant": v, "seed": seed, "step": k, "accuracy": a}
                      for k, a in zip((0, 2, 4), acc[seed])]
    return pd.DataFrame(rows), pd.DataFrame(evals)


def test_accuracy_against_cumulative_time():
    history, evals = _tables()
    c = accuracy_vs_time(history, evals).set_index(["variant", "step"])
    # after 2 steps: seeds' cumulative times 4 and 8 (baseline), mean 6; after 4: 8 and 16
    assert c.loc[("baseline", 2), "time_s"] == 6.0 and c.loc[("baseline", 4), "time_s"] == 12
    assert c.loc[("baseline", 4), "accuracy"] == pytest.approx(0.5)
    assert c.loc[("async", 4), "time_s"] == pytest.approx((5 + 10) / 2)  # last step 2x
    assert c.loc[("async", 0), "time_s"] == 0
    assert list(dict.fromkeys(c.index.get_level_values(0))) == list(RUNS)
    reach = time_to_accuracy(c.reset_index(), 0.5)
    assert reach == {"baseline": 12.0, "async": 3.0, "overprovision": None,
                     "tlt+partial": None}
    with pytest.raises(ValueError, match="after 6 steps has no step times"):
        accuracy_vs_time(history, evals.assign(step=evals["step"] + 2))


def test_remedy_metrics_name_each_variant_and_the_first_to_the_baselines_accuracy():
    history, evals = _tables()
    m = Ablation(history, evals).remedy_metrics()
    assert m["accuracy_final_baseline"] == pytest.approx(0.5)
    assert m["accuracy_start"] == pytest.approx(0.1)
    assert m["speedup_baseline"] == 1.0
    # paired per (seed, step): 2/1, 4/2 on steps 0-2, then 2/2 and 4/4: median 2
    assert m["speedup_async"] == 2.0 and m["speedup_tlt+partial"] == 4.0
    assert m["offpolicy_share_async"] == 1.0 and m["offpolicy_share_baseline"] == 0.0
    assert m["offpolicy_share_tlt+partial"] == 0.25
    assert m["accuracy_final_overprovision"] == pytest.approx(0.2)
    assert m["time_to_accuracy_overprovision"] is None
    assert m["groups_per_step_async"] == 1.5 and "groups_per_step_baseline" not in m
    # the paired ratios' IQR and the mean idle fraction, per variant: async's ratios are
    # 2, 2, 2, 1 (seed 0) and 2, 2, 2, 1 (seed 1)
    assert (m["e2e_speedup_q25_async"], m["e2e_speedup_q75_async"]) == (1.75, 2.0)
    assert m["idle_fraction_async"] == 0.4 and m["idle_fraction_baseline"] == 0.4
    assert (m["best_time_to_accuracy"], m["best_time_to_accuracy_s"]) == ("async", 3.0)
    # when no remedy gets there, the baseline is first, at its own end
    slow = history["variant"] != "async"
    m = remedy_metrics(history[slow], evals[evals["variant"] != "async"], {})
    assert (m["best_time_to_accuracy"], m["best_time_to_accuracy_s"]) == ("baseline", 12.0)
    assert all(not isinstance(v, (dict, list)) for v in m.values())
    with pytest.raises(ValueError, match="baseline"):
        remedy_metrics(history, evals[evals["variant"] != "baseline"], {})


def test_the_reading_is_the_numbers_own():
    history, evals = _tables()
    m = Ablation(history, evals).remedy_metrics()
    text = reading(m)
    assert text[0].startswith("Fastest step: tlt+partial, 4.00x")
    assert "rollout is 75% of its step" in text[1] and "idle 40%" in text[1]
    assert text[2].startswith("First to the baseline's final accuracy 0.500: async, after "
                              "3.0 s")
    assert any(t.startswith("overprovision: 3.00x per step, 1.5 groups trained a step, "
                            "trained responses 10.0 tokens long on average (the baseline's "
                            "30.0)")
               and "-0.300 against the baseline, standard error 0.100: beyond 2 standard "
               "errors" in t and "never" in t for t in text)
    assert any(t.startswith("async: 2.00x") and "+0.000 against the baseline, standard error "
               "0.100: within noise" in t for t in text)
    flat = evals.assign(accuracy=0.1)  # no learning: time to accuracy says nothing
    text = reading(Ablation(history, flat).remedy_metrics())
    assert any("gained no held-out accuracy" in t for t in text)
    assert not any(t.startswith("Against TLT alone (") for t in text)


def test_a_baseline_gain_within_noise_is_no_target():
    """The baseline ends at 0.1 and 0.3 over its two seeds (mean 0.2, standard error of
    the gain 0.1 from a start of 0.1 on both): +0.1 is within 2 standard errors, so no
    variant's time to it is read as a win, and TLT is compared per step instead."""
    history, evals = _tables({"async": "tlt"})
    last = (evals["variant"] == "baseline") & (evals["step"] == 4)
    evals.loc[last, "accuracy"] = [0.1, 0.3]
    m = Ablation(history, evals).remedy_metrics()
    assert m["accuracy_gain_se_baseline"] == pytest.approx(0.1)
    text = reading(m)
    assert ("The baseline's held-out gain (0.100 to 0.200, +0.100) is within its seeds' noise "
            "(standard error 0.100)") in text[2]
    assert not any(t.startswith("First to") for t in text)
    # per step: tlt 2x; overprovision 3x and tlt+partial 4x are faster
    # tlt ends at 0.5 on both seeds: +0.3 against a standard error of 0.1
    assert text[-1] == ("Against TLT alone: no verdict on time to accuracy (above); ended above "
                        "the baseline beyond 2 standard errors: tlt; per step faster than "
                        "TLT's 2.00x: overprovision, tlt+partial.")
    # a variant that ends above the baseline beyond noise where TLT does not
    end = evals["step"] == 4
    evals.loc[end & (evals["variant"] == "overprovision"), "accuracy"] = 0.9
    evals.loc[end & (evals["variant"] == "tlt"), "accuracy"] = 0.2
    text = reading(Ablation(history, evals).remedy_metrics())
    assert "ended above the baseline beyond 2 standard errors: overprovision (TLT did not)" \
        in text[-1]
    # the same gain over a spread a third as wide is beyond noise: raced to as before
    evals.loc[last, "accuracy"] = [0.17, 0.23]
    m = Ablation(history, evals).remedy_metrics()
    assert m["accuracy_gain_se_baseline"] == pytest.approx(0.03)
    assert reading(m)[2].startswith("First to the baseline's final accuracy 0.200")
    one = Ablation(history[history["seed"] == 0], evals[evals["seed"] == 0]).remedy_metrics()
    assert one["accuracy_gain_se_baseline"] is None


def test_final_accuracy_noise_and_tlts_reward_against_the_run_it_speeds():
    """The seeds' spread: each final accuracy's sd and the standard error of its cost; TLT
    against the baseline and tlt+<remedy> against its remedy on the final training reward,
    within 2 of the reference's sd (lossless) or not."""
    history, evals = _tables({"async": "tlt", "overprovision": "partial"})
    m = Ablation(history, evals).remedy_metrics()
    # baseline final accuracy 0.4 and 0.6 (sd 0.141), partial's 0.2 and 0.2 (sd 0)
    assert m["accuracy_final_sd_baseline"] == pytest.approx(0.02 ** 0.5)
    assert m["accuracy_final_sd_partial"] == 0.0
    assert m["accuracy_cost_se_partial"] == pytest.approx((0.02 / 2) ** 0.5)
    assert m["reward_final_baseline"] == pytest.approx(0.4)
    assert m["reward_final_sd_baseline"] == pytest.approx(0.02 ** 0.5)
    assert m["reward_final_tlt+partial"] == pytest.approx(0.2)
    text = reading(m)
    assert ("tlt (lossless SD): final training reward 0.400 against baseline's 0.400 ± 0.141 "
            "(sd over seeds): within 2 sd.") in text
    assert ("tlt+partial (lossless SD): final training reward 0.200 against partial's "
            "0.100 ± 0.000 (sd over seeds): beyond 2 sd.") in text
    # the same as one row per variant
    t = remedy_table(m).set_index("variant")
    assert list(t.index) == ["baseline", "tlt", "partial", "tlt+partial"]
    assert t.loc["partial", "accuracy_cost"] == pytest.approx(-0.3)
    assert t.loc["partial", "accuracy_cost_se"] == pytest.approx((0.02 / 2) ** 0.5)
    assert t.loc["tlt", "time_to_accuracy_s"] == 3.0 and pd.isna(t.loc["partial",
                                                                      "time_to_accuracy_s"])
    assert t.loc["tlt", "speedup"] == 2.0 and t.loc["tlt", "groups_per_step"] == 1.5
    assert pd.isna(t.loc["baseline", "groups_per_step"])
    assert t.loc["tlt+partial", "reward_final"] == pytest.approx(0.2)
    assert t.loc["partial", "response_len"] == 10.0 and t.loc["baseline", "response_len"] == 30
    # one seed: no spread to read the cost against
    one = Ablation(history[history["seed"] == 0], evals[evals["seed"] == 0]).remedy_metrics()
    assert one["accuracy_cost_se_partial"] is None and one["reward_final_sd_partial"] is None
    text = reading(one)
    assert not any("standard error" in t or " sd." in t for t in text)
    assert ("tlt+partial (lossless SD): final training reward 0.200 against partial's 0.100: "
            "one seed, no spread to read the difference against.") in text
    same = history[history["seed"] == 0].copy()  # tlt's rewards those of the baseline
    same.loc[same["variant"] == "tlt", "reward"] = 0.3
    text = reading(Ablation(same, evals[evals["seed"] == 0]).remedy_metrics())
    assert "tlt (lossless SD): final training reward 0.300 against baseline's 0.300: equal." \
        in text
    assert pd.isna(remedy_table(one).set_index("variant").loc["partial", "reward_final_sd"])


def test_remedy_figures_draw_the_tables():
    history, evals = _tables()
    fig = remviz.step_times(history, label="P=2")
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == pytest.approx([3.0, 1.875, 1.0, 0.75])  # means over seeds and steps
    assert fig.axes[0].patches[3].get_hatch() == "//"        # tlt+partial: composed
    curves = accuracy_vs_time(history, evals)
    fig = remviz.accuracy_vs_time(curves, target=0.5)
    lines = fig.axes[0].lines
    assert list(lines[0].get_xdata()) == [0.0, 6.0, 12.0]
    assert list(lines[-1].get_ydata()) == [0.5, 0.5]           # the target line
    # the baseline's band: its standard error (0.5 ± 0.1414 / sqrt(2) at the end), not its sd
    band = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert (band.min(), band.max()) == pytest.approx((0.1, 0.6))
    fig = remviz.learning_over_steps(history, curves, window=2)
    reward_ax, accuracy_ax = fig.axes
    assert len(reward_ax.lines) == len(RUNS) and len(accuracy_ax.lines) == len(RUNS)
    # baseline rewards 0.3 and 0.5 every step: 0.4 each step, and so its moving mean
    assert list(reward_ax.lines[0].get_ydata()) == pytest.approx([0.4] * 4)
    assert list(accuracy_ax.lines[0].get_xdata()) == [0, 2, 4]
    assert list(accuracy_ax.lines[0].get_ydata()) == pytest.approx([0.1, 0.3, 0.5])
    band = accuracy_ax.collections[0].get_paths()[0].vertices[:, 1]
    assert (band.min(), band.max()) == pytest.approx((0.1, 0.6))
    assert reward_ax.lines[3].get_linestyle() == "--"          # tlt+partial: composed
    rising = remviz.learning_over_steps(history.assign(reward=history["step"]), curves,
                                        window=2)
    assert list(rising.axes[0].lines[0].get_ydata()) == pytest.approx([0, 0.5, 1.5, 2.5])
    fig = remviz.offpolicy_share(history)
    assert [p.get_height() for p in fig.axes[0].patches] == pytest.approx([0, 1, 0, 0.25])
    fig = remviz.offpolicy_share(history.drop(columns=["offpolicy_token_share"]))
    assert [p.get_height() for p in fig.axes[0].patches] == [0, 0, 0, 0]


def test_first_divergence_is_the_earliest_step_any_seed_differs():
    """Two variants' histories compared seed by seed on ``tokens_digest``: the earliest step
    where one seed's tokens differ, -1 when every common step matches."""
    def rows(variant, seed, digests):
        return [{"variant": variant, "seed": seed, "step": s, "tokens_digest": d}
                for s, d in enumerate(digests)]
    same = pd.DataFrame(rows("a", 0, "xyz") + rows("b", 0, "xyz") + rows("a", 1, "pqr")
                        + rows("b", 1, "pqr"))
    assert Ablation(history=same, evals=pd.DataFrame()).first_divergence("a", "b") == -1
    apart = pd.DataFrame(rows("a", 0, "xyz") + rows("b", 0, "xyZ") + rows("a", 1, "pqr")
                         + rows("b", 1, "pQr"))
    assert Ablation(history=apart, evals=pd.DataFrame()).first_divergence("a", "b") == 1


def test_the_reading_says_how_much_other_work_disturbed_the_run():
    """Each variant's disturbed share and the run's, from the steps' usage columns
    (``GRPO.usage``), in the metrics, and a line of the reading that says what it does to the
    figures on the run's clock; none where the history has no usage columns."""
    history, evals = _tables()
    disturbed = (history["variant"] == "async").astype(float)  # async's steps all disturbed
    history = history.assign(usage_measured_s=1.0, usage_disturbed_s=disturbed,
                             usage_cpu_s=1.0 - 0.5 * disturbed, clock="sim")
    m = Ablation(history, evals).remedy_metrics()
    assert m["disturbed_share_async"] == 1.0 and m["disturbed_share_baseline"] == 0.0
    assert m["disturbed_share"] == pytest.approx(0.25) and m["clock"] == "sim"
    assert reading(m)[-1] == ("Other work disturbed 25% of the run's measured seconds (CPU "
                              f"share {m['cpu_share']:.2f}): the sim clock counts each "
                              "worker's own CPU time, so the times above hold.")
    assert not any("disturbed" in t for t in reading(Ablation(*_tables()).remedy_metrics()))
