"""Check the dispatch model (workbench.cluster.dispatch) on a finished notebook 11 run.

RUN_DIR is notebook 11's ``out_dir`` (its ``history.csv``, and its saved timelines under
``checkpoint/<variant>-seed<s>/timelines`` or ``timelines/<variant>-seed<s>``), after a run
whose variants hold the baseline and Seer's (``seer_schedule``, ``seer_divided``). For every
seed (``--seeds``, default: the run's), ``cluster.seer_run``:

- replays each Seer variant's saved steps through the simulator from its own requests, on
  step costs calibrated on the baseline's timelines alone (``seer_check.check_seer``):
  ``seer_sim_error_<v>``, the summed predicted makespans over the measured ones minus 1 on
  the sim clock (the issue's target: at most 10%), and the rollout speedup over the baseline
  predicted and measured;
- asks the simulator "Seer's scheduling, TLT, or both?" at the run's N and at ``--workers``
  from the run's baseline lengths and its baseline's and TLT's step costs
  (``seer_table.seer_whatif``, ``--draws`` steps at each N).

Each check figure is the median over the seeds with its min, max and n; the what-if's are
the mean over its draws. The per-seed table and the reading are printed; ``--result NAME``
writes ``<--result-folder>/NAME.json`` (default folder ``benchmarks/results``) with the
run's parameters (from the executed notebook beside the run folder, as ``workbench results
record`` reads them) and its disturbed share (the run's ``metrics.json``, else its history).

    .venv/bin/python benchmarks/check_seer_run.py runs/s39/11_defaults --result seer_check_nb11
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import pandas as pd

HEADLINE = ("seer_sim_error_seer_schedule", "seer_sim_error_seer_divided",
            "seer_whatif_tlt_beside_seer_n64", "seer_whatif_tlt_beside_seer_n1024",
            "seer_whatif_speedup_both_n64", "seer_whatif_speedup_both_n1024")
QUESTION = (
    "The cluster simulator's dispatch model (cluster.dispatch) checked on a finished notebook 11 "
    "run, and its answer to \"Seer's scheduling, TLT, or both?\" from that run. "
    "seer_sim_error_<v>: each Seer variant's saved steps replayed from its own requests on "
    "costs calibrated on the baseline alone, summed predicted makespans over measured minus 1 "
    "(sim clock; median over seeds with min and max; target: at most 10%); "
    "seer_predicted/measured_rollout_speedup_<v>: its rollout over the baseline's. "
    "seer_whatif_speedup_<setting>_n<N>: the simulator's step speedup over the static plain "
    "layout (tlt, seer_schedule, seer_divided, both: TLT with Seer's divided rollout) at N "
    "workers (update included) from the run's baseline lengths and its baseline's and TLT's "
    "step costs, the mean of its draws; seer_whatif_tlt_beside_seer_n<N>: TLT with "
    "Seer's divided rollout over Seer's alone. "
    "Note: [docs/lab-notes/2026-12-05-seer-check.md](docs/lab-notes/2026-12-05-seer-check.md).")


def run_seeds(folder: Path) -> list[int]:
    """The seeds of the run in ``folder`` (its ``history.csv``; else ``[0]``)."""
    path = folder / "history.csv"
    if not path.is_file():
        return [0]
    return sorted(int(s) for s in pd.read_csv(path)["seed"].unique())


def run_variants(folder: Path) -> list[str]:
    """The variants of the run in ``folder``: its ``history.csv``'s, else every variant with
    saved timelines under ``checkpoint/``."""
    path = folder / "history.csv"
    if path.is_file():
        return list(dict.fromkeys(pd.read_csv(path)["variant"]))
    found = sorted((folder / "checkpoint").glob("*-seed*/timelines"))
    return list(dict.fromkeys(p.parent.name.rsplit("-seed", 1)[0] for p in found))


def figures_of(metrics: dict) -> dict:
    """The result's figures from ``SeerRun.metrics()``: each ``x`` with its ``x_min``,
    ``x_max``, ``x_n`` as one figure (the speedups in ``x``)."""
    from workbench.provenance import figures_from_metrics

    spread = ("_min", "_max", "_n")
    keys = [k for k in metrics if not k.endswith(spread)]
    figures = figures_from_metrics(metrics, keys)
    for k, f in figures.items():
        if "speedup" in k or "beside" in k:
            f["unit"] = "x"
    return figures


def disturbed_share(folder: Path) -> float | None:
    """The run's disturbed share: its ``metrics.json``'s, else its history's pooled usage
    (``GRPO.usage``); None where neither says."""
    path = folder / "metrics.json"
    if path.is_file():
        share = json.loads(path.read_text()).get("disturbed_share")
        if share is not None:
            return float(share)
    if (folder / "history.csv").is_file():
        from workbench.rl.grpo import GRPO
        share = GRPO.usage(pd.read_csv(folder / "history.csv"))["disturbed_share"]
        return None if pd.isna(share) else float(share)
    return None


def clock(folder: Path) -> str:
    """The sim clock's name (``provenance.CLOCKS``) from ``checkpoint/ablation.json``'s
    ``sim_seconds`` (default: thread CPU time, as the harness reads it now)."""
    from workbench.provenance import clock_of

    path = folder / "checkpoint" / "ablation.json"
    kind = json.loads(path.read_text()).get("sim_seconds") if path.is_file() else None
    return clock_of({"clock": "sim", "sim_seconds": kind or "thread_cpu"}) or "sim-thread-cpu"


def check(folder: Path, seeds=None, workers=(64, 1024), draws: int = 4):
    """``cluster.seer_run.seer_run`` of the run in ``folder`` (its variants, ``seeds``
    default the run's): the ``SeerRun``. A ValueError where the run has no Seer variant or
    baseline to check."""
    from workbench.cluster.seer_run import seer_run

    variants = run_variants(folder)
    run = seer_run(folder, variants, run_seeds(folder) if seeds is None else seeds,
                   workers, draws)
    if not len(run.checks):
        raise ValueError(f"nothing to check in {str(folder)!r}: its variants {variants} need "
                         "'baseline' and 'seer_schedule' or 'seer_divided', with their "
                         "timelines saved (checkpoint/<variant>-seed<s>/timelines)")
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="a finished notebook 11 run folder (its out_dir)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the run's")
    p.add_argument("--workers", type=int, nargs="+", default=[64, 1024],
                   help="the N the simulator answers at (and the run's own N)")
    p.add_argument("--draws", type=int, default=4, help="steps averaged at each N")
    p.add_argument("--result", default=None, help="write <result-folder>/<RESULT>.json")
    p.add_argument("--result-folder", default=None, help="default: benchmarks/results")
    a = p.parse_args(argv)
    run = check(a.run_dir, a.seeds, tuple(a.workers), a.draws)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(run.checks.round(4).to_string(index=False), "\n")
    print("\n".join(run.lines()))
    if a.result is None:
        return 0
    from workbench.provenance import run_parameters, write_result

    figures = figures_of(run.metrics())
    command = " ".join(shlex.quote(x) for x in [".venv/bin/python", "benchmarks/check_seer_run.py",
                                                  *(sys.argv[1:] if argv is None else argv)])
    path = write_result(a.result, QUESTION, figures, clock=clock(a.run_dir),
                        disturbed_share=disturbed_share(a.run_dir), command=command,
                        folder=a.result_folder,
                        headline=[k for k in HEADLINE if k in figures] or None,
                        parameters=run_parameters(a.run_dir / "metrics.json"))
    print(f"\nResult: {path} (regenerate RESULTS.md with: .venv/bin/workbench results table)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
