"""A plugin drafter in an RL ablation (``TLTConfig.drafter``, tests/plugins/
bigram_counts_drafter.py: a drafter that learns as it drafts, its counts in a torch module):
its name and settings are in the ablation's settings, so a folder is resumed only with the
same; its module's state is in the run's checkpoint, so an interrupted run resumes as if it
had run straight (the same tokens, the same drafts accepted, the same counts)."""
import json
import re
from pathlib import Path

import pytest
import torch

from workbench.plugins import load_plugins
from workbench.rl.ablation.runner import run_ablation
from workbench.rl.ablation.runs import Turns
from workbench.rl.ablation.store import SETTINGS_FILE, run_folder
from workbench.rl.checkpoint import load_state
from workbench.rl.tlt import TLTTrainer
from workbench.speculative.drafter_spec import DrafterSpec
from workbench.speculative.drafters import DRAFTERS

from .helpers.models import tiny_model
from .helpers.rl import PROBLEMS, length_reward, remedy_grpo

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "tests" / "plugins" / "bigram_counts_drafter.py"
SPEC = "bigram_counts:min_count=2"
RUN = ("static_sd", 0)
# what a step's tokens and drafts decide (not the clock)
COLUMNS = ["step", "reward", "loss", "tokens", "tokens_digest", "accept_len"]


@pytest.fixture
def bigram_counts():
    """The plugin loaded (``"bigram_counts"`` registered), forgotten after the test."""
    (module,) = load_plugins([str(PLUGIN)])
    yield module.BigramCounter
    DRAFTERS.unregister("bigram_counts")


def _ablation(tokenizer, steps, folder, drafter=SPEC, variants=("static_sd",)):
    return run_ablation(tiny_model("qwen2", tokenizer), tokenizer, PROBLEMS,
                        remedy_grpo(max_new_tokens=12), steps, variants=list(variants),
                        seeds=[0], reward=length_reward, progress=False, spec_k=3,
                        drafter=drafter, checkpoint_dir=folder, checkpoint_every=1)


def _counts(ablation) -> torch.Tensor:
    return ablation.trainers[RUN].drafter.module.counts


def test_an_interrupted_run_with_a_plugin_drafter_resumes_as_if_it_had_run_straight(
        bigram_counts, tokenizer, tmp_path, monkeypatch):
    straight = _ablation(tokenizer, 3, tmp_path / "straight")
    drafter = straight.trainers[RUN].drafter
    assert isinstance(drafter, bigram_counts) and drafter.min_count == 2  # the spec's setting
    assert straight.history["accept_len"].gt(0).all()  # its drafts were accepted
    folder = tmp_path / "resumed"
    real, calls = Turns.step, []

    def dies(self, key):  # interrupted in the third step, after two were checkpointed
        calls.append(key)
        if len(calls) > 2:
            raise KeyboardInterrupt
        real(self, key)
    with monkeypatch.context() as m:
        m.setattr(Turns, "step", dies)
        with pytest.raises(KeyboardInterrupt):
            _ablation(tokenizer, 3, folder)
    saved = load_state(folder / run_folder(RUN) / "state", TLTTrainer.STATE_FILE)
    assert saved["drafter"]["counts"].sum() > 0  # what it learned in two steps is saved
    resumed = _ablation(tokenizer, 3, folder)
    assert resumed.history[COLUMNS].equals(straight.history[COLUMNS])
    assert torch.equal(_counts(resumed), _counts(straight))
    assert _counts(resumed).sum() > saved["drafter"]["counts"].sum()  # and it learned on


def test_the_plugin_drafters_name_and_settings_are_the_ablations_settings(
        bigram_counts, tokenizer, tmp_path):
    folder = tmp_path / "ckpt"
    _ablation(tokenizer, 1, folder)
    settings = json.loads((folder / SETTINGS_FILE).read_text())
    assert settings["tlt"]["drafter"] == repr(SPEC)
    with pytest.raises(ValueError, match=re.escape(
            """tlt: saved {'drafter': "'bigram_counts:min_count=2'", 'spec_k': '3'}, this """
            """call {'drafter': "'bigram_counts:min_count=3'", 'spec_k': '3'}""")):
        _ablation(tokenizer, 2, folder, drafter="bigram_counts:min_count=3")


def test_a_plugin_drafter_is_refused_where_it_cannot_serve(bigram_counts, tokenizer,
                                                          tmp_path):
    with pytest.raises(ValueError, match=r"drafter 'bigram_counts' with adaptive_drafter: the "
                                         r"spot trainer trains EAGLE heads only"):
        _ablation(tokenizer, 1, tmp_path / "tlt", drafter="bigram_counts", variants=["tlt"])
    assert not (tmp_path / "tlt" / SETTINGS_FILE).exists()  # refused before it wrote
    with pytest.raises(ValueError, match=r"drafter 'bigram_counts' does not take the settings "
                                         r"\{'window': 3\}"):
        DrafterSpec.parse("bigram_counts:window=3").build(tiny_model("qwen2", tokenizer),
                                                          tokenizer)
    with pytest.raises(ValueError, match=r"drafter 'bigram_count' is not registered; "
                                         r"registered: \['ngram', 'sibling', 'suffix', "
                                         r"'bigram_counts'\]"):
        _ablation(tokenizer, 1, tmp_path / "typo", drafter="bigram_count")
    with pytest.raises(ValueError, match=r"setting 'min_count' is not 'key=value'"):
        DrafterSpec.parse("bigram_counts:min_count")
