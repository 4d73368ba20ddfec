"""Shared fixtures: tiny random models built in the test, in float64 where equality matters;
the session's one local Ray and its 2 actors."""
import copy
import itertools
import logging
import os
import time
from pathlib import Path

import pytest
import torch

from workbench.zoo.tokenizer import build_char_tokenizer
from .xdist_groups import (GroupScheduling, close_shared, open_shared, publish_groups,
                           shared_folder)
from .helpers.models import PROMPTS, tiny_model  # noqa: F401 (PROMPTS: test_suffix_drafter imports it here)

# one thread, here and in every process the tests start (kernels, the command line, fresh
# processes; a test may set its own): the session's notebook runs (tests/notebook_runs.py)
# share the two cores with these tests, and torch threads that outnumber free cores spin in
# their barriers (10x slower)
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# inductor compiles in the test's process, not in a pool of its own processes (each imports
# torch: seconds of CPU that the two cores' other work wants)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# dynamo logs every trace and guard at DEBUG to "torch.__trace", which torch means to keep to
# itself; propagated, each record reaches pytest's log capture, and formatting them made
# dynamo's traces 3x slower (an EAGLE test: 47 s against 15 s)
logging.getLogger("torch.__trace").propagate = False


def whole_core() -> tuple[float, float]:
    """A usage probe double (``workbench.clock.usage_probe``): the CPU time and the wall time
    of one reading, equal, so that every call got a whole core."""
    now = time.monotonic()
    return now, now


@pytest.fixture(autouse=True)
def undisturbed_repeats(monkeypatch):
    """A benchmark's repeats are never run again as disturbed in a test (``speedup.interleave``
    redoes a repeat that got less than a core, and how often depends on the machine's load):
    a test counts the calls it made. ``test_speedup`` tests the redo with its own double."""
    import workbench.speedup as speedup
    monkeypatch.setattr(speedup, "usage_probe", lambda clock: whole_core)


@pytest.fixture
def tick_clock(monkeypatch):
    """Every clock reading, wall (``perf_counter``) and thread CPU time alike (the sim clock's:
    ``workbench.clock``), 1/1024 s after the one before: a step's times are exact in binary
    and the same on every machine, for a test whose outcome reads the measured clock."""
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) / 1024)
    monkeypatch.setattr(time, "thread_time", lambda: next(ticks) / 1024)


@pytest.fixture(scope="session")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(params=["llama", "qwen2"])
def tiny_gqa(request, tokenizer):
    return tiny_model(request.param, tokenizer)


# the fixtures of the session's notebook runs (tests/notebook_runs.py): a test that reads them
# runs late in the session, by which time the runs, started with the first test, are done
SESSION_RUN_FIXTURES = {"quickstart_runs", "notebook_runs"}
# tests that want the cores to themselves run after those: a local Ray (its start gives its
# node a fixed 30 s to register, which a machine busy with kernels can miss) and JupyterLab
# in Chromium (a browser's waits)
QUIET_FIXTURES = {"local_ray", "lab"}


def _reads_session_runs(item) -> bool:
    return bool(SESSION_RUN_FIXTURES & set(getattr(item, "fixturenames", ())))


def _place(item) -> int:
    """0: runs beside the session's notebook runs; 1: compiles with inductor (marked
    ``compiles``), late, when the runs are mostly done: a cold compile, CPU-bound in the
    test's process and in g++, ran several times slower beside two kernels; 2: reads the
    runs; 3: wants a quiet machine."""
    if QUIET_FIXTURES & set(getattr(item, "fixturenames", ())):
        return 3
    if _reads_session_runs(item):
        return 2
    return int(item.get_closest_marker("compiles") is not None)


# pytest-xdist's groups (tests/xdist_groups.py): each goes to one worker whole, in its place
GROUPS = {1: "inductor", 3: "quiet"}


def pytest_collection_modifyitems(items):
    """The tests in their places (:func:`_place`), each place in its order. Under pytest-xdist
    the compiling tests are one group (one worker's warm-up of inductor, not two) and the quiet
    ones another (one local Ray, one browser at a time)."""
    items.sort(key=_place)  # stable
    publish_groups({item.nodeid: GROUPS[place] for item in items
                    if (place := _place(item)) in GROUPS})


def pytest_configure(config):
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        open_shared()  # the controller of pytest-xdist's workers


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        close_shared()


def pytest_xdist_make_scheduler(config, log):
    """The groups' scheduler, where xdist would deal the tests one by one (``--dist load``,
    what ``-n`` runs by default)."""
    return GroupScheduling(config, log) if config.getvalue("dist") == "load" else None


@pytest.fixture(scope="session", autouse=True)
def session_runs(request, tmp_path_factory):
    """The session's notebook runs (``notebook_runs.SessionRuns``), started in the background
    with the first test when a test of the session reads them; None when none does. Under
    pytest-xdist, one worker runs them and the others read what it publishes
    (``notebook_runs.PublishedRuns``); it waits for them before it ends, since a test on
    another worker may still read them."""
    if not any(_reads_session_runs(item) for item in request.session.items):
        yield None
        return
    from .notebook_runs import PublishedRuns, SessionRuns, claim, stop_cli
    from .helpers.notebooks import SMOKE
    shared = shared_folder()
    if shared is not None and not claim(shared):
        yield PublishedRuns(shared)
        return
    runs = SessionRuns(tmp_path_factory.mktemp("session_runs"), SMOKE, publish_to=shared)
    yield runs.start()
    if shared is not None and not request.session.shouldfail:
        runs.wait()
    stop_cli()  # nothing left once every test that reads them has run


@pytest.fixture(scope="session")
def quickstart_runs(session_runs) -> Path:
    """The main job's pipeline (00 once, 01 over seeds 0 and 1) at the notebooks' smoke sizes,
    run once for the session: the notebooks' smoke tests read its 00 and 01 runs, the browser
    test its report. Its folder of runs."""
    return session_runs.quickstart()


@pytest.fixture(scope="session")
def notebook_runs(session_runs):
    """Every other notebook run of the session, as one pipeline (tests/notebook_runs.py)."""
    return session_runs.notebooks()


@pytest.fixture(scope="session")
def notebook_runs_ended(session_runs) -> None:
    """Waits for the session's notebook runs to end (kernels, notebook 08's own Ray): the
    quiet tests want the cores. Without pytest-xdist the tests that read the runs have
    waited already; with it, the quiet group's worker may get there first."""
    if session_runs is not None:
        session_runs.wait()


@pytest.fixture(scope="session")
def local_ray(tmp_path_factory, notebook_runs_ended) -> Path:
    """One local Ray for the session's Ray tests (2 CPUs, loopback, its session folder under a
    run folder whose path is long enough to matter): a start costs ~9 s, so every Ray test
    reuses it; it shuts down at the session's end. Its log folder."""
    import ray
    from workbench.ray_cluster import connect
    log_dir = tmp_path_factory.mktemp("a_run_folder_whose_path_is_long_enough_to_matter") / "ray"
    assert connect(None, num_cpus=2, log_dir=log_dir)  # started here, not found running
    yield log_dir
    ray.shutdown()


class SessionActors:
    """The session's 2 Ray actors (an actor's start imports torch and transformers: seconds),
    started at the first :meth:`backend` and again after :meth:`release`: each holds a copy of
    ``tiny_model("llama")`` (seed 0) and its own EAGLE drafter. Tests that change the actors'
    weights reset them first (an engine that finds running actors sends its model)."""

    def __init__(self, tokenizer):
        self.tokenizer, self._backend = tokenizer, None

    def backend(self):
        from workbench.rollout import RayBackend, RolloutEngine
        from workbench.speculative import EagleDrafter, EagleHead
        if self._backend is None or self._backend.num_workers != 2:
            self._backend = self._backend or RayBackend()  # the session's Ray, reused
            policy = tiny_model("llama", self.tokenizer, seed=0)
            RolloutEngine(policy, self.tokenizer, backend=self._backend).start(
                2, policy_factory=lambda w: copy.deepcopy(policy),
                drafter_factory=lambda w, model: EagleDrafter(EagleHead(model), model))
        return self._backend

    def release(self) -> None:
        """Kill the actors (they hold both CPUs of the session's Ray); Ray stays up."""
        if self._backend is not None:
            self._backend.close()


@pytest.fixture(scope="session")
def ray_actors(local_ray, tokenizer) -> SessionActors:
    actors = SessionActors(tokenizer)
    yield actors
    actors.release()


def pytest_terminal_summary(terminalreporter):
    """Say where the browser tests' screenshots are (tests/browser.py)."""
    from .browser import SAVED
    if SAVED:
        terminalreporter.section("browser screenshots")
        for path in SAVED:
            terminalreporter.write_line(str(path))
