"""What veRL, OpenRLHF and TRL actually log, read into a ``StepLog``.

The formats and the files their keys come from (docs/diagnose.md lists them too):

- ``verl``: veRL's per-step metrics (``verl/trainer/ppo/metric_utils.py``:
  ``compute_timing_metrics`` writes ``timing_s/<name>`` for every timer of
  ``verl/trainer/ppo/ray_trainer.py``'s ``fit``: ``gen``, ``reward``, ``old_log_prob``,
  ``ref``, ``values``, ``adv``, ``update_critic``, ``update_actor``, ``step``;
  ``compute_data_metrics`` writes ``response_length/mean|max|min|clip_ratio`` and
  ``prompt_length/mean``; ``compute_throughout_metrics`` writes ``perf/total_num_tokens``,
  ``perf/time_per_step`` and ``perf/throughput``). As its file logger writes them
  (``verl/utils/tracking.py``: JSONL lines ``{"step": N, "data": {...}}``) or flat (one
  row per step, a ``step`` or ``training/global_step`` column: a CSV or JSONL export).
  Per-request lengths from a rollout dump (``trainer.rollout_data_dir``: one
  ``<step>.jsonl`` per step, ``ray_trainer.py``'s ``_dump_generations``, keys ``input``,
  ``output``, ``score``, ``step``).
- ``openrlhf``: OpenRLHF's training logs (``openrlhf/trainer/ppo_utils/loggers.py`` prefixes
  every key with ``train/``; ``openrlhf/trainer/ppo_trainer.py`` logs the experience's
  ``response_length``, ``total_length``, ``reward`` and ``train/global_step``): lengths only,
  no time per part of the step.
- ``trl``: TRL's GRPO logs (``trl/trainer/grpo_trainer.py``: ``completions/mean_length``,
  ``completions/min_length``, ``completions/max_length``, ``completions/clipped_ratio``,
  ``reward``), as the Trainer saves them (``trainer_state.json``'s ``log_history``) or as
  JSONL/CSV rows: lengths only.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from .log_rows import bad_logs, data_lines, numeric_column, read_rows, step_column
from .steplog import LENGTHS, PARTS, StepLog, finish_steps

__all__ = ["read_verl", "read_openrlhf", "read_trl"]

CHARS_PER_TOKEN = 4.0  # a rollout dump without token counts: characters per token, estimated

# veRL: each canonical part is the sum of these timing_s/ keys (those present)
VERL_PARTS = {"rollout_s": ("timing_s/gen",),
              "reward_s": ("timing_s/reward",),
              "logprob_s": ("timing_s/old_log_prob", "timing_s/ref", "timing_s/values"),
              "update_s": ("timing_s/adv", "timing_s/update_critic", "timing_s/update_actor")}
VERL_LENGTHS = {"response_mean": "response_length/mean", "response_max": "response_length/max",
                "response_min": "response_length/min", "clip_ratio": "response_length/clip_ratio",
                "prompt_mean": "prompt_length/mean"}
OPENRLHF_LENGTHS = {"response_mean": "train/response_length",
                    "total_mean": "train/total_length"}
TRL_LENGTHS = {"response_mean": "completions/mean_length", "response_max": "completions/max_length",
               "response_min": "completions/min_length", "clip_ratio": "completions/clipped_ratio"}


# ---- veRL -------------------------------------------------------------------------------
def _dump_lengths(folder: Path) -> tuple[pd.DataFrame | None, list[str]]:
    """Per-request lengths of a veRL rollout dump (``<step>.jsonl`` files). A line's token
    count is its ``response_length`` (or ``response_tokens``) where the dump holds one (a
    reward function's extra info is dumped beside each line), else estimated from its
    ``output`` text at ``CHARS_PER_TOKEN`` characters per token (said in the notes)."""
    rows, estimated = [], 0
    for path in sorted(folder.glob("*.jsonl"), key=lambda p: (len(p.stem), p.stem)):
        for i, line in enumerate(data_lines(path)):
            entry = json.loads(line)
            tokens = entry.get("response_length", entry.get("response_tokens"))
            if tokens is None:
                tokens = max(1, round(len(str(entry.get("output", ""))) / CHARS_PER_TOKEN))
                estimated += 1
            step = entry.get("step", path.stem)
            rows.append({"step": int(step), "response_tokens": int(tokens),
                         "prompt_tokens": int(entry.get("prompt_length", 0)),
                         "group": str(entry.get("uid", entry.get("input", i)))})
    if not rows:
        return None, [f"rollout dump {str(folder)!r} holds no <step>.jsonl lines"]
    notes = [f"{estimated} of {len(rows)} dumped responses carry no token count "
             f"(response_length): estimated from their text at {CHARS_PER_TOKEN:g} "
             "characters per token"] if estimated else []
    return pd.DataFrame(rows), notes


def read_verl(path: str | os.PathLike, rollout_dump: str | os.PathLike | None = None) -> StepLog:
    """veRL's per-step metrics (module docstring): a metrics file, or a folder holding
    ``metrics.jsonl`` / ``metrics.csv``; per-request lengths from ``rollout_dump`` (default:
    the folder's ``rollout_data/`` where there is one)."""
    path = Path(path)
    if rollout_dump is not None and not Path(rollout_dump).is_dir():
        raise ValueError(f"rollout dump {str(rollout_dump)!r} is no folder; accepted: veRL's "
                         "trainer.rollout_data_dir, a folder of <step>.jsonl files")
    if path.is_dir():
        found = [path / n for n in ("metrics.jsonl", "metrics.csv") if (path / n).is_file()]
        if not found:
            raise bad_logs(path, "the folder holds no metrics.jsonl or metrics.csv", "verl")
        if rollout_dump is None and (path / "rollout_data").is_dir():
            rollout_dump = path / "rollout_data"
        path = found[0]
    rows = read_rows(path, "verl")
    if not any(str(c).startswith(("timing_s/", "response_length/")) for c in rows.columns):
        raise bad_logs(path, "none of its keys is a veRL metric (timing_s/..., "
                       f"response_length/...); its keys: {sorted(map(str, rows.columns))[:12]}",
                       "verl")
    steps = pd.DataFrame({"step": step_column(rows, ("step", "training/global_step"),
                                               path, "verl")})
    missing = {}
    for part, keys in VERL_PARTS.items():
        present = [k for k in keys if k in rows]
        steps[part] = (sum(numeric_column(rows, k).fillna(0) for k in present) if present
                       else np.nan)
        if not present:
            missing[part] = " + ".join(keys)
    steps["step_s"] = numeric_column(rows, "timing_s/step")
    if "timing_s/step" not in rows:
        missing["step_s"] = "timing_s/step"
    for col, key in VERL_LENGTHS.items():
        steps[col] = numeric_column(rows, key)
        if key not in rows and col in LENGTHS:
            missing[col] = key
    log = StepLog(finish_steps(steps), "verl", f"file {str(path)!r}", missing=missing)
    perf = ("perf/total_num_tokens", "perf/time_per_step", "perf/throughput")
    if all(k in rows for k in perf):  # throughput = tokens / (time x n_gpus)
        gpus = (numeric_column(rows, perf[0]) / (numeric_column(rows, perf[1]) * numeric_column(rows, perf[2])))
        if gpus.notna().any():
            log.workers = int(round(float(gpus.median())))
            log.notes.append(f"GPUs {log.workers}: perf/total_num_tokens / (perf/time_per_step"
                             " x perf/throughput)")
    else:
        missing["workers"] = " and ".join(perf)
    if rollout_dump is not None:
        log.requests, notes = _dump_lengths(Path(rollout_dump))
        log.notes += notes
    if log.requests is None:
        missing["requests"] = "a rollout dump (trainer.rollout_data_dir: <step>.jsonl files)"
    else:
        counts = log.requests.groupby("step").size()
        log.steps["requests"] = log.steps["step"].map(counts)
    return log


def _lengths_only(path, fmt: str, lengths: dict, step_keys: tuple, parts_source: str,
                  marker: str) -> StepLog:
    rows = read_rows(Path(path), fmt)
    if not any(k in rows for k in lengths.values()):
        raise bad_logs(path, f"none of its keys is one of {fmt}'s ({sorted(lengths.values())}); "
                       f"its keys: {sorted(map(str, rows.columns))[:12]}", fmt)
    steps = pd.DataFrame({"step": step_column(rows, step_keys, path, fmt)})
    missing = {p: parts_source for p in PARTS}
    missing["step_s"] = parts_source
    for col, key in lengths.items():
        steps[col] = numeric_column(rows, key)
        if key not in rows and col in LENGTHS:
            missing[col] = key
    for col in LENGTHS:
        if col not in steps:
            steps[col] = np.nan
            missing.setdefault(col, f"not in {fmt}'s logs")
    for part in PARTS:
        steps[part] = np.nan
    steps = steps.dropna(subset=[c for c in lengths if c in steps], how="all")
    missing["requests"] = "per-request lengths (not in these logs)"
    missing["workers"] = "the number of rollout workers (not in these logs)"
    return StepLog(finish_steps(steps), fmt, f"file {str(path)!r}", missing=missing,
                   notes=[f"{marker} logs hold lengths, not the time of each part of a step"])


def read_openrlhf(path: str | os.PathLike) -> StepLog:
    """OpenRLHF's ``train/...`` logs (module docstring): lengths, no part times."""
    return _lengths_only(path, "openrlhf", OPENRLHF_LENGTHS,
                         ("train/global_step", "global_step", "step"),
                         "no per-part time in OpenRLHF's logs (openrlhf/trainer/ppo_trainer.py)",
                         "OpenRLHF's")


def read_trl(path: str | os.PathLike) -> StepLog:
    """TRL's GRPO logs (module docstring): lengths, no part times."""
    path = Path(path)
    if path.is_dir():
        path = path / "trainer_state.json"
    return _lengths_only(path, "trl", TRL_LENGTHS, ("step", "global_step"),
                         "no per-part time in TRL's logs (trl/trainer/grpo_trainer.py)", "TRL's")
