"""TLT needs nothing of a backend but its protocol: a backend written here against
``rollout.backend.Backend`` alone, whose workers live apart and whose idle jobs run on copies
(as a backend of processes would), runs TLT steps that reproduce the baseline's tokens and
trains the drafter from what the job hands back."""
import copy
import re
from pathlib import Path

from workbench.rl.tlt import first_divergence
from workbench.rollout.backend import Backend
from workbench.rollout.idle import IdleRun
from workbench.rollout.timeline import IdleWindow
from workbench.rollout.worker import Worker

from .helpers.rl import lengthen_slowest, same_state, state_copy, tlt_trainer

ROOT = Path(__file__).resolve().parent.parent


class ApartBackend(Backend):
    """The Backend base, nothing more: workers run in reverse order, every idle job runs
    on a deep copy of itself (changes a job makes to itself never reach the caller), and the
    calls are counted."""

    name = "apart"
    clock = "sim"
    runs_copies = False  # map runs fn itself: a schedule learns in place, no absorb needed

    def __init__(self):
        self.held_workers, self.calls = [], []

    @property
    def num_workers(self) -> int:
        return len(self.held_workers)

    def start(self, policy_factory, drafter_factory=None, num_workers=1):
        self.calls.append("start")
        self.held_workers = []
        for w in range(num_workers):
            policy = policy_factory(w)
            drafter = drafter_factory(w, policy) if drafter_factory is not None else None
            self.held_workers.append(Worker(w, policy, drafter, self.clock))

    def map(self, fn, items, progress=None):
        self.calls.append("map")
        done = {w: fn(self.held_workers[w], item) for w, item in reversed(list(enumerate(items)))}
        if progress is not None:  # as a backend of processes: per worker, as results arrive
            for item in items:
                progress(len(getattr(item, "requests", ())))
        return [done[w] for w in range(len(items))]

    def update_weights(self, policy=None, drafter=None):
        self.calls.append("update_weights")
        for worker in self.held_workers:
            worker.load_weights(policy, drafter)

    def map_tail(self, fn, items, tail, progress=None):
        """``map``, then each worker but the last to finish runs a deep copy of its job, in
        the order they finished, its window's end known (sim clock)."""
        self.calls.append("map_tail")
        values = self.map(fn, items, progress)
        lengthen_slowest([w.recorder for w in self.held_workers], values)  # as ``long_tails``
        ends = sorted((w.rollout_end_s, w.index) for w in self.held_workers[:len(items)])
        windows, runs = [], []
        for start, w in ends[:-1]:
            window = IdleWindow(w, start, ends[-1][0])
            job = tail.job(window, values)
            if job is not None:
                windows.append(window)
                runs.append(self.held_workers[w].run_idle(copy.deepcopy(job), window))
        return values, IdleRun.of(windows, runs)

    def close(self):
        self.held_workers = []


def test_a_backend_written_against_the_protocol_runs_tlt_steps(tokenizer):
    apart = ApartBackend()
    tlt = tlt_trainer(tokenizer, "tlt", backend=apart)
    base = tlt_trainer(tokenizer, "baseline")
    head0 = state_copy(tlt.drafter.head)
    ht, hb = tlt.run(2, progress=False), base.run(2, progress=False)
    assert first_divergence(hb, ht) == -1  # SD stays lossless on any backend
    assert {"start", "map", "map_tail"} <= set(apart.calls)
    # the job trained a copy; what it handed back became the driver's trainer and drafter (how
    # many steps fit a later window depends on this machine's measured step time)
    assert ht["drafter_steps"].iloc[0] >= 1, ht.filter(like="drafter").to_dict("list")
    assert ht["drafter_version"].tolist() == (ht["drafter_steps"] > 0).cumsum().tolist()
    assert tlt.spot.eagle.steps_done == ht["drafter_steps"].sum()
    assert not same_state(head0, state_copy(tlt.drafter.head))
    assert same_state(state_copy(tlt.spot.head), state_copy(tlt.drafter.head))
    steps = tlt.record.timelines[1].steps
    trained = steps[steps["kind"] == "drafter_train"]
    assert len(trained) == ht["drafter_steps"].iloc[1] + ht["drafter_preempted"].iloc[1]
    assert (ht["drafter_overrun_s"] == 0).all()


def test_rl_and_adapt_reach_workers_only_through_the_backend():
    """No module of rl/ or adapt/ names a worker or its recorder (``config.workers``, the
    worker count, is fine; an idle job's ``clock`` is the backend's handle)."""
    forbidden = re.compile(r"backend\.workers\b|\bworkers\[|\.recorder\b|\bWorker\b"
                           r"|\bStepRecorder\b")
    sources = [f for layer in ("rl", "adapt") for f in (ROOT / "workbench" / layer).glob("*.py")]
    assert len(sources) > 5
    hits = [f"{f.name}:{i}: {line.strip()}" for f in sources
            for i, line in enumerate(f.read_text().splitlines(), 1) if forbidden.search(line)]
    assert hits == []
