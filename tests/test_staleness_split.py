"""The staleness run on two cores: the trajectory and the observer processes, over a spool,
give the one-process run's rows, step for step (float64: equal), whether run one after the
other, resumed after an interruption, or as two real processes side by side; the trajectory
waits for the observer when ``max_ahead`` observations are pending."""
import pandas as pd
import pytest
import torch

from workbench.speculative import EagleHead

from .helpers.models import tiny_model
from .helpers.staleness import (SAME, hold_clock_steady,  # noqa: F401 (fixtures: steady_clock,
                                staleness_config, staleness_problems,  # straight)
                                staleness_reward, staleness_run, steady_clock, straight)


def _trajectory(tokenizer, tmp_path, config, max_ahead=3, wait_s=None, checkpoints=False):
    """The trajectory process of a two-core run (here: in this process)."""
    from workbench.rl.staleness.split import StalenessTrajectory
    from workbench.rl.staleness.spool import Spool
    spool = Spool(tmp_path / "spool", max_ahead, wait_s=wait_s, poll_s=0.01)
    return StalenessTrajectory(tiny_model("llama", tokenizer), tokenizer, staleness_problems(), spool,
                               staleness_reward, config,
                               checkpoint_dir=tmp_path / "trajectory" if checkpoints else None)


def _observer(tokenizer, tmp_path, config, checkpoints=False):
    """The observer process of a two-core run, with a model of its own."""
    from workbench.rl.staleness.split import SplitObserver
    from workbench.rl.staleness.spool import Spool
    model = tiny_model("llama", tokenizer)
    torch.manual_seed(1)
    return SplitObserver(model, tokenizer, EagleHead(model), config,
                         Spool(tmp_path / "spool", poll_s=0.01),
                         checkpoint_dir=tmp_path / "observer" if checkpoints else None)


def _split(tokenizer, tmp_path, config, max_ahead=3, wait_s=None, checkpoints=False):
    return (_trajectory(tokenizer, tmp_path, config, max_ahead, wait_s, checkpoints),
            _observer(tokenizer, tmp_path, config, checkpoints))


def _pair_process(role, tmp_path, steps):
    """One process of a real two-process run (spawned), on the steady clock."""
    from workbench.zoo.tokenizer import build_char_tokenizer
    hold_clock_steady(pytest.MonkeyPatch())
    make = _trajectory if role == "trajectory" else _observer
    kw = {"max_ahead": 1} if role == "trajectory" else {}
    make(build_char_tokenizer(), tmp_path, staleness_config(), checkpoints=True, **kw).run_to(steps)


def _assert_same_as_straight(straight, trajectory, observer):
    from workbench.rl.staleness.split import split_history
    history = split_history(trajectory.rows, observer.rows)
    assert list(history.columns) == list(straight.history.columns)
    same = SAME + ["idle_fraction", "wasted_fraction", "accuracy", "loss", "grad_norm",
                   "adaptive_pairs", "ceiling_converged"]
    pd.testing.assert_frame_equal(straight.history[same], history[same])
    pd.testing.assert_frame_equal(straight.positions, observer.positions)
    for a, b in zip(straight.policy.state_dict().values(),
                    trajectory.grpo.model.state_dict().values()):
        assert torch.equal(a, b)
    for name in ("adaptive", "ceiling"):
        assert all(torch.equal(a, b) for a, b in zip(
            straight.drafters[name].drafter.head.state_dict().values(),
            observer.observer.drafters[name].drafter.head.state_dict().values()))


def test_the_two_process_run_gives_the_one_process_rows(tokenizer, tmp_path, straight,
                                                        steady_clock):
    trajectory, observer = _split(tokenizer, tmp_path, staleness_config())
    trajectory.run_to(3)
    assert trajectory.spool.steps() == [0, 1, 2]
    observer.run_to(3)
    assert trajectory.spool.steps() == []  # each observation deleted once consumed
    _assert_same_as_straight(straight, trajectory, observer)


def test_the_trajectory_waits_when_max_ahead_observations_are_pending(tokenizer, tmp_path):
    trajectory, observer = _split(tokenizer, tmp_path, staleness_config(drafters=["frozen"]),
                                  max_ahead=2, wait_s=0.05)
    with pytest.raises(TimeoutError, match="2 pending observations"):
        trajectory.run_to(3)
    assert trajectory.rl_step == 2 and trajectory.spool.pending() == [0, 1]
    observer.step()
    trajectory.run_to(3)
    assert trajectory.spool.pending() == [1, 2]


def test_a_resumed_pair_gives_the_same_rows(tokenizer, tmp_path, straight, steady_clock):
    config = staleness_config(checkpoint_every=2)
    trajectory, observer = _split(tokenizer, tmp_path, config, checkpoints=True)
    for _ in range(3):  # checkpointed after step 2; step 2's observation written
        trajectory.step()
    observer.step()  # step 0 observed, not checkpointed: the observation stays
    assert trajectory.spool.steps() == [0, 1, 2] and trajectory.spool.pending() == [1, 2]
    # the stopped run's observation of step 2 as a process paused mid-rollout leaves it: its
    # sim-clock steps stretched by the pause, so the idle windows grow with it
    stale = trajectory.spool.take(2)
    stale.rl.result.timeline.steps[["start_s", "end_s"]] *= 1000
    trajectory.spool.put(stale)
    from workbench.rl.staleness.split import clear_for_resume, trajectory_step
    assert trajectory_step(tmp_path / "trajectory") == 2
    assert trajectory_step(tmp_path / "nowhere") == 0
    assert clear_for_resume(trajectory.spool, tmp_path / "trajectory") == 2
    assert trajectory.spool.steps() == [0, 1]  # written anew by the resumed trajectory
    trajectory, observer = _split(tokenizer, tmp_path, config, checkpoints=True)
    assert (trajectory.rl_step, observer.rl_step) == (2, 0)
    observer.spool.wait_s = 0.05  # the observer first: it waits for the new step 2
    with pytest.raises(TimeoutError, match="the observation of step 2"):
        observer.run_to(3)
    assert observer.rl_step == 2
    observer.spool.wait_s = None
    trajectory.run_to(3)
    observer.run_to(3)
    _assert_same_as_straight(straight, trajectory, observer)
    # the pair's checkpoints make one one-process run's state: its history, its drafters
    from workbench.rl.staleness.split import split_state
    joined = staleness_run(tokenizer, config)
    joined.load_state_dict(split_state(tmp_path / "trajectory", tmp_path / "observer"))
    pd.testing.assert_frame_equal(joined.history[SAME], straight.history[SAME])
    pd.testing.assert_frame_equal(joined.positions, straight.positions)
    assert joined.rl_step == 3 and joined.drafters["adaptive"].spot.step_s > 0


def test_side_by_side_processes_stop_together_when_one_fails():
    import sys
    import time

    from workbench.rl.staleness.split import run_side_by_side
    run_side_by_side({"a": (time.sleep, (0,)), "b": (time.sleep, (0,))}, poll_s=0.05)
    sleep_s = 600  # the trajectory's: a run that waited for it would take that long
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the observer process failed \(exit code 3.*"
                                           r"\['trajectory'\]\) were stopped"):
        run_side_by_side({"trajectory": (time.sleep, (sleep_s,)), "observer": (sys.exit, (3,))},
                         poll_s=0.05)
    assert time.monotonic() - t0 < sleep_s  # stopped, not waited for (a margin no load eats)


def test_two_real_processes_side_by_side_give_the_one_process_rows(tokenizer, tmp_path,
                                                                   straight):
    from workbench.rl.staleness.split import run_side_by_side, split_state
    run_side_by_side({role: (_pair_process, (role, tmp_path, 3))
                      for role in ("trajectory", "observer")}, poll_s=0.05)
    joined = staleness_run(tokenizer)
    joined.load_state_dict(split_state(tmp_path / "trajectory", tmp_path / "observer"))
    same = SAME + ["idle_fraction", "wasted_fraction"]
    pd.testing.assert_frame_equal(joined.history[same], straight.history[same])
    pd.testing.assert_frame_equal(joined.positions, straight.positions)


def test_bad_arguments_of_a_split_run_are_refused_before_anything_runs(tmp_path, monkeypatch):
    import workbench.models as models
    from workbench.rl.staleness.split import split_setup
    from workbench.rl.staleness.spool import Spool
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    spool = Spool(tmp_path / "spool")
    with pytest.raises(ValueError, match="role.*'both'"):
        split_setup("both", staleness_config(), spool)
    with pytest.raises(ValueError, match="config must be a StalenessConfig"):
        split_setup("observer", {"spec_k": 4}, spool)
    with pytest.raises(ValueError, match="max_ahead"):
        Spool(tmp_path / "other", max_ahead=0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="existing file"):
        Spool(tmp_path / "file")
    with pytest.raises(ValueError, match="existing file"):
        split_setup("trajectory", staleness_config(), spool, checkpoint_dir=tmp_path / "file")


def test_an_observation_pickled_before_the_staleness_modules_moved_is_read(tmp_path,
                                                                           monkeypatch):
    """A spool written by a version whose ``Observation`` lived in
    ``workbench.rl.staleness_spool`` (before issue 37's ``rl/staleness/``) is still taken."""
    import sys

    from workbench.rl.checkpoint import MOVED_MODULES
    from workbench.rl.staleness import spool as spool_module
    from workbench.rl.staleness.spool import Observation, Spool
    old = "workbench.rl.staleness_spool"
    assert MOVED_MODULES[old] == spool_module.__name__
    spool = Spool(tmp_path / "spool")
    with monkeypatch.context() as patch:  # pickled by reference under the old module path
        patch.setitem(sys.modules, old, spool_module)
        patch.setattr(Observation, "__module__", old)
        spool.put(Observation(0, {"w": torch.ones(2)}, None, []))
    assert old.encode() in spool.path(0).read_bytes()
    assert old not in sys.modules
    taken = spool.take(0)
    assert type(taken) is Observation and torch.equal(taken.policy["w"], torch.ones(2))
