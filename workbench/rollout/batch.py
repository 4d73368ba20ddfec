"""The state of one decoding batch: rows, their KV cache, visibility mask and positions.

Rows of a batch advance by different amounts (speculative decoding accepts a different number
of draft tokens per row) and join at different times (continuous batching), so the cache is
shared in shape but not in meaning:

- ``mask[r, j]`` says whether cache column ``j`` is part of row ``r``'s sequence;
- ``col_pos[r, j]`` is the position id of the token in that column (meaningless for holes);
- ``next_pos[r]`` is the position id row ``r``'s next token takes.

Invariant: a row's visible columns hold its own tokens, left to right in position order, and
their keys/values equal a fresh recompute of that row's sequence. A column may be a hole
(masked) anywhere in a row; attention never sees it. Attention masks are built from
``col_pos``, never from column indices, so causality and sliding windows count real tokens
however many holes lie between them (see ``rollout.forward.attention_mask``).
Finished rows leave (``keep_rows``), new rows join (``concat``), and columns no row can see
are trimmed, so finished requests cost nothing further.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["DecodeBatch", "KVCache", "GrowingLayer"]


class GrowingLayer(DynamicLayer):
    """A KV cache layer whose ``keys``/``values`` are views ``[:, :, :n]`` of buffers with room
    to spare, so appending a step's columns is an in-place write, not a copy of the whole
    cache (``torch.cat``, HF's way, copies every column at every step: a third of a step's
    time at batch 32). Whenever the batch's own operations replace ``keys`` by something that
    is not a prefix of the buffer (rows dropped or joined, columns trimmed on the left,
    compaction), the next append moves it into a fresh buffer once."""

    def _backs(self, buf: torch.Tensor | None, view: torch.Tensor) -> bool:
        return (buf is not None and view.data_ptr() == buf.data_ptr()
                and view.shape[:2] == buf.shape[:2] and view.stride() == buf.stride()
                and view.shape[2] <= buf.shape[2])

    def _room(self, view: torch.Tensor, buf: torch.Tensor | None, need: int) -> torch.Tensor:
        if self._backs(buf, view) and buf.shape[2] >= need:
            return buf
        shape = list(view.shape)
        shape[2] = max(64, 2 * need)
        fresh = view.new_empty(shape)
        fresh[:, :, :view.shape[2]] = view
        return fresh

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
            self._buf_k = self._buf_v = self._mine = None
        n, m = self.keys.shape[2], key_states.shape[2]
        if self.keys is not self._mine or self._buf_k.shape[2] < n + m:
            # not the view this layer handed out last (the batch replaced it), or full
            self._buf_k = self._room(self.keys, self._buf_k, n + m)
            self._buf_v = self._room(self.values, self._buf_v, n + m)
        self._buf_k[:, :, n:n + m] = key_states
        self._buf_v[:, :, n:n + m] = value_states
        self.keys, self.values = self._buf_k[:, :, :n + m], self._buf_v[:, :, :n + m]
        self._mine = self.keys
        return self.keys, self.values


class KVCache(DynamicCache):
    """HF's DynamicCache (so HF forwards accept it) made of :class:`GrowingLayer`."""

    def __init__(self):
        super().__init__()
        self.layer_class_to_replicate = GrowingLayer

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """HF's ``Cache.update`` without its offloading checks."""
        while len(self.layers) <= layer_idx:
            self.layers.append(GrowingLayer())
        return self.layers[layer_idx].update(key_states, value_states)


def _layers(cache):
    """The initialised layers of ``cache`` (a layer is initialised by its first update)."""
    return [layer for layer in cache.layers if getattr(layer, "is_initialized", False)]


@dataclass
class DecodeBatch:
    """Rows being decoded together on one worker, with everything needed to advance them."""

    request_ids: list[int]               # index into the worker's requests, per row
    mask: torch.Tensor                   # [B, T] long: 1 = column visible to the row
    col_pos: torch.Tensor                # [B, T] long: position id of each column's token
    next_pos: torch.Tensor               # [B] long: position id of the row's next token
    last_token: torch.Tensor             # [B] long: the token to feed next
    cache: DynamicCache = field(default_factory=KVCache)

    @property
    def size(self) -> int:
        return len(self.request_ids)

    @property
    def width(self) -> int:
        return self.mask.shape[1]

    @classmethod
    def from_prompts(cls, prompts: list[list[int]], request_ids, pad_id: int,
                     device, cache: DynamicCache | None = None
                     ) -> tuple["DecodeBatch", torch.Tensor, torch.Tensor]:
        """A batch before prefill, plus the left-padded ``input_ids`` and ``position_ids``;
        its cache is ``cache`` (default: a fresh :class:`KVCache`)."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[r, width - len(p):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0).to(device)
        batch = cls(request_ids=list(request_ids), mask=mask.to(device), col_pos=pos,
                    next_pos=mask.sum(-1).to(device), last_token=ids[:, -1].to(device),
                    **({} if cache is None else {"cache": cache}))
        return batch, ids.to(device), pos

    @classmethod
    def empty(cls, rows: int, device) -> "DecodeBatch":
        """A batch of ``rows`` with nothing fed yet (a drafter's cache before its first feed)."""
        zeros = torch.zeros((rows, 0), dtype=torch.long, device=device)
        return cls(request_ids=list(range(rows)), mask=zeros, col_pos=zeros.clone(),
                   next_pos=torch.zeros(rows, dtype=torch.long, device=device),
                   last_token=torch.zeros(rows, dtype=torch.long, device=device))

    # ---- columns ------------------------------------------------------------------------
    def append_columns(self, n: int, visible: torch.Tensor | None = None,
                       positions: torch.Tensor | None = None) -> torch.Tensor:
        """Extend the batch by ``n`` columns for tokens about to be fed (visible by default,
        at positions ``next_pos + 0..n-1`` by default); returns their positions ``[B, n]``."""
        if positions is None:  # one column (a plain step): a copy, not an arange added
            positions = (self.next_pos[:, None].clone() if n == 1 else
                         self.next_pos[:, None] + torch.arange(n, device=self.mask.device))
        self.mask = (F.pad(self.mask, (0, n), value=1) if visible is None
                     else torch.cat([self.mask, visible.to(self.mask.dtype)], dim=1))
        self.col_pos = torch.cat([self.col_pos, positions], dim=1)
        return positions

    def append_ragged(self, seqs: list[list[int]], pad_id: int, width: int = 0):
        """Append one block holding each row's new tokens right-aligned (holes before them),
        at least ``width`` columns wide (a compiled step's fixed width: more holes).

        Returns ``input_ids`` and ``position_ids`` ``[B, L]`` for the block; the last column is
        every row's newest token, so one forward yields every row's next-token logits.
        """
        width = max(width, *(len(s) for s in seqs))
        device = self.mask.device
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        vis = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            if s:
                ids[r, width - len(s):] = torch.tensor(s, dtype=torch.long)
                vis[r, width - len(s):] = 1
        vis = vis.to(device)
        pos = (self.next_pos[:, None] + vis.cumsum(-1) - 1).clamp(min=0)
        self.append_columns(width, visible=vis, positions=pos)
        self.next_pos = self.next_pos + vis.sum(-1)
        return ids.to(device), pos

    def _keep_columns(self, start: int, stop: int):
        """Keep cache and mask columns ``start:stop`` (a view, no copy)."""
        self.mask = self.mask[:, start:stop]
        self.col_pos = self.col_pos[:, start:stop]
        for layer in _layers(self.cache):
            layer.keys = layer.keys[:, :, start:stop]
            layer.values = layer.values[:, :, start:stop]

    def trim_left(self):
        """Remove leading columns that no row can see (left padding of departed rows)."""
        if self.size == 0 or self.width == 0:
            return
        first = int(self.mask.any(dim=0).to(torch.int8).argmax())
        if first > 0:
            self._keep_columns(first, self.width)

    def trim_right(self):
        """Remove trailing columns that no row can see (drafts every row rejected), so a
        batch of one never carries holes and its attention needs no mask."""
        if self.size == 0 or self.width == 0:
            return
        visible = torch.nonzero(self.mask.any(dim=0))
        keep = int(visible[-1]) + 1 if len(visible) else 0
        if keep < self.width:
            self._keep_columns(0, keep)

    def crop_right(self, n: int):
        """Forget the last ``n`` columns, visible to every row (a drafter's speculative tail)."""
        if n <= 0:
            return
        self._keep_columns(0, self.width - n)
        self.next_pos = self.next_pos - n

    def compact(self, min_holes: int = 16):
        """Squeeze out holes once they are many: each row's visible columns move right,
        in order, and the cache is gathered to match. Attention results are unchanged."""
        if self.size == 0:
            return
        width = int(self.mask.sum(dim=1).max())
        if self.width - width < max(min_holes, self.width // 4):
            return
        # a stable sort of the 0/1 mask puts each row's hidden columns first and keeps the
        # visible ones in their original order at the end
        order = torch.sort(self.mask, dim=1, stable=True).indices[:, -width:]
        self.mask = self.mask.gather(1, order)
        self.col_pos = self.col_pos.gather(1, order)
        for layer in _layers(self.cache):
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, idx)
            layer.values = layer.values.gather(2, idx)

    # ---- rows ---------------------------------------------------------------------------
    def keep_rows(self, rows: torch.Tensor | list[int]):
        """Drop every row not in ``rows`` (finished requests), then trim all-hole columns."""
        rows_t = torch.as_tensor(rows, dtype=torch.long, device=self.mask.device)
        self.request_ids = [self.request_ids[i] for i in rows_t.tolist()]
        self.mask = self.mask.index_select(0, rows_t)
        self.col_pos = self.col_pos.index_select(0, rows_t)
        self.next_pos = self.next_pos.index_select(0, rows_t)
        self.last_token = self.last_token.index_select(0, rows_t)
        for layer in _layers(self.cache):
            layer.keys = layer.keys.index_select(0, rows_t)
            layer.values = layer.values.index_select(0, rows_t)
        self.trim_left()

    def concat(self, other: "DecodeBatch") -> None:
        """Append ``other``'s rows below this batch's (requests joining a running batch).

        The narrower of the two is left-padded with hole columns, so every row keeps its own
        columns, right-aligned, and sees nothing of the other's. A cache layer that only one
        side has initialised gets all-hole rows on the other side.
        """
        width = max(self.width, other.width)
        parts = [(self, width - self.width), (other, width - other.width)]
        self.mask = torch.cat([pad_left(b.mask, n) for b, n in parts])
        self.col_pos = torch.cat([pad_left(b.col_pos, n) for b, n in parts])
        n_layers = max(len(self.cache.layers), len(other.cache.layers))
        for i in range(n_layers):
            mine, theirs = _layer_kv(self.cache, i), _layer_kv(other.cache, i)
            if mine is None and theirs is None:
                continue
            like = mine if mine is not None else theirs
            kv = []
            for j in range(2):
                blocks = [_kv_or_zeros(x, j, like[j], b.size, b.width)
                          for x, b in ((mine, self), (theirs, other))]
                kv.append(torch.cat([pad_left(t, width - t.shape[2], dim=2) for t in blocks]))
            if mine is None:
                self.cache.update(kv[0], kv[1], i)
            else:
                layer = self.cache.layers[i]
                layer.keys, layer.values = kv
        self.request_ids = self.request_ids + other.request_ids
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.last_token = torch.cat([self.last_token, other.last_token])


def _layer_kv(cache, i):
    if i < len(cache.layers) and getattr(cache.layers[i], "is_initialized", False):
        return cache.layers[i].keys, cache.layers[i].values
    return None


def _kv_or_zeros(kv, j, like, rows, width):
    if kv is not None:
        return kv[j]
    return like.new_zeros((rows, like.shape[1], width, like.shape[3]))


def pad_left(t: torch.Tensor, n: int, dim: int = 1) -> torch.Tensor:
    """``t`` with ``n`` zero columns prepended along ``dim`` (holes: masked, never seen)."""
    if n <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)
