"""The state of one decoding batch: rows, their KV cache, visibility mask and positions.

Rows of a batch advance by different amounts (speculative decoding accepts a different number
of draft tokens per row), so the cache is shared in shape but not in meaning: ``mask[r, j]``
says whether cache column ``j`` is part of row ``r``'s sequence, and ``next_pos[r]`` is the
position id row ``r``'s next token takes. A column may be a hole (masked) in the middle of a
row; attention never sees it, so what a row attends to always equals a fresh recompute of its
own tokens. Finished rows leave the batch (``keep_rows``) and all-hole columns on the left are
trimmed, so finished requests cost nothing further.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

__all__ = ["PolicyForward", "DecodeBatch"]


class PolicyForward:
    """A causal LM split into the pieces the engine calls: decoder stack, final norm, LM head.

    Calling the decoder and the head separately lets the engine compute logits only where it
    needs them (the last prompt position at prefill, every draft position at verify) and read
    the pre-norm last hidden state, which the EAGLE drafter consumes and the harvest stores.
    Works for Llama-family models (Llama, Qwen2/3, Mistral) as transformers builds them.
    """

    @classmethod
    def of(cls, model) -> "PolicyForward":
        """The model's PolicyForward, created once (its norm hook is registered once)."""
        if not isinstance(getattr(model, "_workbench_forward", None), cls):
            model._workbench_forward = cls(model)
        return model._workbench_forward

    def __init__(self, model):
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.config = model.config
        self.context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self._prenorm: torch.Tensor | None = None
        self.decoder.norm.register_forward_pre_hook(self._keep_prenorm)

    def _keep_prenorm(self, module, args):
        self._prenorm = args[0]

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @torch.no_grad()
    def __call__(self, input_ids, attention_mask, position_ids, cache, logits_from: int = -1):
        """``(logits, prenorm_hidden)`` for positions ``logits_from:`` of the new tokens."""
        out = self.decoder(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, cache=cache, use_cache=True)
        hidden = out.last_hidden_state[:, logits_from:]
        return self.lm_head(hidden), self._prenorm


@dataclass
class DecodeBatch:
    """Rows being decoded together on one worker, with everything needed to advance them."""

    request_ids: list[int]               # index into the worker's requests, per row
    mask: torch.Tensor                   # [B, T] long: 1 = column visible to the row
    next_pos: torch.Tensor               # [B] long: position id of the row's next token
    last_token: torch.Tensor             # [B] long: the token to feed next
    cache: DynamicCache = field(default_factory=DynamicCache)

    @property
    def size(self) -> int:
        return len(self.request_ids)

    @classmethod
    def from_prompts(cls, prompts: list[list[int]], request_ids: list[int], pad_id: int,
                     device) -> tuple["DecodeBatch", torch.Tensor, torch.Tensor]:
        """A batch before prefill, plus the left-padded ``input_ids`` and ``position_ids``."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[r, width - len(p):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        batch = cls(request_ids=list(request_ids), mask=mask.to(device),
                    next_pos=mask.sum(-1).to(device), last_token=ids[:, -1].to(device))
        return batch, ids.to(device), pos.to(device)

    def append_columns(self, n: int, visible: torch.Tensor | None = None):
        """Extend the mask by ``n`` columns for tokens about to be fed (visible by default)."""
        cols = (torch.ones((self.size, n), dtype=self.mask.dtype, device=self.mask.device)
                if visible is None else visible.to(self.mask.dtype))
        self.mask = torch.cat([self.mask, cols], dim=1)

    def keep_rows(self, rows: torch.Tensor | list[int]):
        """Drop every row not in ``rows`` (finished requests), then trim all-hole columns."""
        rows_t = torch.as_tensor(rows, dtype=torch.long, device=self.mask.device)
        self.request_ids = [self.request_ids[i] for i in rows_t.tolist()]
        self.mask = self.mask.index_select(0, rows_t)
        self.next_pos = self.next_pos.index_select(0, rows_t)
        self.last_token = self.last_token.index_select(0, rows_t)
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.keys = layer.keys.index_select(0, rows_t)
                layer.values = layer.values.index_select(0, rows_t)
        self.trim_left()

    def trim_left(self):
        """Remove leading columns that no row can see (left padding of departed rows)."""
        if self.size == 0:
            return
        seen = self.mask.any(dim=0)
        first = int(seen.to(torch.int8).argmax())
        if first > 0:
            self._keep_columns(first, self.mask.shape[1])

    def trim_right(self):
        """Remove trailing columns that no row can see (drafts every row rejected), so a
        batch of one never carries holes and its attention needs no mask."""
        if self.size == 0 or self.mask.shape[1] == 0:
            return
        visible = torch.nonzero(self.mask.any(dim=0))
        keep = int(visible[-1]) + 1 if len(visible) else 0
        if keep < self.mask.shape[1]:
            self._keep_columns(0, keep)

    def _keep_columns(self, start: int, stop: int):
        """Keep cache and mask columns ``start:stop`` (a view, no copy)."""
        self.mask = self.mask[:, start:stop]
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.keys = layer.keys[:, :, start:stop]
                layer.values = layer.values[:, :, start:stop]

    def compact(self, min_holes: int = 16):
        """Squeeze out holes once they are many: each row's visible columns move right,
        in order, and the cache is gathered to match. Attention results are unchanged."""
        if self.size == 0:
            return
        counts = self.mask.sum(dim=1)
        width = int(counts.max())
        holes = self.mask.shape[1] - width
        if holes < max(min_holes, self.mask.shape[1] // 4):
            return
        # a stable sort of the 0/1 mask puts each row's hidden columns first and keeps the
        # visible ones in their original order at the end
        order = torch.sort(self.mask, dim=1, stable=True).indices[:, -width:]
        self.mask = self.mask.gather(1, order)
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1,
                                                     layer.keys.shape[-1])
                layer.keys = layer.keys.gather(2, idx)
                layer.values = layer.values.gather(2, idx)

    @classmethod
    def empty(cls, rows: int, device) -> "DecodeBatch":
        """A batch of ``rows`` with nothing fed yet (a drafter's cache before its first feed)."""
        return cls(request_ids=list(range(rows)),
                   mask=torch.zeros((rows, 0), dtype=torch.long, device=device),
                   next_pos=torch.zeros(rows, dtype=torch.long, device=device),
                   last_token=torch.zeros(rows, dtype=torch.long, device=device))

    def append_ragged(self, seqs: list[list[int]], pad_id: int):
        """Append one block holding each row's new tokens right-aligned (holes before them).

        Returns ``input_ids`` and ``position_ids`` ``[B, L]`` for the block; the last column is
        every row's newest token, so one forward yields every row's next-token logits.
        """
        width = max(len(s) for s in seqs)
        device = self.mask.device
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        vis = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            if s:
                ids[r, width - len(s):] = torch.tensor(s, dtype=torch.long)
                vis[r, width - len(s):] = 1
        vis = vis.to(device)
        offsets = vis.cumsum(-1) - 1
        pos = (self.next_pos[:, None] + offsets).clamp(min=0)
        self.append_columns(width, visible=vis)
        self.next_pos = self.next_pos + vis.sum(-1)
        return ids.to(device), pos

    def crop_right(self, n: int):
        """Forget the last ``n`` columns, visible to every row (a drafter's speculative tail)."""
        if n <= 0:
            return
        self._keep_columns(0, self.mask.shape[1] - n)
        self.next_pos = self.next_pos - n
