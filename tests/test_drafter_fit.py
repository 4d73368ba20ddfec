"""Drafters fitted to any model on the spot: within the budget, cached by the model's
fingerprint and reused, tau measured, lossless SD; the `workbench drafter train` command."""
import json

import pytest
import torch

from workbench.cli import main
from workbench.models import load_model, save_model
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative import EagleDrafter, EagleHead, LMDrafter
from workbench.speculative import resolve as resolve_mod
from workbench.speculative.cache import CACHE_ENV, fitted_dir, model_fingerprint
from workbench.speculative.fit import DrafterLMConfig, FitConfig, fit_drafter_lm
from workbench.speculative.resolve import resolve_drafter

from .helpers.models import PROMPTS, tiny_model

FAST = dict(train_prompts=16, heldout_prompts=3, max_new_tokens=24, max_batch_size=8)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache root of the test's own (the user's ~/.cache is never touched)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "drafters"


def greedy_tokens(policy, tokenizer, drafter=None):
    cfg = RolloutConfig(max_new_tokens=24, spec_k=3, max_batch_size=4)
    return RolloutEngine(policy, tokenizer).rollout(PROMPTS, cfg, drafter=drafter,
                                                    progress=False).tokens


def test_auto_head_trains_within_its_budget_is_cached_reused_and_lossless(
        tokenizer, cache, monkeypatch, capsys):
    policy = tiny_model("llama", tokenizer)
    fit = FitConfig(minutes=0.08, **FAST)
    drafter = resolve_drafter("auto", policy, tokenizer, "running_sum", fit=fit)
    assert isinstance(drafter, EagleDrafter)
    fingerprint = model_fingerprint(policy)
    folder = fitted_dir(fingerprint, "eagle", "running_sum")
    assert folder.parent.parent == cache and (folder / "head.pt").is_file()
    record = json.loads((folder / "provenance.json").read_text())
    assert record["model_fingerprint"] == fingerprint and record["task"] == "running_sum"
    assert record["minutes"] == 0.08 and record["steps"] >= 1 and record["tau"] >= 1
    # training got what harvesting left of the budget, and the budget, not the step horizon
    # (2000), ended it, a step past it at most (a busy machine slows steps: 3 mean steps)
    assert record["train_budget_s"] <= max(0.06, 0.08 * 60 - record["harvest_s"]) + 0.1
    assert record["stop_reason"] == "time"
    step_s = record["train_s"] / record["steps"]
    assert record["train_budget_s"] <= record["train_s"] <= record["train_budget_s"] + max(
        1.0, 3 * step_s)
    assert greedy_tokens(policy, tokenizer, drafter) == greedy_tokens(policy, tokenizer)
    assert "fitted the EAGLE head to model " + fingerprint in capsys.readouterr().out

    def no_training(*args, **kwargs):
        raise AssertionError("the cached head should have been reused")
    monkeypatch.setattr(resolve_mod, "fit_eagle", no_training)
    again = resolve_drafter("auto", policy.float(), tokenizer, "running_sum", fit=fit)
    lines = [line for line in capsys.readouterr().out.splitlines() if "reusing" in line]
    assert len(lines) == 1 and fingerprint in lines[0] and str(folder) in lines[0]
    for a, b in zip(drafter.head.state_dict().values(), again.head.state_dict().values()):
        assert torch.equal(a.float(), b)


class Interrupted(Exception):
    pass


def test_an_interrupted_fit_leaves_nothing_to_reuse(tokenizer, cache, monkeypatch):
    from workbench.speculative import fit as fit_mod
    policy = tiny_model("llama", tokenizer)

    def interrupted(*args, **kwargs):
        raise Interrupted
    monkeypatch.setattr(fit_mod, "heldout_tau", interrupted)  # after training, before saving
    with pytest.raises(Interrupted):
        resolve_drafter("auto", policy, tokenizer, fit=FitConfig(minutes=0.02, **FAST))
    folder = fitted_dir(model_fingerprint(policy), "eagle", "running_sum")
    assert not folder.exists()  # the next run fits again instead of reusing half a drafter
    assert [p.name for p in folder.parent.iterdir()] == [folder.name + ".train_state"]


def test_fingerprints_follow_the_weights_not_the_dtype_or_the_object(tokenizer):
    policy = tiny_model("llama", tokenizer)
    same = tiny_model("llama", tokenizer)
    assert model_fingerprint(policy) == model_fingerprint(same) \
        == model_fingerprint(same.float())
    with torch.no_grad():
        same.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3
    assert model_fingerprint(same) != model_fingerprint(policy)
    other_task = fitted_dir(model_fingerprint(policy), "eagle", "default")
    assert other_task == fitted_dir(model_fingerprint(policy), "eagle", "running_sum")


def test_small_lm_drafter_fitted_on_the_spot_is_lossless(tokenizer, tmp_path):
    policy = tiny_model("llama", tokenizer)
    lm = DrafterLMConfig(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64,
                         tokens_per_batch=512, steps=4, warmup=1)
    fitted = fit_drafter_lm(policy, tokenizer, "running_sum", tmp_path / "lm",
                            FitConfig(minutes=0.2, **FAST), lm)
    assert fitted.steps == 4 and fitted.tau >= 1 and fitted.provenance["stop_reason"] == "steps"
    assert json.loads((tmp_path / "lm" / "provenance.json").read_text())["kind"] == "lm"
    drafter = resolve_drafter(tmp_path / "lm", policy, tokenizer)
    assert isinstance(drafter, LMDrafter) and drafter.model.dtype == torch.float64
    assert greedy_tokens(policy, tokenizer, drafter) == greedy_tokens(policy, tokenizer)


def write_jsonl(path, lines: int):
    path.write_text("".join(json.dumps({"prompt": f"a{i} b{i + 1}?", "answer": str(i)}) + "\n"
                            for i in range(lines)))
    return path


def test_cli_fits_a_head_to_a_saved_model_folder_on_a_jsonl_task(tokenizer, tmp_path, capsys):
    save_model(tiny_model("llama", tokenizer, dtype=torch.float32), tokenizer, tmp_path / "m")
    task = write_jsonl(tmp_path / "task.jsonl", 12)
    code = main(["drafter", "train", "--model", str(tmp_path / "m"), "--task", str(task),
                 "--out", str(tmp_path / "head"), "--minutes", "0.05"])
    assert code == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.startswith("tau ") and "6 held-out prompts" in out
    record = json.loads((tmp_path / "head" / "provenance.json").read_text())
    assert record["task_key"].startswith("task-") and record["heldout_prompts"] == 6
    assert float(out.split()[1]) == pytest.approx(record["tau"], abs=1e-3)
    policy, _ = load_model(tmp_path / "m", device="cpu")
    EagleHead.from_pretrained(tmp_path / "head", policy)


@pytest.mark.parametrize("args, message", [
    (["--model", "{tmp}/nowhere"], "unknown model"),
    (["--task", "{tmp}/one.jsonl"], "at least 2"),
    (["--task", "sums"], "unknown task 'sums'"),
    (["--out", "{tmp}/one.jsonl"], "is an existing file"),
    (["--seed", "-1"], "FitConfig.seed must be an integer >= 0"),
])
def test_cli_refuses_bad_arguments_before_anything_runs(args, message, tokenizer, tmp_path,
                                                         capsys):
    save_model(tiny_model("llama", tokenizer, dtype=torch.float32), tokenizer, tmp_path / "m")
    write_jsonl(tmp_path / "one.jsonl", 1)
    given = dict(zip(args[::2], [a.format(tmp=tmp_path) for a in args[1::2]]))
    argv = {"--model": str(tmp_path / "m"), "--task": "running_sum",
            "--out": str(tmp_path / "head"), "--minutes": "0.05", **given}
    assert main(["drafter", "train", *[x for kv in argv.items() for x in kv]]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "head").exists()


def test_cli_kind_and_minutes_are_checked_by_the_parser(capsys):
    for bad in (["--kind", "tree"], ["--minutes", "0"]):
        argv = ["drafter", "train", "--model", "default", "--task", "running_sum", "--out",
                "x", "--minutes", "1", *bad]
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'tree'" in err and "minutes must be a finite number > 0, got 0.0" in err
