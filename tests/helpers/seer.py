"""What the Seer tests share: requests as the Sampler hands them over, a divided dispatch that
moves work whenever a worker falls idle, and a schedule that loses a worker mid-rollout."""
from workbench.rl.remedies.responses import Group
from workbench.rl.remedies.seer_divided import DividedDispatch
from workbench.rollout.schedule import PLAIN, PlainSchedule
from workbench.tasks import Problem


def live_requests(tokenizer, prompts, G=1):
    """``(Group, Response)`` per request, as the Sampler hands them over: G per prompt."""
    groups = [Group.fresh(Problem(prompt=p, answer="a", uid=i), tokenizer(p)["input_ids"], G, i)
              for i, p in enumerate(prompts)]
    return [(g, r) for g in groups for r in g.live]


class InOrder(DividedDispatch):
    """The divided dispatch with every prediction equal, so that the deal is the one drawn,
    and a move whenever a worker falls idle (half the busiest one's rows), whatever the
    measured costs (a tick clock's steps cost the same at any batch size, where no move would
    pay; a wall clock's are no test's to read)."""

    def predictions(self, i):
        return {"siblings": None, "history": None, "prompt": 1.0, "used": 1.0}

    def worth_moving(self, source, runs):
        free = [q for q in source.running if q.uid not in self.moved]
        return free[:max(1, len(source.running) // 2)]


class FailsAt(PlainSchedule):
    """Plain decoding, but worker ``w`` raises at its decode step ``at[w]``, once (each Ray
    actor counts in its own copy)."""

    def __init__(self, at: dict[int, int]):
        self.at, self.seen = at, dict.fromkeys(at, 0)

    def plan(self, batch_size, worker):
        if worker in self.at:
            self.seen[worker] += 1
            if self.seen[worker] == self.at[worker]:
                raise RuntimeError(f"worker {worker} lost (pretend)")
        return PLAIN
