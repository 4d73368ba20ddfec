"""A user's checkpoint keeps its own tokenizer through load_model and save_model (issue #26, 6).

Each folder is what a researcher brings: a tiny Qwen2, Llama or Mistral saved with
``save_pretrained`` beside a byte-level BPE trained here on generated text (tests/user_model.py).
transformers 5 loads the qwen2 folder's tokenizer as Qwen2Tokenizer, whose own pre-tokenizer
splits " 19" into "Ġ", "1", "9"; the workbench must notice and read the folder's tokenizer.json.
"""
import json
import shutil

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

import workbench.models as models
from workbench.models import TOKENIZER_PROBE, load_model, save_model, tokenizer_mismatch
from workbench.tasks import get_problems

from .user_model import EOS, PAD, bpe_tokenizer, save_user_model, user_texts, word_problems

# What a plain AutoTokenizer.from_pretrained does with each family's folder on transformers 5:
# qwen2 is forced to its family class; llama and mistral read the folder's tokenizer.json.
SUBSTITUTED = {"qwen2": True, "llama": False, "mistral": False}
TEXTS = ([TOKENIZER_PROBE] + [p.prompt for p in get_problems("running_sum", 4)]
         + [q["prompt"] for q in word_problems(4, seed=7)])


@pytest.fixture(scope="module")
def user_tokenizer():
    """A BPE trained here on generated text; numbers it saw often are single tokens."""
    return bpe_tokenizer(user_texts(), vocab_size=512)


@pytest.fixture(scope="module", params=sorted(SUBSTITUTED))
def user_folder(request, user_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "model"
    return request.param, save_user_model(folder, request.param, user_tokenizer)


def file_ids(folder, text):
    """The encoding the folder's own tokenizer.json gives, special tokens aside."""
    return Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids


def test_the_user_tokenizer_merges_numbers_and_is_deterministic(user_tokenizer):
    assert user_tokenizer.tokenize(" 19") == ["Ġ19"]  # so a digit-by-digit split shows
    assert 300 <= len(user_tokenizer) <= 512 and user_tokenizer.eos_token == EOS
    assert user_tokenizer.pad_token == PAD
    again = bpe_tokenizer(user_texts(), vocab_size=512)
    assert again.backend_tokenizer.to_str() == user_tokenizer.backend_tokenizer.to_str()


def test_plain_autotokenizer_substitutes_the_qwen2_family_class(user_folder):
    arch, folder = user_folder
    plain = AutoTokenizer.from_pretrained(folder)
    ids = plain(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
    if SUBSTITUTED[arch]:  # the bug: the family class, its own pre-tokenizer
        assert type(plain).__name__ == "Qwen2Tokenizer"
        assert ids != file_ids(folder, TOKENIZER_PROBE)
        assert plain.tokenize(" 19") == ["Ġ", "1", "9"]
    else:  # on this transformers version these families read tokenizer.json as it is
        assert type(plain) is PreTrainedTokenizerFast
        assert ids == file_ids(folder, TOKENIZER_PROBE)


def test_the_check_reports_the_substituted_tokenizer(user_folder):
    arch, folder = user_folder
    report = tokenizer_mismatch(AutoTokenizer.from_pretrained(folder), folder)
    if SUBSTITUTED[arch]:
        assert report is not None and "Qwen2Tokenizer" in report
        assert "'Ġ19'" in report and "['Ġ', '1', '9'" in report  # where the encodings part
    else:
        assert report is None
    assert tokenizer_mismatch(PreTrainedTokenizerFast.from_pretrained(folder), folder) is None


def test_load_model_gives_the_folders_own_encoding(user_folder, capsys):
    arch, folder = user_folder
    _, tokenizer = load_model(folder, device="cpu")
    lines = capsys.readouterr().out.splitlines()
    for text in TEXTS:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == file_ids(folder, text)
    assert tokenizer.tokenize(" 19") == ["Ġ19"]
    assert tokenizer.padding_side == "left" and tokenizer.pad_token == PAD
    assert tokenizer.eos_token == EOS
    if SUBSTITUTED[arch]:
        assert len(lines) == 1, lines
        assert "Qwen2Tokenizer" in lines[0] and "own tokenizer.json is used instead" in lines[0]
        assert str(folder) in lines[0]
    else:
        assert lines == []


def test_pad_falls_back_to_eos_on_the_folders_own_tokenizer(tmp_path, capsys):
    backend = bpe_tokenizer(user_texts(40), vocab_size=300).backend_tokenizer
    no_pad = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS)
    folder = save_user_model(tmp_path / "m", "qwen2", no_pad)
    _, tokenizer = load_model(folder, device="cpu")
    assert "Qwen2Tokenizer" in capsys.readouterr().out  # it went through the substitution
    assert tokenizer.pad_token == EOS and tokenizer.padding_side == "left"


def test_a_folder_whose_own_tokenizer_disagrees_is_refused_by_name(user_folder, tmp_path):
    """An added token declared in tokenizer_config.json but not in tokenizer.json: neither the
    family class nor the folder's own fast tokenizer encodes like tokenizer.json."""
    arch, folder = user_folder
    broken = shutil.copytree(folder, tmp_path / "broken")
    config_file = broken / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    new_id = Tokenizer.from_file(str(broken / "tokenizer.json")).get_vocab_size()
    config["added_tokens_decoder"] = {str(new_id): {
        "content": "Sum", "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False, "special": False}}
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError) as raised:
        load_model(broken, device="cpu")
    message = str(raised.value)
    assert repr(str(broken)) in message and "does not reproduce its own tokenizer.json" in message
    assert "tokenizer_config.json" in message


def test_save_model_reloads_faithfully_with_a_plain_autotokenizer(user_folder, tmp_path, capsys):
    arch, folder = user_folder
    model, tokenizer = load_model(folder, device="cpu")
    saved = save_model(model, tokenizer, tmp_path / "saved")
    capsys.readouterr()
    plain = AutoTokenizer.from_pretrained(saved)
    for text in TEXTS:
        ids = plain(text, add_special_tokens=False)["input_ids"]
        assert ids == file_ids(folder, text) == file_ids(saved, text)
    assert plain.eos_token == EOS and plain.pad_token == PAD
    assert tokenizer_mismatch(plain, saved) is None
    load_model(saved, device="cpu")
    assert capsys.readouterr().out == ""  # nothing left to substitute
    if not SUBSTITUTED[arch]:  # only what was needed is declared: remote code is still optional
        trusting = AutoTokenizer.from_pretrained(saved, trust_remote_code=True)
        assert tokenizer_mismatch(trusting, saved) is None


def test_save_model_makes_the_char_tokenizer_reload_faithfully_in_a_qwen2(tmp_path, tokenizer):
    """The workbench's own character tokenizer beside a qwen2 lost its spaces the same way."""
    from .helpers.models import tiny_model
    folder = save_model(tiny_model("qwen2", tokenizer, dtype=torch.float32), tokenizer,
                        tmp_path / "q")
    plain = AutoTokenizer.from_pretrained(folder)
    assert plain.tokenize("a1 b2?") == ["a", "1", " ", "b", "2", "?"]
    assert plain("a1 b2?")["input_ids"] == tokenizer("a1 b2?")["input_ids"]  # <s> included


def test_save_model_refuses_what_no_declaration_makes_faithful(user_folder, tmp_path, monkeypatch):
    """If transformers picked a class that nothing in tokenizer_config.json can steer, the save
    fails before the previous checkpoint is replaced."""
    arch, folder = user_folder
    model, tokenizer = load_model(folder, device="cpu")
    target = save_model(model, tokenizer, tmp_path / "kept")
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    wrong = AutoTokenizer.from_pretrained(folder, tokenizer_type="qwen2")  # always Qwen2Tokenizer
    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", lambda *a, **k: wrong)
    with pytest.raises(ValueError, match=r"not saving .*kept.*Qwen2Tokenizer encodes the probe"):
        save_model(model, tokenizer, target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in target.parent.iterdir()] == ["kept"]


def test_logits_are_unchanged_by_the_reload(user_folder, tmp_path):
    """In the folder's own dtype (float32), so that the saved file lays its tensors out as the
    original does. In float64 the original is cast into fresh memory while the saved float64
    file is read in place, at other alignments, and BLAS may round the last bit differently."""
    arch, folder = user_folder
    ids = torch.tensor([file_ids(folder, TOKENIZER_PROBE)])
    direct = AutoModelForCausalLM.from_pretrained(folder).eval()
    model, tokenizer = load_model(folder, device="cpu")
    assert torch.equal(torch.tensor([tokenizer(TOKENIZER_PROBE, add_special_tokens=False)
                                     ["input_ids"]]), ids)
    saved = save_model(model, tokenizer, tmp_path / "saved")
    again, tokenizer_again = load_model(saved, device="cpu")
    reloaded_ids = tokenizer_again(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
    assert reloaded_ids == ids[0].tolist()
    with torch.no_grad():
        expected = direct(ids).logits
        assert torch.equal(model(ids).logits, expected)
        assert torch.equal(again(ids).logits, expected)
