"""The diagnosis from a run's own logs (workbench.diagnose, docs/diagnose.md): each framework's
keys read from fixtures whose headers cite the file the keys come from, missing fields named,
the three fastrl complaints each given their cause, and the command line's report and refusals.

The complaints (fastrl issues): #5, SD sped up the offline benchmark but not end-to-end GRPO on
8 H800s with Qwen2.5-7B (a reply blames changed rollout lengths and a long reward); #6, on 8
H20s with 16k-token responses the reward took about 40% of the step and the rollout about 30%
(the fixture ``tests/fixtures/diagnose/verl_issue6``); #7, on an H20 a batch-1 forward with SD
took 8.45 ms against 3.9 ms without."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.cli import main
from workbench.cluster.simulate import Layout, simulate_rollout
from workbench.cluster.cost import StepCost
from workbench.diagnose import FORMATS, check_inputs, diagnose, read_logs, read_sd_curve

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "diagnose"
ISSUE6 = FIXTURES / "verl_issue6"
CURVE6 = ISSUE6 / "sd_curve.csv"


# ---- importers -------------------------------------------------------------------------------
@pytest.mark.parametrize("path, cites", [
    (ISSUE6 / "metrics.jsonl", "verl/trainer/ppo/metric_utils.py"),
    (ISSUE6 / "rollout_data" / "1.jsonl", "verl/trainer/ppo/ray_trainer.py"),
    (FIXTURES / "verl_flat.csv", "verl/trainer/ppo/metric_utils.py"),
    (FIXTURES / "openrlhf.jsonl", "openrlhf/trainer/ppo_utils/loggers.py"),
    (FIXTURES / "trl_trainer_state.json", "trl/trainer/grpo_trainer.py")])
def test_every_fixture_cites_the_framework_file_its_keys_come_from(path, cites):
    assert cites in path.read_text().splitlines()[0] or cites in json.loads(
        path.read_text()).get("_source", "")


def test_verl_file_logger_lines_give_every_part_lengths_requests_and_gpus():
    log = read_logs(ISSUE6)
    assert log.format == "verl" and log.missing == {}
    s = log.steps
    assert len(s) == 6 and s["step"].tolist() == [1, 2, 3, 4, 5, 6]
    row = json.loads((ISSUE6 / "metrics.jsonl").read_text().splitlines()[1])["data"]
    assert s["rollout_s"][0] == pytest.approx(row["timing_s/gen"])
    assert s["reward_s"][0] == pytest.approx(row["timing_s/reward"])
    assert s["logprob_s"][0] == pytest.approx(row["timing_s/old_log_prob"] + row["timing_s/ref"])
    assert s["update_s"][0] == pytest.approx(row["timing_s/adv"] + row["timing_s/update_actor"])
    assert s["step_s"][0] == pytest.approx(row["timing_s/step"])
    assert s["response_max"][0] == row["response_length/max"]
    assert log.workers == 8  # perf/total_num_tokens / (perf/time_per_step x perf/throughput)
    assert len(log.requests) == 6 * 128 and log.requests["response_tokens"].max() <= 16384


def test_verl_flat_export_without_a_dump_names_the_missing_requests():
    log = read_logs(FIXTURES / "verl_flat.csv")
    assert log.format == "verl" and len(log.steps) == 3
    assert set(log.missing) == {"requests"} and "rollout_data_dir" in log.missing["requests"]
    d = diagnose(log)
    assert any("requests is missing" in u for u in d.undecided)
    assert any("SD's speedup per batch size" in u for u in d.undecided)


def test_verl_logs_without_timings_name_each_missing_key(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "data": {"response_length/mean": 900.0,
                                                    "timing_s/gen": 10.0}}) + "\n")
    log = read_logs(path)
    assert log.missing["reward_s"] == "timing_s/reward"
    assert log.missing["update_s"] == "timing_s/adv + timing_s/update_critic + timing_s/update_actor"
    assert log.missing["response_max"] == "response_length/max"
    assert any("reward_s is missing (timing_s/reward)" in u for u in diagnose(log).undecided)


@pytest.mark.parametrize("name, fmt, key", [("openrlhf.jsonl", "openrlhf", "train/response_length"),
                                            ("trl_trainer_state.json", "trl",
                                             "completions/mean_length")])
def test_openrlhf_and_trl_give_lengths_and_name_every_missing_part(name, fmt, key):
    log = read_logs(FIXTURES / name)
    assert log.format == fmt and len(log.steps) == 3
    rows = (json.loads((FIXTURES / name).read_text())["log_history"] if fmt == "trl" else
            [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()[1:]])
    assert log.steps["response_mean"].tolist() == [r[key] for r in rows]
    for part in ("rollout_s", "reward_s", "logprob_s", "update_s", "requests", "workers"):
        assert part in log.missing, part
    d = diagnose(log)
    assert d.findings == [] and len(d.undecided) >= 5
    assert d.remedies.set_index("remedy")["predicted_e2e_speedup"].isna().all()


def _workbench_run(folder: Path) -> None:
    """A workbench run folder: history.csv of baseline and tlt, the baseline's timelines."""
    rng = np.random.default_rng(0)
    cost = StepCost(pd.DataFrame({"batch_size": [1, 8], "kind": "plain", "seconds": [0.01, 0.012],
                                  "tau": 1.0}))
    rows = []
    for step in range(3):
        lay = Layout(rng.integers(5, 200, (2, 4)), np.zeros((2, 4), np.int64))
        t = simulate_rollout(lay, cost)
        t.save(folder / "timelines" / "baseline-seed0" / f"step{step:02d}")
        for variant, speed in (("baseline", 1.0), ("tlt", 0.8)):
            rows.append({"variant": variant, "seed": 0, "step": step,
                         "rollout_s": t.makespan_s * speed, "update_s": 0.5, "update_sim_s": 0.5,
                         "step_s": t.makespan_s * speed + 0.5, "response_len": 100.0,
                         "response_len_max": 199})
    pd.DataFrame(rows).to_csv(folder / "history.csv", index=False)


def test_workbench_run_folder_gives_measured_tail_and_each_variants_measured_speedup(tmp_path):
    _workbench_run(tmp_path)
    log = read_logs(tmp_path)
    assert log.format == "workbench" and len(log.timelines) == 3
    assert {"reward_s", "logprob_s"} <= set(log.missing)
    d = diagnose(log, sd_curve={1: 2.0, 8: 1.5})
    assert d.tail["measured"].all() and d.tail["workers"].eq(2).all()
    measured = d.measured.set_index("variant")["measured_e2e_speedup"]
    assert measured["baseline"] == 1.0 and measured["tlt"] > 1
    assert d.summary["predicted_tlt_threshold"] > 1


def test_an_ablation_checkpoint_folder_gives_the_rollouts_and_names_the_missing_step_times(
        tmp_path):
    _workbench_run(tmp_path)
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "baseline-seed0").mkdir(parents=True)
    (tmp_path / "timelines" / "baseline-seed0").rename(checkpoint / "baseline-seed0" / "timelines")
    (checkpoint / "ablation.json").write_text("{}")
    log = read_logs(checkpoint)
    assert log.format == "workbench" and len(log.timelines) == 3
    assert {"update_s", "step_s", "reward_s"} <= set(log.missing)
    assert (log.steps["rollout_s"] > 0).all()
    d = diagnose(log, sd_curve={1: 2.0, 8: 1.5})
    assert d.summary["predicted_tlt_threshold"] > 1


def test_what_was_read_is_described_in_lines():
    log = read_logs(FIXTURES / "verl_flat.csv")
    lines = log.describe().splitlines()
    assert lines[0] == f"{log.source}: verl, 3 steps" + (f", {log.workers} workers"
                                                         if log.workers else "")
    assert lines[1:] == ([f"note: {n}" for n in log.notes]
                         + [f"missing requests: {log.missing['requests']}"])
    assert read_logs(ISSUE6).describe().splitlines()[0].endswith(": verl, 6 steps, 8 workers")


@pytest.mark.parametrize("bad, match", [
    ({"log_format": "bogus"}, r"log_format must be .*'verl'.*got 'bogus'"),
    ({"workers": 0}, "workers"), ({"workers": 2.0}, "workers"),
    ({"drafter_step_s": 0}, "drafter_step_s"),
    ({"logs": "no/such/logs"}, r"logs 'no/such/logs' do not exist; accepted: .*'trl'")])
def test_notebook_12s_inputs_are_checked_before_anything_is_read(bad, match):
    inputs = {"logs": ISSUE6, "log_format": None, "workers": None, "drafter_step_s": None}
    check_inputs(**inputs)  # None: guessed, from the logs, not counted
    check_inputs(ISSUE6, "verl", 8, 2.0)
    with pytest.raises(ValueError, match=match):
        check_inputs(**{**inputs, **bad})


def test_unknown_format_is_refused_naming_it_and_the_accepted_ones():
    with pytest.raises(ValueError, match="'bogus'") as err:
        read_logs(ISSUE6, "bogus")
    assert all(f in str(err.value) for f in FORMATS)


def test_sd_curve_takes_a_table_of_forward_times():
    curve = read_sd_curve(pd.DataFrame({"batch_size": [1], "plain_ms": [3.9], "sd_ms": [8.45],
                                        "tau": [1.6]}))
    assert curve["speedup"][0] == pytest.approx(3.9 / 8.45 * 1.6)
    with pytest.raises(ValueError, match="batch_size"):
        read_sd_curve(pd.DataFrame({"speedup": [1.2]}))


# ---- the three complaints --------------------------------------------------------------------
def _verl_log(tmp_path: Path, name: str, steps: list[dict], lengths: list[np.ndarray] | None):
    """A veRL file-logger log (and a rollout dump with ``lengths`` per step) under tmp_path."""
    folder = tmp_path / name
    (folder / "rollout_data").mkdir(parents=True)
    lines = []
    for i, timing in enumerate(steps, start=1):
        data = {f"timing_s/{k}": v for k, v in timing.items()}
        if lengths is not None:
            data.update({"response_length/mean": float(lengths[i - 1].mean()),
                         "response_length/max": float(lengths[i - 1].max()),
                         "response_length/min": float(lengths[i - 1].min())})
            (folder / "rollout_data" / f"{i}.jsonl").write_text("".join(
                json.dumps({"input": "q", "output": "a", "score": 0.0, "step": i,
                            "response_length": int(n)}) + "\n" for n in lengths[i - 1]))
        lines.append(json.dumps({"step": i, "data": data}))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_issue6_reward_bound_is_named_first_with_its_amdahl_bound():
    d = diagnose(read_logs(ISSUE6), sd_curve=CURVE6)
    assert d.bottleneck == "reward_bound"
    first = d.findings[0]["sentence"]
    assert "reward is 40% of the step" in first and "rollout 30%" in first
    bound = d.remedies.set_index("remedy")["predicted_e2e_speedup"]
    assert "no rollout remedy can buy more than 1.43x" in first
    assert bound["tlt_threshold"] < bound["any_rollout_remedy_bound"] == pytest.approx(1.43, abs=0.01)
    assert d.tail is not None and d.summary["p99_over_p50"] > 2


def test_issue5_lengths_changed_with_sd_and_a_long_reward(tmp_path):
    """8 H800s, Qwen2.5-7B: with SD each token came faster, yet the responses grew longer, so
    the rollout took as long; the reward is over a third of the step."""
    rng = np.random.default_rng(5)
    timing = {"gen": 200.0, "reward": 180.0, "old_log_prob": 40.0, "ref": 30.0,
              "update_actor": 60.0, "step": 515.0}
    base = [rng.lognormal(np.log(900), 0.6, 64).round() for _ in range(3)]
    sd = [rng.lognormal(np.log(1300), 0.6, 64).round() for _ in range(3)]
    baseline = read_logs(_verl_log(tmp_path, "plain", [timing] * 3, base))
    with_sd = read_logs(_verl_log(tmp_path, "sd", [timing] * 3, sd))
    d = diagnose(with_sd, sd_curve={1: 2.0, 16: 1.6, 64: 1.1}, workers=8, baseline=baseline)
    assert d.bottleneck == "lengths_changed_with_sd"
    assert "reward_bound" in d.causes
    assert "with SD the mean response is" in d.findings[0]["sentence"]


def test_issue7_sd_slower_at_batch1_on_the_h20(tmp_path):
    timing = {"gen": 300.0, "reward": 20.0, "old_log_prob": 30.0, "update_actor": 50.0,
              "step": 400.0}
    rng = np.random.default_rng(7)
    lengths = [rng.lognormal(np.log(800), 0.7, 64).round() for _ in range(2)]
    log = read_logs(_verl_log(tmp_path, "h20", [timing] * 2, lengths))
    curve = pd.DataFrame({"batch_size": [1, 8], "plain_ms": [3.9, 4.4], "sd_ms": [8.45, 12.0]})
    d = diagnose(log, sd_curve=curve, workers=8)
    assert d.bottleneck == "sd_slower_at_batch1"
    assert "0.46x" in d.findings[0]["sentence"]
    assert d.summary["sd_threshold"] == 0  # SD never runs under the threshold rule
    assert d.remedies.set_index("remedy").loc["tlt_threshold", "predicted_e2e_speedup"] == 1.0


def test_sd_losing_at_the_live_batch_is_named(tmp_path):
    timing = {"gen": 300.0, "reward": 20.0, "old_log_prob": 30.0, "update_actor": 50.0,
              "step": 400.0}
    lengths = [np.full(512, 500.0)]
    log = read_logs(_verl_log(tmp_path, "wide", [timing], lengths))
    d = diagnose(log, sd_curve={1: 2.0, 16: 1.3, 64: 0.9, 256: 0.6}, workers=2)
    assert "sd_loses_at_live_batch" in d.causes
    sentence = next(f["sentence"] for f in d.findings if f["cause"] == "sd_loses_at_live_batch")
    assert "stays at or above 64" in sentence


# ---- the command line ------------------------------------------------------------------------
def test_cli_writes_the_report(tmp_path, capsys):
    out = tmp_path / "report"
    rc = main(["diagnose", str(ISSUE6), "--sd-curve", str(CURVE6), "--out", str(out),
               "--drafter-step-s", "2"])
    assert rc == 0
    assert {"diagnosis.html", "diagnosis.json", "steps.csv", "tail.csv", "remedies.csv",
            "step_split.png", "live_batch.png", "remedies.png"} <= {p.name for p in out.iterdir()}
    summary = json.loads((out / "diagnosis.json").read_text())
    assert summary["bottleneck"] == "reward_bound" and summary["drafter_steps_per_step"] > 0
    assert summary["simulator_error"]["figure"] == "sim_error_small_n"
    assert "reward is 40% of the step" in capsys.readouterr().out
    # a second run replaces the earlier diagnosis
    assert main(["diagnose", str(ISSUE6), "--out", str(out)]) == 0


@pytest.mark.parametrize("argv, names", [
    (["--format", "bogus"], ["'bogus'", *FORMATS]),
    (["--workers", "0"], ["workers", "0"]),
    (["--sd-curve", "no_such.csv"], ["no_such.csv", "batch_size"])])
def test_cli_refuses_bad_input_with_one_message_and_writes_nothing(tmp_path, capsys, argv, names):
    out = tmp_path / "report"
    rc = main(["diagnose", str(ISSUE6), "--out", str(out), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert all(n in err for n in names), err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_reads_a_rollout_dump_given_apart(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["diagnose", str(FIXTURES / "verl_flat.csv"), "--rollout-dump",
                 str(ISSUE6 / "rollout_data"), "--out", str(out)]) == 0
    summary = json.loads((out / "diagnosis.json").read_text())
    assert "requests" not in summary["missing"] and summary["tail_share"] > 0
    with pytest.raises(ValueError, match=r"\['rollout_dump'\] is no option of the trl format"):
        read_logs(FIXTURES / "trl_trainer_state.json", rollout_dump=ISSUE6 / "rollout_data")


def test_cli_refuses_an_out_folder_of_other_files(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["diagnose", str(ISSUE6), "--out", str(tmp_path)]) == 2
    assert "a folder of other files" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_validated_errors_read_the_result_files_and_none_elsewhere(tmp_path):
    from workbench.diagnose import validated_errors
    from workbench.diagnose.validated import headline_error
    assert validated_errors(tmp_path).empty and headline_error(tmp_path) is None
    (tmp_path / "nb10.json").write_text(json.dumps(
        {"question": "q", "clock": "sim", "figures": {"sim_error_small_n": {"value": 0.05},
                                                      "predicted_speedup_64": {"value": 1.2}}}))
    assert validated_errors(tmp_path)["figure"].tolist() == ["sim_error_small_n"]
    assert headline_error(tmp_path) == {"error": 0.05, "figure": "sim_error_small_n",
                                        "result": "nb10"}


# ---- the long-tail remedies replayed (cluster.remedies) ---------------------------------------
REPLAYED = ["over_provisioning", "april", "partial_rollouts", "tail_batching"]


def test_a_workbench_runs_diagnosis_carries_each_replayed_remedys_number(tmp_path):
    """Over-provisioning, APRIL, partial rollouts and tail batching each get a predicted
    end-to-end speedup from the run's own lengths; with no recorded check of the remedy model
    the error says so and names the check; a remedy variant of the run is set beside its own
    row, not TLT's."""
    _workbench_run(tmp_path)
    h = pd.read_csv(tmp_path / "history.csv")
    over = h[h["variant"] == "baseline"].assign(variant="overprovision")
    over["step_s"] = over["step_s"] * 0.9
    pd.concat([h, over]).to_csv(tmp_path / "history.csv", index=False)
    results = tmp_path / "results"
    results.mkdir()
    d = diagnose(read_logs(tmp_path), sd_curve={1: 2.0, 8: 1.5}, results=results)
    r = d.remedies.set_index("remedy")
    assert np.isfinite(r.loc[REPLAYED, "predicted_e2e_speedup"]).all()
    assert r.loc[REPLAYED, "error"].isna().all()
    assert r.loc["april", "error_source"].startswith("not validated yet: cluster.remedy_check")
    assert "off-policy" in r.loc["april", "method"] and "off-policy" in r.loc["partial_rollouts", "method"]
    assert "off-policy" in r.loc["async_one_step", "method"]
    for name in REPLAYED:
        assert d.summary[f"predicted_{name}"] == r.loc[name, "predicted_e2e_speedup"]
    m = d.measured.set_index("variant")
    assert m.loc["overprovision", "predicted_e2e_speedup"] == d.summary["predicted_over_provisioning"]
    assert m.loc["tlt", "predicted_e2e_speedup"] == d.summary["predicted_tlt_bandit"]
    assert "padded batch" in r.loc["april", "method"]  # a workbench run's update pads
    (results / "nb11.json").write_text(json.dumps({"figures": {
        "remedy_sim_error_april": {"value": 0.2},
        "remedy_sim_error_april_padded_update": {"value": -0.07}}}))
    d = diagnose(read_logs(tmp_path), results=results)
    from workbench.diagnose import remedies_figure
    remedies_figure(d)  # a negative error's bar is its size
    r = d.remedies.set_index("remedy")
    assert r.loc["april", "error"] == -0.07 and r.loc["april", "error_source"] == \
        "remedy_sim_error_april_padded_update of nb11"  # the check that charged updates so
    assert np.isnan(r.loc["tail_batching", "error"])  # never another remedy's error
    r = diagnose(read_logs(ISSUE6), results=results).remedies.set_index("remedy")
    assert r.loc["april", "error"] == 0.2 and "as logged" in r.loc["april", "method"]


def test_a_rollout_dump_gets_the_replayed_remedies_without_an_sd_curve():
    d = diagnose(read_logs(ISSUE6))
    r = d.remedies.set_index("remedy")["predicted_e2e_speedup"]
    assert (r[REPLAYED] > 1).all() and (r[REPLAYED] <= r["any_rollout_remedy_bound"]).all()
    assert np.isnan(r["tlt_threshold"])  # SD's curve is what TLT's number lacks
    best = r[REPLAYED].idxmax()
    from workbench.diagnose.findings import PADDED_UPDATE  # veRL's rest stays as logged
    assert not any(PADDED_UPDATE in f["sentence"] for f in d.findings)
    tail = next(f["sentence"] for f in d.findings if f["cause"] == "tail_bound")
    assert best == "partial_rollouts" and tail.endswith(
        f"of the remedies that cut the tail, partial rollouts would buy about {r[best]:.2f}x "
        "(training on tokens an older policy sampled)")


# ---- TLT beside each remedy, Seer's variants and one-step async (diagnose.variants) ----------
COMPOSED = ["async_one_step", "tlt+async_one_step", "seer_schedule", "seer_divided",
            "tlt+seer_divided", *[f"tlt+{name}" for name in REPLAYED]]


def test_a_workbench_run_gets_tlt_beside_each_remedy_seer_and_async_each_by_its_check(tmp_path):
    """Every composed and scheduled variant gets a number; TLT (an SD curve above 1 at every
    batch) makes each replayed remedy faster; async is each step the longer of the next
    rollout and its update (x 5/4 once its tokens are stale), computed here from the logged
    times; each measured variant is set beside its own row; the errors are each variant's own
    check, or "not validated yet" naming it."""
    _workbench_run(tmp_path)
    h = pd.read_csv(tmp_path / "history.csv")
    base = h[h["variant"] == "baseline"]
    extra = [base.assign(variant=v, step_s=base["step_s"] * f)
             for v, f in (("async", 0.8), ("tlt+partial", 0.7), ("seer_divided", 0.9))]
    pd.concat([h, *extra]).to_csv(tmp_path / "history.csv", index=False)
    results = tmp_path / "results"
    results.mkdir()
    d = diagnose(read_logs(tmp_path), sd_curve={1: 2.0, 8: 1.5}, results=results)
    r = d.remedies.set_index("remedy")
    speed = r["predicted_e2e_speedup"]
    assert np.isfinite(speed[COMPOSED]).all() and (speed[COMPOSED] > 0).all()
    for name in REPLAYED:
        assert speed[f"tlt+{name}"] > speed[name], name
    s = d.steps
    rollout, update = s["rollout_s"].to_numpy(), (s["step_s"] - s["rollout_s"]).to_numpy()
    times = np.maximum(np.append(rollout[1:], rollout.mean()), update * [1, 1.25, 1.25])
    times[0] += rollout[0]
    assert speed["async_one_step"] == pytest.approx(s["step_s"].sum() / times.sum(), rel=1e-12)
    assert speed["tlt+async_one_step"] > speed["async_one_step"]
    from workbench.diagnose.findings import PADDED_UPDATE  # a padded update moves: no bound
    bounds = [f["sentence"] for f in d.findings if f["cause"] in ("rollout_bound", "update_bound")]
    assert bounds and all(b.endswith(PADDED_UPDATE) for b in bounds)
    assert "off-policy" in r.loc["async_one_step", "method"]
    m = d.measured.set_index("variant")["predicted_e2e_speedup"]
    for variant, row in (("async", "async_one_step"), ("tlt+partial", "tlt+partial_rollouts"),
                         ("seer_divided", "seer_divided")):
        assert m[variant] == d.summary[f"predicted_{row}"] == speed[row]
    assert r.loc["tlt+partial_rollouts", "error_source"] == (
        "not validated yet: benchmarks/check_remedy_model.py on a notebook 11 run folder "
        "holding 'tlt+partial' would give diagnose_error_tlt_partial")
    assert "cluster.seer_check.check_seer" in r.loc["seer_divided", "error_source"]
    (results / "nb11.json").write_text(json.dumps({"figures": {
        "diagnose_error_tlt_partial": {"value": 0.04}, "seer_sim_error_seer_divided": {"value": -0.03},
        "diagnose_error_async": {"value": 0.02}}}))
    r = diagnose(read_logs(tmp_path), results=results).remedies.set_index("remedy")
    assert r.loc["tlt+partial_rollouts", "error"] == 0.04
    assert r.loc["seer_divided", "error_source"] == "seer_sim_error_seer_divided of nb11"
    assert r.loc["async_one_step", "error"] == 0.02
    assert np.isnan(r.loc["tlt+seer_divided", "error"])  # never Seer's or TLT's error


def test_seer_places_equal_lengths_as_the_static_layout_and_needs_no_prefill_cost():
    """A dump's steps of equal lengths: longest first and the divided rollout have nothing to
    reorder or move, so each Seer row predicts the step as logged (1x); the synthetic costs
    have no prefill, so a re-prefill is charged nothing rather than refused."""
    from workbench.diagnose.logs import StepLog
    from workbench.diagnose.steplog import finish_steps
    steps = pd.DataFrame({"step": [0, 1], "rollout_s": [2.0, 2.0], "reward_s": 1.0,
                          "logprob_s": np.nan, "update_s": 1.0, "step_s": 4.0,
                          "response_mean": 50.0, "response_max": 50.0, "response_min": 50.0})
    requests = pd.DataFrame({"step": np.repeat([0, 1], 8), "response_tokens": 50,
                             "group": np.repeat(np.arange(4), 4)})
    log = StepLog(finish_steps(steps), "verl", "equal lengths", requests=requests, workers=2)
    r = diagnose(log, sd_curve={1: 2.0, 8: 1.5}).remedies.set_index("remedy")["predicted_e2e_speedup"]
    assert r["seer_schedule"] == r["seer_divided"] == 1.0
    assert r["tlt+seer_divided"] > 1  # TLT still pays on the same placement


def test_a_run_folder_whose_timelines_are_in_its_checkpoint_alone_is_read_from_there(tmp_path):
    _workbench_run(tmp_path)
    held = tmp_path / "checkpoint" / "baseline-seed0"
    held.mkdir(parents=True)
    (tmp_path / "timelines" / "baseline-seed0").rename(held / "timelines")
    log = read_logs(tmp_path)
    assert len(log.timelines) == 3 and log.timelines[0].parent == held / "timelines"
    assert "requests" not in log.missing
    assert diagnose(log, sd_curve={1: 2.0, 8: 1.5}).tail["measured"].all()


def test_where_the_run_capped_its_rows_tlts_ratio_is_the_capped_replays():
    from workbench.diagnose.variants import capped_bandit
    tail = pd.DataFrame({"step": [3, 5], "bandit_ratio": [0.5, 0.6]})
    replayed = pd.DataFrame({"step": [3, 5, 3, 5], "remedy": ["plain", "plain", "tlt", "tlt"],
                             "ratio": [1.0, 1.0, 0.7, 0.8]})
    replayed.attrs["max_batch"] = 2
    out = capped_bandit(tail, replayed)
    assert out["bandit_ratio"].tolist() == [0.7, 0.8] and out.attrs["bandit_cap"] == 2
    replayed.attrs["max_batch"] = None  # each worker's requests at once: the layout's ratio
    assert capped_bandit(tail, replayed) is tail
