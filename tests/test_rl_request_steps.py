"""The per-request, per-step table (``Timeline.request_steps``) recorded in RL runs when
``GRPOConfig.request_steps`` asks: off by default; on, every step's saved timeline of an
ablation (notebook 04's ``timelines/<variant>-seed<k>/step<NN>``) carries it, in agreement
with its requests table, and ``workbench timeline export`` puts its rows in the Chrome
trace. Recording changes no token; the config's repr (what a resumed run is checked
against) does not name it; the remedies, whose cut timelines would drop it, refuse it."""
import json

import pandas as pd
import pytest

from workbench.cli import main
from workbench.rl import GRPOConfig
from workbench.rl.ablation.runner import run_ablation
from workbench.rl.variants import remedy_config
from workbench.rollout.chrome_trace import read_chrome_trace
from workbench.rollout.timeline import Timeline
from workbench.speculative import EagleHead
from workbench.tasks import Problem

from .helpers.models import MANY, tiny_model

VARIANTS = ["baseline", "tlt"]
STEPS = 2


def _reward(prompt, completion, answer):
    return completion.count("a") / max(1, len(completion))


def _grpo(**kw) -> GRPOConfig:
    return GRPOConfig.flat(prompts_per_step=3, samples_per_prompt=2, max_new_tokens=16,
                           lr=1e-2, workers=2, max_batch_size=3, temperature=1.0,
                           spec_mode="coupled", **kw)


def _saved(tokenizer, folder, **kw):
    """A 2-step ablation of the baseline and TLT, its first seed's timelines saved under
    ``folder/timelines`` (notebook 04's layout)."""
    policy = tiny_model("llama", tokenizer, seed=4)
    problems = [Problem(prompt=p, answer="a", uid=i) for i, p in enumerate(MANY)]
    ab = run_ablation(policy, tokenizer, problems, _grpo(**kw), STEPS, variants=VARIANTS,
                      seeds=[0], drafter_head=EagleHead(policy), reward=_reward,
                      progress=False, spec_k=2, explore_budget=0.5)
    ab.save_timelines(folder / "timelines", seeds=[0])
    return ab


@pytest.fixture(scope="module")
def runs(tokenizer, tmp_path_factory):
    """``{"on": (ablation, folder), "off": ...}``: the same ablation with and without the
    table."""
    out = {}
    for name, kw in {"on": {"request_steps": True}, "off": {}}.items():
        folder = tmp_path_factory.mktemp(name)
        out[name] = (_saved(tokenizer, folder, **kw), folder)
    return out


def _steps(folder, variant):
    return sorted((folder / "timelines" / f"{variant}-seed0").glob("step*"))


def test_it_is_off_by_default_and_not_in_the_configs_repr():
    assert GRPOConfig().request_steps is False
    assert "request_steps" not in repr(_grpo(request_steps=True))
    assert repr(_grpo(request_steps=True)) == repr(_grpo())  # a resume checks this repr
    with pytest.raises(ValueError, match="GRPOConfig.request_steps"):
        _grpo(request_steps="yes")


def test_every_saved_step_carries_the_table_in_agreement_with_its_requests(runs):
    ablation, folder = runs["on"]
    for variant in VARIANTS:
        saved = _steps(folder, variant)
        assert len(saved) == STEPS
        for path in saved:
            assert (path / "request_steps.parquet").exists()
            tl = Timeline.load(path)
            rs, req = tl.request_steps, tl.requests.set_index("uid")
            assert rs is not None and len(rs) > 0
            summed = rs.groupby("uid")["tokens"].sum().reindex(req.index).fillna(0)
            assert (summed.astype(int) == req["response_tokens"]).all(), path
            verify = rs[rs["kind"] == "verify"]
            accepted = verify.groupby("uid")["accepted"].sum().reindex(req.index).fillna(0)
            assert (accepted.astype(int) == req["accepted"]).all(), path
    tlt = pd.concat([Timeline.load(p).request_steps for p in _steps(folder, "tlt")])
    assert (tlt["kind"] == "verify").any() and {"arm", "explored"} <= set(tlt.columns)


def test_off_it_is_absent_and_recording_changes_no_token(runs):
    on, _ = runs["on"]
    off, folder = runs["off"]
    for variant in VARIANTS:
        for path in _steps(folder, variant):
            assert not (path / "request_steps.parquet").exists()
            assert Timeline.load(path).request_steps is None
    key = ["variant", "seed", "step"]
    pd.testing.assert_frame_equal(on.history[key + ["tokens_digest"]],
                                  off.history[key + ["tokens_digest"]])


def test_the_cli_export_holds_the_request_step_slices(runs, tmp_path, capsys):
    _, folder = runs["on"]
    run = folder / "timelines" / "tlt-seed0"
    out = tmp_path / "trace.json"
    assert main(["timeline", "export", str(run), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    events = json.loads(out.read_text())["traceEvents"]
    slices = [e for e in events if e.get("cat", "").startswith("request_step")]
    saved = {p.name: Timeline.load(p) for p in _steps(folder, "tlt")}
    assert len(slices) == sum(len(tl.request_steps) for tl in saved.values())
    assert {"uid", "tokens", "accepted", "drafted", "start_s", "end_s"} <= set(slices[0]["args"])
    for name, tl in saved.items():  # read back from the trace: the same table
        pd.testing.assert_frame_equal(read_chrome_trace(out, name).request_steps,
                                      tl.request_steps)
    _, plain = runs["off"]
    bare = tmp_path / "bare.json"
    assert main(["timeline", "export", str(plain / "timelines" / "tlt-seed0"),
                 "--out", str(bare)]) == 0
    assert not any(e.get("cat", "").startswith("request_step")
                   for e in json.loads(bare.read_text())["traceEvents"])


def test_the_remedies_refuse_it():
    with pytest.raises(ValueError, match="request_steps=True: the remedies' sampler"):
        remedy_config("partial", _grpo(request_steps=True))
    remedy_config("partial", _grpo())


def test_notebook_04s_explorer_exports_it_with_the_shown_step(runs, tmp_path):
    """Notebook 04's last cell: the explorer on the run folder, at the last saved step; its
    export button writes the step's trace with the table's slices."""
    import matplotlib
    matplotlib.use("Agg")
    from workbench.viz.timeline_explorer import TimelineExplorer
    _, folder = runs["on"]
    last = _steps(folder, "tlt")[-1]
    (folder / "metrics.json").write_text("{}")  # the notebook's: marks the folder a run
    explorer = TimelineExplorer(folder, step=last.relative_to(folder).as_posix())
    explorer.export_path.value = str(tmp_path / "shown.json")
    explorer.export_button.click()
    assert "wrote" in explorer.export_status.value
    pd.testing.assert_frame_equal(read_chrome_trace(tmp_path / "shown.json").request_steps,
                                  Timeline.load(last).request_steps)
