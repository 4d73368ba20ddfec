"""The drafter-staleness run: measuring leaves the trajectory alone, every measurement is a
losslessness check, the ceiling stops where its docstring says, a resumed run is the
uninterrupted one, and bad arguments are refused before anything runs."""

import pandas as pd
import pytest
import torch

from workbench.atomic import DamagedFileError
from workbench.rl import GRPO
from workbench.rl.acceptance import NotLosslessError, position_table
from workbench.rl.loop import RLLoop
from workbench.rl.staleness.run import StalenessRun, staleness_setup
from workbench.rl.staleness.drafters import CeilingConfig, CeilingDrafter
from workbench.rl.staleness.report import staleness_metrics, tau_change
from workbench.rollout import verify
from workbench.rollout.request import RequestOutput
from workbench.speculative import EagleHead

from .helpers.models import tiny_model
from .helpers.staleness import (SAME, staleness_config, staleness_grpo,  # noqa: F401 (fixtures:
                                staleness_problems, staleness_reward,   # steady_clock, straight)
                                staleness_run, steady_clock, straight)

TAUS = ["tau_frozen", "tau_adaptive", "tau_ceiling", "tau_sibling", "tau_suffix"]


def test_measuring_leaves_the_trajectory_unchanged(tokenizer, straight):
    alone = RLLoop(GRPO(tiny_model("llama", tokenizer), tokenizer, staleness_problems(), staleness_reward,
                        staleness_grpo()))
    alone.run(3, progress=False)
    for a, b in zip(straight.policy.state_dict().values(), alone.model.state_dict().values()):
        assert torch.equal(a, b)
    history = straight.history
    assert history["reward"].tolist() == alone.history["reward"].tolist()
    # the drafters were measured and learned: every row checked, tau by position recorded
    assert (history[TAUS] >= 1).all().all()
    assert (history.filter(like="diverged_") == 0).all().all()
    assert history["ceiling_steps"].min() >= 1 and history["adaptive_steps"].min() >= 1
    pos = straight.positions
    assert set(pos["drafter"]) == {"frozen", "adaptive", "ceiling", "sibling", "suffix"}
    assert history["sibling_prompts"].tolist() == [2, 4, 6]  # each step's 2 new prompts
    assert history["suffix_prompts"].tolist() == [2, 4, 6]
    assert set(pos["step"]) == {0, 1, 2}
    assert (pos["position"] % 2 == 0).all() and (pos["emitted"] >= pos["verify_steps"]).all()


def test_a_drafter_that_is_not_lossless_is_caught(tokenizer, monkeypatch):
    # drafts accepted wrongly: every draft kept, whatever the policy would have emitted
    monkeypatch.setattr(verify, "accept_by_target",
                        lambda draft, target: torch.full((draft.shape[0],), draft.shape[1]))
    with pytest.raises(NotLosslessError, match=r"drafter 'frozen': request uid \d+ .* differs"):
        staleness_run(tokenizer).step()
    counted = staleness_run(tokenizer, staleness_config(divergence="count", drafters=["frozen"]))
    row = counted.step()
    assert row["diverged_frozen"] > 0


def test_resume_equals_an_uninterrupted_run_for_3_steps(tokenizer, tmp_path, straight,
                                                        steady_clock):
    first = staleness_run(tokenizer, staleness_config(checkpoint_every=1), checkpoint_dir=tmp_path / "ckpt")
    first.run_to(1, progress=False)
    resumed = staleness_run(tokenizer, staleness_config(checkpoint_every=1), checkpoint_dir=tmp_path / "ckpt")
    assert resumed.rl_step == 1
    # the spot trainer's step-time estimate (which steps fit the next windows) comes back too
    assert resumed.drafters["adaptive"].spot.step_s == first.drafters["adaptive"].spot.step_s > 0
    resumed.run_to(3, progress=False)
    same = SAME + ["tau_suffix", "suffix_prompts"]
    pd.testing.assert_frame_equal(straight.history[same], resumed.history[same])
    pd.testing.assert_frame_equal(straight.positions, resumed.positions)
    for a, b in zip(straight.policy.state_dict().values(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b)
    for name in ("adaptive", "ceiling"):
        assert all(torch.equal(a, b) for a, b in zip(
            straight.drafters[name].drafter.head.state_dict().values(),
            resumed.drafters[name].drafter.head.state_dict().values()))
    for name in ("sibling", "suffix"):
        memory = {k: list(v) for k, v in straight.drafters[name].drafter.memory.items()}
        assert {k: list(v) for k, v in resumed.drafters[name].drafter.memory.items()} == memory


def test_a_checkpoint_is_refused_when_damaged_or_made_with_another_config(tokenizer,
                                                                          tmp_path):
    run = staleness_run(tokenizer, staleness_config(drafters=["frozen"]), checkpoint_dir=tmp_path / "ckpt")
    run.run_to(1, progress=False)
    with pytest.raises(ValueError, match="another configuration"):
        staleness_run(tokenizer, staleness_config(drafters=["frozen"], spec_k=2), checkpoint_dir=tmp_path / "ckpt")
    (tmp_path / "ckpt" / "staleness_state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(DamagedFileError, match="staleness_state.pt"):
        staleness_run(tokenizer, staleness_config(drafters=["frozen"]), checkpoint_dir=tmp_path / "ckpt")


def _harvested_step(tokenizer):
    model = tiny_model("llama", tokenizer)
    rl = GRPO(model, tokenizer, staleness_problems(), staleness_reward, staleness_grpo()).rollout(harvest=True)
    torch.manual_seed(1)
    return model, EagleHead(model), rl


def test_the_ceiling_trains_until_the_held_back_loss_stops_falling(tokenizer):
    model, head, rl = _harvested_step(tokenizer)
    # an improvement it cannot reach: it stops after `patience` checks and keeps its start
    stuck = CeilingDrafter(head, model, CeilingConfig.flat(
        batch_size=2, holdout_every=2, check_every=1, patience=2, min_improvement=0.9), 2)
    out = stuck.learn(rl, None)
    assert out["ceiling_steps"] == 2 and out["ceiling_kept_steps"] == 0
    assert out["ceiling_converged"] and out["ceiling_loss"] == out["ceiling_loss_start"]
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(),
                                                 stuck.drafter.head.state_dict().values()))
    # patience outlasts the cap: the cap stops it, and it serves its best state
    capped = CeilingDrafter(head, model, CeilingConfig.flat(
        batch_size=2, holdout_every=2, check_every=1, patience=3, min_improvement=0.0,
        max_steps=2, lr=1e-2), 2)
    out = capped.learn(rl, None)
    assert out["ceiling_steps"] == 2 and not out["ceiling_converged"]
    assert out["ceiling_loss"] <= out["ceiling_loss_start"]
    train, held = capped.split(list(range(8)))  # 4 groups of 2: groups 0 and 2 held back
    assert held == [0, 1, 4, 5] and train == [2, 3, 6, 7]
    assert capped.eagle.evaluate(held_pairs(rl, [0, 1])) == pytest.approx(out["ceiling_loss"])
    assert all(torch.equal(a, b) for a, b in zip(capped.head.state_dict().values(),
                                                 capped.drafter.head.state_dict().values()))


def held_pairs(rl, rows):
    from workbench.speculative.train import harvest_pairs
    pairs = harvest_pairs(rl.result)
    return [pairs[i] for i in rows]


def test_tau_by_position_buckets_each_verify_step_where_it_starts():
    r = RequestOutput(1, 0, 0, [5], tokens=list(range(9)), emitted_per_step=[3, 4, 1])
    table = position_table([r], bucket=4)  # the prefill's token 0, then steps at 1, 4 and 8
    assert table.to_dict("list") == {"position": [0, 4, 8], "verify_steps": [1, 1, 1],
                                     "emitted": [3, 4, 1]}


def test_metrics_and_tau_change_read_the_tables():
    tau = pd.Series([4.0, 4.2] + [4.1] * 16 + [3.0, 3.2])
    change, ci = tau_change(tau)
    assert change == pytest.approx(3.1 - 4.1) and ci == pytest.approx(
        1.96 * (2 * 0.02 / 2) ** 0.5)
    history = pd.DataFrame({"step": range(20), "kl_start": [0.1] * 20, "tau_frozen": tau,
                            "diverged_frozen": [0] * 20})
    probe = pd.DataFrame({"drafter": ["frozen", "adaptive"], "temperature": [1.0, 1.0],
                          "acceptance_length": [4.0, 4.25]})
    m = staleness_metrics(history, pd.DataFrame({"step": [0, 20], "accuracy": [0.4, 0.5]}),
                          probe)
    # first and final: the means of the first and last tenth of the steps (2 of 20)
    assert m["tau_window"] == 2 and m["tau_frozen_first"] == pytest.approx(4.1)
    assert m["tau_frozen_final"] == pytest.approx(3.1)
    assert m["tau_frozen_final"] - m["tau_frozen_first"] == pytest.approx(m["tau_frozen_change"])
    assert m["byproduct_gain"] == 0.25 and m["accuracy_final"] == 0.5 and m["rl_steps"] == 20


def test_the_suffix_drafter_is_reported_against_the_sibling_on_the_same_steps():
    """The table, the metrics and the figure difference the two drafters' tau step by step
    (the same rollouts), with a paired 95% interval and the share of steps suffix leads."""
    import matplotlib
    matplotlib.use("Agg")
    from workbench.rl.staleness.report import paired_difference, tau_per_step
    from workbench.viz import staleness as sviz
    history = pd.DataFrame({"step": [0, 1, 2, 3], "kl_start": [0.0] * 4,
                            "tau_frozen": [3.0, 3.0, 3.0, 3.0],
                            "tau_sibling": [2.0, 2.5, 2.0, 3.0],
                            "tau_suffix": [2.5, 2.5, 3.0, 2.0], "reward": [0.1] * 4})
    taus = tau_per_step(history)
    assert list(taus.columns) == ["step", "tau_frozen", "tau_sibling", "tau_suffix",
                                  "suffix_minus_sibling", "suffix_minus_frozen"]
    assert taus["suffix_minus_sibling"].tolist() == [0.5, 0.0, 1.0, -1.0]
    diff = pd.Series([0.5, 0.0, 1.0, -1.0])
    m = staleness_metrics(history)
    assert m["tau_suffix_minus_sibling"] == pytest.approx(0.125)
    assert m["tau_suffix_minus_sibling_ci95"] == pytest.approx(1.96 * diff.std() / 2)
    assert m["tau_suffix_above_sibling_share"] == 0.5
    assert m["tau_suffix_minus_frozen"] == pytest.approx(-0.5)
    assert "tau_suffix_minus_adaptive" not in m and m["tau_suffix_mean"] == 2.5
    assert paired_difference(pd.Series([3.0]), pd.Series([2.0]))[1] != \
        paired_difference(pd.Series([3.0]), pd.Series([2.0]))[1]  # NaN: one step
    fig = sviz.suffix_against_sibling(taus, label="tiny", k=4)
    top, low = fig.axes
    assert [list(line.get_ydata()) for line in top.lines] == [
        [3.0] * 4, [2.0, 2.5, 2.0, 3.0], [2.5, 2.5, 3.0, 2.0]]
    assert [p.get_height() for p in low.patches] == [0.5, 0.0, 1.0, -1.0]
    with pytest.raises(ValueError, match=r"lacks \['tau_suffix', 'suffix_minus_sibling'\]"):
        sviz.suffix_against_sibling(history[["step", "tau_sibling"]])


def test_bad_arguments_are_refused_before_anything_runs(tokenizer, tmp_path, monkeypatch):
    for kw, match in [({"measure_groups": 3}, r"measure_groups \(at most P = 2\)"),
                      ({"drafters": ["frozen", "stale"]}, "drafters.*'stale'"),
                      ({"drafters": []}, "non-empty"),
                      ({"divergence": "ignore"}, "divergence"),
                      ({"spec_k": 0}, "spec_k"),
                      ({"grpo": staleness_grpo(prompts_per_step=1), "measure_groups": 1},
                       "prompts_per_step must be at least 2")]:
        with pytest.raises(ValueError, match=match):
            staleness_config(**kw)
    with pytest.raises(ValueError, match="holdout_every"):
        CeilingConfig(holdout_every=1)
    model = tiny_model("llama", tokenizer)
    with pytest.raises(ValueError, match="EagleHead"):
        StalenessRun(model, tokenizer, staleness_problems(), object(), staleness_reward, staleness_config())
    with pytest.raises(ValueError, match="eval_every=2 needs held_out"):
        staleness_run(tokenizer, staleness_config(eval_every=2))
    file = tmp_path / "file"
    file.write_text("x")
    import workbench.models as models
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(ValueError, match="existing file"):
        staleness_setup(staleness_config(), checkpoint_dir=file)
    with pytest.raises(ValueError, match="config must be a StalenessConfig"):
        staleness_setup({"spec_k": 4})
    with pytest.raises(ValueError, match="task"):
        staleness_setup(staleness_config(), task="no_such_task")


def test_figures_draw_the_tables():
    import matplotlib
    matplotlib.use("Agg")
    from workbench.viz import staleness as sviz
    history = pd.DataFrame({"step": [0, 1, 2], "kl_start": [0.0, 0.1, 0.2],
                            "tau_frozen": [4.0, 3.9, 3.8], "tau_adaptive": [4.0, 4.0, 4.1]})
    evals = pd.DataFrame({"step": [0, 3], "accuracy": [0.4, 0.5]})
    fig = sviz.tau_over_steps(history, evals, label="tiny", k=4)
    assert len(fig.axes) == 3
    assert [list(line.get_ydata()) for line in fig.axes[0].lines] == [[4.0, 3.9, 3.8],
                                                                     [4.0, 4.0, 4.1]]
    fig = sviz.tau_over_steps(history, smooth=2)  # each drafter's points, then their mean
    drawn = [line.get_ydata() for line in fig.axes[0].lines]
    for line, expected in zip(drawn, [[4.0, 3.9, 3.8], [4.0, 3.95, 3.85], [4.0, 4.0, 4.1],
                                      [4.0, 4.0, 4.05]], strict=True):
        assert list(line) == pytest.approx(expected)
    with pytest.raises(ValueError, match="smooth"):
        sviz.tau_over_steps(history, smooth=0)
    positions = pd.DataFrame({"step": [0, 0, 2, 2], "drafter": ["frozen"] * 4,
                              "position": [0, 16, 0, 16], "verify_steps": [4, 2, 4, 4],
                              "emitted": [16, 6, 12, 8]})
    fig = sviz.tau_by_position(positions)
    assert [list(ax.lines[0].get_ydata()) for ax in fig.axes] == [[4.0, 3.0], [3.0, 2.0]]
    with pytest.raises(ValueError, match="no RL step 5"):
        sviz.tau_by_position(positions, steps=[5])
    probe = pd.DataFrame({"drafter": ["frozen", "adaptive"] * 2, "temperature": [0, 0, 1, 1],
                          "acceptance_length": [4.2, 4.3, 4.0, 4.1]})
    fig = sviz.byproduct_bars(probe)
    assert [p.get_height() for p in fig.axes[0].patches] == [4.2, 4.0, 4.3, 4.1]


def test_held_out_accuracy_and_the_byproduct_end_in_the_metrics(tokenizer):
    from workbench.rl.staleness.report import FinalConfig, byproduct
    run = staleness_run(tokenizer, staleness_config(drafters=["frozen", "adaptive"], eval_every=1),
               held_out=staleness_problems(3))
    history = run.run_to(2, progress=False)
    assert run.evals["step"].tolist() == [0, 1, 2]
    table = byproduct(run, FinalConfig(probe_prompts=2, temperatures=[1.0]))
    assert table["drafter"].tolist() == ["frozen", "adaptive"]
    m = staleness_metrics(history, run.evals, table)
    assert m["byproduct_gain"] == pytest.approx(m["tau_byproduct_adaptive"]
                                                - m["tau_byproduct_frozen"])
    assert m["accuracy_start"] == run.evals["accuracy"].iloc[0] and m["rl_steps"] == 2
    with pytest.raises(ValueError, match="speedup_repeats"):
        FinalConfig(speedup_repeats=2)


def test_the_sibling_speedup_is_measured_like_sd_sweep(tokenizer, straight):
    from workbench.rl.staleness.report import FinalConfig, sibling_speedups
    table = sibling_speedups(straight, FinalConfig(speedup_groups=1,
                                                   speedup_batch_sizes=[1, 2]))
    assert table["batch_size"].tolist() == [1, 2] and table["identical"].all()
    assert (table["speedup_min"] <= table["speedup"]).all()
    assert (table["speedup"] <= table["speedup_max"]).all() and (table["tau"] >= 1).all()
    m = staleness_metrics(straight.history, speedups=table)
    assert m["sibling_speedup_bs1"] == table["speedup"].iloc[0] and "sibling_tau_bs2" in m
    pooled = staleness_metrics(straight.history, speedups=table.assign(disturbed_share=[0.0, 0.5]))
    assert pooled["sibling_speedup_disturbed_share"] == 0.25  # the timed repeats' share
    with pytest.raises(ValueError, match="not the sibling drafter"):
        sibling_speedups(staleness_run(tokenizer, staleness_config(drafters=["frozen"])))
