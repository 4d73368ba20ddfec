"""``RolloutConfig.compile="auto"`` in an RL run (issue 41): the path it chose per bucket is
returned by each rollout (``RolloutResult.compile_choices``), kept in the run's record and
saved in its checkpoint; a resumed run hands it to the policy's compiled step before its
first step, so no bucket is timed again (float32 tokens do not depend on a timing), and a
resumed run whose ``compile`` is no longer ``"auto"`` is refused. Timings come from a test
double; dynamo without inductor (``backend="eager"``) keeps the compiles short."""
import shutil

import pytest

from workbench.rl import GRPO, GRPOConfig
from workbench.rl.checkpoint import load_state
from workbench.rl.loop import RLLoop
from workbench.rollout.compiled import CompiledDecode, compiled_decode_for
from workbench.rollout.forward import LeanForward, policy_forward

from .helpers.models import StepClock, tiny_model
from .helpers.rl import PROBLEMS, length_reward

pytestmark = pytest.mark.compiles

# 4 x 2 rows decoding 10 tokens each (ignore_eos): every plain step is in bucket "8x1"
CONFIG = dict(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=10, ignore_eos=True,
              lr=1e-2, seed=1, compile="auto")


@pytest.fixture
def slow_eager(monkeypatch):
    """Every compiled step made from here on times with a :class:`StepClock` and compiles
    with dynamo alone; eager plain steps are charged 5 s on it."""
    clock = StepClock()
    post_init = CompiledDecode.__post_init__

    def made(self):
        post_init(self)
        self.backend, self.timer = "eager", clock
    monkeypatch.setattr(CompiledDecode, "__post_init__", made)
    eager_call = LeanForward.__call__

    def eager_step(self, input_ids, *args, **kwargs):
        if input_ids.shape[1] == 1:  # a plain step (not a prefill)
            clock.pending += 5.0
        return eager_call(self, input_ids, *args, **kwargs)
    monkeypatch.setattr(LeanForward, "__call__", eager_step)
    return clock


def _run(tokenizer, folder, **kw):
    model = tiny_model("llama", tokenizer, seed=1)
    grpo = GRPO(model, tokenizer, PROBLEMS, length_reward, GRPOConfig.flat(**{**CONFIG, **kw}))
    return RLLoop(grpo, checkpoint_dir=folder)


def _auto(trainer) -> CompiledDecode:
    return compiled_decode_for(policy_forward(trainer.model), "auto")


def test_an_interrupted_auto_run_resumes_on_its_recorded_choices_untimed(tokenizer, tmp_path,
                                                                         slow_eager):
    # the run, straight: step 1 times bucket 8x1 (3 steps each way) and keeps compiled
    straight = _run(tokenizer, tmp_path / "a")
    straight.run(1, progress=False)
    c = _auto(straight)
    assert c.choices == {"8x1": "compiled"} and c.steps == {"compiled": 6, "eager": 3}
    assert straight.record.compile_choices == {"8x1": "compiled"}
    # the choices are in the saved folder, beside the rest of the run's state
    saved = load_state(tmp_path / "a", RLLoop.STATE_FILE)
    assert saved["grpo"]["compile_choices"] == {"8x1": "compiled"}
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the run interrupted after step 1
    straight.run(1, progress=False)

    # resumed in a fresh model (its own compiled step): the choices are given before the
    # first step, so its step 2 decodes compiled throughout, no bucket timed
    resumed = _run(tokenizer, tmp_path / "b")
    r = _auto(resumed)
    assert r.choices == {"8x1": "compiled"} and resumed.rl_step == 1
    resumed.run(1, progress=False)
    assert r.trial_times == {} and r.steps == {"compiled": 9, "eager": 0}
    assert resumed.record.compile_choices == {"8x1": "compiled"}
    assert resumed.history.iloc[-1]["tokens"] == straight.history.iloc[-1]["tokens"]
    assert resumed.history.iloc[-1]["reward"] == straight.history.iloc[-1]["reward"]
    assert load_state(tmp_path / "b", RLLoop.STATE_FILE)["grpo"]["compile_choices"] == {
        "8x1": "compiled"}


@pytest.mark.parametrize("compile_", [False, True])
def test_resuming_recorded_auto_choices_under_another_compile_is_refused(tokenizer, tmp_path,
                                                                         compile_):
    folder = tmp_path / "run"
    run = _run(tokenizer, folder, max_new_tokens=2)
    run.grpo.compile_choices = {"8x1": "eager"}  # as a step of compile="auto" records them
    run.save_checkpoint()
    with pytest.raises(ValueError, match="compile='auto'"):
        _run(tokenizer, folder, max_new_tokens=2, compile=compile_)
    _run(tokenizer, folder, max_new_tokens=2)  # as saved: it resumes


def test_an_ablation_records_each_runs_choices_in_its_folder_and_resumes_on_them(
        tokenizer, tmp_path, slow_eager):
    from workbench.rl.ablation.runner import run_ablation
    folder = tmp_path / "ablation"
    grpo = GRPOConfig.flat(**CONFIG)

    def ablation(steps):
        return run_ablation(tiny_model("llama", tokenizer, seed=1), tokenizer, PROBLEMS, grpo,
                            steps, variants=["baseline"], seeds=[0], reward=length_reward,
                            progress=False, checkpoint_dir=folder, checkpoint_every=1)
    first = ablation(1)  # interrupted after step 1
    run = first.trainers[("baseline", 0)]
    assert run.record.compile_choices == {"8x1": "compiled"}
    state = load_state(folder / "baseline-seed0" / "state", type(run).STATE_FILE)
    assert state["grpo"]["compile_choices"] == {"8x1": "compiled"}
    resumed = ablation(2).trainers[("baseline", 0)]
    c = _auto(resumed)
    assert c.trial_times == {} and c.steps == {"compiled": 9, "eager": 0}  # step 2: untimed
    assert resumed.record.compile_choices == {"8x1": "compiled"}
