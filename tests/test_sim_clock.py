"""The sim clock charges a worker only for its own work, whatever else runs; every step says
what share of a core it got, and a disturbed one is flagged (workbench.clock)."""
import subprocess
import sys
import threading

import pytest
import torch

from workbench import clock
from workbench.rollout import LocalBackend
from workbench.rollout.timeline import Timeline, usage_shares
from workbench.rollout.worker import StepRecorder

from .helpers.models import busy_for, tiny_model

SPIN_S = 0.3  # CPU seconds another thread or process burns while the worker waits on it


def _spin_in_thread(started: threading.Event, done: threading.Event) -> None:
    started.set()
    busy_for(SPIN_S)
    done.set()


def test_a_sim_step_waiting_on_another_threads_work_is_charged_nothing_of_it():
    rec = StepRecorder(0, "sim")
    started, done = threading.Event(), threading.Event()

    def wait_for_the_other_thread():
        threading.Thread(target=_spin_in_thread, args=(started, done)).start()
        started.wait()
        done.wait()  # descheduled: the other thread works meanwhile

    rec.timed("decode", wait_for_the_other_thread)
    charged = rec.rows[-1]["end_s"] - rec.rows[-1]["start_s"]
    # the other thread burned SPIN_S of CPU; this one only started it and waited
    assert charged < SPIN_S / 3


def test_a_sim_step_waiting_on_another_process_is_charged_nothing_of_it():
    rec = StepRecorder(0, "sim")
    spin = f"import time\nend = time.process_time() + {SPIN_S}\nwhile time.process_time() < end: pass"
    rec.timed("decode", lambda: subprocess.run([sys.executable, "-c", spin], check=True))
    charged = rec.rows[-1]["end_s"] - rec.rows[-1]["start_s"]
    # the child's start-up and its SPIN_S of spinning are its own CPU time, not this thread's
    assert charged < SPIN_S / 3


def test_a_sim_step_is_charged_its_own_work_in_full():
    rec = StepRecorder(0, "sim")
    rec.timed("decode", lambda: busy_for(0.05))
    assert rec.rows[-1]["end_s"] - rec.rows[-1]["start_s"] >= 0.05


def test_the_local_backend_runs_its_workers_on_one_torch_thread_and_restores_the_count(
        tokenizer):
    model = tiny_model("llama", tokenizer)
    torch.set_num_threads(2)
    try:
        backend = LocalBackend()
        backend.start(lambda w: model, num_workers=2)
        assert backend.map(lambda worker, item: torch.get_num_threads(), [0, 1]) == [1, 1]
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="sim_work"):
            clock.seconds_reader("sim")  # several threads: refused, not under-counted
        with clock.sim_work():
            assert torch.get_num_threads() == 1 and clock.seconds_reader("sim")() >= 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_a_run_saved_on_wall_sim_seconds_measures_wall_time_in_its_scope():
    torch.set_num_threads(2)
    try:
        with clock.sim_seconds("wall"):
            assert clock.sim_seconds_kind() == "wall"
            with clock.sim_work():
                assert torch.get_num_threads() == 2  # the old runs' threads, untouched
            assert clock.seconds_reader("sim") is clock.seconds_reader("wall")
        assert clock.sim_seconds_kind() == "thread_cpu"
    finally:
        torch.set_num_threads(1)
    with pytest.raises(ValueError, match="'thread_cpu', 'wall', got 'process'"):
        with clock.sim_seconds("process"):
            pass


class HalfCore:
    """A usage probe double: each reading 1 wall second later, with ``share`` of it CPU."""

    def __init__(self, share: float):
        self.share, self.readings = share, 0

    def __call__(self) -> tuple[float, float]:
        self.readings += 1
        return self.readings * self.share, float(self.readings)


@pytest.mark.parametrize("share, disturbed", [(0.5, 1.0), (0.95, 0.0)])
def test_a_wall_clock_step_that_got_less_than_the_bound_of_a_core_is_flagged(share, disturbed):
    rec = StepRecorder(0, "wall", usage=HalfCore(share))
    rec.timed("decode", lambda: None)
    rec.timed("decode", lambda: None)
    assert [row["cpu_share"] for row in rec.rows] == [pytest.approx(share)] * 2
    tl = Timeline.from_records(rec.rows, [], 1)
    assert tl.steps["cpu_share"].dtype == "Float64"
    summary = tl.summary()
    assert summary["disturbed_share"] == disturbed
    assert summary["cpu_share"] == pytest.approx(share)


def test_the_disturbed_share_pools_a_runs_timelines_by_their_seconds():
    usages = [{"measured_s": 3.0, "disturbed_s": 3.0, "cpu_s": 1.5},
              {"measured_s": 1.0, "disturbed_s": 0.0, "cpu_s": 1.0}]
    assert usage_shares(usages) == {"disturbed_share": 0.75, "cpu_share": 0.625}
    nan = usage_shares([])
    assert nan["disturbed_share"] != nan["disturbed_share"]  # NaN: nothing measured


def test_a_timeline_saved_before_the_cpu_share_column_loads_with_it_missing(tmp_path):
    rows = [{"worker": 0, "step": 0, "kind": "decode", "start_s": 0.0, "end_s": 1.0,
             "batch_size": 1, "tokens": 1, "forward_s": 1.0, "clock": "sim"}]
    tl = Timeline.from_records(rows, [], 1)
    tl.save(tmp_path / "tl")
    loaded = Timeline.load(tmp_path / "tl")
    assert loaded.steps["cpu_share"].isna().all()
    assert loaded.summary()["disturbed_share"] != loaded.summary()["disturbed_share"]
