"""Shortest-predicted-first scheduling: an RL variant in one file (docs/extending.md, "An RL
variant"), the worked example of the ``workbench.variants`` seam.

Each rollout's requests go to the workers shortest-predicted first: the engine deals them
round-robin in that order and each worker admits its shard in it, so where a worker's batch is
capped (``max_batch_size``) the short ones are admitted first and the long ones trail, and
every worker gets a like share of short and long. Nothing else changes: GRPO's sampling, its
update, and which groups are trained (the first drawn) are the baseline's, so the variant's
speedup is the order's alone.

The prediction, of the tokens a response has left: a group whose other responses finished at
an earlier step (one carried over) predicts their mean length; a fresh group predicts its
prompt's length in tokens (the running-sum task's answers grow with its number of terms). A
response's tokens so far come off the prediction (at least one token is left). It reads the
requests alone, so a resumed run orders them as a straight one.

Run it (any RL notebook's ``plugins``; the name then goes into ``variants``)::

    .venv/bin/python -m papermill notebooks/11_long_tail_remedies.ipynb out.ipynb \\
        -p plugins '["tests/plugins/shortest_first.py"]' \\
        -p variants '["baseline", "shortest_first", "tlt+shortest_first"]'
"""
from workbench.rl.variants import RemedyVariant, rl_variant


def predicted_left(group, response) -> float:
    """Tokens ``response`` (of ``group``, a ``rl.remedies.responses.Group``) is predicted to
    have left: its finished siblings' mean length, else its prompt's length, less what it
    has (at least 1)."""
    done = [len(r.tokens) for r in group.responses if r.done]
    whole = sum(done) / len(done) if done else len(group.prompt_ids)
    return max(1.0, whole - len(response.tokens))


@rl_variant("shortest_first")
class ShortestFirst(RemedyVariant):
    """GRPO whose rollouts run their requests shortest-predicted first."""

    def order(self, live):
        """The requests by predicted tokens left, shortest first (ties as drawn)."""
        left = [predicted_left(group, response) for group, response in live]
        return sorted(range(len(live)), key=lambda i: (left[i], i))
