"""rl.scaling: the same GRPO steps on several backends, compared on their own clocks (notebook
08); the Ray systems run in its smoke run, here the local one and the measures."""
import pandas as pd
import pytest
import torch

from workbench.rl import GRPOConfig
from workbench.rl.scaling import BackendComparison, compare_backends
from workbench.tasks import Problem

from .helpers.models import PROMPTS, tiny_model


def test_the_local_system_runs_the_grpo_steps_and_records_both_times(tokenizer):
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    problems = [Problem(prompt=p, answer="a", uid=i) for i, p in enumerate(PROMPTS)]
    grpo = GRPOConfig.flat(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=10,
                           temperature=1.0, workers=2)
    result = compare_backends(model, tokenizer, problems, lambda p, c, a: float("a" in c),
                              grpo, 2, actors=(), progress=False)
    steps = result.steps
    assert list(steps["system"]) == ["local", "local"] and list(steps["step"]) == [0, 1]
    assert (steps["clock"] == "sim").all() and (steps["workers"] == 2).all()
    assert (steps["makespan_s"] > 0).all() and (steps["overhead_s"] == 0).all()
    assert steps["tokens_digest"].nunique() == 2 and result.tokens_equal()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # a copy trains
    with pytest.raises(ValueError, match="steps"):
        compare_backends(model, tokenizer, problems, None, grpo, 0, actors=())


def test_the_measures_of_a_comparison():
    """sim_error is |sim - wall| / wall per step, Ray's dispatch out of the wall makespan (its
    median in the metrics); the overhead and the wall speedup are means per step; tokens equal
    means one digest per step; each system's disturbed share pools its steps' seconds."""
    rows = [("local", 0, 1.0, 0.0, 2.0, 0.0, "a"), ("local", 1, 2.0, 0.0, 4.0, 0.0, "b"),
            ("ray-2", 0, 1.35, 0.1, 1.5, 0.25, "a"), ("ray-2", 1, 1.8, 0.2, 2.0, 0.35, "b")]
    usage = [(1.0, 0.0, 1.0), (2.0, 0.0, 2.0), (2.5, 2.5, 1.25), (3.2, 0.0, 3.2)]
    steps = pd.DataFrame(rows, columns=["system", "step", "makespan_s", "dispatch_s", "wall_s",
                                        "overhead_s", "tokens_digest"]).assign(weights_s=0.01)
    steps[["measured_s", "disturbed_s", "cpu_s"]] = usage
    comparison = BackendComparison(steps)
    assert comparison.sim_error("ray-2").tolist() == pytest.approx([0.2, 0.25])
    m = comparison.metrics("ray-2")
    assert m["sim_error"] == pytest.approx(0.225) and m["ray_overhead_s_per_step"] == 0.3
    assert m["ray_dispatch_s_per_step"] == pytest.approx(0.15)
    assert m["ray_disturbed_share"] == pytest.approx(2.5 / 5.7)
    assert m["ray_cpu_share"] == pytest.approx(4.45 / 5.7) and m["sim_disturbed_share"] == 0
    assert m["wall_speedup_ray"] == pytest.approx(3.0 / 1.75) and m["tokens_equal"]
    assert not BackendComparison(steps.assign(tokens_digest=list("abcb"))).tokens_equal()
