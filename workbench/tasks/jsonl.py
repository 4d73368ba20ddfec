"""User tasks from JSONL files: one ``{"prompt": ..., "answer": ...}`` object per line."""
from __future__ import annotations

import json
from pathlib import Path

from .base import Problem

__all__ = ["load_jsonl"]

_JSON_TYPES = {type(None): "null", bool: "true/false", list: "a list", dict: "an object"}


def _json_type(value) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _record_error(rec) -> str | None:
    """Why one parsed line is not a problem (None when it is)."""
    if not isinstance(rec, dict):
        return f"expected an object with 'prompt' and 'answer', got {_json_type(rec)}"
    missing = [k for k in ("prompt", "answer") if k not in rec]
    if missing:
        return f"missing key(s) {missing}; each line needs 'prompt' and 'answer'"
    prompt, answer = rec["prompt"], rec["answer"]
    if not isinstance(prompt, str) or not prompt:
        return f"'prompt' must be a non-empty string, got {json.dumps(prompt)}"
    numeric = isinstance(answer, (int, float)) and not isinstance(answer, bool)
    if not (numeric or (isinstance(answer, str) and answer.strip())):
        shown = "a blank string" if isinstance(answer, str) else _json_type(answer)
        return f"'answer' must be a non-empty string or a number, got {shown}"
    reference = rec.get("reference")
    if reference is not None and not isinstance(reference, str):
        return f"'reference' must be a string (or null for none), got {_json_type(reference)}"
    return None


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"JSONL task file not found: {str(path)!r}")
    try:
        return path.read_text(encoding="utf-8-sig").split("\n")  # not splitlines: U+2028 is valid JSON
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc}); a JSONL task file holds one JSON "
                         "object per line, UTF-8 encoded") from exc


def load_jsonl(path: str | Path) -> list[Problem]:
    """Problems from a JSONL file; every bad line is reported by its 1-based number.

    Blank lines are skipped. ``answer`` is a non-empty string or a number (kept as its text).
    Extra keys go into ``Problem.meta``; a ``reference`` key (a string, or null for none)
    becomes the worked solution.
    """
    path = Path(path)
    problems, errors = [], []
    for lineno, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"line {lineno}: not JSON ({e.msg})")
            continue
        error = _record_error(rec)
        if error:
            errors.append(f"line {lineno}: {error}")
            continue
        meta = {k: v for k, v in rec.items() if k not in ("prompt", "answer", "reference")}
        problems.append(Problem(prompt=rec["prompt"], answer=str(rec["answer"]),
                                reference=rec.get("reference") or "", uid=len(problems),
                                meta=meta))
    if errors:
        shown = "\n  ".join(errors[:20])
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise ValueError(f"{path}: {len(errors)} bad line(s):\n  {shown}{more}")
    if not problems:
        raise ValueError(f"{path}: the file holds no problems (it is empty or blank)")
    return problems
