"""``report_to="tensorboard"`` through the runs that write per-step scalars: an RL run in the
loop shell (``rl.loop.RLLoop``: GRPO, TLT, the remedies and staleness alike) holds every
numeric column of its history in its event files, read back by TensorBoard's own
``EventAccumulator``; a run resumed from its checkpoint writes each step once; the ablation
writes one log folder per (variant, seed) run; distillation logs its steps and evaluations;
a bad value or a run without a folder is refused before anything is written."""
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.models import tiny_model
from workbench.compress.data import distill_data
from workbench.compress.distill import DistillConfig, Distiller
from workbench.rl import GRPO, GRPOConfig
from workbench.rl.ablation.runner import run_ablation
from workbench.rl.loop import RLLoop
from workbench.scalar_log import LOG_DIR, scalars_of
from workbench.tasks import Problem

CONFIG = GRPOConfig.flat(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=4, lr=1e-2,
                         workers=2, temperature=1.0, seed=3)


def _reward(prompt, completion, answer):
    return completion.count("a") / max(1, len(completion))


def _problems(n=6):
    return [Problem(prompt=f"q{i}?", answer="a", uid=i) for i in range(n)]


def _events(folder) -> EventAccumulator:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def _loop(tokenizer, folder, report_to="tensorboard") -> RLLoop:
    torch.manual_seed(0)
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    return RLLoop(GRPO(model, tokenizer, _problems(), _reward, CONFIG), checkpoint_dir=folder,
                  report_to=report_to)


def test_a_grpo_runs_event_files_hold_every_numeric_column_of_its_history(tokenizer,
                                                                         tmp_path):
    history = _loop(tokenizer, tmp_path / "run").run(3, progress=False)
    acc = _events(tmp_path / "run" / LOG_DIR)
    rows = history.to_dict("records")
    tags = set().union(*(scalars_of(row) for row in rows))
    assert {"reward", "loss", "kl_start", "idle_fraction", "time_sim/step_s",
            "time_sim/update_s"} <= tags
    for tag in tags:
        got = {e.step: e.value for e in acc.Scalars(tag)}
        want = {row["step"]: v for row in rows if (v := scalars_of(row).get(tag)) is not None}
        assert got.keys() == want.keys(), tag
        assert [got[s] for s in want] == pytest.approx(list(want.values()), rel=1e-6), tag


def test_a_resumed_run_writes_each_step_once(tokenizer, tmp_path):
    folder = tmp_path / "run"
    first = _loop(tokenizer, folder)
    first.run(2, progress=False)  # checkpointed after step 2 (steps 0 and 1 done)
    first.step()  # step 2 logged, then the run dies before its checkpoint
    first.close_log()
    resumed = _loop(tokenizer, folder)
    assert resumed.rl_step == 2
    history = resumed.run(2, progress=False)
    rewards = [(e.step, e.value) for e in _events(folder / LOG_DIR).Scalars("reward")]
    assert [s for s, _ in rewards] == [0, 1, 2, 3]
    assert [v for _, v in rewards] == pytest.approx(history["reward"].tolist(), rel=1e-6)
    cumulative = [e.value for e in _events(folder / LOG_DIR).Scalars(
        "time_sim/cumulative_step_s")]
    assert cumulative == pytest.approx(history["step_s"].cumsum().tolist(), rel=1e-6)


def test_a_bad_report_to_or_one_without_a_folder_is_refused_before_anything(tokenizer,
                                                                           tmp_path):
    with pytest.raises(ValueError, match="report_to must be one of 'none', 'tensorboard'"):
        _loop(tokenizer, tmp_path / "run", report_to="wandb")
    with pytest.raises(ValueError, match="needs the run's folder"):
        _loop(tokenizer, None)
    assert not (tmp_path / "run").exists()


def test_the_ablation_writes_one_log_folder_per_run(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    ablation = run_ablation(model, tokenizer, _problems(), CONFIG, 2,
                            variants=["baseline", "overprovision"], seeds=[0, 1],
                            reward=_reward, progress=False, checkpoint_dir=tmp_path / "ab",
                            report_to="tensorboard")
    logs = sorted(p.parent.name for p in (tmp_path / "ab").glob(f"*/{LOG_DIR}"))
    assert logs == ["baseline-seed0", "baseline-seed1", "overprovision-seed0",
                    "overprovision-seed1"]
    h = ablation.history
    for name in logs:
        variant, seed = name.rsplit("-seed", 1)
        want = h[(h["variant"] == variant) & (h["seed"] == int(seed))]["reward"].tolist()
        got = _events(tmp_path / "ab" / name / LOG_DIR).Scalars("reward")
        assert [e.step for e in got] == [0, 1]
        assert [e.value for e in got] == pytest.approx(want, rel=1e-6)


def test_distillation_logs_every_step_and_evaluation(tokenizer, tmp_path):
    train, held_out = distill_data(tokenizer, "running_sum", num=160, eval_num=4, batch_size=4,
                                   max_len=32)
    config = DistillConfig.flat(mode="ce", horizon=4, batch_size=4, lr=1e-2, warmup=0,
                                eval_every=2, seed=5, progress=False)
    student = tiny_model("llama", tokenizer)
    distiller = Distiller(student, None, train, config, held_out, report_to="tensorboard",
                          run_dir=tmp_path / "kd")
    history = distiller.run()
    acc = _events(tmp_path / "kd" / LOG_DIR)
    for tag in ("loss", "lr", "grad_norm", "tokens"):
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert got == [(s, pytest.approx(v, rel=1e-6))
                       for s, v in zip(history["step"], history[tag])], tag
    evals = [(e.step, e.value) for e in acc.Scalars("eval/eval_loss")]
    assert evals == [(s, pytest.approx(v, rel=1e-6))
                     for s, v in zip(distiller.evals["step"], distiller.evals["eval_loss"])]
