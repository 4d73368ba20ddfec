"""Seer's question asked of a finished notebook 11 run (workbench.cluster.seer_run) and its
script (benchmarks/check_seer_run.py): on a tiny real ablation (the baseline and both Seer
variants, requests queueing behind a one-row cap), the replay check of each Seer variant
and the simulator's answer from the run's baseline, as metrics, lines and a result file;
nothing read where the baseline or the Seer variants did not run."""
from __future__ import annotations

import itertools
import sys
import threading
import time
from pathlib import Path

import pytest

from workbench.cluster.seer_run import WHATIF_NAMES, seer_run

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ["baseline", "seer_schedule", "seer_divided"]


def _thread_ticks():
    """A clock of ticks per thread: each reading 1/1024 s after the one before on the same
    thread (conftest's ``tick_clock`` per thread: the ablation may step its runs on threads
    side by side, each on its own sim clock), so that the measured makespans, and the
    simulator's error on them, are the same on any machine under any load."""
    counters = threading.local()

    def read():
        if not hasattr(counters, "ticks"):
            counters.ticks = itertools.count()
        return next(counters.ticks) / 1024
    return read


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer):
    """A notebook-11-shaped run folder: its history.csv and its checkpoint (timelines,
    ablation.json), 2 RL steps of 3 prompts x 2 on 2 workers of one row each, measured on
    a tick clock per thread (:func:`_thread_ticks`)."""
    from workbench.rl import GRPOConfig
    from workbench.rl.ablation.runner import run_ablation
    from workbench.tasks import Problem

    from .helpers.models import tiny_model
    folder = tmp_path_factory.mktemp("nb11")
    grpo = GRPOConfig.flat(prompts_per_step=3, samples_per_prompt=2, max_new_tokens=12,
                           lr=5e-2, workers=2, seed=1, temperature=1.0, max_batch_size=1)
    problems = [Problem(prompt=f"q{i}?" + "x" * (i * 7 % 5), answer="a", uid=i) for i in range(4)]
    with pytest.MonkeyPatch.context() as patch:
        ticks = _thread_ticks()
        patch.setattr(time, "perf_counter", ticks)
        patch.setattr(time, "thread_time", ticks)
        ablation = run_ablation(tiny_model("qwen2", tokenizer), tokenizer, problems, grpo, 2,
                                variants=VARIANTS, seeds=[0], progress=False,
                                reward=lambda p, c, a: float(len(c) % 3 == 0),
                                checkpoint_dir=folder / "checkpoint")
    ablation.history.to_csv(folder / "history.csv", index=False)
    return folder


def test_the_run_gives_its_check_and_the_simulators_answer(run_dir):
    run = seer_run(run_dir, VARIANTS, [0], workers=(8,), draws=1)
    assert run.checks["variant"].tolist() == ["seer_schedule", "seer_divided"]
    assert (run.checks["steps"] == 2).all() and (run.checks["error"].abs() < 0.25).all()
    assert run.whatif["workers"].tolist() == [2, 8]  # the run's N, then the asked one
    w = run.whatif.iloc[0]
    assert (w["per_worker"], w["max_batch"], w["samples_per_prompt"]) == (3, 1, 2)
    assert not w["sd_costs"]  # no TLT variant ran: its settings decode plain
    m = run.metrics()
    for v in VARIANTS[1:]:
        assert m[f"seer_sim_error_{v}"] == run.checks.set_index("variant").loc[v, "error"]
        assert m[f"seer_sim_error_{v}_n"] == 1
    for n in (2, 8):
        assert {f"seer_whatif_speedup_{k}_n{n}" for k in WHATIF_NAMES.values()} <= set(m)
        assert m[f"seer_whatif_tlt_beside_seer_n{n}"] == pytest.approx(
            m[f"seer_whatif_speedup_both_n{n}"] / m[f"seer_whatif_speedup_seer_divided_n{n}"])
    assert not any("+" in k for k in m)  # result figure names take no '+'
    lines = run.lines()
    assert lines[0].startswith("The simulator on this run's seer_schedule")
    assert "10% target" in lines[0] and "no speculative step measured" in lines[2]
    assert lines[-2].startswith("  N=2: ") and lines[-1].startswith("  N=8: ")
    # the notebook's call: its checkpoint folder, the history given
    import pandas as pd
    again = seer_run(run_dir / "checkpoint", VARIANTS, [0], workers=(8,), draws=1,
                     history=pd.read_csv(run_dir / "history.csv"))
    pd.testing.assert_frame_equal(again.checks, run.checks)


def test_nothing_is_read_where_the_baseline_or_seers_variants_did_not_run(run_dir, tmp_path):
    alone = seer_run(run_dir, ["baseline"], [0], workers=(8,), draws=1)
    assert alone.checks.empty and alone.whatif is not None
    assert not any(k.startswith("seer_sim_error") for k in alone.metrics())
    none = seer_run(run_dir, ["seer_divided"], [0], workers=(8,), draws=1)
    assert none.metrics() == {} and none.lines() == []
    assert seer_run(tmp_path, VARIANTS, [0]).metrics() == {}  # nothing saved there
    assert seer_run(run_dir, VARIANTS, [5], workers=(8,)).metrics() == {}  # no such seed


def test_the_script_records_the_check_with_its_provenance(run_dir, tmp_path, monkeypatch,
                                                          capsys):
    from workbench.provenance import read_result
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("check_seer_run", None)
    import check_seer_run
    argv = [str(run_dir), "--workers", "8", "--draws", "1", "--result", "seer_tiny",
            "--result-folder", str(tmp_path)]
    assert check_seer_run.main(argv) == 0
    said = capsys.readouterr().out
    assert "The simulator on this run's seer_divided" in said and "N=8: " in said
    result = read_result(tmp_path / "seer_tiny.json")
    f = result["figures"]["seer_sim_error_seer_divided"]
    assert f["n"] == 1 and f["min"] == f["value"] == f["max"]
    assert result["figures"]["seer_whatif_speedup_both_n8"]["unit"] == "x"
    assert result["headline"] == ["seer_sim_error_seer_schedule", "seer_sim_error_seer_divided"]
    assert result["clock"] == "sim-thread-cpu" and "docs/lab-notes/" in result["question"]
    assert result["command"].endswith("--result-folder " + str(tmp_path))
    with pytest.raises(ValueError, match="nothing to check"):
        check_seer_run.check(tmp_path)
