"""The adaptive drafter and the TLT trainer: the buffer's one-step offset, idle-window
training on the sim clock, preemption-safe publishing, and TLT = baseline token for token."""
import copy

import numpy as np
import pytest
import torch

from workbench.adapt import DrafterBuffer, SpotConfig, SpotTrainer
from workbench.rl import GRPOConfig
from workbench.rl.ablation.runner import coupled_first_divergence, run_ablation
from workbench.rl.setup import RLSetup
from workbench.rl.grpo import GRPO
from workbench.rl.loop import RLLoop
from workbench.rl.tlt import TLTConfig, TLTTrainer, first_divergence
from workbench.rl.variants import tlt_config
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative import EagleDrafter, EagleHead
from workbench.speculative.train import harvest_pairs
from workbench.tasks import Problem

from .helpers.models import MANY, PROMPTS, busy_for, tiny_model
from .helpers.rl import (CHAINS, letters_reward, long_tails,  # noqa: F401 (a fixture)
                         longer_tail, prompt_problems,
                         same_state, state_copy, tlt_trainer)


def _rollout(model, tokenizer, workers=2):
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=12, temperature=1.0, workers=workers,
                        samples_per_prompt=2)
    return engine, engine.rollout(PROMPTS, cfg, progress=False, harvest=True)


def test_buffer_serves_finished_sequences_and_the_previous_steps_longest(tokenizer):
    model = tiny_model("llama", tokenizer)
    _, result = _rollout(model, tokenizer)
    pairs = harvest_pairs(result)
    buf = DrafterBuffer(carry_fraction=0.25)
    buf.add_step(result, pairs)
    ends = sorted(r.end_s for r in result.requests)
    assert len(buf.pairs(until_s=ends[3])) == sum(e <= ends[3] for e in ends)
    assert len(buf.pairs()) == len(pairs) and buf.carry == []
    buf.add_step(result, pairs)  # next step: the carry is the longest quarter of the last
    longest = sorted((len(r.tokens) for r in result.requests), reverse=True)[:4]
    assert sorted((it.response_tokens for it in buf.carry), reverse=True) == longest
    assert len(buf.pairs(until_s=-1.0)) == 4
    with pytest.raises(ValueError, match="carry_fraction"):
        DrafterBuffer(carry_fraction=1.5)


def _spot(tokenizer, tmp_path, **kw):
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    torch.manual_seed(1)
    drafter = EagleDrafter(EagleHead(model).eval(), model)
    engine, result = _rollout(model, tokenizer)
    spot = SpotTrainer(model, drafter, SpotConfig.flat(batch_size=4, **kw), tmp_path / "drafter")
    return model, drafter, engine, result, spot


def test_spot_training_runs_in_the_idle_window_on_the_sim_clock(tokenizer, tmp_path):
    model, drafter, engine, result, spot = _spot(tokenizer, tmp_path, max_steps=3,
                                                 idle_workers="first")
    before = {k: v.clone() for k, v in drafter.head.state_dict().items()}
    result = longer_tail(result)
    rollout_end = result.timeline.makespan_s
    last = result.timeline.steps.groupby("worker")["end_s"].max()
    out = spot.train_in_idle(result, engine.backend)
    steps = result.timeline.steps
    train = steps[steps["kind"] == "drafter_train"]
    assert len(train) == out["drafter_steps"] == 3 and out["drafter_preempted"] == 0
    w = out["drafter_worker"]
    assert w == int(last.idxmin()) and set(train["worker"]) == {w}
    assert train["start_s"].iloc[0] == pytest.approx(last[w])          # right after its shard
    assert (train["start_s"].iloc[1:].values == train["end_s"].iloc[:-1].values).all()
    assert (train["end_s"] <= rollout_end).all() and out["drafter_overrun_s"] == 0
    assert result.timeline.makespan_s == rollout_end
    served = drafter.head.state_dict()
    assert any(not torch.equal(before[k], served[k]) for k in before)     # published
    on_disk = EagleHead.from_pretrained(tmp_path / "drafter", model).state_dict()
    assert all(torch.equal(on_disk[k], served[k]) for k in served)


def test_a_step_that_crosses_the_window_is_preempted_and_the_published_drafter_serves_on(
        tokenizer, tmp_path):
    model, drafter, engine, result, spot = _spot(tokenizer, tmp_path, max_steps=5,
                                                 idle_workers="first")
    spot.train_in_idle(longer_tail(result), engine.backend)   # publishes v1
    v1, trainer_v1 = state_copy(drafter.head), copy.deepcopy(spot.eagle.trainer.state_dict())
    step_v1, version = spot.eagle.steps_done, spot.version
    engine, result = _rollout(model, tokenizer)
    result = longer_tail(result, 0.05)
    rollout_end = result.timeline.makespan_s
    window = result.timeline.idle_windows()[0]  # the first worker to finish: the spot's
    start, end = window.start_s, window.end_s
    real_step = spot.eagle.step  # the spot trainer takes one EagleTrainer.step per drafter step

    def slow_step(*a, **k):  # this machine got slower: one step outlasts the whole window
        busy_for(end - start + 0.05)  # work, on the sim clock's CPU time too
        return real_step(*a, **k)
    spot.eagle.step = slow_step
    spot.step_s = 0.0  # the estimate of v1's steps (slow on a loaded machine) lets it start
    out = spot.train_in_idle(result, engine.backend)
    assert out["drafter_preempted"] == 1 and out["drafter_steps"] == 0
    assert out["drafter_wasted_s"] == pytest.approx(end - start)
    assert out["drafter_overrun_s"] == 0 and result.timeline.makespan_s == rollout_end
    row = result.timeline.steps.query("kind == 'drafter_train'").iloc[-1]
    assert bool(row["preempted"]) and row["end_s"] == end and row["forward_s"] > end - start
    # the update was discarded: serving, saved and trained heads, optimizer and step are v1's
    assert spot.version == version and spot.eagle.steps_done == step_v1
    assert same_state(v1, state_copy(drafter.head)) and same_state(v1, state_copy(spot.head))
    assert same_state(v1, EagleHead.from_pretrained(tmp_path / "drafter", model).state_dict())
    adam = spot.eagle.trainer.state_dict()["optimizer"]["state"]
    assert all(torch.equal(adam[i]["exp_avg"], trainer_v1["optimizer"]["state"][i]["exp_avg"])
               for i in adam)
    # its seconds are wasted, not work; the estimate learned the slower step
    tl = result.timeline
    assert tl.wasted_fraction() == pytest.approx(tl.idle_fraction())
    assert spot.step_s > 0.8 * (end - start)


def test_preemption_mid_update_leaves_a_whole_drafter(tokenizer, tmp_path, monkeypatch):
    model, drafter, engine, result, spot = _spot(tokenizer, tmp_path, max_steps=2)
    spot.train_in_idle(longer_tail(result), engine.backend)
    v1 = state_copy(drafter.head)
    # killed inside an optimizer step: the serving and saved drafters stay at v1
    calls = {"n": 0}
    real_loss = spot.eagle.trainer.loss_fn

    def dying_loss(batch, generator):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("preempted")
        return real_loss(batch, generator)
    spot.eagle.trainer.loss_fn = dying_loss
    with pytest.raises(KeyboardInterrupt):
        spot.train_in_idle(longer_tail(result), engine.backend)
    assert same_state(v1, state_copy(drafter.head))
    assert same_state(v1, EagleHead.from_pretrained(tmp_path / "drafter", model).state_dict())
    # killed while the new version is being written: the folder still loads as v1
    spot.eagle.trainer.loss_fn = real_loss
    real_save = torch.save

    def dying_save(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        raise KeyboardInterrupt("preempted while saving")
    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        spot.publish()
    monkeypatch.setattr(torch, "save", real_save)
    loaded = EagleHead.from_pretrained(tmp_path / "drafter", model).state_dict()
    assert same_state(v1, loaded) and same_state(v1, state_copy(drafter.head))
    spot.publish()  # and the next publish lands whole
    assert same_state(state_copy(spot.head), EagleHead.from_pretrained(tmp_path / "drafter",
                                                              model).state_dict())


def test_tlt_reproduces_the_baseline_token_for_token_in_float64(tokenizer, long_tails):
    base = tlt_trainer(tokenizer, "baseline")
    tlt = tlt_trainer(tokenizer, "tlt")
    hb, ht = base.run(2, progress=False), tlt.run(2, progress=False)
    assert first_divergence(hb, ht) == -1
    assert hb["reward"].tolist() == ht["reward"].tolist()
    for a, b in zip(base.model.state_dict().values(), tlt.model.state_dict().values()):
        assert torch.equal(a, b)
    # TLT really speculated and really trained its drafter
    assert (ht["accept_len"] >= 1).all() and ht["drafter_steps"].min() >= 2
    assert ht["drafter_version"].tolist() == [1, 2]
    steps = tlt.record.timelines[1].steps
    assert {"verify", "decode", "drafter_train"} <= set(steps["kind"])
    assert hb["accept_len"].isna().all()


def test_static_and_adaptive_variants(tokenizer):
    static = tlt_trainer(tokenizer, "static_sd")
    head0 = state_copy(static.drafter.head)
    hist = static.run(1, progress=False)
    assert "drafter_steps" not in hist.columns and same_state(head0, state_copy(static.drafter.head))
    assert set(static.record.timelines[0].steps["kind"]) >= {"verify"}


def test_bad_tlt_input(tokenizer):
    with pytest.raises(ValueError, match="threshold"):
        TLTConfig(threshold=0)
    with pytest.raises(ValueError, match=r"delay_s \(seconds\) must be a finite number >= 0, "
                                         r"got -1"):
        TLTConfig(drafter_delay_s=-1)
    with pytest.raises(ValueError, match="explore_budget"):
        TLTConfig(explore_budget=2)
    with pytest.raises(ValueError, match="explore_run"):
        TLTConfig(explore_run=0, speculative=False)  # refused even where nothing explores
    with pytest.raises(ValueError, match=r"settle \(with explore_run=2\)"):
        TLTConfig(explore_run=2, settle=2, speculative=False)
    one_step = TLTConfig(explore_run=1, settle=0).schedule()  # the old rule, passed through
    assert (one_step.bandit.runs.length, one_step.bandit.runs.settle) == (1, 0)
    with pytest.raises(ValueError, match="variant must be one of 'baseline', .*, got 'fast'"):
        tlt_config("fast")
    with pytest.raises(ValueError, match="chain:k=9x|strateg"):
        TLTConfig(arms=("chain:k=9x",))
    model = tiny_model("llama", tokenizer)
    with pytest.raises(ValueError, match="drafter_head"):
        TLTTrainer(model, tokenizer, prompt_problems(), letters_reward, TLTConfig())


def test_tlt_resumes_from_its_checkpoint(tokenizer, tmp_path, long_tails):
    """The policy resumes bit-exactly; the drafter and its trainer come back as saved. (Which
    finished sequences an idle window can train on is decided by the measured clock, so
    later drafter versions are not reproducible run to run, by design.)"""
    def fresh(ckpt=None):
        tr = tlt_trainer(tokenizer, "tlt", spot_steps=2, history_steps=2)
        tr.checkpoint_dir = ckpt
        if ckpt is not None and tr.has_checkpoint(ckpt):
            tr.load_checkpoint(ckpt)
        return tr

    straight = fresh()
    straight.run(2, progress=False)
    first = fresh(tmp_path / "ckpt")
    first.run(1, progress=False)
    resumed = fresh(tmp_path / "ckpt")
    assert resumed.rl_step == 1 and resumed.spot.version == first.spot.version == 1
    assert same_state(state_copy(first.drafter.head), state_copy(resumed.drafter.head))
    assert same_state(state_copy(first.spot.head), state_copy(resumed.spot.head))
    assert len(resumed.spot.buffer.carry) == len(first.spot.buffer.carry) > 0
    # the history comes back too, and the carry is still recognised inside it
    assert resumed.spot.buffer.state() == first.spot.buffer.state()
    assert len(resumed.spot.buffer.pairs(-1.0)) == len(first.spot.buffer.pairs(-1.0)) > 0
    resumed.run(1, progress=False)
    assert same_state(straight.model.state_dict(), resumed.model.state_dict())
    assert straight.history["tokens_digest"].tolist() == resumed.history["tokens_digest"].tolist()


def test_grpo_runs_any_hf_policy_on_a_jsonl_task(tokenizer, tmp_path):
    import json

    from workbench.rl import GRPO
    from workbench.tasks import load_jsonl
    path = tmp_path / "task.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"say {c}?", "answer": c}) for c in "abcd"))
    model = tiny_model("qwen3", tokenizer, dtype=torch.float32)
    g = GRPO(model, tokenizer, load_jsonl(path), letters_reward,
             GRPOConfig.flat(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=6))
    row = g.step()
    assert row["step"] == 0 and 0 <= row["reward"] <= 1 and row["tokens"] > 0


def test_buffer_history_serves_whole_previous_harvests_once(tokenizer):
    model = tiny_model("llama", tokenizer)
    _, result = _rollout(model, tokenizer)
    pairs = harvest_pairs(result)
    buf = DrafterBuffer(carry_fraction=0.25, history_steps=2)
    for step in range(4):
        buf.add_step(result, [(p[0].clone(), p[1]) for p in pairs])  # new pair objects
        served = buf.pairs(until_s=-1.0)  # nothing of this step has finished yet
        # the carry (longest quarter of the last step) and every other sequence of the last
        # min(step, 2) steps, each once
        assert len(served) == min(step, 2) * len(pairs)
        assert len({id(p) for p in served}) == len(served)
    assert buf.state()["buffer_history"] == 2 * len(pairs)
    with pytest.raises(ValueError, match="history_steps"):
        DrafterBuffer(history_steps=-1)


def test_baseline_only_ablation_is_plain_grpo_with_an_accuracy_curve(tokenizer):
    """The ablation's baseline is GRPO itself (same weights after the same steps), so a long
    baseline-only run of notebook 04 is the accuracy benchmark's run; ``eval_every`` adds the
    curve between the ends, and the metrics of a baseline-only run compare it with itself."""
    grpo = GRPOConfig.flat(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=10, lr=1e-2,
                           workers=2, max_batch_size=3, temperature=1.0, seed=5)
    model = tiny_model("llama", tokenizer)
    plain = RLLoop(GRPO(copy.deepcopy(model), tokenizer, prompt_problems(), letters_reward, grpo))
    plain.run(3, progress=False)
    # notebook 04 samples with spec_mode="speculative", the benchmark with the default
    ab = run_ablation(model, tokenizer, prompt_problems(), grpo.updated(spec_mode="speculative"), 3,
                      variants=["baseline"], seeds=[5], reward=letters_reward,
                      eval_problems=prompt_problems(3), eval_every=2, eval_max_new_tokens=4,
                      progress=False)
    for a, b in zip(plain.model.state_dict().values(),
                    ab.trainers[("baseline", 5)].model.state_dict().values()):
        assert torch.equal(a, b)
    assert ab.evals["step"].tolist() == [0, 2, 3]
    m = ab.metrics()
    assert m["compared_variant"] == "baseline" and m["e2e_speedup_baseline"] == 1.0
    assert "e2e_speedup_tlt" not in m and "reward_final_tlt" not in m
    assert m["rl_steps"] == 3 and m["accuracy_final_baseline"] == ab.evals["accuracy"].iloc[-1]
    # what its seconds are, and how much of them other work disturbed: its steps' rows pooled
    assert m["clock"] == "sim" and m["sim_seconds"] == "thread_cpu"
    usage = ab.history[["usage_measured_s", "usage_disturbed_s"]].sum()
    assert m["disturbed_share"] == m["disturbed_share_baseline"] == pytest.approx(
        usage["usage_disturbed_s"] / usage["usage_measured_s"])
    assert 0 < m["cpu_share"] <= 1
    assert ab.bandit_choices("tlt").empty and "tokens_per_s" in ab.bandit_choices("tlt")
    with pytest.raises(ValueError, match=r"variant 'tlt' did not run; ran: \['baseline'\]"):
        ab.metrics("tlt")
    with pytest.raises(ValueError, match="eval_every must be an integer >= 1, got 0"):
        run_ablation(model, tokenizer, prompt_problems(), grpo, 1, variants=["baseline"],
                     eval_every=0)
    setup = RLSetup(model, tokenizer, None, prompt_problems(), [], letters_reward)
    assert coupled_first_divergence(setup, grpo, 0) is None
    with pytest.raises(ValueError, match="steps must be an integer >= 0, got -1"):
        coupled_first_divergence(setup, grpo, -1)


def test_on_a_machine_where_sd_cannot_pay_tlt_converges_to_plain_and_keeps_pace(tokenizer):
    """A hostile machine: every drafted depth sleeps 2 ms, so no SD step can beat a plain one
    of this tiny policy (~0.1 ms). The adaptive engine learns plain in every bucket it decoded in, its
    exploring stays cheap, the spot trainer never stretches a step, and TLT's steps keep pace
    with the baseline's (the benchmark holds the timed figure, this the shape)."""
    grpo = GRPOConfig.flat(prompts_per_step=6, samples_per_prompt=2, max_new_tokens=40, lr=1e-2,
                           workers=2, max_batch_size=6, temperature=1.0)
    problems = [Problem(prompt=p, answer="a", uid=i) for i, p in enumerate(MANY)]
    policy = tiny_model("llama", tokenizer, seed=4)  # ragged: rows finish at many steps
    ab = run_ablation(policy, tokenizer, problems, grpo, 6, variants=["baseline", "tlt"],
                      drafter_head=EagleHead(policy), reward=letters_reward, progress=False,
                      arms=CHAINS, drafter_delay_s=0.002,
                      spot=SpotConfig.flat(batch_size=4, max_steps=2))
    learned = ab.learned("tlt")
    assert len(learned) >= 2 and (learned["choice"] == "plain").all()
    assert (learned["sd_speedup"].dropna() < 1).all() and learned["best_sd"].notna().any()
    m = ab.metrics()
    assert m["plain_share_tlt"] > 0.9 and m["explore_cost_tlt"] < 0.15
    assert m["drafter_overrun_s_max"] == 0
    # keeping pace, without a wall-clock bound (this suite runs beside notebooks; the benchmark
    # holds the timed figure): lossless and coupled, TLT's steps are the baseline's rollouts, and
    # once learned it decodes them the baseline's way, so all it adds is its exploring (above)
    rewards = ab.history.pivot_table(index="step", columns="variant", values="reward")
    assert np.array_equal(rewards["tlt"], rewards["baseline"])
    later = ab.decisions("tlt").query("step >= 3")
    assert (later.loc[~later["explored"].astype(bool), "arm"] == "plain").all()
    assert np.isfinite(m["e2e_speedup_median_tlt"]) and m["e2e_speedup_median_tlt"] > 0
