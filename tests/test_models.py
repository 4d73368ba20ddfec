import shutil
import subprocess
import sys

import pytest
import torch

from workbench.models import EMBEDDED, load_model, save_model

from .conftest import tiny_model


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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected.numpy().tobytes().hex()


def test_save_model_refuses_an_existing_file(tmp_path, tokenizer):
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError, match="existing file"):
        save_model(tiny_model("llama", tokenizer), tokenizer, tmp_path / "f")
