import os
import shutil
import subprocess
import sys

import pytest
import torch

from workbench.models import EMBEDDED, load_model, save_model

from .helpers.models import tiny_model


def test_default_policy_loads_from_data_and_meets_its_spec():
    model, tok = load_model("default", device="cpu")
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.num_hidden_layers >= 6 and cfg.hidden_size >= 256
    assert cfg.num_key_value_heads >= 2
    assert cfg.num_attention_heads // cfg.num_key_value_heads >= 2
    assert tok.decode(tok("a12 b3?")["input_ids"], skip_special_tokens=True) == "a12 b3?"
    assert (EMBEDDED["default"] / "provenance.json").is_file()
    size = sum(f.stat().st_size for f in EMBEDDED["default"].iterdir())
    assert size <= 20 * 2**20


def test_default_policy_loads_from_a_copied_folder(tmp_path):
    copy = shutil.copytree(EMBEDDED["default"], tmp_path / "policy")
    a, tok = load_model("default", device="cpu")
    b, _ = load_model(copy, device="cpu")
    ids = torch.tensor([tok("a1 b2 c3?")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"unknown model 'no-such-model'.*Accepted: \['default'"):
        load_model("no-such-model")
    with pytest.raises(FileNotFoundError, match="folder without config.json"):
        load_model(tmp_path)


def test_saved_model_loads_in_a_fresh_process_with_the_same_logits(tmp_path, tokenizer):
    model = tiny_model("qwen2", tokenizer, dtype=torch.float32)
    path = save_model(model, tokenizer, tmp_path / "m", extra_files={"note.txt": "hi"})
    assert (path / "note.txt").read_text() == "hi"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left
    ids = torch.tensor([tokenizer("a1 b2?")["input_ids"]])
    with torch.no_grad():
        expected = model(ids).logits
    torch.save(ids, tmp_path / "ids.pt")
    code = ("import torch; from transformers import AutoModelForCausalLM as M; "
            f"m = M.from_pretrained(r'{path}'); "
            f"print(m(torch.load(r'{tmp_path / 'ids.pt'}')).logits.detach().numpy().tobytes().hex())")
    # the same torch threads as here: a float32 sum split over other threads rounds otherwise
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.strip() == expected.numpy().tobytes().hex()


def test_save_model_refuses_an_existing_file(tmp_path, tokenizer):
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError, match="existing file"):
        save_model(tiny_model("llama", tokenizer), tokenizer, tmp_path / "f")


# ----------------------------------------------------------------------------- load_model errors

@pytest.fixture
def saved_tiny(tmp_path, tokenizer):
    """A tiny llama saved with save_model: config.json, model.safetensors, tokenizer files."""
    return save_model(tiny_model("llama", tokenizer, dtype=torch.float32), tokenizer,
                      tmp_path / "tiny")


def test_a_file_path_is_reported_as_a_file_not_as_missing(saved_tiny):
    for name in ("config.json", "model.safetensors"):
        with pytest.raises(NotADirectoryError) as raised:
            load_model(saved_tiny / name, device="cpu")
        message = str(raised.value)
        assert repr(str(saved_tiny / name)) in message and "is a file" in message
        assert "does not exist" not in message
        assert "model folder" in message and f"load_model({str(saved_tiny)!r})" in message


def test_truncated_weights_name_the_file_and_the_fix(saved_tiny):
    weights = saved_tiny / "model.safetensors"
    data = weights.read_bytes()
    for broken in (data[: len(data) // 2], data[:5], b""):
        weights.write_bytes(broken)
        with pytest.raises(ValueError) as raised:
            load_model(saved_tiny, device="cpu")
        message = str(raised.value)
        assert str(weights) in message and "truncated or corrupt" in message
        assert "save_model" in message


def test_missing_weights_name_the_accepted_files(saved_tiny):
    (saved_tiny / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no weights.*model\.safetensors"):
        load_model(saved_tiny, device="cpu")


def test_missing_tokenizer_is_found_before_any_weights_load(saved_tiny, monkeypatch):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (saved_tiny / name).unlink(missing_ok=True)
    import workbench.models as models

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded before the tokenizer was checked")

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(FileNotFoundError) as raised:
        load_model(saved_tiny, device="cpu")
    message = str(raised.value)
    assert str(saved_tiny) in message and "tokenizer.json" in message
    assert "save_pretrained" in message and "installed" not in message  # no install hint


def test_corrupt_tokenizer_names_the_file(saved_tiny):
    (saved_tiny / "tokenizer.json").write_text('{"version": "1.0", "trunc')
    with pytest.raises(ValueError, match=r"tokenizer\.json.*truncated or corrupt"):
        load_model(saved_tiny, device="cpu")


def test_missing_embedded_model_names_a_recipe_that_exists(monkeypatch, tmp_path):
    import re

    import workbench.models as models
    from workbench.zoo import RECIPES
    for name in models.EMBEDDED:
        monkeypatch.setitem(models.EMBEDDED, name, tmp_path / "gone")
        with pytest.raises(FileNotFoundError) as raised:
            load_model(name, device="cpu")
        recipe = re.search(r"`workbench zoo train (\S+)`", str(raised.value)).group(1)
        assert recipe in RECIPES, str(raised.value)


def test_unavailable_device_is_refused_before_loading():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match=r"device 'cuda'.*not available.*'cpu'"):
        load_model("default", device="cuda")


def test_interrupted_save_keeps_the_previous_checkpoint(saved_tiny, tokenizer, monkeypatch):
    before = {p.name: p.read_bytes() for p in saved_tiny.iterdir()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(tokenizer), "save_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_model(tiny_model("llama", tokenizer, seed=1, dtype=torch.float32), tokenizer, saved_tiny)
    assert {p.name: p.read_bytes() for p in saved_tiny.iterdir()} == before
    assert [p.name for p in saved_tiny.parent.iterdir()] == [saved_tiny.name]


def test_corrupt_config_names_the_config_not_the_tokenizer(saved_tiny):
    (saved_tiny / "config.json").write_text('{"model_type": "lla')
    with pytest.raises(ValueError, match=r"config\.json' is truncated or corrupt.*save_model"):
        load_model(saved_tiny, device="cpu")


def test_loading_prints_no_weight_bar_and_keeps_the_callers_setting(capfd):
    from transformers.utils import logging as hf_logging
    load_model("default")
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # the caller's setting is back
    hf_logging.disable_progress_bar()
    try:
        load_model("default")
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()
