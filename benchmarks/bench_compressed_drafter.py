"""A compressed drafter that pays? Pruned students of the default policy, before and after
drafter-KD, against the shipped EAGLE head, as drafters for their teacher (issue #25).

Students: depth-pruned (``depth_N``: N of the teacher's 6 layers, chosen by the LM-loss increase
of removing each) and width-pruned (``width_P``: the width plan nearest P% of the parameters),
each distilled from the teacher on the task's reference traces as the compress pipeline does
(``compress_step``: the *before* student), then distilled further as a drafter
(``compress.drafter_kd.distill_drafter``: logit KD on the teacher's own greedy and T=1 rollouts,
the *after* student; with ``--control`` also the *more* student: as many further steps of the
pipeline's own KD on the reference traces, to tell the rollouts' effect from the steps').
Students are saved under ``--out``/students and loaded from there when present, so a second run
(the speed part on a quiet machine) trains nothing.

Part ``tau`` (does not depend on the machine's load): on held-out prompts, greedy, batch 1, every
drafter at every k of ``--ks``: tau, the tokens checked equal to plain decoding's, the step
costs (T1 a plain teacher step, Td one draft token, Tv one verify pass) measured in one more
rollout whose plain and SD steps alternate, so that the machine's load hits them alike, as
ratios c_draft = Td / T1 and c_verify = Tv / T1, the bound tau / (k c_draft + c_verify) and
the tau a 1.2x would need. Also each student's agreement (the share of positions where its
argmax is the teacher's) and KL to the teacher on the teacher's greedy rollouts of the same
prompts.
Part ``speed`` (``sd_sweep``): speedup over plain decoding at ``--batch-sizes``, plain and every
drafter interleaved inside each repeat, median of per-repeat tokens/s ratios, greedy; the run
fails when any drafter's tokens differ from plain decoding's.

    python benchmarks/bench_compressed_drafter.py --part speed --repeats 5
"""
from __future__ import annotations

import argparse
import copy
from dataclasses import replace
from pathlib import Path

import pandas as pd

from bench_spec import sweep_figures
from common import add_common, add_result, header, print_table, record, sim_clock
from workbench.compress.data import CALIBRATION_SEED, distill_data
from workbench.compress.distill import DistillConfig, Distiller, kl_to_teacher
from workbench.compress.drafter_kd import agreement, distill_drafter, rollout_batches
from workbench.compress.importance import calibration_batches
from workbench.compress.iterative import compress_step
from workbench.compress.plan import param_count
from workbench.models import load_model, save_model
from workbench.results import prepare_out_dir, write_table
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.schedule import PLAIN, PlainSchedule, StepPlan
from workbench.speculative import LMDrafter
from workbench.speculative.defaults import default_drafters
from workbench.speculative.measure import acceptance_length, step_times
from workbench.speculative.sweep import first_divergence, sd_sweep, sweep_spread_note
from workbench.tasks import HELDOUT_SEED, get_problems

TASK = "running_sum"
TARGET = 1.2  # the speedup target at batch 1


def parse_student(name: str, layers: int) -> tuple[str, float]:
    """``(kind, target fraction)`` of a student name: ``depth_N`` (N layers) or ``width_P``
    (P% of the parameters)."""
    kind, _, size = name.partition("_")
    if kind == "depth" and size.isdigit() and 1 <= int(size) < layers:
        return kind, int(size) / layers
    if kind == "width" and size.isdigit() and 1 <= int(size) < 100:
        return kind, int(size) / 100
    raise SystemExit(f"student {name!r}: accepted: depth_N (N in 1..{layers - 1} layers) or "
                     "width_P (P in 1..99, percent of the teacher's parameters)")


def _cached(folder: Path, build, tok):
    """The model saved in ``folder``, else ``build()``'s, saved there (its evals beside it)."""
    if (folder / "config.json").is_file():
        return load_model(folder, device="cpu")[0]
    model, evals = build()
    save_model(model, tok, folder, extra_files={"evals.csv": evals.to_csv(index=False)})
    return model


def build_students(teacher, tok, args, out: Path) -> dict[str, dict]:
    """``{name: {"before": model, "after": model}}`` (and ``"more"`` with ``--control``),
    trained or loaded from ``out``."""
    calib = calibration_batches(tok, TASK, 256, max_len=256)
    train, held_out = distill_data(tok, TASK, args.train_size, 32, args.batch_size, args.seed,
                                   256)
    prompts = [p.prompt for p in get_problems(TASK, args.kd_prompts + 32,
                                              seed=CALIBRATION_SEED)]
    pipeline = DistillConfig.flat(horizon=args.distill_steps, batch_size=args.batch_size,
                                  lr=args.lr, seed=args.seed, progress=False,
                                  eval_every=max(1, args.distill_steps // 5))
    drafter = pipeline.updated(horizon=args.kd_steps, eval_every=max(1, args.kd_steps // 5))
    students = {}
    for name in args.students:
        kind, target = parse_student(name, teacher.config.num_hidden_layers)

        def before(kind=kind, target=target, name=name):
            stage = compress_step(teacher, target, train, held_out, calib, kind, pipeline,
                                  name=name, progress=False)
            return stage.model, stage.evals

        def after(start):
            student = copy.deepcopy(start)
            kd = distill_drafter(student, teacher, tok, prompts[:-32], prompts[-32:], drafter,
                                 samples=args.samples, max_new_tokens=args.max_new_tokens)
            return student, kd.evals

        def more(start):
            student = copy.deepcopy(start)
            kd = Distiller(student, teacher, train, drafter, held_out, desc=f"{name} more")
            kd.run()
            return student, kd.evals

        folder = out / "students" / name
        first = _cached(folder / "before", before, tok)
        students[name] = {"before": first,
                          "after": _cached(folder / "after", lambda: after(first), tok)}
        if args.control:
            students[name]["more"] = _cached(folder / "more", lambda: more(first), tok)
        print(f"{name}: {param_count(first.config):,} parameters, "
              f"{first.config.num_hidden_layers} layers", flush=True)
    return students


def drafters_of(students: dict, teacher, tok) -> dict:
    """Every student before and after drafter-KD as an LMDrafter, and the EAGLE head."""
    out = {f"{name} {stage}": LMDrafter(model, tok) for name, pair in students.items()
           for stage, model in pair.items()}
    return {**out, "eagle": default_drafters(teacher, tok, ["eagle"])["eagle"]}


def student_table(students: dict, teacher, tok, prompts, max_new_tokens) -> pd.DataFrame:
    """Agreement and KL to the teacher of every student, on the teacher's greedy rollouts of
    the held-out ``prompts``."""
    batches = rollout_batches(teacher, tok, prompts, temperatures=(0.0,),
                              max_new_tokens=max_new_tokens)
    return pd.DataFrame([{"drafter": f"{name} {stage}", "params": param_count(m.config),
                          "layers": m.config.num_hidden_layers,
                          "hidden": m.config.hidden_size,
                          "agreement": agreement(m, teacher, batches),
                          "kl": kl_to_teacher(m, teacher, batches)}
                         for name, pair in students.items() for stage, m in pair.items()])


class Alternating(PlainSchedule):
    """Plain and speculative decode steps (a chain of ``k``) in turn on every worker: T1, Td
    and Tv measured interleaved step by step, so that a busy machine's swings, which last
    seconds, hit all three alike."""

    needs_drafter = True

    def __init__(self, k: int):
        self.step, self.turn = StepPlan("speculative", k), {}

    def plan(self, batch_size: int, worker: int) -> StepPlan:
        self.turn[worker] = not self.turn.get(worker, False)
        return self.step if self.turn[worker] else PLAIN


def tau_table(engine, prompts, drafters: dict, ks, max_new_tokens) -> pd.DataFrame:
    """Part ``tau``: per (drafter, k), tau from a greedy batch-1 SD rollout, and the step
    costs from one more in which plain and SD steps alternate (:class:`Alternating`); both
    rollouts' tokens are checked against plain decoding's."""
    base = RolloutConfig(max_new_tokens=max_new_tokens, max_batch_size=1)
    plain = engine.rollout(prompts, base, progress=False).tokens
    rows = []
    for name, drafter in drafters.items():
        for k in ks:
            sd = engine.rollout(prompts, replace(base, spec_k=k), drafter=drafter,
                                progress=False)
            mixed = engine.rollout(prompts, base, drafter=drafter, schedule=Alternating(k),
                                   progress=False)
            times = step_times(mixed.timeline.steps, k)
            tau, c_d, c_v = (acceptance_length(sd), times["Td"] / times["T1"],
                             times["Tv"] / times["T1"])
            rows.append({"drafter": name, "k": k, "tau": tau, "T1_ms": 1e3 * times["T1"],
                         "Td_ms": 1e3 * times["Td"], "Tv_ms": 1e3 * times["Tv"],
                         "c_draft": c_d, "c_verify": c_v, "bound": tau / (k * c_d + c_v),
                         "tau_for_target": TARGET * (k * c_d + c_v),
                         "identical": sd.tokens == plain and mixed.tokens == plain,
                         "diverged_at": first_divergence(plain, sd.tokens)})
        print(f"tau: {name} done", flush=True)
    return pd.DataFrame(rows)


def summary(tau: pd.DataFrame | None, speed: pd.DataFrame | None) -> str:
    """The lines printed under the tables: the best compressed drafter by bound and by
    measured speedup at batch 1, against EAGLE and the target."""
    lines = []
    if tau is not None:
        mine = tau[tau["drafter"] != "eagle"]
        best = mine.loc[mine["bound"].idxmax()]
        lines.append(f"best compressed drafter by bound: {best.drafter} k={best.k}: tau "
                     f"{best.tau:.2f}, c_draft {best.c_draft:.2f}, c_verify {best.c_verify:.2f}"
                     f", bound {best.bound:.2f}x (1.2x needs tau {best.tau_for_target:.2f})")
    if speed is not None:
        for bs, cell in speed.groupby("batch_size"):
            mine = cell[cell["drafter"] != "eagle"]
            best = mine.loc[mine["speedup"].idxmax()]
            eagle = cell[cell["drafter"] == "eagle"]["speedup"].max()
            met = " (target 1.2x met)" if bs == 1 and best.speedup >= TARGET else ""
            lines.append(f"batch {bs}: best compressed drafter {best.drafter} k={best.k} "
                         f"{best.speedup:.2f}x ({best.speedup_min:.2f}-{best.speedup_max:.2f})"
                         f"{met}; EAGLE {eagle:.2f}x")
    return "\n".join(lines)


def arguments() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["tau", "speed", "both"], default="both")
    ap.add_argument("--students", nargs="+", default=["depth_1", "depth_2", "width_50",
                                                      "width_25"])
    ap.add_argument("--prompts", type=int, default=32, help="held-out prompts measured")
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 6], help="part tau")
    ap.add_argument("--speed-ks", type=int, nargs="+", default=[4, 6], help="part speed")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32], help="part speed")
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--train-size", type=int, default=512, help="task texts, pipeline KD")
    ap.add_argument("--distill-steps", type=int, default=200, help="pipeline KD (before)")
    ap.add_argument("--kd-prompts", type=int, default=512, help="rollout prompts, drafter KD")
    ap.add_argument("--samples", type=int, default=2, help="T=1 rollouts per KD prompt")
    ap.add_argument("--kd-steps", type=int, default=300, help="drafter KD (after)")
    ap.add_argument("--control", action="store_true",
                    help="also each student after --kd-steps more of the pipeline's own KD "
                         "(reference traces, not rollouts): what the extra steps alone give")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/compressed_drafter")
    add_common(ap, repeats=3)
    add_result(ap)
    return ap


def main():
    ap = arguments()
    args = ap.parse_args()
    out = prepare_out_dir(args.out)
    teacher, tok = load_model("default", device="cpu")
    students = build_students(teacher, tok, args, out)
    prompts = [p.prompt for p in get_problems(TASK, args.prompts, seed=HELDOUT_SEED)]
    drafters = drafters_of(students, teacher, tok)
    engine = RolloutEngine(teacher, tok)
    print(header(ap, args, f"default policy (teacher) on the CPU, {args.prompts} held-out "
                           f"prompts, greedy, max_new_tokens={args.max_new_tokens}"), flush=True)
    tau = speed = None
    if args.part in ("tau", "both"):
        agree = student_table(students, teacher, tok, prompts, args.max_new_tokens)
        write_table(agree, out / "students.csv")
        print_table("Students on the teacher's greedy rollouts", agree.round(4))
        tau = tau_table(engine, prompts, drafters, args.ks, args.max_new_tokens)
        write_table(tau, out / "tau.csv")
        print_table("tau and step costs at batch 1, greedy (one run each)", tau.round(3))
    if args.part in ("speed", "both"):
        speed = sd_sweep(engine, prompts, drafters, ks=args.speed_ks,
                         batch_sizes=args.batch_sizes, repeats=args.repeats,
                         max_new_tokens=args.max_new_tokens, progress=False, wide=args.wide)
        write_table(speed, out / "speed.csv")
        cols = ["batch_size", "drafter", "k", "tau", "plain_tok_s", "sd_tok_s", "speedup",
                "speedup_min", "speedup_max", "bound", "identical"]
        print_table("Speedup over plain decoding (median of per-repeat ratios)",
                    speed[cols].round(3))
        print(sweep_spread_note(speed, args.wide))
    print("\n" + summary(tau, speed), flush=True)
    for name, table in (("tau", tau), ("speed", speed)):
        if table is not None and not table["identical"].all():
            bad = table[~table["identical"].astype(bool)]
            raise SystemExit(f"part {name}: SD tokens differ from plain decoding's for "
                             f"{sorted(set(bad['drafter']))}: not lossless")
    if tau is not None:  # one run each; the bound from step times on the engine clock
        figures = {f"{m}_{r.drafter.replace(' ', '_')}_k{r.k}": {"value": float(getattr(r, m))}
                   for r in tau.itertuples() for m in ("tau", "bound")}
        record(args, f"Compressed drafters {args.students} before/after drafter-KD vs EAGLE at "
               f"batch 1, greedy, {args.prompts} held-out prompts: tau and the bound "
               "tau / (k c_draft + c_verify) from step times (one run each)", figures,
               sim_clock(), None, name=f"{args.result}_tau")
    if speed is not None:
        figures = sweep_figures(speed.assign(drafter=speed["drafter"].str.replace(" ", "_")))
        record(args, f"Does a compressed drafter pay? Speedup over plain decoding (median of "
               f"per-repeat tokens/s ratios, engine clock) and tau of every drafter at batch "
               f"sizes {args.batch_sizes}, greedy, {args.prompts} held-out prompts", figures,
               sim_clock(), None, headline=[k for k in figures if k.startswith("speedup_")])


if __name__ == "__main__":
    main()
