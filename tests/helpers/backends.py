"""Idle jobs and a failing drafter for the backend and fault tests."""
from workbench.rollout.idle import IdleJob
from workbench.speculative import NGramDrafter


class SleepJob(IdleJob):
    """An idle job: ``naps`` steps of ``nap_s`` seconds each, until one is preempted; steps
    that ended past an open window's late end are undone (``clock.settle``). Its outcome is
    what it did, and its preempted row, if any."""

    def __init__(self, naps: int, nap_s: float):
        self.naps, self.nap_s = naps, nap_s

    def run(self, window, clock):
        done = []
        for i in range(self.naps):
            value, row = clock.timed("drafter_train", lambda: clock.wait(self.nap_s) or i,
                                     batch_size=3)
            if row.get("preempted"):
                break
            done.append(value)
        late = clock.settle(len(done))
        cut = next((row for row in clock.rows if row.get("preempted")), None)
        return {"worker": window.worker, "done": done[:len(done) - late], "cut": cut}


class Tail:
    """Tail jobs (``rollout.idle.TailJobs``): ``job`` for every window (or for the
    ``first`` ones), each call recorded as (window, the workers whose values were back)."""

    def __init__(self, job, first: int | None = None):
        self.job_, self.first, self.asked = job, first, []

    def job(self, window, returned):
        self.asked.append((window, [getattr(value, "worker", None) for value in returned]))
        return self.job_ if self.first is None or len(self.asked) <= self.first else None


class BrokenDrafter(NGramDrafter):
    """Drafts until request ``uid`` is in the batch, then raises."""

    def __init__(self, uid):
        super().__init__()
        self.uid = uid

    def draft(self, ctx, k):
        if self.uid in ctx.uids:
            raise RuntimeError("out of memory (pretend)")
        return super().draft(ctx, k)
