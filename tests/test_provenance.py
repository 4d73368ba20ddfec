"""Results with their provenance (workbench/provenance.py): the schema and its refusals, the
atomic write, the table RESULTS.md generated from the files (workbench/provenance_table.py),
the CLI that writes and checks it, the notebook-run recorder, the benchmarks' helper, and that
the committed RESULTS.md is what benchmarks/results/ gives."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from workbench import atomic, machine, provenance
from workbench.cli import main as cli
from workbench.provenance import (CLOCKS, RESULT_COLUMNS, disturbed, figure_from_stats,
                                  figures_from_metrics, read_result, read_results,
                                  validate_result, write_result)
from workbench.provenance_table import figure_cell, results_table

ROOT = Path(__file__).resolve().parent.parent
MACHINE = {"cpu": "Test CPU", "flags": ["avx2", "avx512f", "amx_tile"], "cores": 2,
           "usable_cores": 2, "accelerator": None, "torch": "2.13.0", "transformers": "5.0",
           "python": "3.11.0", "platform": "Linux"}
GIT = {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False}
DATE = "2025-06-01T12:00:00+00:00"


def write(folder, name="r1", figures=None, question="Engine vs HF?", **kw):
    """A result with fixed machine, commit and date (so tables are comparable)."""
    args = dict(clock="wall", disturbed_share=0.1, command="python bench.py --repeats 5",
                folder=folder, machine_info=MACHINE, git=GIT, date=DATE)
    if figures is None:
        figures = {"ratio": {"value": 1.54, "min": 1.5, "max": 1.7, "n": 5, "unit": "x"}}
    return write_result(name, question, figures, **{**args, **kw})


# ---- the schema ------------------------------------------------------------------------

def test_a_result_round_trips_through_its_file(tmp_path):
    figures = {"speedup": {"value": 1.08, "q25": 1.02, "q75": 1.12, "min": 0.9, "max": 1.3,
                           "n": 30}, "tok_s": {"value": 376.1, "unit": "tok/s"}}
    path = write(tmp_path, "bench_engine", figures, headline=["speedup"])
    assert path == tmp_path / "bench_engine.json"
    saved = json.loads(path.read_text())
    assert list(saved) == [k for k in provenance.KEYS if k != "parameters"]  # none given
    assert saved["figures"] == figures and saved["headline"] == ["speedup"]
    assert saved["machine"] == MACHINE and saved["git"] == GIT and saved["date"] == DATE
    assert read_result(path) == saved


def test_defaults_read_this_machine_this_checkout_and_now(tmp_path):
    path = write_result("r", "q?", {"x": {"value": 1}}, clock="none", disturbed_share=None,
                        command="c", folder=tmp_path)
    saved = read_result(path)
    assert saved["machine"]["cpu"] and saved["machine"]["cores"] >= 1
    assert saved["machine"]["python"].count(".") == 2
    assert set(saved["git"]) == {"commit", "dirty"}
    assert saved["date"].endswith("+00:00") and saved["headline"] == ["x"]
    assert saved["disturbed_share"] is None and saved["disturbed_bound"] == 0.8


@pytest.mark.parametrize("change, words", [
    ({"name": "../escape"}, ["name", "'../escape'", "letters, digits"]),
    ({"name": "two words"}, ["name", "'two words'", "letters, digits"]),
    ({"name": ""}, ["name", "''"]),
    ({"clock": "sim"}, ["clock", "'sim'", "'wall'", "'sim-thread-cpu'", "'none'"]),
    ({"figures": {"x": {"q25": 1.0}}}, ["figure 'x' has no value", "None"]),
    ({"figures": {"x": {"value": None}}}, ["figure 'x' has no value"]),
    ({"figures": {"x": {"value": float("nan")}}}, ["'value'", "finite number", "nan"]),
    ({"figures": {"x": {"value": True}}}, ["'value'", "finite number", "True"]),
    ({"figures": {"x": {"value": 1, "median": 1}}}, ["unknown fields ['median']", "'q25'"]),
    ({"figures": {"x": {"value": 2, "min": 0, "max": 1}}}, ["'value' (2)", "'max' (1)"]),
    ({"figures": {"x": {"value": 1, "q25": 1.2, "q75": 1.1}}}, ["'q25' (1.2)", "'q75'"]),
    ({"figures": {"x": {"value": 1, "n": 0}}}, ["'n'", "integer >= 1", "0"]),
    ({"figures": {"x y": {"value": 1}}}, ["a figure name", "'x y'"]),
    ({"figures": {}}, ["figures must be a non-empty dict"]),
    ({"headline": ["nope"]}, ["headline", "'nope'", "['ratio']"]),
    ({"disturbed_share": 1.5}, ["disturbed_share", "1.5", "[0, 1]", "not measured"]),
    ({"command": " "}, ["command", "non-empty"]),
    ({"date": "2025-06-01 12:00"}, ["date", "UTC ISO 8601", "'2025-06-01 12:00'"]),
    ({"date": "2025-06-01T12:00:00+02:00"}, ["date", "UTC"]),
])
def test_bad_input_is_refused_by_name_and_nothing_is_written(tmp_path, change, words):
    kw = {"name": "r1", "figures": None, **change}
    name, figures = kw.pop("name"), kw.pop("figures")
    with pytest.raises(ValueError) as info:
        write(tmp_path, name, figures if figures is not None else
              {"ratio": {"value": 1.54, "min": 1.5, "max": 1.7, "n": 5}}, **kw)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert list(tmp_path.iterdir()) == []


def test_a_file_of_another_schema_or_with_unknown_keys_is_refused():
    good = {"schema": 1, "name": "a", "question": "q", "figures": {"x": {"value": 1}},
                        "clock": "wall", "disturbed_share": None, "disturbed_bound": 0.8,
                        "machine": MACHINE, "command": "c", "git": GIT, "date": DATE}
    assert validate_result(good)["headline"] == ["x"]
    with pytest.raises(ValueError, match="schema must be 1, got 2"):
        validate_result({**good, "schema": 2})
    with pytest.raises(ValueError, match=r"unknown \['extra'\]"):
        validate_result({**good, "extra": 1})
    with pytest.raises(ValueError, match=r"missing \['clock'\]"):
        validate_result({k: v for k, v in good.items() if k != "clock"})
    with pytest.raises(ValueError, match="machine must be a dict"):
        validate_result({**good, "machine": {"flags": []}})


def test_reading_names_the_file_it_refuses(tmp_path):
    path = write(tmp_path, "r1")
    path.rename(tmp_path / "other.json")
    with pytest.raises(ValueError, match=r"other\.json.*name 'r1' is not the file's stem"):
        read_results(tmp_path)
    (tmp_path / "other.json").write_text('{"schema": 1, "na')
    with pytest.raises(ValueError, match=r"result file '.*other\.json'"):
        read_results(tmp_path)
    with pytest.raises(FileNotFoundError, match="no results folder"):
        read_results(tmp_path / "missing")


def test_the_write_is_atomic(tmp_path, monkeypatch):
    path = write(tmp_path, "r1")
    before = path.read_text()

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write(tmp_path, "r1", {"ratio": {"value": 2.0}})
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r1.json"]  # no temporary left


# ---- pieces ------------------------------------------------------------------------------

def test_cpu_model_and_flags_from_cpuinfo(monkeypatch, tmp_path):
    x86 = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
           "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n")
    assert machine.cpu_from_cpuinfo(x86) == (
        "Intel(R) Xeon(R) Platinum 8480+",
        ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"])
    arm = "processor\t: 0\nFeatures\t: fp asimd sve\nModel\t: Raspberry Pi 5\n"
    assert machine.cpu_from_cpuinfo(arm) == ("Raspberry Pi 5", ["asimd", "sve"])
    monkeypatch.setattr(machine, "CPUINFO", tmp_path / "absent")
    box = machine.machine()  # no /proc/cpuinfo: the platform's name, no flags
    assert box["cpu"] and box["flags"] == []


def test_commit_and_dirty_flag_of_a_checkout(tmp_path):
    assert machine.commit(tmp_path) == {"commit": None, "dirty": None}
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "a.txt").write_text("a")
    subprocess.run(git + ["add", "a.txt"], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "a"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert machine.commit(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.txt").write_text("b")
    assert machine.commit(tmp_path) == {"commit": head, "dirty": True}


def test_figures_from_spread_stats_and_metrics():
    stats = {"ratio": 1.5, "ratio_min": 1.4, "ratio_max": 1.7, "spread": 0.2,
             "spread_wide": False, "repeats": 5}
    assert figure_from_stats(stats, "x") == {"value": 1.5, "min": 1.4, "max": 1.7, "n": 5,
                                             "unit": "x"}
    metrics = {"acc": 0.5, "acc_q25": 0.4, "acc_q75": 0.6, "acc_n": 3, "tau": 2.1,
               "e2e_speedup_median_tlt": 1.1, "e2e_speedup_q25_tlt": 1.0,
               "e2e_speedup_q75_tlt": 1.2, "speedup_bs1": 1.3, "speedup_bs1_min": 1.2,
               "speedup_bs1_max": None}
    assert figures_from_metrics(metrics, ["acc", "tau", "e2e_speedup_median_tlt",
                                          "speedup_bs1"]) == {
        "acc": {"value": 0.5, "q25": 0.4, "q75": 0.6, "n": 3}, "tau": {"value": 2.1},
        "e2e_speedup_median_tlt": {"value": 1.1, "q25": 1.0, "q75": 1.2},
        "speedup_bs1": {"value": 1.3, "min": 1.2}}
    with pytest.raises(ValueError, match=r"metric 'accuracy' is not in the metrics.*'acc'"):
        figures_from_metrics(metrics, ["accuracy"])


def test_the_disturbed_share():
    assert disturbed([1.0, 0.95, 0.5, 0.79]) == 0.5
    assert disturbed([0.7], bound=0.6) == 0.0
    assert disturbed([]) is None
    with pytest.raises(ValueError, match="bound"):
        disturbed([1.0], bound=0)


# ---- the table ---------------------------------------------------------------------------

def test_read_results_gives_one_row_per_figure(tmp_path):
    write(tmp_path, "b", {"x": {"value": 1.0, "q25": 0.9, "q75": 1.1, "n": 3},
                          "y": {"value": 2.0}}, headline=["x"])
    write(tmp_path, "a", disturbed_share=None, clock="sim-thread-cpu")
    table = read_results(tmp_path)
    assert list(table.columns) == RESULT_COLUMNS
    assert list(zip(table["name"], table["figure"], table["headline"])) == [
        ("a", "ratio", True), ("b", "x", True), ("b", "y", False)]
    assert table["n"].tolist()[:2] == [5, 3] and pd.isna(table["n"].iloc[2])
    assert pd.isna(table.loc[0, "q25"]) and table.loc[1, "q25"] == 0.9
    assert table.loc[0, "clock"] == "sim-thread-cpu" and pd.isna(table.loc[0, "disturbed_share"])
    assert table.loc[0, "flags"] == "avx2,avx512f,amx_tile"
    assert table.loc[0, "commit"] == GIT["commit"]
    empty = read_results(_empty(tmp_path))  # a README beside no result
    assert empty.empty and list(empty.columns) == RESULT_COLUMNS


def _empty(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "README.md").write_text("the files")
    return folder


def test_results_table_round_trip(tmp_path):
    write(tmp_path, "zeta", {"speedup": {"value": 1.08, "q25": 1.02, "q75": 1.12, "min": 0.7,
                                         "max": 1.3, "n": 30}},
          question="TLT | end to end?", command="papermill a.ipynb b.ipynb -p `x` 1",
          clock="sim-thread-cpu", disturbed_share=None, git={**GIT, "dirty": True})
    write(tmp_path, "alpha", {"ratio": {"value": 1.54, "min": 1.5, "max": 1.7, "n": 5,
                                        "unit": "x"},
                              "tok_s": {"value": 1568.5, "unit": "tok/s"}})
    text = results_table(tmp_path)
    assert text == results_table(tmp_path)  # the same files give the same text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| name | question | figures | clock | disturbed | machine")
    alpha, zeta = rows[1], rows[2]  # ordered by name
    assert alpha.startswith("| alpha | Engine vs HF? | ratio 1.54x (range 1.5-1.7, n=5)<br>"
                            "tok_s 1,568 tok/s | wall | 10% (< 0.8) | Test CPU; AVX2, AVX-512, "
                            "AMX; 2 cores | 0123456789 | 2025-06-01T12:00:00+00:00 | "
                            "`python bench.py --repeats 5` |")
    assert ("| zeta | TLT \\| end to end? | speedup 1.08 (IQR 1.02-1.12, range 0.7-1.3, n=30) "
            "WIDE | sim-thread-cpu | not measured |") in zeta
    assert "0123456789 (dirty)" in zeta and "`papermill a.ipynb b.ipynb -p 'x' 1`" in zeta
    assert all(row.count(" | ") == 8 for row in rows)  # nine cells: no pipe broke a row
    # what the table says is what read_results reads
    frame = read_results(tmp_path)
    for name, figure, value in zip(frame["name"], frame["figure"], frame["value"]):
        row = alpha if name == "alpha" else zeta
        assert figure_cell(figure, {"value": value}) in row


def test_an_empty_folder_gives_a_table_that_says_so(tmp_path):
    text = results_table(_empty(tmp_path))
    assert "No results recorded yet" in text and "| name |" not in text


# ---- the command line --------------------------------------------------------------------

def test_cli_table_writes_and_check_fails_on_a_stale_table(tmp_path, capsys):
    folder, out = tmp_path / "results", tmp_path / "RESULTS.md"
    write(folder, "a")
    args = ["results", "table", "--folder", str(folder), "--out", str(out)]
    assert cli(args + ["--check"]) == 1  # no table yet
    assert "does not exist" in capsys.readouterr().err
    assert cli(args) == 0 and out.read_text() == results_table(folder)
    assert cli(args + ["--check"]) == 0
    write(folder, "b")  # a new result: the table is stale
    assert cli(args + ["--check"]) == 1
    err = capsys.readouterr().err
    assert "differs from" in err and "workbench results table" in err
    assert out.read_text() != results_table(folder)  # --check writes nothing
    (folder / "bad.json").write_text("{}")
    assert cli(args) == 2
    assert "bad.json" in capsys.readouterr().err


def test_cli_record_turns_a_notebook_run_into_a_result(tmp_path, capsys):
    run = tmp_path / "runs" / "tlt" / "04"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({
        "e2e_speedup_median_tlt": 1.08, "e2e_speedup_q25_tlt": 1.02,
        "e2e_speedup_q75_tlt": 1.12, "accuracy_final_baseline": 0.4, "clock": "sim-thread-cpu",
        "disturbed_share": 0.05, "nan_metric": None}))
    (run / "run.json").write_text(json.dumps({
        "git": GIT, "versions": {"python": "3.11.9", "torch": "2.13.0", "transformers": "5.1"},
        "ended_at": DATE, "parameters": {"seeds": [0, 1], "steps": 6}}))
    folder = tmp_path / "results"
    base = ["results", "record", "nb04_tlt", "--question", "What does TLT buy end to end?",
            "--from", str(run / "metrics.json"), "--command",
            "workbench pipeline run pipelines/tlt.yaml --only tlt", "--folder", str(folder)]
    assert cli(base + ["--keys", "e2e_speedup_median_tlt, accuracy_final_baseline"]) == 0
    saved = read_result(folder / "nb04_tlt.json")
    assert saved["figures"] == {"e2e_speedup_median_tlt": {"value": 1.08, "q25": 1.02,
                                                           "q75": 1.12},
                                "accuracy_final_baseline": {"value": 0.4}}
    assert saved["clock"] == "sim-thread-cpu" and saved["disturbed_share"] == 0.05
    assert saved["git"] == GIT and saved["date"] == DATE
    assert saved["machine"]["transformers"] == "5.1" and saved["machine"]["python"] == "3.11.9"
    assert saved["command"] == "workbench pipeline run pipelines/tlt.yaml --only tlt"
    assert saved["parameters"] == {"seeds": [0, 1], "steps": 6}  # the run's, beside its metrics
    # refusals: one message, exit 2, nothing written
    for extra, words in ((["--keys", "nan_metric"], "figure 'nan_metric' has no value"),
                         (["--keys", "missing"], "metric 'missing' is not in the metrics"),
                         (["--keys", "accuracy_final_baseline", "--clock", "cpu"],
                          "clock must be one of 'wall'")):
        capsys.readouterr()
        assert cli([*base[:2], "nb_other", *base[3:], *extra]) == 2
        assert words in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["nb04_tlt.json"]


def test_cli_record_needs_a_clock(tmp_path, capsys):
    (tmp_path / "metrics.json").write_text(json.dumps({"tau": 2.0}))
    args = ["results", "record", "n", "--question", "q", "--from",
            str(tmp_path / "metrics.json"), "--keys", "tau", "--command", "c", "--folder",
            str(tmp_path / "out")]
    assert cli(args) == 2 and "pass --clock" in capsys.readouterr().err
    assert cli(args + ["--clock", "none"]) == 0
    saved = read_result(tmp_path / "out" / "n.json")
    assert saved["clock"] == "none" and saved["disturbed_share"] is None
    assert saved["git"] == machine.commit()  # no run.json: this checkout


def test_a_run_outside_a_pipeline_records_the_commit_it_set_up_at(tmp_path, monkeypatch, capsys):
    """write_metrics records the commit read when the run prepared its folder (the code it
    imported), not the one of a later commit, and ``results record`` takes it, with the
    machine and the time of writing, over this checkout's."""
    from workbench import results
    started = {"commit": "a" * 40, "dirty": False}
    later = {"commit": "b" * 40, "dirty": False}
    monkeypatch.setattr(machine, "commit", lambda root=None: started)
    machine.run_commit.cache_clear()
    try:
        run = results.prepare_out_dir(tmp_path / "run")  # the run sets up ...
        monkeypatch.setattr(machine, "commit", lambda root=None: later)  # ... a commit lands
        results.write_metrics(run, {"tau": 2.0, "clock": "none"})
    finally:
        machine.run_commit.cache_clear()
    written = json.loads((run / results.PROVENANCE).read_text())
    assert written["git"] == started and written["machine"]["cores"] >= 1
    args = ["results", "record", "n", "--question", "q", "--from", str(run / "metrics.json"),
            "--keys", "tau", "--command", "c", "--folder", str(tmp_path / "out")]
    assert cli(args) == 0
    saved = read_result(tmp_path / "out" / "n.json")
    assert saved["git"] == started and saved["date"] == written["written_at"]


def test_cli_record_copies_a_papermill_runs_parameters(tmp_path, capsys):
    """``papermill NB runs/x.ipynb -p out_dir runs/x``: the parameters come from the executed
    notebook beside the run folder, or from the one named; a notebook without them is refused
    and nothing is written."""
    run = tmp_path / "x"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"tau": 2.0, "clock": "none"}))
    executed = {"cells": [], "metadata": {"papermill": {"parameters": {"out_dir": "x", "k": 4}}}}
    (tmp_path / "x.ipynb").write_text(json.dumps(executed))
    base = ["results", "record", "n", "--question", "q", "--from", str(run / "metrics.json"),
            "--keys", "tau", "--command", "papermill", "--folder", str(tmp_path / "out")]
    assert cli(base) == 0
    assert read_result(tmp_path / "out" / "n.json")["parameters"] == {"out_dir": "x", "k": 4}
    (tmp_path / "plain.ipynb").write_text(json.dumps({"cells": [], "metadata": {}}))
    capsys.readouterr()
    assert cli([*base[:2], "m", *base[3:], "--notebook", str(tmp_path / "plain.ipynb")]) == 2
    assert "holds no papermill parameters" in capsys.readouterr().err
    assert not (tmp_path / "out" / "m.json").exists()
    bad = dict(read_result(tmp_path / "out" / "n.json"), parameters=["k"])
    with pytest.raises(ValueError, match="parameters must be a dict"):
        validate_result(bad)


# ---- the benchmarks' helper and the committed table ----------------------------------------

def test_a_benchmark_records_its_result_with_its_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_demo.py"])
    import common
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    common.add_common(ap, repeats=3)
    common.add_result(ap)
    args = ap.parse_args(["--result-folder", str(tmp_path)])
    shares = common.CpuShares()
    assert shares.wrap(lambda x: x + 1)(1) == 2 and len(shares.shares) == 1
    assert 0 <= shares.shares[0] <= 1
    summary = pd.DataFrame({"system": ["a", "b"], "disturbed_share": [0.5, 0.5]})
    assert common.disturbed_of(summary, summary.assign(disturbed_share=0.0)) == 0.25
    assert common.disturbed_of(summary.assign(disturbed_share=float("nan"))) is None
    path = common.record(args, "Demo?", {"ratio": {"value": 1.2, "n": 3}}, "wall",
                         shares.disturbed())
    assert path == tmp_path / "bench_demo.json"
    saved = read_result(path)
    assert saved["command"] == (".venv/bin/python benchmarks/bench_demo.py --prompts 4 "
                                f"--repeats 3 --warmup 0 --wide 0.25 --result bench_demo "
                                f"--result-folder {tmp_path}")
    assert saved["disturbed_share"] in (0.0, 1.0)
    assert common.sim_clock() in CLOCKS and "Result:" in capsys.readouterr().out


def test_the_committed_results_table_is_what_the_results_folder_gives():
    folder = ROOT / "benchmarks" / "results"
    assert (folder / "README.md").is_file()
    assert (ROOT / "RESULTS.md").read_text() == results_table(folder), (
        "RESULTS.md is stale: run .venv/bin/workbench results table")


def test_a_runs_clock_names_what_its_sim_seconds_were():
    assert provenance.clock_of({"clock": "sim", "sim_seconds": "thread_cpu"}) == "sim-thread-cpu"
    assert provenance.clock_of({"clock": "sim", "sim_seconds": "wall"}) == "sim-wall"
    assert provenance.clock_of({"clock": "wall"}) == "wall"
    assert provenance.clock_of({"clock": "sim"}) is None  # saved before it said
    assert provenance.clock_of({}) is None
