"""``backend="ray"`` where users pick it, on the session's local 2-CPU Ray (conftest.py): GRPO takes the
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

from workbench.cli import main
from workbench.pipeline import load_results, run_pipeline
from workbench.rl import GRPO, GRPOConfig
from workbench.rl import variants as rl_variants
from workbench.rl.ablation.runner import close_backend, notebook_backend, run_ablation
from workbench.rollout import LocalBackend, RayBackend, RolloutEngine, make_backend

from .helpers.models import tiny_model
from .helpers.rl import letter_problems, letters_reward
from .helpers.pipelines import project, write_pipeline, write_threads_notebook  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
CONFIG = GRPOConfig.flat(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=10, lr=1e-2,
                         temperature=1.0, workers=2, seed=1)


pytestmark = pytest.mark.usefixtures("local_ray")  # the session's (conftest.py)


def _grpo_steps(tokenizer, backend, steps=2):
    """``steps`` GRPO steps on a tiny float64 policy: each step's tokens, the GRPO, and the
    backend's weight pushes (with what the actors held when the rollout after each ran)."""
    model = tiny_model("llama", tokenizer)
    g = GRPO(model, tokenizer, letter_problems(), letters_reward, CONFIG, backend=backend)
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


@pytest.fixture
def actors(ray_actors):
    """The session's 2 actors (conftest.py), which GRPO and the ablation find running."""
    return ray_actors.backend()


class TestOneSetOfActors:
    """GRPO and the ablation on one Ray backend, its actors started once."""

    def test_grpo_on_ray_takes_the_local_tokens_and_updates(self, tokenizer, actors):
        local_tokens, local, _ = _grpo_steps(tokenizer, "local")
        ray_tokens, on_ray, pushes = _grpo_steps(tokenizer, actors)
        assert ray_tokens == local_tokens and ray_tokens[0] != ray_tokens[1]
        for a, b in zip(local.model.state_dict().values(), on_ray.model.state_dict().values()):
            assert torch.equal(a, b)
        assert [row["clock"] for row in on_ray.rows] == ["wall", "wall"]
        assert [row["clock"] for row in local.rows] == ["sim", "sim"]
        # the policy, before each rollout: the first because the engine found the actors
        # running with whatever their starter gave them, the second after the update
        assert [set(p) for p in pushes] == [{"policy"}, {"policy"}]
        on_ray.close()  # a backend object stays its owner's
        assert actors.num_workers == 2
        by_name = GRPO(local.model, tokenizer, letter_problems(), letters_reward, CONFIG,
                       backend="ray")
        assert isinstance(by_name.engine.backend, RayBackend)
        assert by_name.engine.backend is not actors
        by_name.close()  # what it made (not started yet); the session's Ray stays up
        assert ray.is_initialized()

    def test_ablation_runs_take_turns_on_one_set_of_actors(self, tokenizer, actors,
                                                           monkeypatch):
        policy = tiny_model("llama", tokenizer)
        if actors.num_workers != 2:  # run alone (the GRPO test leaves them up)
            RolloutEngine(policy, tokenizer, backend=actors).start(2)
        starts = []
        monkeypatch.setattr(RayBackend, "start", lambda self, *a, **kw: starts.append(self))
        kw = dict(variants=["baseline"], seeds=[0, 1], reward=letters_reward, progress=False)
        local = run_ablation(policy, tokenizer, letter_problems(), CONFIG, 2, **kw)
        on_ray = run_ablation(policy, tokenizer, letter_problems(), CONFIG, 2, backend=actors, **kw)
        assert starts == [] and actors.num_workers == 2  # the running actors served both seeds
        columns = ["variant", "seed", "step", "reward", "tokens", "response_len",
                   "tokens_digest"]
        assert on_ray.history[columns].equals(local.history[columns])
        assert set(on_ray.history["clock"]) == {"wall"}
        for key, run in local.trainers.items():
            for a, b in zip(run.model.state_dict().values(),
                            on_ray.trainers[key].model.state_dict().values()):
                assert torch.equal(a, b)
        monkeypatch.undo()
        with pytest.raises(ConnectionError, match="no Ray cluster answers at '127.0.0.1:1'"):
            run_ablation(policy, tokenizer, letter_problems(), CONFIG, 2, backend="ray",
                         ray_address="127.0.0.1:1", **kw)  # a backend by name: started here


def test_a_bad_backend_is_refused_naming_it_before_anything_starts(tokenizer, monkeypatch):
    model = tiny_model("llama", tokenizer)
    accepted = r"backend must be one of \['local', 'ray'\] or a backend object, got 'spark'"
    with pytest.raises(ValueError, match=accepted):
        GRPO(model, tokenizer, letter_problems(), letters_reward, CONFIG, backend="spark")
    monkeypatch.setattr(rl_variants, "TLTTrainer", lambda *a, **kw: pytest.fail("a run was built"))
    with pytest.raises(ValueError, match=accepted):
        run_ablation(model, tokenizer, letter_problems(), CONFIG, 1, variants=["baseline"],
                     backend="spark")
    with pytest.raises(ValueError, match=r"the Ray address '127.0.0.1:1' given with "
                                         r"backend='local'"):
        run_ablation(model, tokenizer, letter_problems(), CONFIG, 1, variants=["baseline"],
                     ray_address="127.0.0.1:1")
    with pytest.raises(ValueError, match="address must be None .* got 'nowhere'"):
        GRPO(model, tokenizer, letter_problems(), letters_reward, CONFIG, backend="ray",
             ray_address="nowhere")
    with pytest.raises(ValueError, match="given with an engine"):
        GRPO(model, tokenizer, letter_problems(), letters_reward, CONFIG, backend="ray",
             engine=RolloutEngine(model, tokenizer))
    with pytest.raises(ValueError, match="backend object .* got 3"):
        make_backend(3)


def test_a_pipeline_on_ray_gives_the_local_pipelines_table(project, tmp_path,  # noqa: F811
                                                             capsys, ray_actors):
    ray_actors.release()  # the pipeline's tasks need the CPUs the actors hold
    write_threads_notebook(project, "threads")
    yaml_path = write_pipeline(project, """
notebooks:
  - notebook: notebooks/threads.ipynb
  - notebook: notebooks/toy.ipynb
    parameters: {fail: true}
""")
    local = run_pipeline(yaml_path, runs_root=tmp_path / "local")
    on_ray = run_pipeline(yaml_path, runs_root=tmp_path / "ray", ray=True)
    assert list(on_ray["status"]) == ["ok", "failed"]  # the YAML's order, not the finish's
    assert on_ray["metric.threads"].iloc[0] == 1  # the kernel has its task's one CPU
    same = [c for c in local.columns if c not in ("duration_s", "metric.threads")]
    assert on_ray[same].equals(local[same])
    argv = ["pipeline", "run", str(yaml_path), "--runs-root", str(tmp_path / "ray"), "--ray"]
    assert main(argv) == 1  # a run failed (again: it is retried, the ok one is skipped)
    assert list(load_results(tmp_path / "ray" / "demo")["skipped"]) == [True, False]
    assert main([*argv[:-1], "--jobs", "2", "--ray"]) == 2
    assert "jobs=2 with ray=True" in capsys.readouterr().err
    assert ray.is_initialized()  # the session's Ray, reused and left up
    with pytest.raises(ValueError, match="jobs=2 with ray=True"):
        run_pipeline(yaml_path, runs_root=tmp_path / "other", ray=True, jobs=2)
    with pytest.raises(ValueError, match="are for Ray tasks"):
        run_pipeline(yaml_path, runs_root=tmp_path / "other", threads=2)
    with pytest.raises(ValueError, match="threads=3: each run's task needs 3 CPUs on one node, "
                                         "but the largest node of the local Ray instance has 2"):
        run_pipeline(yaml_path, runs_root=tmp_path / "other", ray=True, threads=3)
    with pytest.raises(ConnectionError, match="no Ray cluster answers at '127.0.0.1:1'"):
        run_pipeline(yaml_path, runs_root=tmp_path / "other", ray=True, ray_address="127.0.0.1:1")
    assert not (tmp_path / "other").exists()


def test_a_ray_backend_made_for_a_run_keeps_a_local_rays_logs_in_its_folder(tmp_path):
    assert make_backend("ray", run_dir=tmp_path).log_dir == tmp_path.resolve() / "ray"
    elsewhere = make_backend("ray", run_dir=tmp_path, log_dir=tmp_path / "logs")
    assert elsewhere.log_dir == tmp_path.resolve() / "logs"  # log_dir, when given, wins
    assert isinstance(make_backend("local", run_dir=tmp_path), LocalBackend)
    with pytest.raises(ValueError, match="log_dir=.* given with backend='local'"):
        make_backend("local", log_dir=tmp_path)


def test_a_notebooks_backend_is_local_as_it_is_or_one_made_for_all_its_ablations(tmp_path,
                                                                                  monkeypatch):
    """Notebook 04's ablation and coupled pair share what ``notebook_backend`` gives: "local"
    (each run its own local backend), or one Ray backend made here, not started (the first
    ablation starts it, the next finds its actors running: TestOneSetOfActors), closed by
    ``close_backend``."""
    assert notebook_backend("local", run_dir=tmp_path) == "local"
    close_backend("local")  # nothing to close
    with pytest.raises(ValueError, match="the Ray address '127.0.0.1:1' given with "
                                         "backend='local'"):
        notebook_backend("local", "127.0.0.1:1")
    made = notebook_backend("ray", run_dir=tmp_path)
    assert isinstance(made, RayBackend) and made.log_dir == tmp_path.resolve() / "ray"
    closed = []
    monkeypatch.setattr(RayBackend, "close", lambda self: closed.append(self))
    close_backend(made)
    assert closed == [made]


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
    # ... with the run's folder, where a local Ray keeps its logs
    passed = [g for g in given if g.get("backend") == "backend"
              and g.get("ray_address") == "ray_address" and g.get("run_dir") == "out"]
    # ... or made once for the notebook (and then passed on as an object)
    made = [call for call, g in zip(calls, given)
            if ast.unparse(call.func) in ("make_backend", "notebook_backend")
            and [ast.unparse(a) for a in call.args] == ["backend", "ray_address"]
            and g.get("run_dir") == "out"]
    assert passed or made
