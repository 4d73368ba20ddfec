"""``backend="ray"`` where users pick it, on one local 2-CPU Ray for the module: GRPO takes the
same tokens and the same updates as on the local backend (new weights reach the actors before
each rollout), the ablation's runs take turns on one set of actors, a bad name is refused
before anything starts, ``run_pipeline(ray=True)`` gives the local pipeline's table, and the
RL notebooks declare the parameter."""
import ast
import copy
from pathlib import Path

import nbformat
import papermill
import pytest
import ray
import torch
from nbformat.v4 import new_code_cell

from workbench.pipeline import run_pipeline
from workbench.ray_cluster import connect
from workbench.rl import GRPO, GRPOConfig
from workbench.rl import ablation
from workbench.rl.ablation import run_ablation
from workbench.rollout import RayBackend, RolloutEngine, make_backend

from .conftest import tiny_model
from .test_grpo import _letters_reward, _problems
from .test_pipeline import project, write_pipeline  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = GRPOConfig.flat(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=10, lr=1e-2,
                         temperature=1.0, workers=2, seed=1)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray for the module (2 CPUs, 127.0.0.1): every backend and pipeline of the
    tests reuses it and leaves it up; it shuts down at the module's end."""
    assert connect(None, num_cpus=2)
    yield
    ray.shutdown()


def _grpo_steps(tokenizer, backend, steps=2):
    """``steps`` GRPO steps on a tiny float64 policy: each step's tokens, the GRPO, and the
    backend's weight pushes (with what the actors held when the rollout after each ran)."""
    model = tiny_model("llama", tokenizer)
    g = GRPO(model, tokenizer, _problems(), _letters_reward, CONFIG, backend=backend)
    pushes, tokens, after_update = [], [], None
    push = g.engine.backend.update_weights
    g.engine.backend.update_weights = lambda **kw: pushes.append(kw) or push(**kw)
    for _ in range(steps):
        rl = g.rollout()
        tokens.append(rl.result.tokens)
        if after_update is not None:  # the actors decoded with the updated policy
            held = g.engine.backend.map(lambda w, _: w.model.state_dict(), [None, None])
            assert all(torch.equal(h[k], v) for h in held for k, v in after_update.items())
        g.update(rl)
        after_update = copy.deepcopy(model.state_dict())
    return tokens, g, pushes


def test_grpo_on_ray_takes_the_local_tokens_and_updates(tokenizer):
    local_tokens, local, _ = _grpo_steps(tokenizer, "local")
    ray_tokens, on_ray, pushes = _grpo_steps(tokenizer, "ray")
    assert ray_tokens == local_tokens and ray_tokens[0] != ray_tokens[1]
    for a, b in zip(local.model.state_dict().values(), on_ray.model.state_dict().values()):
        assert torch.equal(a, b)
    assert [row["clock"] for row in on_ray.rows] == ["wall", "wall"]
    assert [row["clock"] for row in local.rows] == ["sim", "sim"]
    assert [set(p) for p in pushes] == [{"policy"}]  # once, before the second rollout
    assert isinstance(on_ray.engine.backend, RayBackend) and on_ray.engine.backend.num_workers == 2
    on_ray.close()  # the actors go; the module's Ray stays (the backend did not start it)
    assert on_ray.engine.backend.num_workers == 0 and ray.is_initialized()


def test_ablation_runs_take_turns_on_one_set_of_actors(tokenizer, monkeypatch):
    policy = tiny_model("llama", tokenizer)
    starts = []
    real_start = RayBackend.start
    monkeypatch.setattr(RayBackend, "start",
                        lambda self, *a, **kw: starts.append(self) or real_start(self, *a, **kw))
    kw = dict(variants=["baseline"], seeds=[0, 1], reward=_letters_reward, progress=False)
    local = run_ablation(policy, tokenizer, _problems(), CONFIG, 2, **kw)
    on_ray = run_ablation(policy, tokenizer, _problems(), CONFIG, 2, backend="ray", **kw)
    assert len(starts) == 1  # one backend, started once, for both seeds
    assert starts[0].num_workers == 0 and ray.is_initialized()  # closed at the end
    columns = ["variant", "seed", "step", "reward", "tokens", "response_len"]
    assert on_ray.history[columns].equals(local.history[columns])
    for key, run in local.trainers.items():
        for a, b in zip(run.model.state_dict().values(),
                        on_ray.trainers[key].model.state_dict().values()):
            assert torch.equal(a, b)


def test_a_bad_backend_is_refused_naming_it_before_anything_starts(tokenizer, monkeypatch):
    model = tiny_model("llama", tokenizer)
    accepted = r"backend must be one of \['local', 'ray'\] or a backend object, got 'spark'"
    with pytest.raises(ValueError, match=accepted):
        GRPO(model, tokenizer, _problems(), _letters_reward, CONFIG, backend="spark")
    monkeypatch.setattr(ablation, "TLTTrainer", lambda *a, **kw: pytest.fail("a run was built"))
    with pytest.raises(ValueError, match=accepted):
        run_ablation(model, tokenizer, _problems(), CONFIG, 1, variants=["baseline"],
                     backend="spark")
    with pytest.raises(ValueError, match=r"the Ray address '127.0.0.1:1' given with "
                                         r"backend='local'"):
        run_ablation(model, tokenizer, _problems(), CONFIG, 1, variants=["baseline"],
                     ray_address="127.0.0.1:1")
    with pytest.raises(ValueError, match="address must be None .* got 'nowhere'"):
        GRPO(model, tokenizer, _problems(), _letters_reward, CONFIG, backend="ray",
             ray_address="nowhere")
    with pytest.raises(ValueError, match="given with an engine"):
        GRPO(model, tokenizer, _problems(), _letters_reward, CONFIG, backend="ray",
             engine=RolloutEngine(model, tokenizer))
    with pytest.raises(ValueError, match="backend object .* got 3"):
        make_backend(3)


def test_a_pipeline_on_ray_gives_the_local_pipelines_table(project, tmp_path):  # noqa: F811
    notebook = nbformat.read(project / "notebooks" / "toy.ipynb", as_version=4)
    notebook.cells.append(new_code_cell(
        "import os, json, pathlib\nm = pathlib.Path(out_dir, 'metrics.json')\n"
        "m.write_text(json.dumps({**json.loads(m.read_text()), "
        "'threads': int(os.environ.get('OMP_NUM_THREADS', '0'))}))"))
    nbformat.write(notebook, project / "notebooks" / "threads.ipynb")
    yaml_path = write_pipeline(project, """
notebooks:
  - notebook: notebooks/threads.ipynb
    grid: {x: [1, 2]}
  - notebook: notebooks/toy.ipynb
    parameters: {fail: true}
""")
    local = run_pipeline(yaml_path, runs_root=tmp_path / "local")
    on_ray = run_pipeline(yaml_path, runs_root=tmp_path / "ray", ray=True)
    assert list(on_ray["status"]) == ["ok", "ok", "failed"]
    assert on_ray["metric.threads"].iloc[:2].tolist() == [1, 1]  # each kernel its task's CPU
    same = [c for c in local.columns if c not in ("duration_s", "metric.threads")]
    assert on_ray[same].equals(local[same])
    again = run_pipeline(yaml_path, runs_root=tmp_path / "ray", ray=True)
    assert list(again["skipped"]) == [True, True, False]  # the failed run is retried
    assert ray.is_initialized()  # the module's Ray, reused and left up
    with pytest.raises(ValueError, match="jobs=2 with ray=True"):
        run_pipeline(yaml_path, runs_root=tmp_path / "other", ray=True, jobs=2)
    with pytest.raises(ValueError, match="are for Ray tasks"):
        run_pipeline(yaml_path, runs_root=tmp_path / "other", threads=2)
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("name", ["01_long_tail_rollout", "03_adaptive_drafter", "04_tlt_rl"])
def test_the_rl_notebooks_take_backend_and_pass_it_on(name):
    path = ROOT / "notebooks" / f"{name}.ipynb"
    parameters = papermill.inspect_notebook(path)
    assert parameters["backend"]["default"] == '"local"'
    assert parameters["ray_address"]["default"] == "None"
    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                     if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", []))
    calls = [node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Call)]
    given = [{kw.arg: ast.unparse(kw.value) for kw in call.keywords} for call in calls]
    passed = [g for g in given if g.get("backend") == "backend"
              and g.get("ray_address") == "ray_address"]
    made = [call for call in calls if ast.unparse(call.func) == "make_backend"
            and [ast.unparse(a) for a in call.args] == ["backend", "ray_address"]]
    assert passed or made
