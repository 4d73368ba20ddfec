"""Seer's scheduling and divided rollout as RL variants (workbench/rl/remedies/seer_schedule.py,
seer_divided.py) on the local backend's sim-time-ordered loop (``LocalBackend.map_steps``):
requests start longest predicted first across workers; a request moved mid-generation
continues token for token in float64, its re-prefill charged on the receiving worker's sim
clock; each predictor's error is in the history; and the variants run through the ablation
like the built-ins, their tokens those of a run without them at every step."""
import math

import pytest

from workbench.adapt import SpotConfig
from workbench.rl import GRPOConfig
from workbench.rl.ablation.runner import run_ablation
from workbench.rl.remedies import RemedyConfig, RemedyTrainer
from workbench.rl.remedies.seer_divided import DividedDispatch
from workbench.rl.remedies.seer_schedule import LengthPredictor, SeerDispatch, SeerTrainer
from workbench.rl.variants import VARIANTS, get_variant, variant_names
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.backend import Backend
from workbench.speculative.eagle import EagleHead
from workbench.tasks import Problem

from .helpers.models import tiny_model
from .helpers.seer import InOrder, live_requests

COUPLED = dict(temperature=1.0, seed=3, spec_mode="coupled")


def _rollout(engine, live, config, dispatch=None, caps=None):
    return engine.rollout([g.prompt_ids + r.tokens for g, r in live], config, progress=False,
                          caps=caps, dispatch=dispatch)


def test_the_variants_are_registered_built_ins_that_compose_with_tlt():
    names = variant_names()
    assert {"seer_schedule", "seer_divided", "tlt+seer_divided"} <= set(names)
    assert "seer_divided" not in VARIANTS.plugin_names()
    assert get_variant("seer_divided").speculative is False
    assert get_variant("tlt+seer_divided").speculative


def test_the_predictors_history_and_a_line_fitted_on_prompt_size():
    p = LengthPredictor()
    assert p.history([1, 2]) is None and p.prompt([1, 2, 3]) == 3.0  # nothing seen: its size
    p.learn([((1, 2), 10), ((1, 2), 14), ((1, 2, 3, 4), 20)])
    assert p.history([1, 2]) == 12.0 and p.history((1, 2, 3, 4)) == 20.0
    a, b = p.line  # least squares through (2, 10), (2, 14), (4, 20)
    assert b == pytest.approx(4.0) and a == pytest.approx(4.0)
    assert p.prompt([0] * 6) == pytest.approx(28.0)


def test_requests_start_longest_predicted_first_across_workers(tokenizer):
    model = tiny_model("qwen2", tokenizer)
    engine = RolloutEngine(model, tokenizer)
    prompts = [f"q{i}?" for i in range(6)]
    live = live_requests(tokenizer, prompts)
    predictor = LengthPredictor()
    lengths = [3, 40, 12, 25, 7, 30]  # what each prompt's responses ran to at earlier steps
    predictor.learn([(tuple(g.prompt_ids), n) for (g, _), n in zip(live, lengths)])
    config = RolloutConfig(workers=2, max_batch_size=1, max_new_tokens=4, samples_per_prompt=1,
                           **COUPLED)
    dispatch = SeerDispatch(live, predictor)
    result = _rollout(engine, live, config, dispatch)
    order = sorted(range(6), key=lambda i: -lengths[i])  # 1, 5, 3, 2, 4, 0
    req = result.timeline.requests
    for w in range(2):  # worker w starts the w-th, (w+2)-th, ... longest, in that order
        mine = req[req["worker"] == w].sort_values("start_s")
        assert list(mine["prompt_id"]) == order[w::2]
    # every request was predicted at its start, by history (and the line); none by siblings
    assert {i: d["used"] for i, d in dispatch.predicted.items()} == dict(enumerate(
        map(float, lengths)))
    dispatch.end([])  # a second end adds nothing but its errors (checked below)
    # the same requests, as drawn, give the same tokens (uids unchanged)
    plain = _rollout(engine, live, config)
    assert result.tokens == plain.tokens


def test_the_siblings_predict_a_group_from_its_first_finished_and_furthest_advanced(tokenizer):
    live = live_requests(tokenizer, ["a1?", "b22?"], G=3)
    d = SeerDispatch(live, LengthPredictor())

    class Out:  # a RequestOutput as the predictor reads it
        def __init__(self, tokens, finish="", end_s=0.0):
            self.tokens, self.finish, self.end_s = [0] * tokens, finish, end_s
    assert d.siblings(0) is None  # no sibling has a token yet
    d.outputs = {1: Out(5), 2: Out(9)}
    assert d.siblings(0) == 9.0  # the furthest advanced: a lower bound
    d.outputs = {1: Out(7, "eos", end_s=2.0), 2: Out(4, "eos", end_s=1.0)}
    assert d.siblings(0) == 7.0  # the first finished (4), no less than the furthest (7)
    d.outputs = {1: Out(3, "eos", end_s=1.0), 2: Out(2)}
    assert d.siblings(0) == 3.0 and d.predictions(0)["used"] == 3.0
    assert d.predictions(3) == {"siblings": None, "history": None, "prompt": 5.0, "used": 5.0}


def _divided_setup(tokenizer):
    """Two workers: worker 0's three requests stop after 2 tokens, worker 1's run to 24, so
    worker 0 falls idle while worker 1 runs three rows."""
    model = tiny_model("qwen2", tokenizer)
    live = live_requests(tokenizer, [f"p{i}x?" for i in range(6)])
    caps = [2, 24, 2, 24, 2, 24]  # dealt round-robin: 0, 2, 4 on worker 0
    config = RolloutConfig(workers=2, max_new_tokens=24, samples_per_prompt=1, ignore_eos=True,
                           **COUPLED)
    return RolloutEngine(model, tokenizer), live, caps, config


def test_a_request_moved_mid_generation_continues_token_for_token_in_float64(tokenizer,
                                                                              tick_clock):
    engine, live, caps, config = _divided_setup(tokenizer)
    plain = _rollout(engine, live, config, caps=caps)
    dispatch = InOrder(live, LengthPredictor())
    moved = _rollout(engine, live, config, dispatch, caps)
    steps, req = moved.timeline.steps, moved.timeline.requests
    assert dispatch.moves >= 1
    reprefills = steps[steps["moved_from"].notna()]
    assert len(reprefills) >= 1 and set(reprefills["worker"]) == {0}
    assert set(reprefills["moved_from"]) == {1} and (reprefills["kind"] == "prefill").all()
    # a long request finished on worker 0, after being started on worker 1
    long_ones = req[req["prompt_id"].isin([1, 3, 5])]
    assert (long_ones["worker"] == 0).any() and (long_ones["response_tokens"] == 24).all()
    # the moved requests had tokens when they moved: started on worker 1, before it
    first = reprefills["start_s"].min()
    assert (long_ones[long_ones["worker"] == 0]["start_s"] < first).all()
    assert moved.tokens == plain.tokens  # token for token, every request
    for a, b in zip(moved.logprobs, plain.logprobs):
        assert a == pytest.approx(b, abs=1e-12)
    # every request answered once, by the worker that finished it
    assert sorted(req["uid"]) == sorted(r.uid for r in plain.requests)


def test_a_moved_request_continues_token_for_token_under_speculative_decoding(tokenizer,
                                                                             tick_clock):
    from workbench.speculative.drafters import EagleDrafter, NGramDrafter
    engine, live, caps, config = _divided_setup(tokenizer)
    prompts = [g.prompt_ids + r.tokens for g, r in live]
    plain = engine.rollout(prompts, config, progress=False, caps=caps)
    # model-free, and an EAGLE head with per-row state (each worker drafts with a view of it)
    for drafter in (NGramDrafter(), EagleDrafter(EagleHead(engine.model), engine.model)):
        sd = engine.rollout(prompts, config, progress=False, caps=caps, drafter=drafter,
                            spec_k=3, dispatch=InOrder(live, LengthPredictor()))
        steps = sd.timeline.steps
        assert steps["moved_from"].notna().any() and (steps["kind"] == "verify").any()
        assert sd.tokens == plain.tokens, type(drafter).__name__


def test_a_moved_request_hands_over_its_harvested_states(tokenizer, tick_clock):
    import torch
    engine, live, caps, config = _divided_setup(tokenizer)
    prompts = [g.prompt_ids + r.tokens for g, r in live]
    plain = engine.rollout(prompts, config, progress=False, caps=caps, harvest=True)
    moved = engine.rollout(prompts, config, progress=False, caps=caps, harvest=True,
                           dispatch=InOrder(live, LengthPredictor()))
    assert moved.timeline.steps["moved_from"].notna().any()
    for a, b in zip(moved.requests, plain.requests):  # one state per fed position, as there
        assert a.hidden.shape == b.hidden.shape == (len(a.prompt_ids) + len(a.tokens) - 1,
                                                     a.hidden.shape[1])
        assert torch.allclose(a.hidden, b.hidden, atol=1e-9)


def test_the_moved_requests_re_prefill_is_charged_on_the_sim_clock(tokenizer, tick_clock):
    engine, live, caps, config = _divided_setup(tokenizer)
    plain = _rollout(engine, live, config, caps=caps)
    moved = _rollout(engine, live, config, InOrder(live, LengthPredictor()), caps)
    steps = moved.timeline.steps
    re = steps[steps["moved_from"].notna()].iloc[0]
    assert re["end_s"] > re["start_s"] and re["forward_s"] > 0  # it took time, on worker 0
    w0 = steps[steps["worker"] == 0].sort_values("start_s")
    w1 = steps[steps["worker"] == 1].sort_values("start_s")
    # it starts once worker 0 is free and worker 1 has let the request go, not before
    before = w0[w0["end_s"] <= re["start_s"]]
    assert re["start_s"] >= before["end_s"].max()
    gave = w1[w1["end_s"] <= re["start_s"] + 1e-12]
    assert len(gave) >= 1
    # and it is work on worker 0's clock: its busy time counts it, its rows do not overlap
    busy = moved.timeline.busy_s()
    assert busy.loc[0] >= re["end_s"] - re["start_s"]
    assert (w0["start_s"].iloc[1:].to_numpy() >= w0["end_s"].iloc[:-1].to_numpy() - 1e-12).all()
    # worker 1 ran fewer rows after the move: its decode steps' batch shrank
    decodes = w1[w1["kind"] == "decode"]
    assert decodes["batch_size"].max() == 3 and decodes["batch_size"].iloc[-1] < 3
    assert plain.timeline.steps["moved_from"].isna().all()  # the plain rollout moved nothing


def test_queued_requests_move_freely_to_the_worker_with_room(tokenizer, tick_clock):
    engine, live, _, config = _divided_setup(tokenizer)
    config = RolloutConfig(**{**vars(config), "max_batch_size": 1})
    caps = [2, 20, 2, 2, 2, 2]  # request 1 holds worker 1; the short ones queue
    plain = _rollout(engine, live, config, caps=caps)
    dispatch = InOrder(live, LengthPredictor())
    divided = _rollout(engine, live, config, dispatch, caps)
    req = divided.timeline.requests.set_index("prompt_id")
    assert plain.timeline.requests.set_index("prompt_id").loc[[3, 5], "worker"].tolist() == [1, 1]
    assert req.loc[[0, 2, 3, 4, 5], "worker"].tolist() == [0] * 5  # worker 0 took them all
    assert req.loc[1, "worker"] == 1 and dispatch.moves == 0  # nothing running moved
    assert divided.timeline.steps["moved_from"].isna().all()  # no re-prefill
    assert divided.tokens == plain.tokens
    assert divided.timeline.makespan_s < plain.timeline.makespan_s


def test_the_pool_drains_when_every_worker_falls_idle_at_once(tokenizer, tick_clock):
    engine, live, _, config = _divided_setup(tokenizer)
    config = RolloutConfig(**{**vars(config), "max_batch_size": 1})
    caps = [2] * 6  # both workers end their first request together, four wait in the pool
    plain = _rollout(engine, live, config, caps=caps)
    divided = _rollout(engine, live, config, InOrder(live, LengthPredictor()), caps)
    assert divided.tokens == plain.tokens and len(divided.timeline.requests) == 6


def test_a_running_request_moves_only_when_the_measured_costs_say_it_pays(tokenizer):
    live = live_requests(tokenizer, [f"p{i}?" for i in range(4)])
    d = DividedDispatch(live, LengthPredictor())
    d.moved = set()

    class Q:  # a running request, as the dispatch reads it
        def __init__(self, i, left):
            self.uid = self.prompt_id = i
            self.prompt_ids, self.tokens, self.left = [0] * 4, [0] * 2, left

    class Source:
        running = [Q(0, 40), Q(1, 30), Q(2, 10), Q(3, 5)]
    d.left = lambda q: q.left
    d._prefill_cost = lambda runs: 0.01  # 6 context tokens: 0.06 s a moved request
    d._step_cost = lambda runs: (lambda rows: 1.0 if rows else 0.0)  # flat: nothing pays
    assert d.worth_moving(Source, []) == []
    d._step_cost = lambda runs: (lambda rows: 0.1 * rows)  # a step costs by its rows
    # the longest alone: both end after 4.5 s (40 x 0.1 + 0.06 s; 30, 10, 5 left here)
    # against 8.5 s alone; moving 40 and 30 as well would end after 7.12 s
    assert [q.uid for q in d.worth_moving(Source, [])] == [0]
    d._step_cost = lambda runs: None  # nothing measured yet: no move
    assert d.worth_moving(Source, []) == []


def test_a_backend_that_cannot_order_its_workers_refuses_a_dispatch():
    class Parallel(Backend):
        name, clock = "parallel", "wall"
    with pytest.raises(ValueError, match="'parallel' backend moves no work between its "
                                         "workers .*accepted: the local or Ray backend"):
        Parallel().map_steps(None, [], None)


def test_the_variants_are_refused_where_no_work_moves_or_beside_tlt_on_the_wall_clock(
        tokenizer):
    from workbench.rl.variants import VariantRun
    from workbench.rollout import LocalBackend

    class Parallel(LocalBackend):  # workers in parallel, nothing moves between them
        name, clock, dispatches = "parallel", "wall", False

    class Wall(LocalBackend):  # as Ray's: work moves in rounds, no tail beside it
        name, clock = "wall", "wall"
    model = tiny_model("qwen2", tokenizer)
    for name in ("seer_schedule", "seer_divided"):
        run = VariantRun(0, model, tokenizer, PROBLEMS, _reward, GRPO, backend=Parallel())
        with pytest.raises(ValueError, match="'parallel' backend moves no work between"):
            get_variant(name).build(run)
        run = VariantRun(0, model, tokenizer, PROBLEMS, _reward, GRPO, backend=Wall(),
                         drafter_head=EagleHead(model))
        assert isinstance(get_variant(name).build(run), SeerTrainer)
        with pytest.raises(ValueError, match="beside TLT: the 'wall' backend runs no tail"):
            get_variant(f"tlt+{name}").build(run)


GRPO = GRPOConfig.flat(prompts_per_step=3, samples_per_prompt=2, max_new_tokens=12, lr=5e-2,
                       workers=2, seed=1, temperature=1.0)
PROBLEMS = [Problem(prompt=f"q{i}?" + "x" * (i * 7 % 5), answer="a", uid=i) for i in range(4)]


def _reward(prompt, completion, answer):
    return float(len(completion) % 3 == 0)


def test_the_variants_keep_the_tokens_of_a_run_without_them_at_every_step(tokenizer):
    plain = RemedyTrainer(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, _reward,
                          RemedyConfig(grpo=GRPO))
    plain.run(3)
    for name in ("seer_schedule", "seer_divided"):
        variant = VARIANTS.get(name)()
        trainer = SeerTrainer(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, _reward,
                              variant.config(GRPO), dispatch_cls=variant.dispatch_cls)
        trainer.run(3)
        h = trainer.history
        assert list(h["tokens_digest"]) == list(plain.history["tokens_digest"]), name
        assert list(h["reward"]) == list(plain.history["reward"])
        # each predictor's error, per step: the prompt's size from the start, its history
        # once the 4-prompt pool repeats (step 1 on), the siblings' once a sibling ran
        assert (h["seer_n_prompt"] == 6).all() and (h["seer_n_used"] == 6).all()
        assert h.loc[0, "seer_n_history"] == 0 and h["seer_n_history"].iloc[1:].gt(0).all()
        assert all(math.isfinite(x) for x in h["seer_mae_prompt"])
        if name == "seer_schedule":
            assert (h["seer_moves"] == 0).all() and (h["seer_reprefills"] == 0).all()


def test_a_resumed_run_predicts_as_a_straight_one(tokenizer, tmp_path, tick_clock):
    variant = VARIANTS.get("seer_divided")()

    def trainer(folder=None):
        return SeerTrainer(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, _reward,
                           variant.config(GRPO), dispatch_cls=variant.dispatch_cls,
                           checkpoint_dir=folder)
    straight = trainer()
    straight.run(3, progress=False)
    first = trainer(tmp_path / "ckpt")
    first.run(2, progress=False)
    resumed = trainer(tmp_path / "ckpt")  # the predictor's memory comes back with the run
    assert resumed.predictor.lengths == first.predictor.lengths
    resumed.run(1, progress=False)
    columns = ["step", "tokens_digest", "seer_n_history", "seer_mae_history", "seer_mae_prompt"]
    assert resumed.history[columns].equals(straight.history[columns])


def test_the_variants_run_through_the_ablation_like_built_ins(tokenizer):
    variants = ["baseline", "seer_schedule", "seer_divided", "tlt+seer_divided"]
    model = tiny_model("qwen2", tokenizer)
    ablation = run_ablation(model, tokenizer, PROBLEMS, GRPO, 2, variants=variants, seeds=[0],
                            reward=_reward, progress=False, drafter_head=EagleHead(model),
                            spec_k=2, spot=SpotConfig.flat(batch_size=4, max_steps=2),
                            eval_problems=PROBLEMS[:2], eval_every=1)
    h = ablation.history
    assert list(dict.fromkeys(h["variant"])) == variants
    assert set(ablation.per_variant()["variant"]) == set(variants)
    assert {"seer_mae_siblings", "seer_mae_history", "seer_mae_prompt", "seer_moves",
            "seer_reprefill_s"} <= set(h.columns)
    digests = h.set_index(["variant", "step"])["tokens_digest"]
    assert list(digests["seer_schedule"]) == list(digests["seer_divided"])
    # beside TLT (SD, the spot-trained drafter, the bandit) the tokens are still the same
    assert list(digests["tlt+seer_divided"]) == list(digests["seer_divided"])
    metrics = ablation.remedy_metrics()  # notebook 11's metrics.json
    for v in variants[1:]:
        assert metrics[f"offpolicy_share_{v}"] == 0.0 and f"speedup_{v}" in metrics
    assert set(ablation.evals["variant"]) == set(variants)
    from workbench.rl.remedies.compare import reading
    said = [t for t in reading(metrics) if t.startswith("TLT beside seer_divided: ")]
    assert len(said) == 1 and ("still pays" in said[0]) == (
        metrics["speedup_tlt+seer_divided"] > metrics["speedup_seer_divided"])


def test_notebook_11_runs_the_seer_variants_into_its_tables(tmp_path):
    import json
    from pathlib import Path

    import pandas as pd
    import papermill
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "out"
    variants = ["baseline", "seer_schedule", "seer_divided", "tlt+seer_divided"]
    papermill.execute_notebook(
        root / "notebooks" / "11_long_tail_remedies.ipynb", tmp_path / "executed.ipynb",
        parameters={"variants": variants, "rl_problems": 4, "eval_problems": 4, "eval_every": 1,
                    "prompts_per_step": 4, "samples_per_prompt": 2, "max_new_tokens": 16,
                    "steps": 2, "seeds": [0], "workers": 2, "max_batch_size": 2,
                    "explore_budget": 0.5, "out_dir": str(out)},
        kernel_name="python3", language="python", progress_bar=False, cwd=str(root))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["offpolicy_share_seer_divided"] == 0.0
    assert {"speedup_seer_schedule", "speedup_seer_divided", "speedup_tlt+seer_divided",
            "accuracy_final_seer_divided"} <= set(metrics)
    assert metrics["first_divergence_step_seer_divided"] >= -1
    assert metrics["max_batch_size"] == 2 and metrics["rl_problems"] == 4
    history = pd.read_csv(out / "history.csv")
    assert list(dict.fromkeys(history["variant"])) == variants
    seer = history[history["variant"] == "seer_divided"]
    assert seer["seer_n_history"].iloc[-1] > 0  # the 4-prompt pool came back at step 1
    assert list(pd.read_csv(out / "remedies.csv")["variant"]) == variants
