"""Our GRPO step vs TRL's ``GRPOTrainer`` step: wall time, rollout/update split and reward.

Both systems start from separate copies of the same policy and take the same GRPO step:
``--prompts`` prompts (P) of the default task, ``--samples`` completions (G) each, temperature
1.0, at most ``--max-new-tokens`` completion tokens, AdamW at a constant ``--lr``, no KL term
(beta 0), one epoch of one minibatch (one optimizer step per RL step, on-policy), clip 0.2,
token-mean loss (TRL's ``dapo``), group-scaled advantages, gradient norm clipped at 1. Step
``s`` of both uses the same P prompts: the ones our GRPO draws for step ``s``; TRL reads them
in that order (``shuffle_dataset=False``), which is checked every step. A repeat is one step
of each system, the order rotating; the figure is the median of the per-step ratios TRL
seconds / our seconds, with its min-max and spread, flagged WIDE above ``--wide``.

What is timed, in one process on the wall clock:

* ours: ``GRPO.rollout()`` (the engine samples all P*G rows with continuous batching on one
  worker, ``max_batch_size=None``, then the reward) and ``GRPO.update()`` (the loss forward
  and backward, the optimizer step, and the KL-to-start measure on ``kl_sample`` rows, which
  our step always takes).
* TRL: ``trainer.train()`` runs in a background thread that a callback parks at the start of
  every optimizer step; a timed step lets it go and waits until it parks again (or ``train``
  returns), so everything TRL does for a step (generation, reward, loss, backward, optimizer,
  logging) is inside the timing and none of it overlaps our step. Its rollout is the time in
  ``GRPOTrainer._generate`` (tokenising, ``model.generate``, decoding); its update is the rest.

TRL's own defaults that would make it do more work than ours are turned off: bf16 (this is a
float32 CPU comparison) and gradient checkpointing (a forward recomputed in the backward to
save memory, which this policy does not need; ``--trl-gradient-checkpointing`` turns it back
on, as TRL ships). TRL needs the ``bench`` extra: ``pip install -e '.[bench]'``.

    python benchmarks/bench_grpo.py --steps 5 --prompts 16 --samples 8 \
        --max-new-tokens 256 --lr 5e-5
"""
from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import threading
import time
import warnings

import pandas as pd
import torch

from common import add_result, command_line, disturbed_of, print_table, ratio_cells, record
from workbench.models import load_model
from workbench.provenance import figure_from_stats
from workbench.rl import GRPO, GRPOConfig
from workbench.speedup import WIDE_SPREAD, interleave, summarize
from workbench.tasks import RL_SEED, exact_match_reward, get_problems

SYSTEMS = ("trl", "ours")  # baseline first: the ratio reads TRL seconds / our seconds

# TRL 1.16 asks the model `is_gradient_checkpointing`, which transformers 5 deprecates, several
# times a step; the warnings say nothing about this comparison.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


def require_trl():
    """The ``trl`` module, or exit naming the extra that installs it (TRL is not a dependency
    of workbench: only this benchmark uses it)."""
    try:
        import datasets  # noqa: F401  (TRL's trainer takes a datasets.Dataset)
        import trl
    except ImportError as e:
        raise SystemExit(f"bench_grpo.py needs TRL and datasets ({e}). Install the optional "
                         "extra without touching torch or transformers: "
                         "pip install -e '.[bench]' (see pyproject.toml, "
                         "[project.optional-dependencies] bench).") from e
    return trl


# ---- ours --------------------------------------------------------------------------------

def ours_grpo(model, tok, pool, args) -> GRPO:
    """Our GRPO on one worker (its rollout clock then is this process's wall clock)."""
    config = GRPOConfig.flat(prompts_per_step=args.prompts, samples_per_prompt=args.samples,
                             max_new_tokens=args.max_new_tokens, temperature=1.0, lr=args.lr,
                             epochs=1, minibatches=1, kl_coef=0.0, workers=1,
                             max_batch_size=None, seed=args.seed)
    return GRPO(model, tok, pool, exact_match_reward, config)


def ours_step(grpo: GRPO) -> dict:
    """One RL step, its halves timed here on the wall clock."""
    t0 = time.perf_counter()
    rl = grpo.rollout()
    t1 = time.perf_counter()
    row = grpo.update(rl)
    t2 = time.perf_counter()
    return {"step_s": t2 - t0, "rollout_s": t1 - t0, "update_s": t2 - t1,
            "reward": row["reward"], "tokens": row["response_len"],
            "prompts": sorted({p.prompt for p in rl.problems})}


# ---- TRL ---------------------------------------------------------------------------------

def trl_dataset(grpo: GRPO, rounds: int):
    """The prompts (and answers, a column the reward reads) our GRPO draws for steps
    ``0..rounds-1``, in that order, so TRL's unshuffled sampler gives step s the same P."""
    from datasets import Dataset
    problems = [p for s in range(rounds) for p in grpo.problems_for(s)]
    return Dataset.from_dict({"prompt": [p.prompt for p in problems],
                              "answer": [str(p.answer) for p in problems]})


def trl_config(args, out_dir: str, rounds: int, clip_norm: float, beta2: float):
    """TRL's GRPOConfig for the same step as ours: one generation batch of P*G completions
    per optimizer step, constant lr, our clipping and AdamW beta2, nothing saved or reported."""
    return require_trl().GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=args.prompts * args.samples,
        gradient_accumulation_steps=1, steps_per_generation=1, num_generations=args.samples,
        max_completion_length=args.max_new_tokens, temperature=1.0, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=clip_norm,
        adam_beta2=beta2, weight_decay=0.0, beta=0.0, num_iterations=1, epsilon=0.2,
        loss_type="dapo", scale_rewards="group", shuffle_dataset=False, max_steps=rounds,
        activation_checkpointing=args.trl_gradient_checkpointing, bf16=False, use_cpu=True,
        seed=args.seed, logging_steps=1, report_to="none", save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0)


class TRLStepper:
    """Runs ``GRPOTrainer.train()`` one optimizer step per :meth:`step` call.

    ``train()`` owns TRL's loop (dataloader, accumulation, clipping, scheduler), so it runs in
    a background thread; a callback parks that thread at each step's start until :meth:`step`
    releases it, and :meth:`step` returns when the thread parks again or ``train`` returns.
    The setup before the first step (accelerate's prepare, the optimizer) stays untimed, as
    our GRPO's constructor does.
    """

    def __init__(self, model, tok, dataset, config):
        from transformers import PrinterCallback, TrainerCallback
        stepper = self

        class Park(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                stepper._parked.release()
                stepper._go.acquire()

        self._go, self._parked = threading.Semaphore(0), threading.Semaphore(0)
        self.error = None
        self.trainer = require_trl().GRPOTrainer(
            model=model, reward_funcs=self._reward, args=config, train_dataset=dataset,
            processing_class=tok, callbacks=[Park()])
        self.trainer.remove_callback(PrinterCallback)  # its per-step log dicts clutter stdout
        self._time_generation()
        self._thread = threading.Thread(target=self._train, daemon=True)
        self._thread.start()
        self._wait()

    def _reward(self, prompts, completions, completion_ids, answer, **kwargs) -> list[float]:
        """TRL's reward signature around our exact-match reward; records what it scored."""
        rewards = [exact_match_reward(p, c, a) for p, c, a in zip(prompts, completions, answer)]
        self._seen.update(prompts=sorted(set(prompts)), rewards=rewards,
                          tokens=[len(ids) for ids in completion_ids])
        return rewards

    def _time_generation(self) -> None:
        """Wrap the trainer's ``_generate`` (prompts in, completions out) with a timer."""
        generate = self.trainer._generate

        def timed(prompts):
            t0 = time.perf_counter()
            try:
                return generate(prompts)
            finally:
                self._generate_s += time.perf_counter() - t0

        self.trainer._generate = timed

    def _train(self) -> None:
        try:
            self.trainer.train()
        except BaseException as e:  # re-raised in the main thread by _wait
            self.error = e
        finally:
            self._parked.release()

    def _wait(self) -> None:
        self._parked.acquire()
        if self.error is not None:
            raise RuntimeError("TRL's GRPOTrainer.train() failed") from self.error

    def step(self) -> dict:
        """One TRL optimizer step (generation through logging), timed on the wall clock."""
        self._generate_s, self._seen = 0.0, {}
        t0 = time.perf_counter()
        self._go.release()
        self._wait()
        step_s = time.perf_counter() - t0
        state = self.trainer.state
        logged = next((h for h in state.log_history if h.get("step") == state.global_step), {})
        return {"step_s": step_s, "rollout_s": self._generate_s,
                "update_s": step_s - self._generate_s,
                "reward": statistics.fmean(self._seen["rewards"]),
                "tokens": statistics.fmean(self._seen["tokens"]),
                "logged_reward": logged.get("reward"), "prompts": self._seen["prompts"]}


# ---- the comparison ----------------------------------------------------------------------

def check_same_prompts(runs, args) -> None:
    """Both systems scored the same P prompts at every step (and TRL's own logged reward
    agrees with the one its reward function returned); exits naming the first mismatch."""
    for r, (trl, ours) in enumerate(zip(runs.outputs["trl"], runs.outputs["ours"])):
        step = args.warmup + r
        if trl["prompts"] != ours["prompts"]:
            raise SystemExit(f"step {step}: TRL and our GRPO got different prompts")
        if trl["logged_reward"] is not None and abs(trl["logged_reward"] - trl["reward"]) > 1e-6:
            raise SystemExit(f"step {step}: TRL logged reward {trl['logged_reward']} but its "
                             f"reward function returned a mean of {trl['reward']}")


def per_step_table(runs, args) -> pd.DataFrame:
    rows = []
    for name in SYSTEMS:
        for r, out in enumerate(runs.outputs[name]):
            rows.append({"step": args.warmup + r, "system": name, "step s": out["step_s"],
                         "rollout s": out["rollout_s"], "update s": out["update_s"],
                         "reward": out["reward"], "completion tokens": out["tokens"]})
    return pd.DataFrame(rows).sort_values(["step", "system"])


def system_table(runs, stats: pd.DataFrame) -> pd.DataFrame:
    """One row per system: medians over the timed steps; rollout share is over their sum."""
    rows = []
    for name in SYSTEMS:
        outs = runs.outputs[name]
        steps = [o["step_s"] for o in outs]
        rows.append({"system": name, "step s": statistics.median(steps),
                     "step min-max": f"{min(steps):.2f}-{max(steps):.2f}",
                     "rollout s": statistics.median(o["rollout_s"] for o in outs),
                     "update s": statistics.median(o["update_s"] for o in outs),
                     "rollout share": f"{sum(o['rollout_s'] for o in outs) / sum(steps):.0%}",
                     "mean reward": statistics.fmean(o["reward"] for o in outs),
                     "completion tokens": statistics.fmean(o["tokens"] for o in outs),
                     **ratio_cells(stats.loc[name], baseline=name == "trl"),
                     "spread_wide": bool(stats.loc[name, "spread_wide"])})
    return pd.DataFrame(rows)


def step_figures(runs, stats: pd.DataFrame) -> dict:
    """The result file's figures: the ratio TRL s / our s, and each system's step, rollout
    and update seconds over the timed steps (median, quartiles, range)."""
    figures = {"step_ratio": figure_from_stats(stats.loc["ours"], "x")}
    for name in SYSTEMS:
        for part in ("step", "rollout", "update"):
            seconds = pd.Series([o[f"{part}_s"] for o in runs.outputs[name]], dtype=float)
            figures[f"{name}_{part}_s"] = {
                "value": float(seconds.median()), "q25": float(seconds.quantile(0.25)),
                "q75": float(seconds.quantile(0.75)), "min": float(seconds.min()),
                "max": float(seconds.max()), "n": int(seconds.size), "unit": "s"}
    return figures


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5,
                    help="timed GRPO steps of each system (>= 3), alternating, order rotating")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed steps of each system first (lazy initialisation)")
    ap.add_argument("--prompts", type=int, default=16, help="P: prompts per step")
    ap.add_argument("--samples", type=int, default=8, help="G: completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="completion length cap")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="torch intra-op threads for both systems")
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="TRL as it ships: recompute activations in the backward")
    ap.add_argument("--wide", type=float, default=WIDE_SPREAD,
                    help="(max-min)/median of the per-step ratios above this is flagged")
    add_result(ap)
    return ap, ap.parse_args()


def main():
    ap, args = parse_args()
    trl_version = require_trl().__version__
    torch.set_num_threads(args.threads)
    rounds = args.warmup + args.steps
    policy, tok = load_model("default", device="cpu")
    pool = get_problems("running_sum", args.prompts * rounds, seed=RL_SEED)
    ours = ours_grpo(copy.deepcopy(policy), tok, pool, args)
    with tempfile.TemporaryDirectory() as out_dir:
        config = trl_config(args, out_dir, rounds, ours.config.train.clip_norm,
                            ours.config.train.betas[1])
        trl = TRLStepper(copy.deepcopy(policy), tok, trl_dataset(ours, rounds), config)
        # redo=0: a step cannot run again (each system's state moves on, and TRL's run has
        # exactly warmup + steps); a disturbed step is kept and counted in disturbed_share
        runs = interleave({"trl": trl.step, "ours": lambda: ours_step(ours)}, args.steps,
                          warmup=args.warmup, redo=0)
    check_same_prompts(runs, args)
    stats = summarize(runs, baseline="trl", wide=args.wide).set_index("system")
    table = system_table(runs, stats)
    print(f"\nOur GRPO vs TRL {trl_version} GRPOTrainer, default policy, "
          f"P={args.prompts} G={args.samples} max_new_tokens={args.max_new_tokens} "
          f"lr={args.lr:g} beta=0, 1 epoch, temperature 1.0; threads={torch.get_num_threads()}, "
          f"torch {torch.__version__}; {args.warmup} untimed + {args.steps} timed steps of each, "
          "alternating (order rotating); ratio = median of the per-step ratios TRL s / our s, "
          f"min-max and spread = (max-min)/median, WIDE above {args.wide:g}; same prompts "
          f"checked every step\n\nCommand:\n\n```bash\n{command_line(ap, args)}\n```")
    print_table("Per step (wall seconds)", per_step_table(runs, args))
    print_table("GRPO step, TRL vs ours (medians over the timed steps)",
                table.drop(columns="spread_wide"), table["spread_wide"], args.wide, "systems")
    record(args, f"Our GRPO step vs TRL {trl_version} GRPOTrainer's, same prompts: TRL seconds "
           f"over ours per step (median of per-step ratios), P={args.prompts} G={args.samples} "
           f"max_new_tokens={args.max_new_tokens}, {args.steps} timed steps, "
           f"threads={torch.get_num_threads()}", step_figures(runs, stats), "wall",
           disturbed_of(stats), headline=["step_ratio", "ours_step_s", "trl_step_s"])


if __name__ == "__main__":
    main()
