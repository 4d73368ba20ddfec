"""The rollout's end (``rollout.timeline.rollout_end_s``): one definition that idle windows,
rollout seconds, drafter overrun and each worker's window start all read."""
import pandas as pd

from workbench.rollout.timeline import rollout_end_s


def test_the_rollouts_end_is_one_definition_for_tables_rows_and_workers():
    """Idle work and failed rows never end a rollout; every site reads the same end."""
    rows = [
        {"worker": 0, "step": 0, "kind": "prefill", "start_s": 0.0, "end_s": 1.0},
        {"worker": 0, "step": 1, "kind": "decode", "start_s": 1.0, "end_s": 3.0},
        {"worker": 0, "step": 2, "kind": "drafter_train", "start_s": 3.0, "end_s": 9.0},
        {"worker": 1, "step": 0, "kind": "verify", "start_s": 0.0, "end_s": 2.0},
        {"worker": 1, "step": 1, "kind": "failed", "start_s": 2.0, "end_s": 7.0},
    ]
    steps = pd.DataFrame(rows)
    assert rollout_end_s(rows) == rollout_end_s(steps) == 3.0
    assert rollout_end_s([rows[2]], default=0.5) == 0.5
    ends = [rollout_end_s([r for r in rows if r["worker"] == w]) for w in (0, 1, 2)]
    assert ends == [3.0, 2.0, 0.0]
