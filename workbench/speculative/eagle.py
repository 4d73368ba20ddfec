"""The EAGLE-style drafter: one decoder layer that predicts the policy's next hidden state.

Architecture (TLT / EAGLE): ``fc = Linear(2H -> H)`` on concat(token embedding, policy
pre-norm hidden state), one decoder layer of the policy's own architecture, then the policy's
frozen final norm and LM head. The embedding, norm and LM head are the policy's (shared and
frozen), so the head itself is small and always speaks the policy's vocabulary.

A pair ``(h_t, x_{t+1})`` sits at position ``t``: the state that predicted a token, and that
token. From it the head predicts ``h_{t+1}``, whose logits give the draft for ``x_{t+2}``;
chaining feeds the predicted state back in. The head saves with ``save_pretrained`` into a
folder holding ``eagle_config.json`` (which policy architecture it belongs to) and its weights.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..rollout.forward import lean_layer, supports_lean

__all__ = ["EagleHead", "EagleConfig", "policy_fingerprint"]

_FINGERPRINT_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "max_position_embeddings")


def policy_fingerprint(config) -> dict:
    """The architecture facts a head depends on; a head only loads onto a matching policy."""
    return {k: getattr(config, k, None) for k in _FINGERPRINT_KEYS}


@dataclass
class EagleConfig:
    policy: dict            # policy_fingerprint of the policy the head was built for
    policy_name: str = ""   # where that policy came from, for the reader

    def check(self, policy_config) -> None:
        mine, theirs = self.policy, policy_fingerprint(policy_config)
        diff = {k: (mine.get(k), theirs[k]) for k in theirs if mine.get(k) != theirs[k]}
        if diff:
            detail = ", ".join(f"{k}: head {a!r} vs policy {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"this EAGLE head belongs to another policy architecture ({detail})"
                             f"; train a head for this policy")


class EagleHead(nn.Module):
    """``fc`` + one decoder layer of the policy's class; returns predicted pre-norm states."""

    def __init__(self, policy):
        super().__init__()
        cfg = policy.config
        self.config = EagleConfig(policy_fingerprint(cfg), str(getattr(cfg, "_name_or_path", "")))
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=True)
        layer_cls = type(policy.get_decoder().layers[0])
        self.layer = layer_cls(cfg, layer_idx=0)
        self.lean = supports_lean(cfg, self.layer)  # step() runs the modules itself (rollout.forward)
        self.to(dtype=policy.get_output_embeddings().weight.dtype,
                device=policy.get_output_embeddings().weight.device)

    def forward(self, emb, hidden, attention_mask, position_embeddings, cache=None):
        x = self.fc(torch.cat([emb, hidden], dim=-1))
        return self.layer(x, attention_mask=attention_mask, position_embeddings=position_embeddings,
                          cache=cache, use_cache=cache is not None)

    def step(self, emb, hidden, attention_mask, position_embeddings, cache):
        """One drafting step, the same function as ``forward`` with less machinery on the way
        (``rollout.forward``); the cache is the layer-0 entry of ``cache``. Drafting runs k of
        these per verify step, so their fixed cost is what SD pays."""
        if not self.lean:
            return self(emb, hidden, attention_mask, position_embeddings, cache)
        x = self.fc(torch.cat([emb, hidden], dim=-1))
        return lean_layer(self.layer, x, attention_mask, position_embeddings, cache, 0)

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """Write ``eagle_config.json`` and ``head.pt`` into ``path`` atomically."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"cannot save an EAGLE head to {str(path)!r}: it is a file")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        tmp.chmod(0o755)
        (tmp / "eagle_config.json").write_text(json.dumps(asdict(self.config), indent=2))
        torch.save({k: v.detach().cpu() for k, v in self.state_dict().items()}, tmp / "head.pt")
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
        return path

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, policy) -> "EagleHead":
        """Load a head saved by ``save_pretrained`` onto ``policy`` (architectures must match)."""
        path = Path(path)
        cfg_path = path / "eagle_config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"no EAGLE head in {str(path)!r}: expected eagle_config.json "
                                    "and head.pt (EagleHead.save_pretrained writes them)")
        EagleConfig(**json.loads(cfg_path.read_text())).check(policy.config)
        head = cls(policy)
        head.load_state_dict(torch.load(path / "head.pt", map_location="cpu", weights_only=True))
        head.config = EagleConfig(**json.loads(cfg_path.read_text()))
        return head.to(policy.get_output_embeddings().weight.device)
