"""The simulator's check on a real RL run (``cluster.run_check``): a tiny ablation's folder,
as notebook 04 writes it, read back; the costs calibrated on the baseline and static SD only;
every baseline step replayed plain and under the bandit's limit with its own update time;
the predicted and measured speedups the ratios of summed step times; bad folders refused by
what they lack."""
import shutil

import numpy as np
import pandas as pd
import pytest

from workbench.cluster import StepCost, layout, simulate_rollout, trace_from_timeline
from workbench.cluster.run_check import check_run, run_check_metrics
from workbench.rl import GRPOConfig
from workbench.rl.ablation.runner import run_ablation
from workbench.rollout.timeline import Timeline
from workbench.results import write_table
from workbench.speculative import EagleHead
from workbench.tasks import Problem

from .helpers.models import MANY, tiny_model


def _reward(prompt, completion, answer):
    return completion.count("a") / max(1, len(completion))


@pytest.fixture(scope="module")
def run_folder(tokenizer, tmp_path_factory):
    """Notebook 04's files of a 2-step ablation: the first seed's timelines and the history."""
    grpo = GRPOConfig.flat(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=24, lr=1e-2,
                           workers=2, temperature=1.0)
    problems = [Problem(prompt=p, answer="a", uid=i) for i, p in enumerate(MANY)]
    policy = tiny_model("llama", tokenizer, seed=4)  # ragged: rows finish at many steps
    ab = run_ablation(policy, tokenizer, problems, grpo, 2,
                      variants=["baseline", "static_sd", "tlt"], seeds=[0],
                      drafter_head=EagleHead(policy), reward=_reward, progress=False, spec_k=2)
    out = tmp_path_factory.mktemp("nb04")
    ab.save_timelines(out / "timelines", seeds=[0])
    write_table(ab.history, out / "history.csv")
    return out


def test_tlt_is_predicted_from_the_baseline_and_static_sd_alone(run_folder):
    check = check_run(run_folder, "tlt", seed=0)
    load = lambda v: [Timeline.load(p) for p in sorted((run_folder / "timelines" /
                                                        f"{v}-seed0").glob("step*"))]
    base, static = load("baseline"), load("static_sd")
    cost = StepCost.from_timelines(base + static)  # never TLT's own steps
    assert "chain:k=2" in cost.kinds
    s = check.steps
    assert s["step"].tolist() == [0, 1]
    for step, timeline in enumerate(base):
        lay = layout(trace_from_timeline(timeline))
        assert s.loc[step, "plain_s"] == simulate_rollout(lay, cost).makespan_s
        assert s.loc[step, "bandit_s"] == simulate_rollout(lay, cost, rule="bandit").makespan_s
    # the bandit's limit never decodes slower than plain: plain is one of its arms
    assert (s["bandit_s"] <= s["plain_s"] + 1e-12).all()
    h = pd.read_csv(run_folder / "history.csv").set_index(["variant", "step"])
    assert s["update_s"].tolist() == [h.loc[("baseline", i), "update_sim_s"] for i in (0, 1)]
    assert s["variant_step_s"].tolist() == [h.loc[("tlt", i), "step_s"] for i in (0, 1)]
    measured = sum(h.loc[("baseline", i), "step_s"] for i in (0, 1)) / sum(
        h.loc[("tlt", i), "step_s"] for i in (0, 1))
    predicted = (s["plain_s"] + s["update_s"]).sum() / (s["bandit_s"] + s["update_s"]).sum()
    assert check.measured == pytest.approx(measured, rel=1e-12)
    assert check.predicted == pytest.approx(predicted, rel=1e-12) and check.predicted >= 1 - 1e-12
    assert check.error == pytest.approx((predicted - measured) / measured, rel=1e-12)
    assert check.metrics() == {"predicted_e2e_speedup_tlt": check.predicted,
                               "measured_e2e_speedup_tlt_seed0": check.measured,
                               "simulator_error_tlt": check.error}
    assert np.isfinite(check.error)


def test_a_folder_without_what_the_check_needs_is_refused(run_folder, tmp_path):
    with pytest.raises(ValueError, match=r"no saved timelines of 'baseline' seed 3 .*notebook 04"):
        check_run(run_folder, "tlt", seed=3)
    with pytest.raises(ValueError, match=r"no saved timelines of 'adaptive_drafter' seed 0"):
        check_run(run_folder, "adaptive_drafter")
    partial = tmp_path / "partial"
    shutil.copytree(run_folder, partial)
    shutil.rmtree(partial / "timelines" / "static_sd-seed0")
    with pytest.raises(ValueError, match=r"no saved timelines of 'static_sd' seed 0.*"
                                         r"\['baseline', 'static_sd'\]"):
        check_run(partial, "tlt")
    (partial / "history.csv").unlink()
    shutil.copytree(run_folder / "timelines" / "static_sd-seed0",
                    partial / "timelines" / "static_sd-seed0")
    with pytest.raises(ValueError, match="no history.csv in"):
        check_run(partial, "tlt")


def test_the_notebooks_metrics_take_the_check_where_the_run_has_its_variants(run_folder,
                                                                             tmp_path):
    """Notebook 04's metrics.json: the check's metrics where the variants hold the baseline,
    static SD and TLT; none, and nothing read, where they do not (a baseline-only run)."""
    assert (run_check_metrics(run_folder, ["baseline", "static_sd", "tlt"], "tlt", 0)
            == check_run(run_folder, "tlt", 0).metrics())
    empty = tmp_path / "empty"  # check_run would refuse it: nothing is read
    for variants in (["baseline"], ["baseline", "tlt"], ["baseline", "static_sd"]):
        assert run_check_metrics(empty, variants, "tlt", 0) == {}
    with pytest.raises(ValueError, match="no saved timelines"):
        run_check_metrics(empty, ["baseline", "static_sd", "tlt"])
