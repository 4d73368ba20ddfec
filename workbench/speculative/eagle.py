"""The EAGLE-style drafter: one decoder layer that predicts the policy's next hidden state.

Architecture (TLT / EAGLE): ``fc = Linear(2H -> H)`` on concat(token embedding, policy
pre-norm hidden state), one decoder layer of the policy's own architecture, then the policy's
frozen final norm and LM head. The embedding, norm and LM head are the policy's (shared and
frozen), so the head itself is small and always speaks the policy's vocabulary.

A pair ``(h_t, x_{t+1})`` sits at position ``t``: the state that predicted a token, and that
token. From it the head predicts ``h_{t+1}``, whose logits give the draft for ``x_{t+2}``;
chaining feeds the predicted state back in. The head saves with ``save_pretrained`` into a
folder holding ``eagle_config.json`` (which policy architecture it belongs to) and its weights.

Compiled (``RolloutConfig.compile=True``): the head's draft step, fed one token a row (a
chain) or a tree level's nodes, runs as one ``torch.compile`` graph over the drafter's KV
cache preallocated as the policy's is (:class:`CompiledDraft`, ``rollout.compiled``'s
machinery: row buckets, symbolic columns, a graph per (row bucket, fed tokens, tree), each
compiled before the step as a ``compile`` row). Its catch-up (every committed pair not seen
yet, a ragged block once a round) runs through the same graphs, a width a graph, when it is
at most ``EagleDrafter.COMPILED_CATCH_UP`` pairs a row; a longer one (the prompt of a row
joining) and the first round's (the cache not filled yet) eagerly. A chain round is one
graph call in all (:class:`CompiledChain`: the catch-up, then each draft picked in the graph
and fed back), a graph per (row bucket, k), the catch-up padded with holes to k + 1 pairs:
at batch 1 the fixed cost of ``k`` draft steps and ``k`` eager head passes was most of a
round's drafting. In float64 its
predicted states equal the eager step's to the norms' float32 rounding, so its drafts, and
the accepted tokens, are the same (tests/test_compiled_lossless.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..atomic import atomic_dir, load_torch_file, recover_dir
from ..rollout.compiled import CompiledDecode, final_tensors
from ..rollout.few_rows import kernel_applies, pack
from ..rollout.forward import RopeTable, layer_plan, lean_layer, supports_lean, weights_key
from ..rollout.sampling_mode import SamplingMode
from ..rollout.step_graph import layer_tensors, make_draft_chain, make_draft_step

__all__ = ["EagleHead", "CompiledDraft", "CompiledChain"]

# Config attributes the head's shapes or arithmetic depend on (None where a config lacks one).
_FINGERPRINT_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "max_position_embeddings",
                     "hidden_act", "rms_norm_eps", "attention_bias", "mlp_bias",
                     "partial_rotary_factor")


def _jsonable(value):
    """``value`` as it reads back from JSON (tuples become lists), so saved and live compare."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _rope(config) -> dict | None:
    """The RoPE settings: transformers 5 keeps them in ``rope_parameters``, older versions in
    ``rope_theta`` and ``rope_scaling``; whichever the config has is what the head rotates by."""
    params = getattr(config, "rope_parameters", None)
    if params is not None:
        return _jsonable(params)
    old = {k: getattr(config, k) for k in ("rope_theta", "rope_scaling") if hasattr(config, k)}
    return _jsonable(old) if old else None


def policy_fingerprint(config) -> dict:
    """The architecture facts a head depends on; a head only loads onto a matching policy.

    Shapes (widths, heads, ``head_dim``: explicit or hidden / heads) and arithmetic (activation,
    norm epsilon, biases, RoPE settings): a head trained under one RoPE base drafts garbage
    under another even though every tensor fits.
    """
    out = {k: _jsonable(getattr(config, k, None)) for k in _FINGERPRINT_KEYS}
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and getattr(config, "num_attention_heads", None):
        head_dim = config.hidden_size // config.num_attention_heads
    out["head_dim"] = head_dim
    out["rope_parameters"] = _rope(config)
    return out


def _differences(mine, theirs, prefix: str = "") -> list[str]:
    """``"key: head A vs policy B"`` for each differing entry; nested dicts (RoPE) key by key."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        out = []
        for k in sorted(set(mine) | set(theirs)):
            out += _differences(mine.get(k), theirs.get(k), f"{prefix}{k}.")
        return out
    return [] if mine == theirs else [f"{prefix[:-1]}: head {mine!r} vs policy {theirs!r}"]


@dataclass
class EagleConfig:
    policy: dict            # policy_fingerprint of the policy the head was built for
    policy_name: str = ""   # where that policy came from, for the reader

    def check(self, policy_config) -> None:
        """Raise ``ValueError`` naming every field where the head's policy and this one differ.

        Only keys the head recorded are checked: heads saved before a key joined the
        fingerprint (the shipped one lacks ``head_dim`` and the RoPE settings) still load.
        """
        mine, theirs = self.policy, policy_fingerprint(policy_config)
        recorded = [k for k in theirs if k in mine]
        diff = [d for k in recorded for d in _differences(mine[k], theirs[k], f"{k}.")]
        if diff:
            raise ValueError(f"this EAGLE head belongs to another policy architecture "
                             f"({', '.join(diff)}); train a head for this policy")


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

    def save_pretrained(self, path: str | os.PathLike,
                        extra_files: dict[str, str] | None = None) -> Path:
        """Write ``eagle_config.json`` and ``head.pt`` into ``path`` atomically; ``extra_files``
        maps file names to text written in the same folder swap (provenance), so a reader never
        sees a head without them."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"cannot save an EAGLE head to {str(path)!r}: it is a file")
        config = json.dumps(asdict(self.config), indent=2)
        weights = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        with atomic_dir(path) as tmp:  # the previous head stays whole until the new one is
            (tmp / "eagle_config.json").write_text(config)
            torch.save(weights, tmp / "head.pt")
            for name, text in (extra_files or {}).items():
                (tmp / name).write_text(text)
        return path

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, policy) -> "EagleHead":
        """Load a head saved by ``save_pretrained`` onto ``policy`` (architectures must match)."""
        path = Path(path)
        recover_dir(path)  # a save interrupted between its two renames left the head aside
        cfg_path = path / "eagle_config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"no EAGLE head in {str(path)!r}: expected eagle_config.json "
                                    "and head.pt (EagleHead.save_pretrained writes them)")
        saved = EagleConfig(**json.loads(cfg_path.read_text()))
        saved.check(policy.config)  # before any tensor is read: a clear error, not a size one
        head = cls(policy)
        weights = load_torch_file(path / "head.pt", "the EAGLE head's weights",
                                  f"delete the folder {str(path)!r} and fit or copy the head "
                                  "again (EagleHead.save_pretrained writes it whole)")
        head.load_state_dict(weights)
        # keys an older save did not record are now known to be this policy's
        head.config = EagleConfig({**head.config.policy, **saved.policy}, saved.policy_name)
        return head.to(policy.get_output_embeddings().weight.device)


@dataclass(eq=False)
class CompiledDraft(CompiledDecode):
    """An :class:`EagleHead`'s draft step compiled (``RolloutConfig.compile=True``): the
    decode step's machinery (``rollout.compiled``) over the head's one layer, with its
    ``fc``, the policy's embedding module ``embed`` and its ``rope`` table. :meth:`prepare`
    takes the parents' states ``[B, q, H]`` as its one ``data`` input; :meth:`run` returns the
    predicted states ``([B, q, H],)``. Always compiled (``mode`` True): ``"auto"`` drafts
    eagerly."""

    head: EagleHead | None = None
    embed: nn.Module | None = None
    rope: RopeTable | None = None

    def _plans(self) -> list:
        return [layer_plan(self.head.layer)]

    def _layer_count(self) -> int:
        return 1

    def _make_step(self, plans):
        return make_draft_step(plans[0], self.head.fc.out_features, self._packed())

    def _packed(self) -> bool:
        w = self.head.fc.weight
        return kernel_applies(self.few_rows, w.dtype, w.device)

    def _rope(self, pos: torch.Tensor, bound: int):
        return self.rope(self.head.fc.weight, pos, bound)

    def _weights(self, plans) -> tuple:
        """The draft step's weight arguments, read again only when the layer's plan (rebuilt
        when one of its weights changes) or the embedding or ``fc`` changes (a draft call is
        small, so its fixed cost counts); ``fc``'s weight packed where the kernel runs
        (a copy: hence its version in the key, as the drafter trains in place)."""
        fc = self.head.fc
        key = (plans[0], weights_key((self.embed.weight, fc.weight, fc.bias)))
        if self._key is None or self._key[0] is not key[0] or self._key[1] != key[1]:
            fc_w, packed = fc.weight.detach(), self._packed()
            self._tensors = (self.embed.weight.detach(),
                             pack(fc_w) if packed else fc_w, fc.bias.detach(),
                             layer_tensors(plans[0], packed))
            self._key = key
        return self._tensors


@dataclass(eq=False)
class CompiledChain(CompiledDraft):
    """An :class:`EagleHead`'s whole chain round in one compiled graph
    (``rollout.step_graph.make_draft_chain``): the catch-up's pairs, then ``k`` drafts, each
    picked by ``sampling`` (a rowless ``SamplingMode``) from the policy's final ``norm`` and
    ``lm_head`` and fed back to the head but the last. :meth:`prepare` takes ``data =
    (hidden [B, w, H], u [B, k])`` (the catch-up's parent states, each depth's uniform);
    :meth:`run` returns ``(drafts [B, k],)``, with their adjusted logprobs ``[B, k, V]``
    after them in speculative mode. A graph per (row bucket, ``w``, ``k``): both are
    unrolled, so no size but the columns is symbolic; the drafter pads every catch-up to
    ``w = k + 1`` pairs with holes, so a row bucket's graphs are one per ``k``."""

    sampling: SamplingMode | None = None
    norm: nn.Module | None = None
    lm_head: nn.Module | None = None
    automatic_dynamic = False

    def __post_init__(self):
        super().__post_init__()
        self._head_key = self._head = None

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_head_key": None, "_head": None}

    def _make_step(self, plans):
        return make_draft_chain(plans[0], self.head.fc.out_features, self._packed(),
                                self.norm.variance_epsilon, self.lm_head.weight.shape[0],
                                self.sampling.pick)

    def _key_extra(self, data) -> tuple:
        return (data[0].shape[1],)  # w; k is the fed columns' count less w, plus 1

    def _weights(self, plans) -> tuple:
        """:class:`CompiledDraft`'s, then the policy's final norm's weight and its head's
        (packed where the kernel runs), read again when one of them changes."""
        head = self.lm_head
        key = weights_key((self.norm.weight, head.weight) + (
            () if head.bias is None else (head.bias,)))
        if self._head_key != key:
            self._head = final_tensors(self.norm, head, self._packed())
            self._head_key = key
        return (*super()._weights(plans), *self._head)
