"""Refusals that leave nothing behind (docs/design.md, "Bad input gets a clear error"): an
ablation's bad arguments and a Ray too small for its workers are refused, naming the value and
what is accepted, before a file is written or Ray started, so that the corrected call into the
same folder runs; the RL notebooks check their parameters in the cell after them; a policy
exported onto another architecture names the checkpoint, the model and what differs."""
import ast
import json
import sys
from argparse import Namespace
from pathlib import Path

import nbformat
import pytest
import ray
import torch

from workbench.checks import check_int, check_list
from workbench.models import save_model
from workbench.pipeline import run_pipeline
from workbench.ray_cluster import known_cpus
from workbench.rl.ablation.runner import check_ablation, run_ablation
from workbench.rl.ablation.store import SETTINGS_FILE
from workbench.rl.checkpoint import save_state
from workbench.rl.export import export_policy
from workbench.rollout.ray_backend import RayBackend

from .helpers.models import tiny_model
from .helpers.rl import PROBLEMS, length_reward, remedy_grpo

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_ray_start(monkeypatch):
    """Fails the test if anything calls ``ray.init``; afterwards, Ray is up only if it was."""
    was_up = ray.is_initialized()
    monkeypatch.setattr(ray, "init", lambda *a, **kw: pytest.fail("ray.init was called"))
    yield
    assert ray.is_initialized() == was_up


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _ablation(tokenizer, folder, steps=0, grpo=None, **kw):
    args = dict(variants=["baseline"], seeds=[0], reward=length_reward, progress=False,
                checkpoint_dir=folder, checkpoint_every=1)
    return run_ablation(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, grpo or remedy_grpo(),
                        steps, **{**args, **kw})


def _too_many_workers() -> int:
    """One worker more than the Ray this process would use has CPUs (one CPU each)."""
    return int(known_cpus(None)) + 1


@pytest.mark.parametrize("bad, match", [
    (dict(seeds=[]), r"seeds must be a non-empty list of integers in \[0, \d+\], each once, "
                     r"got \[\]"),
    (dict(variants=[]), r"variants must be a non-empty list of variants of \['baseline', .*\], "
                        r"each once, got \[\]"),
    (dict(seeds=[0, 0]), r"seeds must be .* each once, got \[0, 0\]"),
    (dict(seeds=[-1]), r"seeds\[0\] must be an integer in \[0, \d+\], got -1"),
    (dict(variants="baseline"), r"variants must be .* got 'baseline'"),
    (dict(variants=["baseline", "fast"]), r"variants\[1\] must be one of 'baseline', .* "
                                          r"got 'fast'"),
    (dict(spec_k=0), r"spec_k"),  # TLT's arguments: checked by building the runs
])
def test_bad_runs_are_refused_before_the_folder_is_made_and_the_corrected_call_runs(
        tokenizer, tmp_path, no_ray_start, bad, match):
    folder = tmp_path / "ablation"
    with pytest.raises(ValueError, match=match):
        _ablation(tokenizer, folder, **bad)
    assert _listing(tmp_path) == []  # no checkpoint folder, no ablation.json
    done = _ablation(tokenizer, folder)  # the corrected call, into the same folder
    assert done.history.empty and (folder / SETTINGS_FILE).is_file()


def test_a_local_ray_too_small_for_the_workers_is_refused_before_it_starts(
        tokenizer, tmp_path, no_ray_start):
    folder = tmp_path / "ablation"
    (folder).mkdir()
    (folder / "keep.txt").write_text("mine")  # an existing folder stays as it was too
    workers = _too_many_workers()
    need = rf"num_workers={workers} x threads_per_worker=1 need {workers} CPUs, but the local " \
           rf"Ray instance has {workers - 1}; accepted: at most {workers - 1} CPUs"
    for backend in ("ray", RayBackend()):  # by name, or the object notebook 04 shares
        with pytest.raises(ValueError, match=need):
            _ablation(tokenizer, folder, grpo=remedy_grpo(workers=workers), backend=backend)
        assert _listing(tmp_path) == ["ablation", "ablation/keep.txt"]
    with pytest.raises(ValueError, match=need):  # any caller's start: before ray.init
        RayBackend().start(lambda w: pytest.fail("an actor started"), num_workers=workers)
    _ablation(tokenizer, folder, grpo=remedy_grpo(workers=workers))  # corrected: the local backend
    assert json.loads((folder / SETTINGS_FILE).read_text())["backend"] == "local"


def test_a_clusters_cpus_are_known_only_once_attached(no_ray_start):
    if ray.is_initialized():
        pytest.skip("this process's Ray is up: its CPUs are known, whatever the address")
    assert known_cpus("127.0.0.1:1") is None
    RayBackend("127.0.0.1:1").check_fits(10_000)  # nothing to check against yet: start does


def test_check_ablation_refuses_what_run_ablation_refuses(no_ray_start):
    with pytest.raises(ValueError, match=r"seeds must be .* got \[\]"):
        check_ablation(1, ["baseline"], [], remedy_grpo())
    with pytest.raises(ValueError, match=r"checkpoint_every must be None or an integer >= 1, "
                                         r"got 0"):
        check_ablation(1, ["baseline"], [0], remedy_grpo(), checkpoint_every=0)
    with pytest.raises(ValueError, match=r"explore_budget"):
        check_ablation(1, ["baseline"], [0], remedy_grpo(), explore_budget=2)
    with pytest.raises(ValueError, match=r"need \d+ CPUs"):
        check_ablation(1, ["baseline"], [0], remedy_grpo(workers=_too_many_workers()), backend="ray")
    check_ablation(1, ["baseline", "tlt"], (0, 1), remedy_grpo(), backend="ray")


def test_check_list_names_the_list_or_the_item():
    assert check_list("xs", range(2), lambda n, x: check_int(n, x, 0), "integers") == [0, 1]
    for bad, match in (([], r"xs must be a non-empty list of integers, each once, got \[\]"),
                       ((1, 1), r"each once, got \(1, 1\)"), ("ab", "got 'ab'"),
                       ([0, -1], r"xs\[1\] must be an integer >= 0, got -1")):
        with pytest.raises(ValueError, match=match):
            check_list("xs", bad, lambda n, x: check_int(n, x, 0), "integers")


# ---- the notebooks: a check cell right after the parameters, calling check_ablation

NOTEBOOKS = ["03_adaptive_drafter", "04_tlt_rl", "11_long_tail_remedies"]


def _cells(name: str) -> tuple[str, str, list[str]]:
    """A notebook's parameters cell, its check cell (the cell after it, or after the cell
    that loads its ``plugins`` first, whose names the checks accept), and the code cells
    after that."""
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    i = next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
    j = i + 1 + ("load_plugins(plugins)" in code[i + 1].source)
    return code[i].source, code[j].source, [c.source for c in code[j + 1:]]


def _run_checks(name: str, tmp_path: Path, **overrides) -> None:
    """The notebook's parameters (``out_dir`` in ``tmp_path``) with ``overrides``, then its
    check cell, in this process."""
    parameters, checks, _ = _cells(name)
    scope: dict = {}
    exec(parameters, scope)
    scope.update(out_dir=str(tmp_path / "out"), **overrides)
    exec(checks, scope)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_an_rl_notebook_checks_its_parameters_in_the_cell_after_them(name, tmp_path,
                                                                     no_ray_start):
    _, checks, later = _cells(name)
    called = {ast.unparse(c.func) for c in ast.walk(ast.parse(checks)) if isinstance(c, ast.Call)}
    assert "check_ablation" in called
    assert "prepare_out_dir" not in checks and "prepare_out_dir" in "\n".join(later)
    _run_checks(name, tmp_path)  # its defaults pass
    bad = {"seed": -1} if name.startswith("03") else {"seeds": []}
    with pytest.raises(ValueError, match=r"seeds? must be .* got (\[\]|-1)"):
        _run_checks(name, tmp_path, **bad)
    if "backend" in _cells(name)[0]:  # notebook 11 runs on the local backend only
        with pytest.raises(ValueError, match=r"need \d+ CPUs"):
            _run_checks(name, tmp_path, workers=_too_many_workers(), backend="ray")
    assert _listing(tmp_path) == []


def test_notebook_04_checks_the_variants_and_the_coupled_pairs_steps(tmp_path, no_ray_start):
    with pytest.raises(ValueError, match=r"variants must be .* got \[\]"):
        _run_checks("04_tlt_rl", tmp_path, variants=[])
    with pytest.raises(ValueError, match=r"divergence_steps must be an integer >= 0, got -1"):
        _run_checks("04_tlt_rl", tmp_path, divergence_steps=-1)
    assert _listing(tmp_path) == []


# ---- callers beside the notebooks

def test_a_pipeline_on_a_local_ray_too_small_for_a_task_is_refused_before_it_starts(
        tmp_path, no_ray_start):
    if ray.is_initialized():
        pytest.skip("this process's Ray is up: the pipeline checks it as it is")
    threads = _too_many_workers()
    with pytest.raises(ValueError, match=rf"threads={threads}: each run's task needs {threads} "
                                         rf"CPUs on one node, but the largest node of the "
                                         rf"local Ray instance has {threads - 1}"):
        run_pipeline(ROOT / "pipelines" / "tlt.yaml", runs_root=tmp_path / "runs", ray=True,
                     threads=threads)
    assert _listing(tmp_path) == []


def test_gpu_check_refuses_its_arguments_before_writing_its_report(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("gpu_check", None)
    import gpu_check
    args = Namespace(prompts=8, batch_sizes=[1, 8], max_new_tokens=16, repeats=1, rl_steps=1,
                     rl_prompts=2, rl_samples=2, parts=[0, 3], budget=60.0)
    gpu_check.check_args(args)
    for bad, match in ((dict(rl_steps=0), r"--rl-steps must be an integer >= 1, got 0"),
                       (dict(batch_sizes=[]), r"--batch-sizes must be a non-empty list"),
                       (dict(batch_sizes=[16]), r"--batch-sizes\[0\] must be an integer in "
                                                r"\[1, 8\], got 16"),
                       (dict(parts=[5]), r"--parts\[0\] must be one of 0, 1, 2, 3, 4, got 5")):
        with pytest.raises(ValueError, match=match):
            gpu_check.check_args(Namespace(**{**vars(args), **bad}))
    out = tmp_path / "gpu_check.md"
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(out), "--rl-steps", "0"])
    with pytest.raises(ValueError, match="--rl-steps"):
        gpu_check.main()
    assert not out.exists()


# ---- export_policy: a checkpoint of another architecture

def test_a_policy_of_another_architecture_is_refused_naming_both_and_what_differs(
        tokenizer, tmp_path):
    llama = tiny_model("llama", tokenizer, dtype=torch.float32)
    checkpoint = save_state(tmp_path / "run", "tlt_state.pt", {
        "grpo": {"trainer": {"model": llama.state_dict()}, "rl_step": 3}})
    qwen = save_model(tiny_model("qwen2", tokenizer, dtype=torch.float32), tokenizer,
                      tmp_path / "qwen")
    small = save_model(tiny_model("llama", tokenizer, dtype=torch.float32, layers=1),
                       tokenizer, tmp_path / "small")
    before = _listing(tmp_path)
    with pytest.raises(ValueError, match=r"(?s)checkpoint '.*run/tlt_state.pt' holds a policy "
                                         r"of another architecture than model '.*qwen'.*"
                                         r"missing from the checkpoint: .*bias.*accepted: as "
                                         r"model, the policy the run started from"):
        export_policy(checkpoint, tmp_path / "policy", model=qwen)
    with pytest.raises(ValueError, match=r"(?s)model '.*small'.*not in the model: "
                                         r"model\.layers\.1\."):
        export_policy(checkpoint, tmp_path / "policy", model=small)
    assert _listing(tmp_path) == before
    llama_dir = save_model(llama, tokenizer, tmp_path / "llama")
    assert export_policy(checkpoint, tmp_path / "policy", model=llama_dir).is_dir()


@pytest.mark.parametrize("name, bad, message", [
    ("00_task_and_policy", {"num_problems": 0}, r"num_problems must be an integer >= 1, got 0"),
    ("01_long_tail_rollout", {"num_prompts": -2}, r"num_prompts must be an integer >= 1, got -2"),
    ("01_long_tail_rollout", {"task": "nope"}, r"unknown task 'nope'"),
    ("08_ray_scaling", {"idle_steps": 0}, r"idle_steps must be an integer >= 1, got 0"),
    ("08_ray_scaling", {"drafter": "ngram"}, r"speculative RL variants need an EAGLE head"),
])
def test_other_notebooks_check_their_parameters_before_any_cell_reads_them(
        name, bad, message, tmp_path, no_ray_start):
    _, checks, later = _cells(name)
    assert "prepare_out_dir" not in checks and "prepare_out_dir" in "\n".join(later)
    _run_checks(name, tmp_path)  # its defaults pass
    with pytest.raises(ValueError, match=message):
        _run_checks(name, tmp_path, **bad)
    assert _listing(tmp_path) == []
