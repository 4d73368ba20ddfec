"""What RL frameworks actually log, read into one shape: a ``StepLog``.

Why: the question "why didn't TLT pay on my cluster?" starts from the logs a run already
wrote, not from a new run. Each framework names the parts of a step its own way; this module
maps each to the same columns and names every field it could not find, so the diagnosis can
say what it could not decide without it. The formats and the files their keys come from are
in docs/diagnose.md.

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
- ``workbench``: a run folder of notebook 04 or 11 (``history.csv``: ``rollout_s``,
  ``update_sim_s``, ``step_s``, ``response_len``, ``response_len_max`` per variant, seed and
  step; the rollouts' saved timelines under ``timelines/<variant>-seed<seed>/step<NN>``).
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..rollout.timeline import Timeline

__all__ = ["StepLog", "read_logs", "read_verl", "read_openrlhf", "read_trl", "read_workbench",
           "FORMATS", "PARTS"]

FORMATS = ("verl", "openrlhf", "trl", "workbench")
OPTIONS = {"verl": ("rollout_dump",), "openrlhf": (), "trl": (), "workbench": ("variant", "seed")}
PARTS = ("rollout_s", "reward_s", "logprob_s", "update_s")  # a step's parts, in order
LENGTHS = ("response_mean", "response_max", "response_min")
CHARS_PER_TOKEN = 4.0
RUN_TIMELINES = "timelines/{variant}-seed{seed}"         # a run folder's saved timelines
CHECKPOINT_TIMELINES = "{variant}-seed{seed}/timelines"  # an ablation checkpoint_dir's  # a rollout dump without token counts: characters per token, estimated

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


@dataclass
class StepLog:
    """A run's steps as one table, whatever wrote them.

    ``steps``: one row per RL step: ``step``, the parts ``rollout_s``, ``reward_s``,
    ``logprob_s``, ``update_s`` (NaN where the logs hold none), ``step_s`` and
    ``other_s`` (the step less its known parts), the lengths ``response_mean``,
    ``response_max``, ``response_min`` (and ``clip_ratio``, ``requests`` where known).
    ``requests``: per-request lengths where the logs hold them (``step``,
    ``response_tokens``, optional ``prompt_tokens``, ``group``, ``worker``), else None.
    ``missing``: each field not found -> the key(s) it is read from, so a report names them.
    ``workers``: the rollout's workers where the logs tell it. ``timelines``: for a
    workbench run, each step's saved rollout timeline folder. ``notes``: what was assumed."""

    steps: pd.DataFrame
    format: str
    source: str
    requests: pd.DataFrame | None = None
    missing: dict[str, str] = field(default_factory=dict)
    workers: int | None = None
    timelines: list[Path] | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def has(self, column: str) -> bool:
        return column in self.steps and self.steps[column].notna().any()

    def means(self) -> dict[str, float]:
        """Each part's mean seconds over the steps, and the step's (NaN where unknown)."""
        return {c: float(self.steps[c].mean()) if self.has(c) else float("nan")
                for c in (*PARTS, "other_s", "step_s")}


# ---- reading rows ---------------------------------------------------------------------
def _bad(path, why: str, fmt: str) -> ValueError:
    return ValueError(f"cannot read {str(path)!r} as {fmt} logs: {why}; accepted: "
                      "docs/diagnose.md lists each format's files and keys")


def _rows(path: Path, fmt: str) -> pd.DataFrame:
    """A file of per-step rows: CSV, JSONL (flat rows, or veRL's ``{"step", "data"}``
    lines), or a JSON list / ``trainer_state.json`` (its ``log_history``)."""
    if not path.is_file():
        raise _bad(path, "no such file", fmt)
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(io.StringIO("\n".join(_lines(path))))
        if suffix == ".jsonl":
            records = [json.loads(line) for line in _lines(path)]
        elif suffix == ".json":
            loaded = json.loads(path.read_text())
            records = loaded.get("log_history", loaded) if isinstance(loaded, dict) else loaded
        else:
            raise _bad(path, f"suffix {suffix!r} is not one of '.csv', '.jsonl', '.json'", fmt)
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        if isinstance(exc, ValueError) and "cannot read" in str(exc):
            raise
        raise _bad(path, f"it does not parse ({exc})", fmt) from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise _bad(path, "it holds no list of per-step records", fmt)
    flat = [{**{k: v for k, v in r.items() if k != "data"}, **r["data"]}
            if isinstance(r.get("data"), dict) else r for r in records]
    return pd.DataFrame(flat)


def _lines(path: Path) -> list[str]:
    """The file's lines but blank ones and ``#`` comments (a fixture's header citing where
    its keys come from; no framework writes such a line)."""
    return [line for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _step_column(rows: pd.DataFrame, names: tuple[str, ...], path, fmt: str) -> pd.Series:
    for name in names:
        if name in rows:
            return pd.to_numeric(rows[name], errors="coerce")
    if len(rows):
        return pd.Series(np.arange(len(rows)), index=rows.index, dtype=float)
    raise _bad(path, "it holds no rows", fmt)


def _numeric(rows: pd.DataFrame, key: str) -> pd.Series:
    return pd.to_numeric(rows[key], errors="coerce") if key in rows else pd.Series(
        np.nan, index=rows.index)


def _finish(steps: pd.DataFrame) -> pd.DataFrame:
    """Add ``other_s`` (the step less its known parts, never below 0) and fill ``step_s``
    from the parts where the logs give no step time."""
    parts = steps[list(PARTS)]
    known = parts.sum(axis=1, min_count=1)
    if "step_s" not in steps or steps["step_s"].isna().all():
        steps["step_s"] = known
    steps["other_s"] = (steps["step_s"] - known.fillna(0)).clip(lower=0)
    steps["step"] = steps["step"].astype(int)
    return steps.sort_values("step").reset_index(drop=True)


# ---- veRL -------------------------------------------------------------------------------
def _dump_lengths(folder: Path) -> tuple[pd.DataFrame | None, list[str]]:
    """Per-request lengths of a veRL rollout dump (``<step>.jsonl`` files). A line's token
    count is its ``response_length`` (or ``response_tokens``) where the dump holds one (a
    reward function's extra info is dumped beside each line), else estimated from its
    ``output`` text at ``CHARS_PER_TOKEN`` characters per token (said in the notes)."""
    rows, estimated = [], 0
    for path in sorted(folder.glob("*.jsonl"), key=lambda p: (len(p.stem), p.stem)):
        for i, line in enumerate(_lines(path)):
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
            raise _bad(path, "the folder holds no metrics.jsonl or metrics.csv", "verl")
        if rollout_dump is None and (path / "rollout_data").is_dir():
            rollout_dump = path / "rollout_data"
        path = found[0]
    rows = _rows(path, "verl")
    if not any(str(c).startswith(("timing_s/", "response_length/")) for c in rows.columns):
        raise _bad(path, f"none of its keys is a veRL metric (timing_s/..., response_length/...); "
                   f"its keys: {sorted(map(str, rows.columns))[:12]}", "verl")
    steps = pd.DataFrame({"step": _step_column(rows, ("step", "training/global_step"),
                                               path, "verl")})
    missing = {}
    for part, keys in VERL_PARTS.items():
        present = [k for k in keys if k in rows]
        steps[part] = (sum(_numeric(rows, k).fillna(0) for k in present) if present
                       else np.nan)
        if not present:
            missing[part] = " + ".join(keys)
    steps["step_s"] = _numeric(rows, "timing_s/step")
    if "timing_s/step" not in rows:
        missing["step_s"] = "timing_s/step"
    for col, key in VERL_LENGTHS.items():
        steps[col] = _numeric(rows, key)
        if key not in rows and col in LENGTHS:
            missing[col] = key
    log = StepLog(_finish(steps), "verl", f"file {str(path)!r}", missing=missing)
    perf = ("perf/total_num_tokens", "perf/time_per_step", "perf/throughput")
    if all(k in rows for k in perf):  # throughput = tokens / (time x n_gpus)
        gpus = (_numeric(rows, perf[0]) / (_numeric(rows, perf[1]) * _numeric(rows, perf[2])))
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


# ---- OpenRLHF, TRL ---------------------------------------------------------------------
def _lengths_only(path, fmt: str, lengths: dict, step_keys: tuple, parts_source: str,
                  marker: str) -> StepLog:
    rows = _rows(Path(path), fmt)
    if not any(k in rows for k in lengths.values()):
        raise _bad(path, f"none of its keys is one of {fmt}'s ({sorted(lengths.values())}); "
                   f"its keys: {sorted(map(str, rows.columns))[:12]}", fmt)
    steps = pd.DataFrame({"step": _step_column(rows, step_keys, path, fmt)})
    missing = {p: parts_source for p in PARTS}
    missing["step_s"] = parts_source
    for col, key in lengths.items():
        steps[col] = _numeric(rows, key)
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
    return StepLog(_finish(steps), fmt, f"file {str(path)!r}", missing=missing,
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


# ---- the workbench's own run folders ----------------------------------------------------
def read_workbench(folder: str | os.PathLike, variant: str = "baseline",
                   seed: int | None = None) -> StepLog:
    """A run folder of notebook 04 or 11 (``history.csv``; the saved timelines where there
    are some): ``variant``'s steps of ``seed`` (default: the first seed whose timelines are
    saved, else the first in the history). Its ``extra`` holds the whole history, so the
    diagnosis can set each variant's measured speedup beside its prediction."""
    folder = Path(folder)
    history = folder / "history.csv"
    if not history.is_file():
        if (folder / "ablation.json").is_file():
            return _read_checkpoint(folder, variant, seed)
        raise _bad(folder, "no history.csv in it (notebook 04 or 11 writes one into out_dir) "
                   "and no ablation.json (an ablation's checkpoint_dir)", "workbench")
    h = pd.read_csv(history)
    if variant not in set(h.get("variant", [])):
        raise ValueError(f"variant {variant!r} is not in {str(history)!r}; its variants: "
                         f"{sorted(set(h.get('variant', [])))}")
    saved = sorted(folder.glob(f"timelines/{variant}-seed*"))
    if seed is None:
        seeds = [int(p.name.rsplit("seed", 1)[1]) for p in saved] or sorted(h["seed"].unique())
        seed = int(seeds[0])
    mine = h[(h["variant"] == variant) & (h["seed"] == seed)]
    if not len(mine):
        raise ValueError(f"no steps of {variant!r} seed {seed} in {str(history)!r}; its seeds: "
                         f"{sorted(h.loc[h['variant'] == variant, 'seed'].unique().tolist())}")
    update = mine["update_sim_s"] if "update_sim_s" in mine else mine["update_s"]
    steps = pd.DataFrame({"step": mine["step"].to_numpy(), "rollout_s": mine["rollout_s"].to_numpy(),
                          "reward_s": np.nan, "logprob_s": np.nan,
                          "update_s": update.to_numpy(), "step_s": mine["step_s"].to_numpy(),
                          "response_mean": _column(mine, "response_len"),
                          "response_max": _column(mine, "response_len_max"),
                          "response_min": np.nan})
    missing = {"reward_s": "the workbench's history counts the reward inside the rollout",
               "logprob_s": "the workbench's history counts log-probs inside the update",
               "response_min": "response_len_min (not in history.csv)"}
    log = StepLog(_finish(steps), "workbench", f"run folder {str(folder)!r}", missing=missing,
                  extra={"history": h, "variant": variant, "seed": seed, "folder": folder,
                         "timeline_dir": RUN_TIMELINES})
    if {"drafter_train_s", "drafter_steps"} <= set(h) and h["drafter_steps"].sum() > 0:
        log.extra["drafter_step_s"] = float(h["drafter_train_s"].sum() / h["drafter_steps"].sum())
        log.notes.append(f"a drafter step takes {log.extra['drafter_step_s']:.4g} s "
                         "(drafter_train_s / drafter_steps of the history)")
    where = folder / "timelines" / f"{variant}-seed{seed}"
    if where.is_dir():
        log.timelines = sorted(where.glob("step*"))
        log.notes.append(f"per-request lengths and workers from {len(log.timelines)} saved "
                         f"timelines under {str(where)!r}")
    else:
        missing["requests"] = f"saved timelines under {str(where)!r}"
    return log


def _read_checkpoint(folder: Path, variant: str, seed: int | None) -> StepLog:
    """An ablation's ``checkpoint_dir`` (``ablation.json``; each run's saved timelines under
    ``<variant>-seed<seed>/timelines/step<NNNN>``): the rollouts alone, each step's makespan
    its rollout time; the update's time is in the run folder's history.csv, not here."""
    saved = sorted(folder.glob(f"{variant}-seed*/timelines"))
    if not saved:
        raise ValueError(f"no saved timelines of {variant!r} in the checkpoint folder "
                         f"{str(folder)!r}; its runs: {sorted(p.name for p in folder.glob('*-seed*'))}")
    seed = int(saved[0].parent.name.rsplit("seed", 1)[1]) if seed is None else seed
    where = folder / CHECKPOINT_TIMELINES.format(variant=variant, seed=seed)
    paths = sorted(where.glob("step*"))
    if not paths:
        raise ValueError(f"no saved timelines of {variant!r} seed {seed} under {str(where)!r}")
    rows = []
    for p in paths:
        t = Timeline.load(p)
        lengths = t.requests["response_tokens"]
        rows.append({"step": int(p.name.removeprefix("step")), "rollout_s": t.makespan_s,
                     "reward_s": np.nan, "logprob_s": np.nan, "update_s": np.nan,
                     "step_s": np.nan, "response_mean": float(lengths.mean()),
                     "response_max": float(lengths.max()), "response_min": float(lengths.min())})
    why = "the checkpoint folder holds the rollouts' timelines alone (the run folder's history.csv holds the step times)"
    missing = {"reward_s": why, "logprob_s": why, "update_s": why, "step_s": why}
    return StepLog(_finish(pd.DataFrame(rows)), "workbench", f"checkpoint folder {str(folder)!r}",
                   missing=missing, timelines=paths,
                   extra={"variant": variant, "seed": seed, "folder": folder,
                          "timeline_dir": CHECKPOINT_TIMELINES},
                   notes=[f"rollout times and lengths from {len(paths)} saved timelines"])


def _column(rows: pd.DataFrame, name: str):
    return rows[name].to_numpy(float) if name in rows else np.nan


def read_logs(path: str | os.PathLike, format: str | None = None, **options) -> StepLog:
    """Read ``path`` as ``format`` (one of ``FORMATS``); without one, guessed: a folder
    with ``history.csv`` is a workbench run, ``trainer_state.json`` is TRL's, keys starting
    ``timing_s/`` or ``response_length/`` are veRL's, ``train/`` OpenRLHF's,
    ``completions/`` TRL's. ``options`` go to the format's reader."""
    if format is not None and format not in FORMATS:
        raise ValueError(f"format {format!r} is unknown; accepted: {list(FORMATS)}")
    path = Path(path)
    if not path.exists():
        raise ValueError(f"logs {str(path)!r} do not exist; accepted: a file or folder of "
                         f"one of the formats {list(FORMATS)} (docs/diagnose.md)")
    format = format or _guess(path)
    options = {k: v for k, v in options.items() if v is not None}
    accepted = OPTIONS[format]
    if set(options) - set(accepted):
        raise ValueError(f"{sorted(set(options) - set(accepted))} is no option of the "
                         f"{format} format; its options: {list(accepted)}")
    reader = {"verl": read_verl, "openrlhf": read_openrlhf, "trl": read_trl,
              "workbench": read_workbench}[format]
    return reader(path, **options)


def _guess(path: Path) -> str:
    if path.is_dir():
        if (path / "history.csv").is_file() or (path / "ablation.json").is_file():
            return "workbench"
        if (path / "trainer_state.json").is_file():
            return "trl"
        if any((path / n).is_file() for n in ("metrics.jsonl", "metrics.csv")):
            return "verl"
    elif path.name == "trainer_state.json":
        return "trl"
    else:
        keys = " ".join(map(str, _rows(path, "any format").columns))
        for prefix, fmt in (("timing_s/", "verl"), ("response_length/", "verl"),
                            ("completions/", "trl"), ("train/", "openrlhf")):
            if prefix in keys:
                return fmt
    raise ValueError(f"cannot tell the format of {str(path)!r}; pass one of {list(FORMATS)}")
