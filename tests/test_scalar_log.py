"""TensorBoard logging (``workbench.scalar_log``): every numeric value of a row is read back by
TensorBoard's own ``EventAccumulator`` at its step, seconds tagged with their clock, the time
axis the run's cumulative step seconds; a resumed run writes no step twice; figures go in as
images; a bad ``report_to`` is refused before anything is written."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from workbench.scalar_log import (LOG_DIR, log_saved_figures, scalar_log, scalars_of,  # noqa: E402
                                  tag_of)


def _events(folder) -> EventAccumulator:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def _rows(steps, start=0):
    return [{"step": s, "reward": 0.1 * s, "loss": np.float64(1.0 / (s + 1)), "kl_start": 0.0,
             "step_s": 2.0 + s, "update_s": 0.5, "clock": "sim", "spoke": np.bool_(s % 2),
             "arm": "chain:k=4"} for s in range(start, steps)]


def test_every_numeric_value_is_read_back_at_its_step_with_its_clock(tmp_path):
    rows = _rows(3)
    with scalar_log("tensorboard", tmp_path) as log:
        for row in rows:
            log.row(row["step"], row)
    acc = _events(tmp_path / LOG_DIR)
    for row in rows:
        for tag, value in scalars_of(row).items():
            got = {e.step: e for e in acc.Scalars(tag)}[row["step"]]
            assert got.value == pytest.approx(value, rel=1e-6)
    assert "time_sim/step_s" in acc.Tags()["scalars"] and "arm" not in acc.Tags()["scalars"]
    assert tag_of("update_s", "wall") == "time_wall/update_s" and tag_of("loss", "sim") == "loss"
    cumulative = [e.value for e in acc.Scalars("time_sim/cumulative_step_s")]
    assert cumulative == pytest.approx(np.cumsum([r["step_s"] for r in rows]))
    assert [e.wall_time for e in acc.Scalars("reward")] == pytest.approx(cumulative)


def test_a_resumed_run_writes_no_step_twice(tmp_path):
    with scalar_log("tensorboard", tmp_path) as log:  # crashed after step 3, checkpoint at 2
        for row in _rows(4):
            log.row(row["step"], row)
    elapsed = sum(r["step_s"] for r in _rows(2))
    with scalar_log("tensorboard", tmp_path, resume_step=2, elapsed_s=elapsed) as log:
        for row in _rows(5, start=2):
            log.row(row["step"], {**row, "reward": row["reward"] + 1})
    rewards = [(e.step, e.value) for e in _events(tmp_path / LOG_DIR).Scalars("reward")]
    assert [s for s, _ in rewards] == [0, 1, 2, 3, 4]
    assert [v for _, v in rewards] == pytest.approx([0.0, 0.1, 1.2, 1.3, 1.4])


def test_a_resumed_log_is_read_after_the_crashed_one_whatever_the_writers_count(
        tmp_path, monkeypatch):
    """TensorBoard reads a folder's event files in name order, and a name ends with the
    process's count of writers so far, which does not sort as a number ("...9" after
    "...10"): the resumed run's file is still read after the crashed run's, so its purge
    drops the steps run again. (Before, which of the two came first hung on how many
    writers the test's process had opened before it.)"""
    from tensorboard.summary.writer import event_file_writer
    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(9))
    test_a_resumed_run_writes_no_step_twice(tmp_path)
    files = sorted(p.name for p in (tmp_path / LOG_DIR).glob("events.out.tfevents.*"))
    assert [f.rsplit(".", 1)[-1] for f in files] == ["9", "10"]


def test_figures_go_in_as_images(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    with scalar_log("tensorboard", tmp_path) as log:
        log.figures({"reward_curve": fig}, step=3)
    plt.close(fig)
    acc = _events(tmp_path / LOG_DIR)
    assert acc.Tags()["images"] == ["figures/reward_curve"]
    assert acc.Images("figures/reward_curve")[0].step == 3


def test_a_bad_report_to_is_refused_and_none_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match=r"report_to must be one of 'none', 'tensorboard', got 'wandb'"):
        scalar_log("wandb", tmp_path)
    with pytest.raises(ValueError, match="needs the run's folder"):
        scalar_log("tensorboard", None)
    with scalar_log("none", tmp_path) as log:
        log.row(0, _rows(1)[0])
    assert not (tmp_path / LOG_DIR).exists()


def test_a_runs_saved_figures_go_in_as_images_only_when_reported(tmp_path):
    for name in ("reward_curves", "timeline"):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, 1])
        fig.savefig(tmp_path / f"{name}.png")
        plt.close(fig)
    assert log_saved_figures("none", tmp_path) == [] and not (tmp_path / LOG_DIR).exists()
    assert log_saved_figures("tensorboard", tmp_path, step=10) == ["reward_curves", "timeline"]
    acc = _events(tmp_path / LOG_DIR)
    assert acc.Tags()["images"] == ["figures/reward_curves", "figures/timeline"]
    assert acc.Images("figures/timeline")[0].step == 10
