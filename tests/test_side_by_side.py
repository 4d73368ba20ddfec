"""Jobs side by side (``workbench.side_by_side``): results in job order, torch on one thread
while they run and its thread count restored after, the caller's context in every job, and
a job's error raised only once every job is done."""
import contextvars
import threading

import pytest
import torch

from workbench.side_by_side import side_by_side, width_for

NAME = contextvars.ContextVar("name", default="unset")


def test_results_come_in_job_order_with_one_torch_thread_and_the_callers_context():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    token = NAME.set("caller's")
    try:
        def job(i):
            return i, torch.get_num_threads(), NAME.get(), threading.current_thread().name
        out = side_by_side([lambda i=i: job(i) for i in range(5)], width=2)
        assert [o[0] for o in out] == list(range(5))
        assert {o[1] for o in out} == {1} and {o[2] for o in out} == {"caller's"}
        assert threading.main_thread().name not in {o[3] for o in out}
        assert torch.get_num_threads() == 2
    finally:
        NAME.reset(token)
        torch.set_num_threads(before)


def test_width_one_runs_in_the_caller_and_changes_nothing():
    out = side_by_side([lambda: threading.current_thread().name] * 3, width=1)
    assert out == [threading.main_thread().name] * 3


def test_a_failing_job_lets_the_others_finish_then_raises_the_first_error():
    done = []

    def fails(message):
        raise ValueError(message)
    jobs = [lambda: fails("first"), lambda: done.append(1), lambda: fails("second"),
            lambda: done.append(2)]
    with pytest.raises(ValueError, match="first"):
        side_by_side(jobs, width=2)
    assert sorted(done) == [1, 2]


def test_the_width_is_one_unless_sim_seconds_are_thread_cpu_time_on_backends_of_their_own():
    assert width_for("wall", False) == 1 and width_for("thread_cpu", True) == 1
    assert width_for("thread_cpu", False) == torch.get_num_threads()
    with pytest.raises(ValueError, match="width"):
        side_by_side([lambda: 1], width=0)
