"""The long-tail remedies do what they claim: over-provisioning ends on the target group
count, the first to finish, at the time the target-th finished; partial responses resume
exactly where they stopped, each token's version recorded; one-step async trains on data
exactly one version old, weighted by the behaviour policy's log-probs; and the clock and the
off-policy measures are counted right."""
import copy
from types import SimpleNamespace

import pytest
import torch

from workbench.rl import token_terms
from workbench.rl.ablation.runner import run_ablation
from workbench.rl.loss import UpdateData
from workbench.rl.remedies import Behaviour, RemedyConfig, RemedyTrainer, Sampler
from workbench.rl.remedies.cut import tokens_at
from workbench.rl.variants import remedy_config
from workbench.rollout import RolloutConfig, RolloutEngine, StaticSchedule
from workbench.speculative.drafters import NGramDrafter

from .helpers.models import tiny_model
from .drafters import ScriptedDrafter
from .helpers.rl import PROBLEMS, length_reward, remedy_grpo


def _trainer(tokenizer, name, **kw):
    model = tiny_model("qwen2", tokenizer)  # lengths from 1 to the cap at temperature 1
    return RemedyTrainer(model, tokenizer, PROBLEMS, length_reward,
                         remedy_config(name, remedy_grpo(), **kw))


# ---- the engine's own caps, and the tokens at a time -----------------------------------------

def test_each_prompt_stops_at_its_own_cap_and_bad_caps_are_refused(tokenizer):
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    res = engine.rollout(["ab", "cd", "ef"], max_new_tokens=9, ignore_eos=True,
                         samples_per_prompt=2, caps=[2, 9, 5], progress=False)
    assert [len(r.tokens) for r in res.requests] == [2, 2, 9, 9, 5, 5]
    with pytest.raises(ValueError, match=r"caps\[1\].*\[1, 9\]"):
        engine.rollout(["ab", "cd"], max_new_tokens=9, caps=[2, 10], progress=False)
    with pytest.raises(ValueError, match="one length cap per prompt"):
        engine.rollout(["ab", "cd"], max_new_tokens=9, caps=[2], progress=False)


@pytest.mark.parametrize("speculative,batching", [(False, "continuous"), (True, "continuous"),
                                                  (False, "waves")])
def test_tokens_at_counts_what_each_request_had_emitted(tokenizer, speculative, batching):
    engine = RolloutEngine(tiny_model("qwen2", tokenizer), tokenizer)
    prompts = ["ab", "a longer one", "c", "dd", "e?"]
    cfg = RolloutConfig(max_new_tokens=20, samples_per_prompt=2, workers=2, max_batch_size=3,
                        batching=batching, temperature=1.0)
    res = engine.rollout(prompts, cfg, progress=False)
    if speculative:  # verify steps emit several tokens, each row its own count
        drafter = ScriptedDrafter({r.uid: r.tokens for r in res.requests},
                                  {r.uid: i % 4 for i, r in enumerate(res.requests)})
        res = engine.rollout(prompts, cfg, progress=False, drafter=drafter,
                             schedule=StaticSchedule(3))
    steps = res.timeline.steps
    assert set(steps["kind"]) >= ({"verify"} if speculative else {"decode"})
    assert len({len(r.tokens) for r in res.requests}) > 2  # rows leave and join the batch
    for r in res.requests:
        assert tokens_at(steps, r, r.end_s) == len(r.tokens)
        assert tokens_at(steps, r, r.start_s) == 0
        counts = [tokens_at(steps, r, t) for t in sorted(steps["end_s"])]
        assert counts == sorted(counts) and counts[-1] == len(r.tokens)


# ---- over-provisioning with early stop --------------------------------------------------------

@pytest.mark.parametrize("leftover", ["abort", "carry"])
def test_overprovisioning_trains_the_first_target_groups_to_finish(tokenizer, leftover):
    tr = _trainer(tokenizer, "overprovision", extra_groups=3, leftover=leftover)
    P, G = 3, 3
    row = tr.step()
    s = tr.last[0]
    full = s.result.requests  # every request decoded to its end; fresh groups in draw order
    finish = [max(r.end_s for r in full[g * G:(g + 1) * G]) for g in range(P + 3)]
    first = sorted(range(P + 3), key=lambda g: finish[g])[:P]
    cut = sorted(finish)[P - 1]
    assert row["groups_trained"] == len(s.trained) == P
    assert [g.drawn for g in s.trained] == first
    assert s.timeline.makespan_s == row["rollout_s"] == cut < max(finish)
    assert row["step_s"] == pytest.approx(cut + row["update_sim_s"])
    assert row["idle_fraction"] == pytest.approx(s.timeline.idle_fraction())
    late = [r for r in full if r.end_s > cut]
    at_cut = {r.uid: tokens_at(s.result.timeline.steps, r, cut) for r in late}
    if leftover == "abort":
        assert s.carried == [] and row["aborted_tokens"] == sum(
            len(r.tokens) if r.end_s <= cut else at_cut[r.uid]
            for g in range(P + 3) if g not in first for r in full[g * G:(g + 1) * G])
        return
    assert row["carried_groups"] == 3 and row["aborted_tokens"] == 0
    by_uid = {r.uid: r for r in full}
    carried = [r for g in s.carried for r in g.responses]
    for r in carried:  # each keeps exactly the prefix it had at the cut
        assert r.tokens == by_uid[r.uid].tokens[:at_cut.get(r.uid, len(r.tokens))]
        assert r.versions == [0] * len(r.tokens)
    assert any(not r.done for r in carried)
    # next step: they continue from that prefix, under policy version 1
    before = {id(r): list(r.tokens) for r in carried}
    tr.step()
    for r in carried:
        n = len(before[id(r)])
        assert r.tokens[:n] == before[id(r)] and r.versions[n:] == [1] * (len(r.tokens) - n)


# ---- tail batching ----------------------------------------------------------------------------

def test_tail_batching_defers_the_prompts_that_ran_long_to_a_long_round(tokenizer):
    tr = _trainer(tokenizer, "tail_batching", extra_groups=3)
    P, G = 3, 3
    deferred = []
    for _ in range(6):
        waiting, first = list(tr.sampler.tail), tr.sampler.drawn
        row = tr.step()
        s = tr.last[0]
        if row["long_round"]:  # the deferred prompts alone, sampled afresh, run to their end
            assert len(waiting) >= P and row["groups_trained"] == P
            assert sorted(g.drawn for g in s.trained) == sorted(g.drawn for g in waiting[:P])
            assert all(r.versions == [tr.version - 1] * len(r.tokens)
                       for g in s.trained for r in g.responses)
            assert s.timeline.makespan_s == s.result.timeline.makespan_s
            break
        full, drawn = s.result.requests, range(first, first + P + 3)  # fresh groups alone
        finish = [max(r.end_s for r in full[i * G:(i + 1) * G]) for i in range(P + 3)]
        cut = s.timeline.makespan_s
        ran_long = [d for d, t in zip(drawn, finish) if t > cut]
        assert [g.drawn for g in tr.sampler.tail[len(waiting):]] == ran_long
        assert not {g.drawn for g in s.trained} & set(deferred)
        deferred += ran_long
    else:
        pytest.fail("no long round in 6 steps")


# ---- partial rollouts -------------------------------------------------------------------------

@pytest.mark.parametrize("speculative", [False, True])
def test_partial_greedy_responses_resume_exactly_where_they_stopped(tokenizer, speculative):
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    cfg = RolloutConfig(max_new_tokens=12, temperature=0.0, samples_per_prompt=2, workers=2)
    problems = PROBLEMS[:8]
    sampler = Sampler(engine, cfg, 2, lambda s: problems[2 * s:2 * s + 2], leftover="carry",
                      segment_tokens=5)
    sd = dict(schedule=StaticSchedule(3), drafter=NGramDrafter()) if speculative else {}
    trained, kinds = [], set()
    for version in range(4):  # 12 tokens in segments of 5: at most 3 steps each
        s = sampler.sample(version, **sd)
        trained += s.trained
        kinds |= set(s.timeline.steps["kind"])
    assert ("verify" in kinds) == speculative
    first = [g for g in trained if g.drawn < 2]
    assert len(first) == 2
    whole = engine.rollout([g.problem.prompt for g in first], cfg, progress=False)
    assert any(len(r.tokens) > 5 for r in whole.requests)  # some were cut and resumed
    for g, i in zip(first, range(2)):
        for r, w in zip(g.responses, whole.requests[2 * i:2 * i + 2]):
            assert r.tokens == w.tokens and r.finish == w.finish
            # one segment per step, each sampled by that step's version
            assert r.versions == [j // 5 for j in range(len(r.tokens))]


def test_partial_keeps_the_prefix_under_a_new_policy_and_counts_its_staleness(tokenizer):
    tr = _trainer(tokenizer, "partial", segment_tokens=8)
    start = copy.deepcopy(tr.model.state_dict())
    tr.step()
    carried = [r for g in tr.sampler.pool for r in g.responses]
    before = {id(r): list(r.tokens) for r in carried}
    assert any(0 < len(t) < 24 for t in before.values())
    checked = 0
    for _ in range(3):
        version = tr.version
        row = tr.step()
        if row["groups_trained"]:
            checked += row["offpolicy_token_share"] > 0
            versions = [v for g in tr.last[0].trained for r in g.responses for v in r.versions]
            stale = [version - v for v in versions]
            assert row["offpolicy_token_share"] == pytest.approx(
                sum(a > 0 for a in stale) / len(stale))
            assert row["max_staleness"] == max(stale)
    assert checked  # some step trained tokens of an older version
    assert any(not torch.equal(start[k], v) for k, v in tr.model.state_dict().items())
    for r in carried:  # every carried response kept its prefix; versions grow step by step
        n = len(before[id(r)])
        assert r.tokens[:n] == before[id(r)]
        assert r.versions == sorted(r.versions) and r.versions[:n] == [0] * n
    assert any(len(set(r.versions)) > 1 for r in carried)
    assert len(tr.history) == 4


def test_of_the_finished_groups_partial_trains_the_first_drawn_and_early_stop_the_first_done(
        tokenizer):
    """More groups than ``target`` (3) may finish in one partial step (held-over ones beside
    fresh ones): partial trains the first drawn, whatever the clock says (a resumed run takes
    the same groups); over-provisioning trains the first to finish, its early stop's choice."""
    groups = [SimpleNamespace(done=True, drawn=d) for d in (5, 1, 3, 0)]
    groups.append(SimpleNamespace(done=False, drawn=2))
    live = [(g, None) for g in groups]
    outs = [SimpleNamespace(end_s=t) for t in (0.1, 0.4, 0.2, 0.3, 0.05)]  # measured ends
    trained, carried, dropped = _trainer(tokenizer, "partial").sampler.split(groups, live, outs)
    assert [g.drawn for g in trained] == [0, 1, 3] and [g.drawn for g in carried] == [2, 5]
    trained, carried, _ = _trainer(tokenizer, "april").sampler.split(groups, live, outs)
    assert [g.drawn for g in trained] == [5, 3, 0] and [g.drawn for g in carried] == [1, 2]


# ---- one-step async ---------------------------------------------------------------------------

def _logp(model, prompts, responses):
    data = UpdateData(prompts, responses, torch.zeros(len(prompts)), None, None, 0,
                      torch.device("cpu"))
    return data.logprobs(model, len(data), 1.0, 8192)


def test_async_data_is_exactly_one_version_old_and_weighted_by_its_behaviour(tokenizer):
    tr = _trainer(tokenizer, "async", is_cap=1.5)
    seen = []
    update = tr.grpo.update
    tr.grpo.update = lambda rl, extra=None: seen.append(rl) or update(rl, extra)
    policies = []
    for step in range(3):
        policies.append(copy.deepcopy(tr.model))
        if step:  # the queued data: sampled by last step's policy, its log-probs recorded
            responses = [r for g in tr.queued.trained for r in g.responses]
            prompts = [g.prompt_ids for g in tr.queued.trained for r in g.responses]
            old = _logp(policies[step - 1], prompts, [r.tokens for r in responses])
            for r, lp in zip(responses, old):
                assert torch.allclose(r.behaviour(), lp.double(), atol=1e-5, rtol=0)
            # the update's weights: min(pi_now / pi_behav, cap), from those log-probs
            data = tr.grpo.update_data(tr.step_data(tr.queued))
            now = _logp(tr.model, prompts, [r.tokens for r in responses])
            for w, n, r in zip(data.weights, now, responses):
                assert torch.allclose(w, torch.exp(n - r.behaviour().float()).clamp(max=1.5),
                                      atol=1e-6)
            assert (torch.cat(data.weights) != 1).any()  # the policy moved: weights differ
        row = tr.step()
        assert row["sampled_version"] == max(0, step - 1)
        assert row["max_staleness"] == (step > 0)
        assert row["offpolicy_token_share"] == (1.0 if step else 0.0)
        versions = {v for g in tr.last[-1].trained for r in g.responses for v in r.versions}
        assert versions == {step}  # what this step sampled ahead: the current policy
    assert seen[0].behaviour is None  # step 0: on-policy data, no weights
    assert all(set(v) == {0} for v in seen[1].behaviour.versions)
    assert seen[1].behaviour.current == 1


def test_async_step_time_overlaps_the_rollout_with_the_update(tokenizer):
    tr = _trainer(tokenizer, "async")
    for step in range(2):
        row = tr.step()
        runs = [s.timeline.makespan_s for s in tr.last]
        assert len(runs) == (2 if step == 0 else 1)
        first = runs[0] if step == 0 else 0.0
        assert row["step_s"] == pytest.approx(first + max(runs[-1], row["update_sim_s"]))
        assert row["rollout_s"] == pytest.approx(sum(runs))
        assert 0 < row["rollout_fraction"] <= 1
    sync = _trainer(tokenizer, "baseline").step()
    assert sync["step_s"] == pytest.approx(sync["rollout_s"] + sync["update_sim_s"])


# ---- the pieces -------------------------------------------------------------------------------

def test_behaviour_weights_are_truncated_on_stale_tokens_only():
    behav = [torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)]
    prox = [torch.tensor([-0.5, -2.5, -3.0], dtype=torch.float64)]
    w = Behaviour(behav, [[0, 1, 2]], current=2, cap=1.5).weights(prox)[0]
    assert w.tolist() == pytest.approx([1.5, torch.exp(torch.tensor(-0.5)).item(), 1.0])
    free = Behaviour(behav, [[0, 0, 0]], current=1, cap=None).weights(prox)[0]
    assert free.tolist() == pytest.approx(torch.exp(prox[0] - behav[0]).tolist())


def test_the_weight_multiplies_the_surrogate_not_the_kl_term():
    T = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    logp, old, ref, adv = T([[-1.0, -0.5]]), T([[-1.2, -0.5]]), T([[-1.1, -0.4]]), T([0.7])
    plain, _ = token_terms(logp, old, adv, 0.2)
    kl, _ = token_terms(logp, old, adv, 0.2, ref, 0.1)
    got, _ = token_terms(logp, old, adv, 0.2, ref, 0.1, weight=T([[2.0, 0.5]]))
    assert torch.allclose(got, plain * T([[2.0, 0.5]]) + (kl - plain))


def test_bad_remedy_configs_are_refused():
    with pytest.raises(ValueError, match="leftover='carry'"):
        RemedyConfig(segment_tokens=8, leftover="abort")
    with pytest.raises(ValueError, match="leftover"):
        RemedyConfig(leftover="keep")
    with pytest.raises(ValueError, match="top_p"):
        RemedyConfig.flat(one_step_async=True, top_p=0.9)
    with pytest.raises(ValueError, match="is_cap"):
        RemedyConfig(is_cap=0.5)
    with pytest.raises(ValueError, match="extra_groups"):
        RemedyConfig(extra_groups=-1)
    with pytest.raises(ValueError, match="remedy"):
        remedy_config("fastest")
    cfg = RemedyConfig.flat(extra_groups=2, prompts_per_step=5, max_new_tokens=40)
    assert (cfg.extra_groups, cfg.grpo.prompts_per_step, cfg.grpo.rollout.max_new_tokens) == (
        2, 5, 40)


def test_the_ablation_runs_the_remedies_beside_the_baseline(tokenizer):
    ab = run_ablation(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, remedy_grpo(), 2,
                      variants=["baseline", "overprovision", "async"], progress=False,
                      reward=length_reward)
    pv = ab.per_variant().set_index("variant")
    assert sorted(pv.index) == ["async", "baseline", "overprovision"]
    assert (pv["e2e_speedup"] > 0).all() and pv.loc["baseline", "e2e_speedup"] == 1
    h = ab.history.set_index(["variant", "step"])
    assert h.loc[("async", 1), "max_staleness"] == 1
    assert h.loc[("overprovision", 0), "groups_trained"] == 3
    assert sorted(ab.trainers["async", 0].record.timelines) == [0, 1]


def test_the_remedies_compose(tokenizer):
    """Over-provisioning, carried partial rollouts and one-step async at once: at most P
    groups trained, the data sampled by the last step's policy, the async clock, and every
    group whole, finished, its versions in order, its behaviour recorded."""
    tr = _trainer(tokenizer, "april", segment_tokens=8, one_step_async=True)
    versions = []  # the policy's version at the start of each step
    for step in range(4):
        versions.append(tr.version)
        row = tr.step()
        assert row["groups_trained"] <= 3
        assert row["sampled_version"] == versions[max(0, step - 1)]  # last step's policy
        if row["groups_trained"]:
            assert row["max_staleness"] >= versions[-1] - row["sampled_version"]
        assert row["step_s"] == pytest.approx(
            sum(s.timeline.makespan_s for s in tr.last[:-1])
            + max(tr.last[-1].timeline.makespan_s, row["update_sim_s"]))
    for g in tr.queued.trained:
        assert g.done and len(g.responses) == 3
        for r in g.responses:
            assert r.versions == sorted(r.versions) and r.behaviour().shape == (len(r.tokens),)


@pytest.mark.parametrize("name", ["partial", "async"])
def test_a_resumed_run_continues_exactly(tokenizer, tmp_path, name):
    """Partial rollouts and async choose their data by tokens alone, so a resumed run
    continues exactly (over-provisioning chooses by the measured sim clock: below)."""
    whole = _resumable(tokenizer, name, None)
    whole.run(4, progress=False)
    _resumable(tokenizer, name, tmp_path).run(2, progress=False)
    resumed = _resumable(tokenizer, name, tmp_path)  # carried and queued groups come back
    resumed.run(2, progress=False)
    cols = ["reward", "loss", "tokens", "offpolicy_token_share", "groups_trained",
            "carried_groups", "sampled_version"]
    assert resumed.history[cols].equals(whole.history[cols])


@pytest.mark.parametrize("name", ["april", "tail_batching"])
def test_a_checkpoint_keeps_the_carried_and_deferred_groups(tokenizer, tmp_path, name,
                                                            tick_clock):
    # the cut reads the measured clock; on one that ticks 1/1024 s per reading the first step
    # is the same on every machine. With responses up to 64 tokens the groups' longest
    # responses differ (at 24 most groups end together at the cap and none waits)
    run = _resumable(tokenizer, name, tmp_path, max_new_tokens=64)
    run.run(1, progress=False)
    back = _resumable(tokenizer, name, tmp_path, max_new_tokens=64)
    for part in ("pool", "tail"):
        saved, loaded = getattr(run.sampler, part), getattr(back.sampler, part)
        assert [(g.drawn, [r.tokens for r in g.responses], [r.versions for r in g.responses])
                for g in saved] == [(g.drawn, [r.tokens for r in g.responses],
                                     [r.versions for r in g.responses]) for g in loaded]
    assert (back.sampler.pool or back.sampler.tail) and back.rl_step == run.rl_step
    assert (back.sampler.drawn, back.sampler.rollouts) == (run.sampler.drawn,
                                                           run.sampler.rollouts)
    assert back.history.equals(run.history)


def _resumable(tokenizer, name, folder, **grpo):
    return RemedyTrainer(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS, length_reward,
                         remedy_config(name, remedy_grpo(**grpo)), checkpoint_dir=folder)
