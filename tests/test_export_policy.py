"""export_policy: the policy of an RL checkpoint becomes an HF model folder that loads with the
checkpoint's weights, from GRPO's own layout and the nested one of TLT, remedy and staleness
runs; a folder without one state file is refused before anything is written."""
import json

import pytest
import torch

from workbench.models import load_model, save_model
from workbench.rl import GRPO, GRPOConfig
from workbench.rl.checkpoint import save_state
from workbench.rl.export import export_policy
from workbench.rl.loop import RLLoop
from workbench.tasks import Problem

from .helpers.models import tiny_model


def _trained(tokenizer, tmp_path):
    base = save_model(tiny_model("qwen2", tokenizer, dtype=torch.float32), tokenizer,
                      tmp_path / "base")
    policy, _ = load_model(base, device="cpu")
    cfg = GRPOConfig.flat(prompts_per_step=2, samples_per_prompt=3, max_new_tokens=5, lr=1e-2)
    problems = [Problem(prompt=f"q{i}?", answer="a", uid=i) for i in range(4)]
    g = RLLoop(GRPO(policy, tokenizer, problems, lambda p, c, a: float(len(c)), cfg),
               checkpoint_dir=tmp_path / "ckpt")
    g.run(2, progress=False)
    return base, g


@pytest.mark.parametrize("layout", ["grpo", "nested"])
def test_the_exported_policy_has_the_checkpoints_weights(tokenizer, tmp_path, layout):
    base, g = _trained(tokenizer, tmp_path)
    source = tmp_path / "ckpt"
    if layout == "nested":  # a TLT, remedy or staleness run keeps GRPO's state under "grpo"
        source = save_state(tmp_path / "tlt", "tlt_state.pt", {"grpo": g.grpo.state_dict()})
    out = export_policy(source, tmp_path / "policy", model=base)
    exported, _ = load_model(out, device="cpu")
    start, _ = load_model(base, device="cpu")
    trained = g.model.state_dict()
    for name, weight in exported.state_dict().items():
        assert torch.equal(weight, trained[name]), name
    assert any(not torch.equal(a, b) for a, b in
               zip(exported.state_dict().values(), start.state_dict().values()))
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["rl_step"] == 2 and provenance["base_model"] == str(base)


def test_a_folder_without_one_state_file_is_refused_before_anything_is_written(tokenizer,
                                                                              tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"checkpoint '.*empty': accepted an RL run's state "
                                         r"file \(\*\.pt\) or the folder holding exactly one; "
                                         r"found \[\]"):
        export_policy(tmp_path / "empty", tmp_path / "policy")
    save_state(tmp_path / "other", "x.pt", {"weights": {}})
    with pytest.raises(ValueError, match=r"holds no RL policy \(keys \['weights'\]\)"):
        export_policy(tmp_path / "other", tmp_path / "policy")
    assert not (tmp_path / "policy").exists()
