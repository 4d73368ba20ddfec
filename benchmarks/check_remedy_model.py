"""Check the long-tail remedy model (workbench.cluster.remedies) on real notebook 11 runs.

A notebook-11-shaped ablation (its defaults: the default policy on running sums, P 8 x G 4,
128 tokens, 8 workers with at most 2 rows each, sim clock; the baseline and the four remedies
the model replays, ``--steps`` RL steps, one folder per ``--seeds`` group) is run where
``--run`` is given, then every seed of every ``--folder`` is checked:

- ``cluster.remedy_check.check_remedies``: each remedy's end-to-end speedup predicted from
  the baseline's timelines alone, against the measured one, with the updates as the
  baseline logged them (``remedy_sim_error_<v>``) and moved with their padded batch, a
  stale step's charged for its old log-probs (``..._padded_update``), and the rollout's own error (``remedy_rollout_error_<v>``);
- ``diagnose`` of the run folder as logs (the baseline of that seed): its prediction for
  every other variant that ran (the remedies, async, TLT, Seer's variants, TLT beside a
  remedy or Seer) against the variant's measured speedup (``diagnose_error_<v>``, ``+``
  written ``_``).

Each figure is the median over the seeds, with its min, max and n; the per-seed tables are
printed. ``--result NAME`` writes ``benchmarks/results/NAME.json``.

    .venv/bin/python benchmarks/check_remedy_model.py --run --folder runs/issue40r/nb11_s0 \\
        --seeds 0 --steps 6
    .venv/bin/python benchmarks/check_remedy_model.py --folder runs/issue40r/nb11_s0 \\
        --folder runs/issue40r/nb11_s12 --result remedy_model_nb11
    .venv/bin/python benchmarks/check_remedy_model.py --folder runs/s39/11_defaults \\
        --result diagnose_nb11_variants
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

VARIANTS = ["baseline", "overprovision", "april", "partial", "tail_batching"]
NOTE = "2026-12-05-remedy-model.md"  # the lab note each result's question links


def run(folder: Path, steps: int, seeds: list[int]) -> None:
    """The ablation of notebook 11's defaults, ``VARIANTS`` alone; its history and every
    run's timelines saved into ``folder``."""
    from workbench.rl import GRPOConfig
    from workbench.rl.ablation.runner import run_ablation
    from workbench.rl.setup import rl_setup

    grpo = GRPOConfig.flat(prompts_per_step=8, samples_per_prompt=4, max_new_tokens=128,
                           temperature=1.0, lr=2e-4, kl_coef=0.0, workers=8, max_batch_size=2)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    s = rl_setup("default", "running_sum", 16, 4, reward="exact", drafter="none",
                 variants=VARIANTS)
    ab = run_ablation(s.policy, s.tokenizer, s.pool, grpo, steps, variants=VARIANTS,
                      seeds=seeds, reward=s.reward, progress=False,
                      checkpoint_dir=folder / "checkpoint")
    ab.history.to_csv(folder / "history.csv", index=False)
    ab.save_timelines(folder / "timelines")
    print(f"ran {folder} in {time.time() - started:.0f} s")


def diagnosed(folder: Path) -> list[dict]:
    """One row per seed and variant of ``folder`` other than the baseline: `workbench
    diagnose` of the baseline's steps, its prediction for the variant against the variant's
    measured speedup that seed."""
    from workbench.diagnose import diagnose
    from workbench.diagnose.workbench_runs import read_workbench

    h = pd.read_csv(folder / "history.csv")
    rows = []
    for seed in sorted(h["seed"].unique()):
        d = diagnose(read_workbench(folder, "baseline", int(seed)))
        for _, r in d.measured[d.measured["variant"] != "baseline"].iterrows():
            rows.append({"folder": str(folder), "seed": int(seed), "variant": r["variant"],
                         "measured": r["measured_e2e_speedup_seed"],
                         "predicted": r["predicted_e2e_speedup"], "error": r["error_seed"]})
    return rows


def check(folder: Path) -> list[dict]:
    """One row per seed and remedy variant of ``folder``: the remedy check's figures, the
    updates as logged and moved with the padded batch."""
    from workbench.cluster.remedy_check import check_remedies

    h = pd.read_csv(folder / "history.csv")
    rows = []
    for seed in sorted(h["seed"].unique()):
        logged = check_remedies(folder, int(seed)).table.set_index("variant")
        padded = check_remedies(folder, int(seed), update="padded").table.set_index("variant")
        for v in logged.index:
            rows.append({"folder": str(folder), "seed": int(seed), "variant": v,
                         "measured": logged.loc[v, "measured"],
                         "predicted_logged": logged.loc[v, "predicted"],
                         "error_logged": logged.loc[v, "error"],
                         "predicted_padded": padded.loc[v, "predicted"],
                         "error_padded": padded.loc[v, "error"],
                         "rollout_measured": logged.loc[v, "rollout_measured"],
                         "rollout_predicted": logged.loc[v, "rollout_predicted"],
                         "rollout_error": logged.loc[v, "rollout_error"]})
    return rows


def _figure(values, unit=None) -> dict:
    v = np.asarray(values, float)
    out = {"value": float(np.median(v)), "min": float(v.min()), "max": float(v.max()),
           "n": int(len(v))}
    return out if unit is None else {**out, "unit": unit}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", action="append", type=Path, required=True)
    p.add_argument("--run", action="store_true", help="run the ablation into the folder first")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seeds", default="0", help="comma-separated seeds of --run")
    p.add_argument("--result", default=None, help="write benchmarks/results/<RESULT>.json")
    a = p.parse_args(argv)
    if a.run:
        if len(a.folder) != 1:
            p.error("--run takes one --folder")
        run(a.folder[0], a.steps, [int(s) for s in a.seeds.split(",")])
    t = pd.DataFrame([r for f in a.folder for r in check(f)])
    every = pd.DataFrame([r for f in a.folder for r in diagnosed(f)])
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print(t.round(3).to_string(index=False))
        print(every.round(3).to_string(index=False))
    if a.result is None:
        return 0
    from workbench.diagnose.validated import figure_name
    from workbench.provenance import write_result

    figures = {}
    for v, r in t.groupby("variant", sort=False):
        figures[f"remedy_rollout_error_{v}"] = _figure(r["rollout_error"])
        figures[f"remedy_sim_error_{v}"] = _figure(r["error_logged"])
        figures[f"remedy_sim_error_{v}_padded_update"] = _figure(r["error_padded"])
        figures[f"predicted_e2e_speedup_{v}_padded_update"] = _figure(r["predicted_padded"], "x")
    within, beyond = [], []
    for v, r in every.groupby("variant", sort=False):
        name = figure_name(v)
        figures[f"diagnose_error_{name}"] = _figure(r["error"])
        figures[f"measured_e2e_speedup_{name}"] = _figure(r["measured"], "x")
        figures[f"diagnosed_e2e_speedup_{name}"] = _figure(r["predicted"], "x")
        (within if r["error"].abs().max() <= 0.10 else beyond).append(
            v if r["error"].abs().max() <= 0.10 else
            f"{v} ({(r['error'].abs() > 0.10).sum()} of {len(r)})")
    histories = pd.concat([pd.read_csv(f / "history.csv") for f in a.folder])
    disturbed = float(histories["usage_disturbed_s"].sum() / histories["usage_measured_s"].sum())
    seeds = sorted(t["seed"].unique().tolist())
    question = ("The diagnosis (`workbench diagnose` of a notebook 11 run's baseline) and the "
                "long-tail remedy model (cluster.remedies) checked on notebook-11-shaped runs "
                f"(its defaults, {histories['step'].max() + 1} RL steps, seeds {seeds}): each "
                "variant's speedup over the baseline predicted from the baseline's timelines "
                "alone, against the measured one; errors (predicted - measured) / measured, "
                "median over the seeds with min and max. diagnose_error_<v>: the diagnosis "
                "(TLT, the remedies, async, Seer's variants, TLT beside each; '+' written "
                "'_'); remedy_rollout_error: the remedy model's rollout alone; "
                "remedy_sim_error: end to end, the updates as the baseline logged them; "
                "..._padded_update: each update moved with its padded batch and charged for "
                "stale tokens' old log-probs, as the diagnosis of a workbench run does. "
                f"Within 10% on every seed: {', '.join(within) or 'none'}; beyond 10% on some "
                f"seed (seeds beyond): {', '.join(beyond) or 'none'}. Note: "
                f"[docs/lab-notes/{NOTE}](docs/lab-notes/{NOTE}).")
    path = write_result(a.result, question, figures, clock="sim-thread-cpu",
                        disturbed_share=disturbed, command=" ".join(["python", *sys.argv]),
                        headline=[k for k in figures if k.startswith("diagnose_error")])
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
