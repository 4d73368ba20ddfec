"""User tasks from JSONL files: one ``{"prompt": ..., "answer": ...}`` object per line."""
from __future__ import annotations

import json
from pathlib import Path

from .base import Problem

__all__ = ["load_jsonl"]


def load_jsonl(path: str | Path) -> list[Problem]:
    """Problems from a JSONL file; every bad line is reported by its 1-based number.

    Blank lines are skipped. Extra keys go into ``Problem.meta``; a ``reference`` key, if
    present, becomes the worked solution.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"JSONL task file not found: {str(path)!r}")
    problems, errors = [], []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                errors.append(f"line {lineno}: not JSON ({e.msg})")
                continue
            if not isinstance(rec, dict):
                errors.append(f"line {lineno}: expected an object with 'prompt' and 'answer', "
                              f"got {type(rec).__name__}")
                continue
            missing = [k for k in ("prompt", "answer") if k not in rec]
            if missing:
                errors.append(f"line {lineno}: missing key(s) {missing}; each line needs "
                              "'prompt' and 'answer'")
                continue
            if not isinstance(rec["prompt"], str) or not rec["prompt"]:
                errors.append(f"line {lineno}: 'prompt' must be a non-empty string")
                continue
            meta = {k: v for k, v in rec.items() if k not in ("prompt", "answer", "reference")}
            problems.append(Problem(prompt=rec["prompt"], answer=str(rec["answer"]),
                                    reference=str(rec.get("reference", "")),
                                    uid=len(problems), meta=meta))
    if errors:
        shown = "\n  ".join(errors[:20])
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise ValueError(f"{path}: {len(errors)} bad line(s):\n  {shown}{more}")
    if not problems:
        raise ValueError(f"{path}: the file holds no problems (it is empty or blank)")
    return problems
