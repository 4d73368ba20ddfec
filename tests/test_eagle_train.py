"""EAGLE training on the harness (flags, optimizer kept across calls, exact resume) and the
head's fingerprint (head_dim, RoPE; old saves still load)."""
import json
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workbench.speculative import eagle as eagle_mod
from workbench.speculative.eagle import EagleHead, policy_fingerprint
from workbench.speculative.train import EagleTrainConfig, EagleTrainer, train_eagle
from workbench.train import isolated_rng, train_state_dir

OLD_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "max_position_embeddings")


class Interrupted(Exception):
    pass


def policy(seed=0, **kw):
    cfg = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
               num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    with isolated_rng(seed):
        return LlamaForCausalLM(LlamaConfig(**{**cfg, **kw})).double().eval()


def pairs(n=12, hidden=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 5 + i % 4
        out.append((torch.randint(0, 40, (length,), generator=g),
                    torch.randn(length - 1, hidden, generator=g, dtype=torch.float64) * 3))
    return out


def cfg(**kw):
    return EagleTrainConfig.flat(**{**dict(horizon=6, batch_size=4, unroll=1, noise=0.1, seed=2),
                                    **kw})


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def flags(m):
    return [p.requires_grad for p in m.parameters()], [x.training for x in m.modules()]


def test_eagle_training_leaves_the_policys_flags_and_the_global_rng_alone():
    pol = policy()
    pol.model.layers[0].train()          # a mixed state the caller chose
    pol.lm_head.weight.requires_grad_(False)
    before, weights = flags(pol), [p.clone() for p in pol.parameters()]
    rng = torch.get_rng_state()
    head, hist = train_eagle(pol, pairs(), cfg(), progress=False)
    assert flags(pol) == before
    assert all(torch.equal(a, b) for a, b in zip(weights, pol.parameters()))
    assert torch.equal(torch.get_rng_state(), rng)
    assert len(hist) == 6 and not head.training
    assert all(p.grad is None for p in pol.parameters())


def test_eagle_trainer_keeps_its_optimizer_across_calls():
    pol = policy()
    ref_head, ref_hist = train_eagle(pol, pairs(), cfg(), progress=False)
    trainer = EagleTrainer(pol, config=cfg())
    first = trainer.train(pairs(), steps=3)
    state = trainer.optimizer.state[next(trainer.head.parameters())]
    assert int(state["step"]) == 3 and "exp_avg" in state
    second = trainer.train(steps=3)  # the same pairs, three more steps
    assert int(trainer.optimizer.state[next(trainer.head.parameters())]["step"]) == 6
    assert list(first["step"]) == [1, 2, 3] and list(second["step"]) == [4, 5, 6]
    assert trainer.steps_done == 6 and len(trainer.history) == 6
    assert same_weights(trainer.head, ref_head)
    assert list(trainer.history["loss"]) == list(ref_hist["loss"])
    trainer.train(pairs(seed=5), steps=2)  # new harvest after another rollout
    assert trainer.steps_done == 8


def test_eagle_steps_in_one_session_equal_train_calls():
    """What the spot trainer does between rollouts: pairs set once, then one step at a time
    in one session; bitwise the steps ``train`` takes."""
    pol = policy()
    ref, ref_hist = train_eagle(pol, pairs(), cfg(), progress=False)
    trainer = EagleTrainer(pol, config=cfg())
    with pytest.raises(ValueError, match="no training pairs.*set_pairs"):
        trainer.train(steps=1)
    trainer.set_pairs(pairs())
    before = flags(pol)
    with trainer.training():
        rows = [trainer.step() for _ in range(6)]
    assert flags(pol) == before
    assert [r["step"] for r in rows] == list(range(1, 7)) and trainer.steps_done == 6
    assert [r["loss"] for r in rows] == list(ref_hist["loss"])
    assert same_weights(trainer.head, ref)


def test_interrupted_eagle_training_resumes_to_the_same_head(tmp_path):
    pol = policy()
    ref, _ = train_eagle(pol, pairs(), cfg(), progress=False)
    out = tmp_path / "eagle"
    preempted = EagleTrainer(pol, config=cfg(), checkpoint_dir=train_state_dir(out))
    preempted.train(pairs(), stop=lambda step: step >= 4)
    assert preempted.steps_done == 4 and train_state_dir(out).is_dir()
    head, hist = train_eagle(pol, pairs(), cfg(), out_dir=out, progress=False)
    assert list(hist["step"]) == list(range(1, 7))
    assert same_weights(head, ref)
    assert same_weights(EagleHead.from_pretrained(out, pol), ref)
    assert not train_state_dir(out).exists()  # done: the train state has served


def test_interrupted_head_save_keeps_the_previous_head(tmp_path, monkeypatch):
    pol = policy()
    old = EagleHead(pol)
    old.save_pretrained(tmp_path / "head")
    new = EagleHead(policy(seed=3))

    def crash(obj, path, *a, **kw):
        open(path, "wb").write(b"half")
        raise Interrupted

    monkeypatch.setattr(eagle_mod.torch, "save", crash)
    with pytest.raises(Interrupted):
        new.save_pretrained(tmp_path / "head")
    monkeypatch.undo()
    assert same_weights(EagleHead.from_pretrained(tmp_path / "head", pol), old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]
    # crash between the two renames: the old head is aside, and loading puts it back
    real_replace, calls = os.replace, []

    def crash_on_second(src, dst):
        calls.append(1)
        if len(calls) == 2:
            raise Interrupted
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_second)
    with pytest.raises(Interrupted):
        new.save_pretrained(tmp_path / "head")
    monkeypatch.undo()
    assert same_weights(EagleHead.from_pretrained(tmp_path / "head", pol), old)


def test_head_dim_and_rope_mismatches_name_the_field(tmp_path):
    pol = policy()
    EagleHead(pol).save_pretrained(tmp_path / "head")
    assert policy_fingerprint(pol.config)["head_dim"] == 16
    wide_heads = policy(head_dim=32)
    with pytest.raises(ValueError, match=r"another policy architecture \(head_dim: head 16 vs "
                                         r"policy 32\)"):
        EagleHead.from_pretrained(tmp_path / "head", wide_heads)
    other_rope = policy(rope_theta=500000.0)
    with pytest.raises(ValueError, match=r"rope_parameters\.rope_theta: head 10000\.0 vs "
                                         r"policy 500000\.0"):
        EagleHead.from_pretrained(tmp_path / "head", other_rope)
    with pytest.raises(ValueError, match=r"rms_norm_eps: head 1e-06 vs policy 1e-05"):
        EagleHead.from_pretrained(tmp_path / "head", policy(rms_norm_eps=1e-5))
    with pytest.raises(ValueError, match="rope_parameters.rope_theta"):
        EagleTrainer(other_rope, head=EagleHead(pol))  # training refuses it as well


def test_a_head_saved_before_the_new_keys_still_loads(tmp_path):
    pol = policy()
    head = EagleHead(pol)
    head.save_pretrained(tmp_path / "head")
    path = tmp_path / "head" / "eagle_config.json"
    saved = json.loads(path.read_text())
    saved["policy"] = {k: saved["policy"][k] for k in OLD_KEYS}  # the shipped head's format
    path.write_text(json.dumps(saved))
    back = EagleHead.from_pretrained(tmp_path / "head", pol)
    assert same_weights(back, head)
    assert back.config.policy == policy_fingerprint(pol.config)  # re-saves record everything
    with pytest.raises(ValueError, match="hidden_size: head 32 vs policy 48"):
        EagleHead.from_pretrained(tmp_path / "head", policy(hidden_size=48))


def test_the_shipped_eagle_head_still_loads():
    from workbench.models import load_model
    from workbench.speculative.defaults import default_drafters
    pol, tok = load_model("default", device="cpu")
    drafter = default_drafters(pol, tok, names=("eagle",))["eagle"]
    assert drafter.head.config.policy["head_dim"] == 32


@pytest.mark.parametrize("field, value, message", [
    ("batch_size", 0, r"EagleTrainConfig\.batch_size must be an integer >= 1, got 0"),
    ("noise", -0.1, r"EagleTrainConfig\.noise must be a finite number >= 0, got -0\.1"),
    ("lr", -1.0, r"TrainConfig\.lr must be a finite number > 0, got -1\.0"),
    ("checkpoint_every", -5, r"TrainConfig\.checkpoint_every must be an integer >= 0, got -5")])
def test_bad_eagle_config_values_are_named_before_training(field, value, message):
    with pytest.raises(ValueError, match=message):
        train_eagle(policy(), pairs(), cfg(**{field: value}), progress=False)
