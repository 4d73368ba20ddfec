"""The training harness: exact resume, step-by-step continuation, flags and RNG left alone,
schedules, config errors, and checkpoints that survive an interrupted write."""
import json
import math
import re

import pytest
import torch
from torch import nn

from workbench import train as train_mod
from workbench.train import CHECKPOINT_FILE, TrainConfig, Trainer, isolated_rng, lr_at


class Interrupted(Exception):
    pass


def tiny_net(seed=0):
    with isolated_rng(seed):
        net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.0), nn.Linear(16, 3))
    return net.double()


def make_batches(n=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 6, generator=g, dtype=torch.float64),
             torch.randn(8, 3, generator=g, dtype=torch.float64)) for _ in range(n)]


def mse(net, noise=0.0):
    """A loss that draws input noise from the trainer's generator when ``noise`` > 0."""
    def loss_fn(batch, generator):
        x, y = batch
        if noise:
            x = x + noise * torch.randn(x.shape, generator=generator, dtype=x.dtype)
        loss = ((net(x) - y) ** 2).mean()
        return loss, {"target_rms": y.pow(2).mean().sqrt()}
    return loss_fn


def config(**kw):
    base = dict(horizon=12, lr=0.05, schedule="cosine", warmup=2, seed=3, progress=False)
    return TrainConfig(**{**base, **kw})


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def uninterrupted(noise, **kw):
    net = tiny_net()
    trainer = Trainer(net, mse(net, noise), config(**kw))
    trainer.run(make_batches())
    return net, trainer


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_stopped_then_resumed_run_equals_an_uninterrupted_one(tmp_path, noise):
    ref, ref_trainer = uninterrupted(noise)
    net = tiny_net()
    first = Trainer(net, mse(net, noise), config(checkpoint_dir=tmp_path / "ck"))
    first.run(make_batches(), stop=lambda step: step >= 5)
    assert first.stop_reason == "stop" and first.steps_done == 5
    assert (tmp_path / "ck" / CHECKPOINT_FILE).is_file()
    net2 = tiny_net(seed=99)  # different init: everything must come from the checkpoint
    second = Trainer(net2, mse(net2, noise), config(checkpoint_dir=tmp_path / "ck"))
    assert second.steps_done == 5
    hist = second.run(make_batches())
    assert second.steps_done == 12 and list(hist["step"]) == list(range(1, 13))
    assert_same_weights(net2, ref)
    assert list(hist["loss"]) == list(ref_trainer.history["loss"])


def test_crash_mid_run_resumes_from_the_last_checkpoint_exactly(tmp_path):
    ref, _ = uninterrupted(0.3)
    net = tiny_net()
    calls = []

    def crashing(batch, generator):
        calls.append(1)
        if len(calls) == 9:
            raise Interrupted
        return mse(net, 0.3)(batch, generator)

    first = Trainer(net, crashing, config(checkpoint_dir=tmp_path / "ck", checkpoint_every=4))
    with pytest.raises(Interrupted):
        first.run(make_batches())
    net2 = tiny_net()
    second = Trainer(net2, mse(net2, 0.3), config(checkpoint_dir=tmp_path / "ck",
                                                  checkpoint_every=4))
    assert second.steps_done == 8
    second.run(make_batches())
    assert_same_weights(net2, ref)


def test_two_runs_of_n_steps_equal_one_run_of_2n():
    ref, ref_trainer = uninterrupted(0.3, horizon=10)
    net = tiny_net()
    trainer = Trainer(net, mse(net, 0.3), config(horizon=10))
    trainer.run(make_batches(), steps=5)
    state = trainer.optimizer.state[trainer.params[0]]
    assert int(state["step"]) == 5
    trainer.run(make_batches(), steps=5)
    assert int(trainer.optimizer.state[trainer.params[0]]["step"]) == 10
    assert_same_weights(net, ref)
    assert trainer.history.equals(ref_trainer.history.assign(elapsed_s=trainer.history.elapsed_s))


def test_run_leaves_the_callers_flags_and_global_rng_alone():
    net = tiny_net()
    teacher = tiny_net(seed=5)
    net.eval()
    net[0].weight.requires_grad_(False)  # the caller froze this one: it stays out of training
    teacher[0].train()
    flags = lambda m: ([p.requires_grad for p in m.parameters()],  # noqa: E731
                       [x.training for x in m.modules()])
    before, teacher_before = flags(net), flags(teacher)
    frozen_w = net[0].weight.clone()
    seen = {}

    def loss_fn(batch, generator):
        seen["training"], seen["teacher"] = net.training, teacher.training
        seen["teacher_grad"] = any(p.requires_grad for p in teacher.parameters())
        x, y = batch
        return ((net(x) + teacher(x) - y) ** 2).mean()

    rng = torch.get_rng_state()
    trainer = Trainer(net, loss_fn, config(horizon=3), frozen=[teacher])
    trainer.run(make_batches())
    assert seen == {"training": True, "teacher": False, "teacher_grad": False}
    assert flags(net) == before and flags(teacher) == teacher_before
    assert torch.equal(net[0].weight, frozen_w)
    assert torch.equal(torch.get_rng_state(), rng)

    def boom(batch, generator):
        raise Interrupted

    trainer.loss_fn = boom
    with pytest.raises(Interrupted):
        trainer.run(make_batches(), steps=1)
    assert flags(net) == before and flags(teacher) == teacher_before


def test_single_steps_in_one_session_equal_a_run():
    """``step`` takes exactly one optimizer step and returns its row; steps taken one by one
    in a session are the run's steps, bitwise (``run`` is a loop over ``step``)."""
    ref, ref_trainer = uninterrupted(0.3)
    net = tiny_net()
    trainer = Trainer(net, mse(net, 0.3), config())
    batches = make_batches()
    rows = []
    with trainer.training():
        for s in range(12):
            rows.append(trainer.step(batches[s % len(batches)]))
            assert trainer.steps_done == s + 1
            assert int(trainer.optimizer.state[trainer.params[0]]["step"]) == s + 1
    assert_same_weights(net, ref)
    assert [r["loss"] for r in rows] == list(ref_trainer.history["loss"])
    assert rows[-1]["step"] == 12 and set(rows[0]) == set(ref_trainer.history.columns)
    assert trainer.history.drop(columns="elapsed_s").equals(
        ref_trainer.history.drop(columns="elapsed_s"))


def test_the_session_sets_flags_once_and_restores_them_on_any_exit():
    net, teacher = tiny_net(), tiny_net(seed=5)
    net.eval()
    net[0].weight.requires_grad_(False)
    flags = lambda m: ([p.requires_grad for p in m.parameters()],  # noqa: E731
                       [x.training for x in m.modules()])
    before, teacher_before = flags(net), flags(teacher)
    trainer = Trainer(net, mse(net), config(), frozen=[teacher])
    with pytest.raises(RuntimeError, match=r"inside a training session.*trainer\.training\(\)"):
        trainer.step(make_batches()[0])
    assert trainer.steps_done == 0 and flags(net) == before
    with pytest.raises(Interrupted):
        with trainer.training():
            assert net.training and not teacher.training
            assert not any(p.requires_grad for p in teacher.parameters())
            with trainer.training():  # nested: the outer session keeps the flags
                trainer.step(make_batches()[0])
            assert net.training and net[3].weight.requires_grad  # still the outer session's
            trainer.step(make_batches()[1])
            raise Interrupted
    assert trainer.steps_done == 2
    assert flags(net) == before and flags(teacher) == teacher_before


def test_open_ended_training_has_no_horizon_and_a_cosine_needs_one():
    with pytest.raises(ValueError, match=r"schedule='cosine' .*horizon is None"):
        TrainConfig(schedule="cosine")
    net = tiny_net()
    trainer = Trainer(net, mse(net), TrainConfig(lr=0.05, progress=False))  # constant, no end
    assert trainer.config.horizon is None
    with pytest.raises(ValueError, match=r"run\(\) without steps .*horizon.* None"):
        trainer.run(make_batches())
    assert list(trainer.run(make_batches(), steps=3)["lr"]) == [0.05] * 3
    assert lr_at(10 ** 15, trainer.config) == 0.05


def test_lr_schedules_give_the_documented_values():
    const = TrainConfig(lr=1.0, warmup=4, horizon=10)
    assert [lr_at(s, const) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_at(10_000, const) == 1.0
    cos = TrainConfig(lr=2.0, schedule="cosine", warmup=2, horizon=12, lr_floor=0.1)
    assert lr_at(0, cos) == 1.0 and lr_at(1, cos) == 2.0
    assert lr_at(2, cos) == 2.0                                    # decay starts at the peak
    assert math.isclose(lr_at(7, cos), 2.0 * (0.1 + 0.9 * 0.5))  # halfway
    assert math.isclose(lr_at(12, cos), 0.2) and math.isclose(lr_at(50, cos), 0.2)  # the floor
    eagle = TrainConfig(lr=1.0, schedule="cosine", horizon=100)  # no warm-up: EAGLE's recipe
    assert math.isclose(lr_at(25, eagle), 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    net = tiny_net()
    trainer = Trainer(net, mse(net), TrainConfig(lr=1.0, warmup=4, horizon=6, progress=False))
    assert list(trainer.run(make_batches())["lr"]) == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("field, value, accepted", [
    ("horizon", -1, "None .*or an integer >= 0"), ("horizon", 2.5, "None .*or an integer >= 0"),
    ("warmup", True, "integer"),
    ("lr", 0.0, "> 0"), ("lr", float("nan"), "> 0"), ("schedule", "linear", "'constant'"),
    ("lr_floor", 1.5, r"\[0, 1\]"), ("clip_norm", -1.0, "None .*or a finite number > 0"),
    ("betas", (0.9, 1.0, 0.5), r"\[0, 1\)"), ("max_minutes", 0, "> 0"), ("seed", -3, r"\[0, "),
    ("weight_decay", -0.1, ">= 0"), ("progress", "yes", "True or False")])
def test_bad_config_values_are_named(field, value, accepted):
    with pytest.raises(ValueError, match=rf"TrainConfig\.{field} must be .*{accepted}.*"
                                         "got " + re.escape(repr(value)[:4])):
        TrainConfig(**{field: value})


def test_a_bad_beta_is_named_by_its_index():
    with pytest.raises(ValueError, match=r"TrainConfig\.betas\[1\] must be a number in "
                                         r"\[0, 1\), got 1\.0"):
        TrainConfig(betas=(0.9, 1.0))


def test_bad_inputs_to_the_trainer_are_named(tmp_path):
    net = tiny_net()
    with pytest.raises(ValueError, match="params must belong to the model"):
        Trainer(net, mse(net), config(), params=tiny_net().parameters())
    trainer = Trainer(net, mse(net), config())
    with pytest.raises(ValueError, match="batches must be .*got list"):
        trainer.run([])
    with pytest.raises(ValueError, match=r"run\(steps=...\) must be .*got -2"):
        trainer.run(make_batches(), steps=-2)
    trainer.loss_fn = lambda b, g: torch.tensor(float("nan"), requires_grad=True)
    before = [p.clone() for p in net.parameters()]
    with pytest.raises(FloatingPointError, match="loss is nan at step 0"):
        trainer.run(make_batches(), steps=1)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    # a checkpoint written under another lr does not resume silently
    Trainer(net, mse(net), config(checkpoint_dir=tmp_path / "ck")).run(make_batches(), steps=2)
    with pytest.raises(ValueError, match="written with lr=0.05, this config has lr=0.1"):
        Trainer(net, mse(net), config(checkpoint_dir=tmp_path / "ck", lr=0.1))


def test_interrupted_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    net = tiny_net()
    ck = tmp_path / "ck"
    trainer = Trainer(net, mse(net), config(checkpoint_dir=ck))
    trainer.run(make_batches(), steps=3)
    real_save = torch.save

    def half_then_crash(obj, path, *a, **kw):
        with open(path, "wb") as f:
            f.write(b"half a checkpoint")
        raise Interrupted

    monkeypatch.setattr(train_mod.torch, "save", half_then_crash)
    with pytest.raises(Interrupted):
        trainer.run(make_batches(), steps=2)
    monkeypatch.setattr(train_mod.torch, "save", real_save)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temp folder left behind
    net2 = tiny_net(seed=7)
    again = Trainer(net2, mse(net2), config(checkpoint_dir=ck))
    assert again.steps_done == 3
    ref = tiny_net()
    Trainer(ref, mse(ref), config()).run(make_batches(), steps=3)
    assert_same_weights(net2, ref)


def test_wall_clock_cap_and_history_columns():
    net = tiny_net()
    trainer = Trainer(net, mse(net), config(max_minutes=1e-9))
    hist = trainer.run(make_batches())
    assert trainer.stop_reason == "time" and trainer.steps_done <= 1
    net = tiny_net()
    hist = Trainer(net, mse(net), config(horizon=2)).run(make_batches())
    assert list(hist.columns) == ["step", "loss", "lr", "grad_norm", "target_rms", "elapsed_s"]


def test_policy_recipe_trains_saves_and_resumes_after_a_crash(tmp_path, monkeypatch):
    from workbench.models import load_model
    from workbench import lm_train
    from workbench.train import train_state_dir
    from workbench.zoo import policy as recipe_mod
    recipe = lambda: recipe_mod.PolicyRecipe(  # noqa: E731
        hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64, train_problems=40,
        tokens_per_batch=700, steps=4, warmup=2, eval_problems=3, checkpoint_every_s=1e-9)
    rng = torch.get_rng_state()
    straight = recipe_mod.train_policy(tmp_path / "straight", recipe=recipe())
    assert torch.equal(torch.get_rng_state(), rng)  # the recipe no longer reseeds the caller
    assert straight["steps"] == 4 and straight["train_tokens"] > 0
    assert straight["heldout"]["num_problems"] == 3
    real_loss, calls = lm_train.response_lm_loss, []

    def crash_on_third_step(model):
        inner = real_loss(model)

        def loss_fn(batch, generator):
            calls.append(1)
            if len(calls) == 3:
                raise Interrupted
            return inner(batch, generator)
        return loss_fn

    monkeypatch.setattr(lm_train, "response_lm_loss", crash_on_third_step)
    with pytest.raises(Interrupted):
        recipe_mod.train_policy(tmp_path / "resumed", recipe=recipe())
    monkeypatch.undo()
    assert train_state_dir(tmp_path / "resumed").is_dir() and not (tmp_path / "resumed").exists()
    resumed = recipe_mod.train_policy(tmp_path / "resumed", recipe=recipe())
    assert resumed["steps"] == 4 and not train_state_dir(tmp_path / "resumed").exists()
    assert json.loads((tmp_path / "resumed" / "provenance.json").read_text())["heldout"]
    a, _ = load_model(tmp_path / "straight", device="cpu")
    b, _ = load_model(tmp_path / "resumed", device="cpu")
    assert next(a.parameters()).dtype == torch.float32  # loads back (saved as float16)
    assert_same_weights(a, b)


def test_drafter_lm_recipe_runs_on_the_harness(tmp_path):
    from workbench.models import load_model
    from workbench.zoo import drafters
    recipe = drafters.DrafterLMRecipe(num_prompts=2, heldout_prompts=2, hidden_size=32,
                                      layers=1, heads=2, kv_heads=1, intermediate_size=64,
                                      steps=3, warmup=1)
    record = drafters.train_drafter_lm(tmp_path / "lm", recipe=recipe)
    assert record["steps"] == 3 and math.isfinite(record["final_loss"])
    assert record["tau"] >= 1 and record["heldout_prompts"] == 2
    assert record["command"] == "workbench zoo train drafter-lm --seed 0"
    assert json.loads((tmp_path / "lm" / "provenance.json").read_text())["steps"] == 3
    assert not (tmp_path / "lm.train_state").exists()
    model, _ = load_model(tmp_path / "lm", device="cpu")
    assert model.config.hidden_size == 32


def test_eagle_recipe_is_the_on_the_spot_fit_with_the_shipped_settings(tmp_path):
    from workbench.models import load_model
    from workbench.speculative import EagleHead
    from workbench.speculative.train import EagleTrainConfig
    from workbench.zoo import drafters
    recipe = drafters.EagleRecipe(num_prompts=2, heldout_prompts=1,
                                  train=EagleTrainConfig.flat(horizon=3))
    record = drafters.train_eagle_head(tmp_path / "head", recipe=recipe)
    assert record["steps"] == 3 and record["stop_reason"] == "steps" and record["tau"] >= 1
    assert record["fit"]["harvest_share"] is None and record["fit"]["max_new_tokens"] == 384
    assert record["command"] == "workbench zoo train eagle --seed 0"
    assert json.loads((tmp_path / "head" / "provenance.json").read_text()) == record
    assert not (tmp_path / "head.train_state").exists()
    policy, _ = load_model("default", device="cpu")
    EagleHead.from_pretrained(tmp_path / "head", policy)


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_a_damaged_checkpoint_names_its_file_and_what_to_do(tmp_path, damage):
    from workbench.atomic import DamagedFileError
    from workbench.rl.checkpoint import load_state, save_state
    from workbench.train import CHECKPOINT_FILE

    net = tiny_net()
    Trainer(net, mse(net), config(checkpoint_dir=tmp_path / "ck")).run(make_batches(), steps=2)
    save_state(tmp_path / "rl", "tlt_state.pt", {"step": 3, "schedule": None})
    for path in (tmp_path / "ck" / CHECKPOINT_FILE, tmp_path / "rl" / "tlt_state.pt"):
        data = path.read_bytes()
        path.write_bytes(b"" if damage == "empty" else data[: len(data) // 2])
    net2 = tiny_net()
    with pytest.raises(DamagedFileError, match=r"the trainer checkpoint '.*trainer\.pt' .*"
                                               r"delete the folder"):
        Trainer(net2, mse(net2), config(checkpoint_dir=tmp_path / "ck"))  # resumes on init
    with pytest.raises(DamagedFileError, match=r"the RL checkpoint '.*tlt_state\.pt' .*"
                                               r"delete the folder"):
        load_state(tmp_path / "rl", "tlt_state.pt")
