"""TLT beside a long-tail remedy: the remedy trainer's rollouts decode with TLT's SD and
adaptive engine, and the spot trainer trains the drafter in their idle windows; with an early
stop those windows end at the cut, and the drafter trains on the requests as they stood
there."""

import pytest
import torch

from workbench.adapt import SpotConfig
from workbench.rl import GRPOConfig
from workbench.rl.ablation.runner import run_ablation
from workbench.rl.remedies import RemedyConfig, RemedyTrainer
from workbench.rl.remedies.cut import tokens_at
from workbench.rl.variants import remedy_config, tlt_config
from workbench.rollout import LocalBackend
from workbench.speculative.eagle import EagleHead
from workbench.rollout.timeline import ROLLOUT_KINDS

from .helpers.models import tiny_model
from .helpers.rl import CHAINS, PROBLEMS, length_reward, long_tails  # noqa: F401 (a fixture)


def _grpo(workers=6):
    return GRPOConfig.flat(prompts_per_step=3, samples_per_prompt=3, max_new_tokens=24,
                           lr=5e-2, workers=workers, seed=1)


def _tlt(grpo):
    return tlt_config("tlt", grpo, arms=CHAINS, spec_k=3, explore_budget=0.5,
                      spot=SpotConfig.flat(batch_size=4, max_steps=3))


def _trainer(tokenizer, remedy, backend="local", **kw):
    model = tiny_model("qwen2", tokenizer)
    torch.manual_seed(3)
    head = EagleHead(model).to(torch.float64)
    grpo = _grpo()
    return RemedyTrainer(model, tokenizer, PROBLEMS, length_reward,
                         remedy_config(remedy, grpo, **kw), backend=backend,
                         tlt=_tlt(grpo), drafter_head=head)


def test_with_an_early_stop_the_drafter_trains_until_the_cut_on_the_cut_requests(
        tokenizer, tick_clock):
    """On a clock that ticks 1/1024 s per reading (so that which worker is idle when is
    fixed), TLT beside over-provisioning: every idle window ends at the cut, each worker that
    finished before it trains from its last step, no drafter step ends past the cut, and the
    harvest the drafter learns from is each request's prefix at the cut."""
    tr = _trainer(tokenizer, "overprovision", extra_groups=3)
    for _ in range(4):  # until a step is cut while some workers idle before the cut
        version = tr.spot.version
        row = tr.step()
        s = tr.last[0]
        cut, full = s.timeline.makespan_s, s.result.timeline
        if cut < full.makespan_s and row["drafter_steps"]:
            break
    else:
        pytest.fail("no step was cut with drafter steps in 4 steps")
    assert row["groups_trained"] == 3 and tr.spot.version == version + 1
    steps = full.steps[full.steps["kind"].isin(ROLLOUT_KINDS)]
    last = steps.groupby("worker")["end_s"].max()
    idle = sorted((w, t) for w, t in last.items() if t < cut)
    windows = s.at_end.idle.windows
    assert sorted((w.worker, w.start_s) for w in windows) == idle
    assert all(w.end_s == cut for w in windows)
    drafts = s.timeline.steps[s.timeline.steps["kind"] == "drafter_train"]
    assert len(drafts) >= row["drafter_steps"] > 0 and (drafts["end_s"] <= cut).all()
    assert row["drafter_overrun_s"] == 0 and row["step_s"] == pytest.approx(
        cut + row["update_sim_s"])
    # the drafter's pairs: the requests as they stood at the cut, states and all
    by_uid = {r.uid: r for r in s.result.requests}
    cut_requests = [r for r in s.at_end.requests if r.finish == "cut"]
    assert cut_requests
    for r in cut_requests:
        n = tokens_at(full.steps, by_uid[r.uid], cut)
        assert r.tokens == by_uid[r.uid].tokens[:n] and r.end_s == cut
        assert r.hidden.shape[0] == len(r.prompt_ids) + n - 1
    sequences = {tuple(r.prompt_ids + r.tokens) for r in s.at_end.requests}
    assert tr.spot.buffer.carry and all(tuple(it.pair[0].tolist()) in sequences
                                        for it in tr.spot.buffer.carry)


def test_without_a_cut_the_jobs_run_inside_the_rollout_and_resume_from_a_checkpoint(
        tokenizer, tmp_path, long_tails):
    """TLT beside partial rollouts (never cut; every rollout's tail 60 s longer, so that the
    windows hold ``max_steps`` drafter steps whatever the machine's load): the spot
    trainer's jobs go into the rollout (TLT's own path), the bandit and drafter decide, and a
    checkpoint keeps the drafter's trainer, its version and the bandit."""
    tr = _trainer(tokenizer, "partial", segment_tokens=8)
    row = tr.step()
    s = tr.last[0]
    assert s.at_end is s.result  # the engine ran the jobs in its own idle windows
    assert row["accept_len"] >= 1 and row["drafter_steps"] == 3 * (6 - 1)
    assert row["drafter_version"] == tr.spot.version == 1
    assert "verify" in set(s.timeline.steps["kind"])
    tr.save_checkpoint(tmp_path)
    back = _trainer(tokenizer, "partial", segment_tokens=8)
    back.load_checkpoint(tmp_path)
    assert back.spot.version == 1 and back.schedule is not tr.schedule
    for a, b in zip(tr.drafter.head.state_dict().values(),
                    back.drafter.head.state_dict().values()):
        assert torch.equal(a, b)
    assert back.sampler.pool and back.step()["drafter_version"] == 2


def test_the_ablation_runs_tlt_beside_a_remedy(tokenizer, long_tails):
    model = tiny_model("qwen2", tokenizer)
    torch.manual_seed(3)
    ab = run_ablation(model, tokenizer, PROBLEMS, _grpo(workers=3), 2,
                      variants=["baseline", "tlt+async"], drafter_head=EagleHead(model),
                      reward=length_reward, progress=False, arms=CHAINS, spec_k=3,
                      explore_budget=0.5, spot=SpotConfig.flat(batch_size=4, max_steps=2))
    h = ab.history.set_index(["variant", "step"])
    assert h.loc[("tlt+async", 1), "max_staleness"] == 1
    assert h.loc[("tlt+async", 0), "drafter_version"] == 2  # step 0: two rollouts, two merges
    assert (h.loc["tlt+async", "accept_len"] >= 1).any()  # the bandit speculated
    assert ab.trainers["tlt+async", 0].schedule is not None


class _WallBackend(LocalBackend):
    clock = "wall"


def test_tlt_with_an_early_stop_is_refused_on_the_wall_clock(tokenizer):
    with pytest.raises(ValueError, match="extra_groups=3.*'wall'.*sim clock"):
        _trainer(tokenizer, "overprovision", backend=_WallBackend(), extra_groups=3)
    with pytest.raises(ValueError, match="drafter_head"):
        RemedyTrainer(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, length_reward,
                      RemedyConfig(), tlt=_tlt(_grpo()))
