"""The spot trainer on every idle worker: each trains a copy of the published drafter in its
own window (sim clock), and the copies merge by local SGD at the step's end."""
import copy

import pytest
import torch

from workbench.adapt import SpotConfig, SpotTrainer
from workbench.adapt.local_sgd import merge_copies
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative import EagleDrafter, EagleHead
from workbench.train import TrainConfig, Trainer

from .helpers.models import PROMPTS, tiny_model
from .helpers.rl import longer_tail, long_tails  # noqa: F401 (a fixture)


def _spot(tokenizer, tmp_path, workers, **kw):
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    torch.manual_seed(1)
    drafter = EagleDrafter(EagleHead(model).eval(), model)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=12, temperature=1.0, workers=workers,
                        samples_per_prompt=2)
    result = longer_tail(engine.rollout(PROMPTS, cfg, progress=False, harvest=True))
    spot = SpotTrainer(model, drafter, SpotConfig.flat(batch_size=4, **kw), tmp_path / "head")
    return engine, result, spot


def test_every_idle_worker_trains_right_after_its_shard_and_the_step_is_not_stretched(
        tokenizer, tmp_path):
    engine, result, spot = _spot(tokenizer, tmp_path, workers=4, max_steps=2)
    rollout_end = result.timeline.makespan_s
    windows = [w for w in result.timeline.idle_windows() if w.seconds > 0]
    before = {k: v.clone() for k, v in spot.serving.head.state_dict().items()}
    out = spot.train_in_idle(result, engine.backend)
    train = result.timeline.steps.query("kind == 'drafter_train'")
    assert set(train["worker"]) == {w.worker for w in windows} and len(windows) == 3
    for w in windows:  # each copy starts right after its worker's last rollout step
        rows = train[train["worker"] == w.worker]
        assert rows["start_s"].iloc[0] == pytest.approx(w.start_s) and len(rows) == 2
    assert out["drafter_steps"] == 2 * 3 and out["drafter_workers"] == 3
    assert out["drafter_window_s"] == pytest.approx(sum(w.seconds for w in windows))
    assert out["drafter_overrun_s"] == 0 and result.timeline.makespan_s == rollout_end
    assert spot.version == 1 and spot.eagle.steps_done == 6       # the merge continues from 6
    served = spot.serving.head.state_dict()
    assert any(not torch.equal(before[k], served[k]) for k in before)
    on_disk = EagleHead.from_pretrained(tmp_path / "head", spot.eagle.policy).state_dict()
    assert all(torch.equal(on_disk[k], served[k]) for k in served)


def test_all_idle_workers_take_more_drafter_steps_than_the_first_finisher_on_the_same_rollout(
        tokenizer, tmp_path):
    firsts, alls = [], []
    for rule, steps in (("first", firsts), ("all", alls)):
        engine, result, spot = _spot(tokenizer, tmp_path / rule, workers=4, max_steps=3,
                                     idle_workers=rule)
        steps.append(spot.train_in_idle(result, engine.backend)["drafter_steps"])
    assert firsts == [3] and alls == [9]


def _trainer(seed: int) -> Trainer:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2).double()
    return Trainer(model, lambda batch, g: ((model(batch) - 1) ** 2).mean(),
                   TrainConfig(lr=0.1, progress=False))


def test_the_merge_is_the_step_weighted_mean_of_the_copies():
    """Weights 1/4 and 3/4 for copies of 1 and 3 steps; AdamW's moments averaged alike, its
    step count the larger copy's; the harness continues from start + 4; one copy merges to
    itself and copies without steps do not count."""
    trainer = _trainer(0)
    start = copy.deepcopy(trainer.state_dict())
    copies = []
    for steps, x in ((1, 1.0), (3, -2.0)):
        trainer.load_state_dict(copy.deepcopy(start))
        with trainer.training():
            for _ in range(steps):
                trainer.step(torch.full((4, 3), x, dtype=torch.float64))
        copies.append(copy.deepcopy(trainer.state_dict()))
    merged = merge_copies(start, copies, [1, 3])
    for key in start["model"]:
        expected = 0.25 * copies[0]["model"][key] + 0.75 * copies[1]["model"][key]
        assert torch.allclose(merged["model"][key], expected, rtol=0, atol=1e-15)
    for index, moments in merged["optimizer"]["state"].items():
        a, b = (c["optimizer"]["state"][index] for c in copies)
        assert torch.allclose(moments["exp_avg_sq"], 0.25 * a["exp_avg_sq"] + 0.75 * b["exp_avg_sq"])
        assert float(moments["step"]) == 3.0
    assert merged["step"] == start["step"] + 4 and len(merged["history"]) == 4
    trainer.load_state_dict(merged)  # a whole state the harness takes back
    assert merge_copies(start, copies[:1], [1]) is copies[0]
    assert merge_copies(start, [copies[0], None], [1, 0]) is copies[0]
    assert merge_copies(start, [None, None], [0, 0]) is None
    with pytest.raises(ValueError, match="2 copies for 1 step counts"):
        merge_copies(start, copies, [1])


def test_idle_workers_is_a_fixed_choice():
    with pytest.raises(ValueError, match="idle_workers"):
        SpotConfig(idle_workers="every")


def test_an_estimate_that_no_window_fits_is_halved_until_one_tries_again(tokenizer, tmp_path):
    """One slow step (a first one, a busy moment) raises the estimate above every window;
    windows that then do not dare a step halve it, so drafter training resumes."""
    engine, result, spot = _spot(tokenizer, tmp_path, workers=2, max_steps=2)
    spot.step_s = 1e6  # longer than any window: nobody tries
    out = spot.train_in_idle(result, engine.backend)
    assert out["drafter_steps"] == 0 and out["drafter_preempted"] == 0
    assert spot.step_s == 5e5


def test_the_two_rules_on_the_same_rollouts_differ_in_drafter_steps_alone(tokenizer,
                                                                         long_tails):
    """rl.scaling.compare_idle_rules: two TLT trainers in lockstep with coupled sampling
    decode the same tokens; with 60 s tails every window fits ``max_steps``, so every idle
    worker's rule takes 3 windows' steps where the first finisher takes one's."""
    from workbench.rl import GRPOConfig
    from workbench.rl.scaling import compare_idle_rules
    from workbench.tasks import Problem
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    torch.manual_seed(1)
    head = EagleHead(model)
    problems = [Problem(prompt=p, answer="a", uid=i) for i, p in enumerate(PROMPTS)]
    grpo = GRPOConfig.flat(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=12,
                           temperature=1.0, workers=4)
    rules = compare_idle_rules(model, tokenizer, problems, lambda p, c, a: float("a" in c),
                               head, grpo, 2, spot=SpotConfig.flat(batch_size=4, max_steps=2),
                               progress=False)
    wide = rules.pivot(index="step", columns="rule")
    assert (wide["tokens_digest"]["first"] == wide["tokens_digest"]["all"]).all()
    assert wide["drafter_steps"]["first"].tolist() == [2, 2]
    assert wide["drafter_steps"]["all"].tolist() == [6, 6]
    assert wide["drafter_workers"]["all"].tolist() == [3, 3]


def _after_the_rollout(trainer_cls):
    """``trainer_cls`` whose spot trainer trains as main's did, before the drafter trained
    during the rollout: the rollout without tail jobs, then ``SpotTrainer.train_in_idle`` in
    its idle windows, on the same sim clock (the reference the tail jobs must reproduce)."""
    from workbench.rl.tlt import tokens_digest
    from workbench.speculative.measure import acceptance_length

    class AfterTheRollout(trainer_cls):
        def step(self):
            rl = self.grpo.rollout(self.schedule, self.drafter, harvest=True)
            extra = {"accept_len": acceptance_length(rl.result),
                     "tokens_digest": tokens_digest(rl.result)}
            extra.update(self.spot.train_in_idle(rl.result, self.grpo.engine.backend))
            self.timelines[rl.step] = rl.result.timeline
            return self.grpo.update(rl, extra)
    return AfterTheRollout


@pytest.mark.parametrize("workers", [2, 4])
def test_the_local_backends_figures_are_mains_on_a_fixed_clock(tokenizer, long_tails,
                                                              tick_clock, workers):
    """The tail jobs on the sim clock train what the spot trainer trained after the rollout
    (main's path, run here beside them as the reference: figures recorded on another CPU
    differ in float64's last digits): on a clock that ticks 1/1024 s per reading (so that
    which requests finished before each window is fixed, ties included: every time is exact
    in binary), three steps of the static-chain variant take the same drafter steps, pairs
    and losses on both paths, on 2 workers (the first finisher alone) and on 4 (three
    copies)."""

    from workbench.rl import GRPOConfig
    from workbench.rl.tlt import TLTTrainer
    from workbench.rl.variants import tlt_config

    from .helpers.rl import prompt_problems, letters_reward

    def run(trainer_cls):
        model = tiny_model("llama", tokenizer)
        torch.manual_seed(3)
        head = EagleHead(model).to(torch.float64)
        grpo = GRPOConfig.flat(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=10,
                               lr=1e-2, workers=workers, max_batch_size=3, temperature=1.0,
                               spec_mode="coupled")
        cfg = tlt_config("adaptive_drafter", grpo, spec_k=3,
                                spot=SpotConfig.flat(batch_size=4, max_steps=3,
                                                     history_steps=1))
        tlt = trainer_cls(model, tokenizer, prompt_problems(), letters_reward, cfg, drafter_head=head)
        return tlt.run(3, progress=False)

    history = run(TLTTrainer)
    main = run(_after_the_rollout(TLTTrainer))
    copies = 1 if workers == 2 else workers - 1  # the first finisher alone; all but the last
    assert history["drafter_workers"].tolist() == [copies] * 3
    assert history["drafter_steps"].tolist() == [3 * copies] * 3  # max_steps in every window
    for column in ("tokens_digest", "drafter_steps", "drafter_workers", "drafter_pairs",
                   "drafter_preempted"):
        assert history[column].tolist() == main[column].tolist(), column
    # the same training on the same pairs, in this process: equal, not merely close
    assert history["drafter_loss"].tolist() == main["drafter_loss"].tolist()
    assert (history["drafter_stop_wait_s"] == 0).all()  # nothing waits on the sim clock


def test_a_job_stopped_mid_step_keeps_its_last_whole_step_before_the_end(tokenizer, tmp_path):
    """Wall clock, an open window: the stop comes while the job's 4th step runs, with the
    end inside the 3rd. The 3rd (whole, but past the end) is undone and its row cut at the
    end, the 4th (in flight, begun after the end) discarded without a row; the copy is the
    one two steps give."""
    import math
    import threading
    import time

    from workbench.rollout.timeline import IdleWindow
    from workbench.rollout.idle import WindowEnd
    from workbench.rollout.worker import StepRecorder, Worker
    from workbench.speculative.train import EagleTrainer
    engine, result, spot = _spot(tokenizer, tmp_path, workers=2, max_steps=50)
    tail = spot.tail(2)
    window = IdleWindow(0, result.timeline.makespan_s, math.inf)  # every request is ready
    job = tail.job(window, [result])
    worker = Worker(0, spot.eagle.policy, clock="wall")
    worker.recorder = StepRecorder(0, "wall")
    started, real_step = [], spot.eagle.step
    # the 4th step waits in flight until the stop has come (an order of events, not a race
    # that a loaded machine could lose by letting a 5th step start first)
    fourth, stopped = threading.Event(), threading.Event()

    def slow_step(batch):
        started.append(time.perf_counter())
        time.sleep(0.05)  # every step lasts 0.05 s at least: the end below falls inside the 3rd
        if len(started) == 4:
            fourth.set()
            assert stopped.wait(60)
        return real_step(batch)
    spot.eagle.step = slow_step
    end, done = WindowEnd(), []
    thread = threading.Thread(target=lambda: done.append(worker.run_idle(job, window, end)))
    thread.start()
    assert fourth.wait(60)
    rows = [r for r in worker.recorder.rows if r["kind"] == "drafter_train"]
    assert len(rows) == 3  # three whole steps recorded, the 4th in flight
    end.close(rows[2]["start_s"] + 0.02)  # the driver's stop, late
    stopped.set()
    thread.join(10)
    (outcome, recorded), = done
    assert len(outcome.losses) == 2 and outcome.preempted == 1
    assert [r.get("preempted", False) for r in recorded] == [False, False, True]
    assert recorded[-1]["end_s"] == end.end_s and outcome.wasted_s == pytest.approx(
        end.end_s - recorded[-1]["start_s"])
    here = EagleTrainer(spot.eagle.policy, EagleHead(spot.eagle.policy), job.config)
    here.trainer.load_state_dict(copy.deepcopy(job.start))
    here.set_pairs(job.pairs)
    with here.training():
        for batch in range(2):
            here.step(job.start["step"] + batch)
    expected = here.trainer.state_dict()
    assert all(torch.equal(outcome.state["model"][k], expected["model"][k])
               for k in expected["model"])
    assert outcome.state["step"] == job.start["step"] + 2
