"""An ablation with a checkpoint folder resumes: interrupted after some steps and called again
with the same arguments it gives the same histories and held-out evaluations as one that ran
straight through, redoing no evaluation; a folder made with other settings is refused before
anything runs; a finished one returns its tables without stepping."""
import json

import pandas as pd
import pytest
import torch

from workbench.adapt import SpotConfig
from workbench.cli import main
from workbench.rl.ablation.runner import run_ablation
from workbench.rl.ablation.runs import Turns
from workbench.rl.ablation.store import (PROGRESS_FILE, SETTINGS_FILE, ablation_progress,
                                         merge_ablations)
from workbench.rollout.timeline import Timeline
from workbench.speculative.eagle import EagleHead

from .helpers.models import tiny_model
from .helpers.rl import PROBLEMS, length_reward, remedy_grpo
from .helpers.rl import CHAINS, long_tails  # noqa: F401 (a fixture)

# the baseline and a remedy that chooses its data by tokens alone (not by the measured clock)
VARIANTS = ["baseline", "partial"]
# what does not depend on wall time
COLUMNS = ["variant", "seed", "step", "reward", "loss", "tokens", "tokens_digest",
           "offpolicy_token_share", "groups_trained", "carried_groups", "sampled_version"]
HELD_OUT = PROBLEMS[:6]
# responses of 12 tokens, 3 per partial step: groups held over several steps finish together
# with fresh ones, so which are trained must not read the clock (it once did, by finish time)
GRPO = remedy_grpo(max_new_tokens=12)


def _ablation(tokenizer, steps, folder=None, seeds=(0, 1), **kw):
    args = dict(variants=VARIANTS, seeds=list(seeds), reward=length_reward, progress=False,
                eval_problems=HELD_OUT, eval_every=2, eval_max_new_tokens=8, **kw)
    if folder is not None:
        args.update(checkpoint_dir=folder, checkpoint_every=args.pop("checkpoint_every", 1))
    return run_ablation(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, GRPO, steps,
                        **args)


@pytest.fixture(scope="module")
def straight(tokenizer):
    """``straight(steps)``: the ablation run straight through, once per module and length
    (the tests only read it). Every test that compares with it runs on the tick clock
    (``tick_clock``: each reading 1/1024 s after the one before), which it is then run on too:
    whatever a run decides by the measured clock (an early stop, which groups finish first)
    it decides alike straight, interrupted and resumed, however loaded the machine."""
    done = {}

    def run(steps: int):
        if steps not in done:
            done[steps] = _ablation(tokenizer, steps)
        return done[steps]
    return run


def _count_steps(monkeypatch) -> list:
    """Every run's step from here on, as (variant, seed)."""
    stepped, real = [], Turns.step

    def counted(self, key):
        stepped.append(key)
        real(self, key)
    monkeypatch.setattr(Turns, "step", counted)
    return stepped


def _evaluated(monkeypatch) -> list:
    """Every held-out evaluation from here on."""
    import workbench.rl.ablation.runs as runs
    calls, real = [], runs.evaluate_policy

    def counted(*args, **kw):
        calls.append(1)
        return real(*args, **kw)
    monkeypatch.setattr(runs, "evaluate_policy", counted)
    return calls


def _interrupted(tokenizer, steps, folder, after: int, monkeypatch, **kw) -> None:
    """An ablation stopped (``KeyboardInterrupt``) at its run's step number ``after`` + 1."""
    real, calls = Turns.step, []

    def dies(self, key):
        calls.append(key)
        if len(calls) > after:
            raise KeyboardInterrupt
        real(self, key)
    with monkeypatch.context() as m:
        m.setattr(Turns, "step", dies)
        with pytest.raises(KeyboardInterrupt):
            _ablation(tokenizer, steps, folder, **kw)


def test_an_interrupted_ablation_resumes_as_if_it_had_run_straight(tokenizer, tmp_path,
                                                                    monkeypatch, straight,
                                                                    tick_clock):
    whole = straight(5)
    folder = tmp_path / "ckpt"
    # interrupted inside step 3 (0-based): 2 variants x 2 seeds x 3 steps, then 2 runs more
    _interrupted(tokenizer, 5, folder, 2 * 2 * 3 + 2, monkeypatch, checkpoint_every=3)
    progress = json.loads((folder / PROGRESS_FILE).read_text())
    assert progress["steps_done"] == 3 and {e["step"] for e in progress["evals"]} == {0, 2}
    # ... and resumed: steps 3 and 4 of every run, the evaluations after 4 and 5 only
    stepped, evaluated = _count_steps(monkeypatch), _evaluated(monkeypatch)
    resumed = _ablation(tokenizer, 5, folder, checkpoint_every=3)
    assert len(stepped) == 2 * 2 * 2 and len(evaluated) == 2 * 4
    assert resumed.history[COLUMNS].equals(whole.history[COLUMNS])
    assert resumed.evals.equals(whole.evals)
    for key, trainer in resumed.trainers.items():  # every step's timeline, saved or new
        assert sorted(trainer.record.timelines) == list(range(5))
        assert trainer.record.timelines[1].requests["response_tokens"].tolist() == \
            whole.trainers[key].record.timelines[1].requests["response_tokens"].tolist()
    assert isinstance(Timeline.load(folder / "partial-seed1" / "timelines" / "step0004"),
                      Timeline)


def test_runs_saved_at_different_steps_catch_up_before_the_lockstep_goes_on(tokenizer,
                                                                          tmp_path,
                                                                          monkeypatch,
                                                                          straight,
                                                                          tick_clock):
    """A save interrupted between runs leaves some a step ahead: they wait for the rest."""
    whole = straight(3)
    folder = tmp_path / "ckpt"
    _interrupted(tokenizer, 3, folder, 2 * 2 + 1, monkeypatch)  # saved after step 1
    ahead = _ablation(tokenizer, 2).trainers["partial", 1]  # one run's state after 2 steps
    run = folder / "partial-seed1"
    ahead.record.timelines[1].save(run / "timelines" / "step0001")  # timelines go first
    ahead.save_checkpoint(run / "state")
    stepped = _count_steps(monkeypatch)
    resumed = _ablation(tokenizer, 3, folder)
    assert stepped.count(("partial", 1)) == 1 and len(stepped) == 3 + 4
    assert resumed.history[COLUMNS].equals(whole.history[COLUMNS])
    assert resumed.evals.equals(whole.evals)


def test_seeds_run_apart_watched_and_merged_give_the_ablation_run_together(
        tokenizer, tmp_path, monkeypatch, straight, capsys, tick_clock):
    """Each seed in a process (here: a call) of its own, interrupted or not, watched from their
    progress files, then merged: the merged folder resumes and returns what one call with both
    seeds returns."""
    whole = straight(3)
    _ablation(tokenizer, 3, tmp_path / "seed0", seeds=[0])
    _interrupted(tokenizer, 3, tmp_path / "seed1", 2 * 2 + 1, monkeypatch, seeds=[1])  # in step 2
    # watched: seed 0 finished (evaluated after 0, 2, 3 steps), seed 1 saved after 2 steps
    steps, accuracy = ablation_progress([tmp_path / "seed0", tmp_path / "seed1"])
    assert steps == {str(tmp_path / "seed0"): 3, str(tmp_path / "seed1"): 2}
    assert list(dict.fromkeys(accuracy["variant"])) == VARIANTS
    for variant in VARIANTS:
        rows = accuracy[accuracy["variant"] == variant].set_index("step")
        assert rows["seeds"].to_dict() == {0: 2, 2: 2, 3: 1}
    assert main(["ablation", "status", str(tmp_path / "seed0"), str(tmp_path / "seed1")]) == 0
    assert f"{tmp_path / 'seed1'}: 2 RL steps checkpointed" in capsys.readouterr().out
    merged = tmp_path / "all"  # by the command line, as a user joins runs made apart
    assert main(["ablation", "merge", str(tmp_path / "seed0"), str(tmp_path / "seed1"),
                 "--into", str(merged)]) == 0
    assert json.loads((merged / SETTINGS_FILE).read_text())["seeds"] == [0, 1]
    stepped = _count_steps(monkeypatch)
    joined = _ablation(tokenizer, 3, merged)
    assert sorted(set(stepped)) == [("baseline", 1), ("partial", 1)] and len(stepped) == 2
    assert joined.history[COLUMNS].equals(whole.history[COLUMNS])
    order = ["variant", "seed", "step"]
    assert joined.evals.sort_values(order).reset_index(drop=True).equals(
        whole.evals.sort_values(order).reset_index(drop=True))
    # the sources are left as they were: the seed-1 folder still stands at its interruption
    assert json.loads((tmp_path / "seed1" / PROGRESS_FILE).read_text())["steps_done"] == 2


def test_the_status_of_seeds_run_apart_is_their_evaluations_pooled(tmp_path, capsys):
    """Accuracy so far per variant and step: mean and sd over the seeds evaluated there (a
    seed ahead of the others stands alone at its later steps), variants in run order."""
    variants = ["baseline", "april"]
    for seed, steps, acc in [(0, 20, {0: 0.40, 10: 0.45, 20: 0.50}), (1, 10, {0: 0.40, 10: 0.41})]:
        folder = tmp_path / f"seed{seed}"
        folder.mkdir()
        (folder / SETTINGS_FILE).write_text(json.dumps({"variants": variants, "seeds": [seed]}))
        evals = [{"variant": v, "seed": seed, "step": k, "accuracy": a - 0.1 * (v == "april")}
                 for k, a in acc.items() for v in variants]
        (folder / PROGRESS_FILE).write_text(json.dumps({"steps_done": steps, "evals": evals}))
    steps, accuracy = ablation_progress([tmp_path / "seed0", tmp_path / "seed1"])
    assert steps == {str(tmp_path / "seed0"): 20, str(tmp_path / "seed1"): 10}
    assert accuracy["variant"].tolist() == ["baseline"] * 3 + ["april"] * 3
    base = accuracy[accuracy["variant"] == "baseline"].set_index("step")
    assert base["accuracy"].to_dict() == pytest.approx({0: 0.40, 10: 0.43, 20: 0.50})
    assert base.loc[10, "accuracy_sd"] == pytest.approx(0.04 / 2 ** 0.5)
    assert base["seeds"].to_dict() == {0: 2, 10: 2, 20: 1} and pd.isna(base.loc[20, "accuracy_sd"])
    april = accuracy[accuracy["variant"] == "april"].set_index("step")["accuracy"]
    assert april.to_dict() == pytest.approx({0: 0.30, 10: 0.33, 20: 0.40})
    assert main(["ablation", "status", str(tmp_path / "seed0"), str(tmp_path / "seed1")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"{tmp_path / 'seed0'}: 20 RL steps checkpointed" in out
    baseline_row = next(line for line in out if line.startswith("baseline"))
    assert baseline_row.split()[1:] == ["0.400", "±", "0.000", "(2)", "0.430", "±", "0.028",
                                        "(2)", "0.500", "(1)"]
    with pytest.raises(ValueError, match=r"folders \[\]: accepted one or more"):
        ablation_progress([])


def test_merging_other_ablations_or_overlapping_seeds_is_refused(tokenizer, tmp_path, capsys):
    _ablation(tokenizer, 1, tmp_path / "a", seeds=[0])
    _ablation(tokenizer, 1, tmp_path / "b", seeds=[0])
    _ablation(tokenizer, 1, tmp_path / "c", seeds=[1], threshold=8)
    with pytest.raises(ValueError, match=r"seeds \[\[0\], \[0\]\] overlap"):
        merge_ablations([tmp_path / "a", tmp_path / "b"], tmp_path / "all")
    with pytest.raises(ValueError, match=r"'.*c' holds another ablation than '.*a' \(they "
                                         r"differ in \['tlt'\]\)"):
        merge_ablations([tmp_path / "a", tmp_path / "c"], tmp_path / "all")
    with pytest.raises(ValueError, match=r"target '.*b' exists"):
        merge_ablations([tmp_path / "a", tmp_path / "c"], tmp_path / "b")
    # the command line says the same in one line and exits 2
    assert main(["ablation", "merge", str(tmp_path / "a"), str(tmp_path / "b"), "--into",
                 str(tmp_path / "all")]) == 2
    assert "workbench ablation merge: error: the folders' seeds" in capsys.readouterr().err
    assert not (tmp_path / "all").exists()
    # a folder that is not an ablation's, watched: the same kind of message
    assert main(["ablation", "status", str(tmp_path / "a"), str(tmp_path)]) == 2
    assert f"{str(tmp_path)!r} has no ablation.json" in capsys.readouterr().err


def test_a_folder_of_other_settings_is_refused_before_anything_runs(tokenizer, tmp_path,
                                                                    monkeypatch):
    folder = tmp_path / "ckpt"
    _ablation(tokenizer, 1, folder)
    stepped = _count_steps(monkeypatch)
    with pytest.raises(ValueError, match=r"other settings:\n  variants: saved \['baseline', "
                                         r"'partial'\], this call \['baseline', 'async'\]"):
        run_ablation(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, GRPO, 2,
                     variants=["baseline", "async"], seeds=[0, 1], reward=length_reward,
                     eval_problems=HELD_OUT, eval_every=2, eval_max_new_tokens=8,
                     progress=False, checkpoint_dir=folder)
    with pytest.raises(ValueError, match=r"eval: saved .*'every': 2.*'every': 3"):
        run_ablation(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, GRPO, 2,
                     variants=VARIANTS, seeds=[0, 1], reward=length_reward,
                     eval_problems=HELD_OUT, eval_every=3, eval_max_new_tokens=8,
                     progress=False, checkpoint_dir=folder)
    with pytest.raises(ValueError, match=r"grpo: saved .*lr=0\.05.*lr=0\.01"):
        run_ablation(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS,
                     GRPO.updated(lr=1e-2), 2,
                     variants=VARIANTS, seeds=[0, 1], reward=length_reward,
                     eval_problems=HELD_OUT, eval_every=2, eval_max_new_tokens=8,
                     progress=False, checkpoint_dir=folder)
    with pytest.raises(ValueError, match=r"steps=0, but .* already holds 1 steps.*steps >= 1"):
        _ablation(tokenizer, 0, folder)
    with pytest.raises(ValueError, match="checkpoint_every must be None or an integer >= 1, "
                                         "got 0"):
        _ablation(tokenizer, 1, tmp_path / "other", checkpoint_every=0)
    with pytest.raises(ValueError, match="checkpoint_every=2 without checkpoint_dir"):
        _ablation(tokenizer, 1, checkpoint_every=2)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is an existing file; accepted: a folder"):
        _ablation(tokenizer, 1, tmp_path / "file")
    assert stepped == [] and json.loads((folder / SETTINGS_FILE).read_text())["seeds"] == [0, 1]


def test_a_finished_ablation_returns_its_tables_without_stepping(tokenizer, tmp_path,
                                                               monkeypatch):
    folder = tmp_path / "ckpt"
    done = _ablation(tokenizer, 2, folder, checkpoint_every=None)
    stepped, evaluated = _count_steps(monkeypatch), _evaluated(monkeypatch)
    again = _ablation(tokenizer, 2, folder, checkpoint_every=None)
    assert stepped == [] and evaluated == []
    assert again.history.equals(done.history) and again.evals.equals(done.evals)
    assert again.per_variant().equals(done.per_variant())
    longer = _ablation(tokenizer, 3, folder, checkpoint_every=None)  # a larger steps goes on
    assert len(stepped) == 2 * 2 and sorted(longer.evals["step"].unique()) == [0, 2, 3]


def test_a_folder_saved_when_rollout_configs_held_rl_step_and_harvest_resumes(
        tokenizer, tmp_path, monkeypatch):
    """Before issue 37 ``RolloutConfig`` had the per-call fields ``rl_step`` and ``harvest``
    (now arguments of ``RolloutEngine.rollout``): a folder whose saved GRPO config names
    them is the same ablation, and resumes."""
    folder = tmp_path / "ckpt"
    _ablation(tokenizer, 1, folder, checkpoint_every=None)
    settings = json.loads((folder / SETTINGS_FILE).read_text())
    old = (settings["grpo"].replace("workers=", "rl_step=0, workers=", 1)
           .replace("spec_k=", "harvest=False, spec_k=", 1))
    assert "rl_step=0" in old and old != settings["grpo"]
    (folder / SETTINGS_FILE).write_text(json.dumps({**settings, "grpo": old}))
    stepped = _count_steps(monkeypatch)
    _ablation(tokenizer, 2, folder, checkpoint_every=None)
    assert len(stepped) == 2 * 2  # one more step of each run (variant, seed), not refused


def test_a_restored_tlt_run_keeps_its_timelines_bandit_and_drafter(tokenizer, tmp_path,
                                                                  monkeypatch, long_tails):
    """What no history row holds comes back too: every step's timeline (the bandit's
    decisions and choices are read from them), what the adaptive engine learned, and the
    spot-trained drafter."""
    model = tiny_model("qwen2", tokenizer)
    torch.manual_seed(3)
    head = EagleHead(model)
    args = dict(variants=["baseline", "tlt"], drafter_head=head, reward=length_reward,
                progress=False, arms=CHAINS, spec_k=3, explore_budget=0.5,
                spot=SpotConfig.flat(batch_size=4, max_steps=2), checkpoint_dir=tmp_path)
    done = run_ablation(model, tokenizer, PROBLEMS, remedy_grpo(workers=3), 2, **args)
    stepped = _count_steps(monkeypatch)
    again = run_ablation(model, tokenizer, PROBLEMS, remedy_grpo(workers=3), 2, **args)
    assert stepped == [] and again.history.equals(done.history)
    assert len(again.decisions()) > 0 and again.decisions().equals(done.decisions())
    assert again.bandit_choices().equals(done.bandit_choices())
    assert again.learned().equals(done.learned())
    for step in (0, 1):
        for table in ("steps", "requests"):
            assert getattr(again.timeline("tlt", 0, step), table).equals(
                getattr(done.timeline("tlt", 0, step), table))
    saved, back = done.trainers["tlt", 0], again.trainers["tlt", 0]
    assert back.spot.version == saved.spot.version > 0
    assert all(torch.equal(a, b) for a, b in zip(saved.drafter.head.state_dict().values(),
                                                 back.drafter.head.state_dict().values()))


def test_a_folder_saved_on_wall_sim_seconds_resumes_on_them_and_a_new_one_on_cpu_time(
        tokenizer, tmp_path, monkeypatch):
    import workbench.clock as clock
    walls = []
    wall = clock.wall_seconds
    monkeypatch.setattr(clock, "wall_seconds", lambda: walls.append(1) or wall())
    folder = tmp_path / "ckpt"
    torch.set_num_threads(2)  # the notebooks' threads: a new run still reads thread CPU time
    try:
        _ablation(tokenizer, 1, folder)
        assert json.loads((folder / "ablation.json").read_text())["sim_seconds"] == "thread_cpu"
        assert walls == [] and torch.get_num_threads() == 2
        settings = json.loads((folder / "ablation.json").read_text())
        (folder / "ablation.json").write_text(json.dumps({**settings, "sim_seconds": "wall"}))
        _ablation(tokenizer, 2, folder)  # saved before the CPU clock: resumed on wall time
        assert walls and clock.sim_seconds_kind() == "thread_cpu"
    finally:
        torch.set_num_threads(1)


def test_runs_side_by_side_give_the_tables_of_runs_one_at_a_time(tokenizer, straight,
                                                                 monkeypatch):
    """With two torch threads the runs go two at a time, each on a thread of its own
    (``workbench.side_by_side``); what they compute does not move."""
    import threading
    one_at_a_time = _ablation(tokenizer, 3)
    threads, real = set(), Turns.step

    def step(self, key):
        threads.add(threading.current_thread().name)
        real(self, key)
    monkeypatch.setattr(Turns, "step", step)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        together = _ablation(tokenizer, 3)
    finally:
        torch.set_num_threads(before)
    assert len(threads) >= 2 and threading.main_thread().name not in threads
    assert together.history[COLUMNS].equals(one_at_a_time.history[COLUMNS])
    assert together.evals.equals(one_at_a_time.evals)
    assert (together.history["clock"] == "sim").all()
