"""RL test pieces: problem pools, rewards, GRPO configs, the TLT trainer of the tests and the
``long_tails`` fixture."""
import pytest
import torch

from workbench.adapt import SpotConfig
from workbench.rl import GRPOConfig
from workbench.rl.tlt import TLTTrainer
from workbench.rl.variants import tlt_config
from workbench.rollout import LocalBackend
from workbench.rollout import RolloutEngine
from workbench.rollout.timeline import rollout_end_s
from workbench.rollout.worker import WorkerResult
from workbench.speculative import EagleHead
from workbench.tasks import Problem

from .models import PROMPTS
from .models import tiny_model


CHAINS = ("chain:k=2", "chain:k=3")


PROBLEMS = [Problem(prompt=f"q{i}?" + "x" * (i % 3), answer="a", uid=i) for i in range(32)]


def length_reward(prompt, completion, answer):
    """A reward that differs inside groups (so the policy really moves)."""
    return float(len(completion) % 3 == 0)


def remedy_grpo(**kw):
    base = dict(prompts_per_step=3, samples_per_prompt=3, max_new_tokens=24, lr=5e-2,
                workers=2, seed=1)
    return GRPOConfig.flat(**{**base, **kw})


def letters_reward(prompt, completion, answer):
    return completion.count("a") / max(1, len(completion))


def letter_problems(n=8):
    return [Problem(prompt=f"q{i}?", answer="a", uid=i) for i in range(n)]


def prompt_problems(n=8):
    return [Problem(prompt=p, answer="a", uid=i) for i, p in enumerate(PROMPTS[:n])]


def longer_tail(result, seconds=60.0):
    """``result`` whose slowest worker decoded ``seconds`` more at the end (a longer tail),
    so that the first worker to finish has an idle window long enough to train in. Only the
    sim clock moves: a window far longer than any drafter step, so that ``max_steps`` and not
    this machine's load (a first step can take over a second on a busy machine, and the
    spot trainer's estimate rises to it at once) decides how many steps fit."""
    tl = result.timeline
    last = tl.steps.loc[tl.steps["end_s"].idxmax()]
    result.timeline = tl.with_steps([{
        "worker": int(last["worker"]), "step": int(tl.steps["step"].max()) + 1,
        "kind": "decode", "start_s": tl.makespan_s, "end_s": tl.makespan_s + seconds,
        "batch_size": 1, "tokens": 1, "forward_s": seconds}])
    return result


def lengthen_slowest(recorders, values, seconds=60.0) -> None:
    """``longer_tail`` inside a map, before its idle jobs run: of the workers that ran the
    map's rollout ``values`` (its ``WorkerResult`` s), whose step ``recorders`` these are
    (``LocalBackend.recorders``, in worker order), the one whose rollout ended last decoded
    ``seconds`` more (one more decode row in its recorder and its result)."""
    if not all(isinstance(value, WorkerResult) for value in values):
        return  # not a rollout
    rec = max(recorders[:len(values)],
              key=lambda r: (rollout_end_s(r.rows, r.start_s), -r.worker))
    row = {"worker": rec.worker, "step": len(rec.rows), "kind": "decode",
           "start_s": rec.mark, "end_s": rec.mark + seconds, "batch_size": 1, "tokens": 1,
           "forward_s": seconds, "clock": rec.clock}
    rec.rows.append(row)
    rec.mark = row["end_s"]
    next(v for v in values if v.worker == rec.worker).steps.append(row)


@pytest.fixture
def long_tails(monkeypatch):
    """Every RL step's rollout on the local backend gets a 60 s longer tail (sim clock)
    before the idle jobs run (``lengthen_slowest``)."""
    real = LocalBackend.map

    def lengthened(self, fn, items, progress=None, workers=None):
        values = real(self, fn, items, progress, workers)
        if workers is None:  # a rollout's map, not a re-run's
            lengthen_slowest(self.recorders, values)
        return values
    monkeypatch.setattr(LocalBackend, "map", lengthened)


def state_copy(head):
    return {k: v.detach().clone() for k, v in head.state_dict().items()}


def same_state(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def tlt_trainer(tokenizer, variant, spot_steps=3, history_steps=0, backend=None, **kw):
    """A TLT trainer of ``variant`` on a tiny float64 policy (its engine on ``backend``,
    default the local one)."""
    model = tiny_model("llama", tokenizer)
    torch.manual_seed(3)
    head = EagleHead(model).to(torch.float64)
    grpo = GRPOConfig.flat(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=10, lr=1e-2,
                           workers=2, max_batch_size=3, temperature=1.0, spec_mode="coupled")
    kw = {"explore_budget": 0.5, **kw}  # a short run: explore freely, so that TLT speculates
    cfg = tlt_config(variant, grpo, arms=CHAINS, spec_k=3,
                     spot=SpotConfig.flat(batch_size=4, max_steps=spot_steps,
                                          history_steps=history_steps), **kw)
    engine = RolloutEngine(model, tokenizer, backend=backend) if backend is not None else None
    return TLTTrainer(model, tokenizer, prompt_problems(), letters_reward, cfg, drafter_head=head,
                      engine=engine)
