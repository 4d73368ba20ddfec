"""Notebook 04 with a researcher's decoding arm: the worked example
(tests/plugins/confident_chain.py) loaded as a plugin and named in ``arms`` is pulled by TLT's
adaptive engine like a built-in arm, named in the written steps and learned tables, and the
coupled pair finds TLT's tokens equal to the baseline's (lossless); an unknown arm is refused
in the cell after the parameters, listing the registered kinds, before anything is written."""
import json
import re
from pathlib import Path

import pandas as pd
import papermill
import pytest

from workbench.rollout.timeline import Timeline
from workbench.speculative.arms import ARMS

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "04_tlt_rl.ipynb"
PLUGIN = ROOT / "tests" / "plugins" / "confident_chain.py"
ARM = "confident:k=4,p=0.3"
TINY = {"rl_problems": 32, "eval_problems": 4, "prompts_per_step": 2, "samples_per_prompt": 2,
        "max_new_tokens": 24, "steps": 1, "seeds": [0], "workers": 2, "explore_budget": 1.0,
        "divergence_steps": 1, "variants": ["baseline", "tlt"]}


def _run(tmp_path, **parameters):
    return papermill.execute_notebook(NOTEBOOK, tmp_path / "executed.ipynb",
                                      parameters={**TINY, **parameters}, kernel_name="python3",
                                      language="python", progress_bar=False, cwd=str(ROOT))


def test_notebook_04_runs_tlt_with_a_plugin_arm_losslessly(tmp_path):
    out = tmp_path / "run"
    _run(tmp_path, plugins=[str(PLUGIN)], arms=[ARM], out_dir=str(out))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["first_divergence_step"] == -1  # coupled: TLT's tokens are the baseline's
    steps = pd.concat([Timeline.load(folder).steps
                       for folder in sorted((out / "timelines").glob("tlt-seed0/step*"))])
    assert ARM in set(steps["arm"].dropna())
    assert set(steps["arm"].dropna()) <= {"plain", ARM}
    learned = pd.read_csv(out / "learned.csv")
    assert set(learned["best_sd"].dropna()) == {ARM}


def test_notebook_04_refuses_an_unknown_arm_before_anything_runs(tmp_path):
    out = tmp_path / "run"
    built_in = [n for n in ARMS.names() if n not in ARMS.plugin_names()]  # the kernel's kinds
    kinds = re.escape(repr(built_in))
    with pytest.raises(papermill.PapermillExecutionError,
                       match=rf"unknown SD strategy 'confident:k=4,p=0.3'.*registered arm "
                             rf"kinds: {kinds}"):
        _run(tmp_path, arms=[ARM], out_dir=str(out))  # no plugin
    assert not out.exists()
