"""The KV cache of the compiled decode step (``rollout.compiled``): each layer's keys and
values in buffers preallocated to the rollout's length, so that the compiled graph, which is
specialised to its input shapes, sees fixed shapes while the batch grows a column a step and
loses and gains rows.

:class:`StaticLayer` keeps ``[rows, kv heads, length, head dim]`` buffers (rows rounded up to
a power of two, :func:`row_bucket`), zeroed, so that columns and rows past the batch's own
hold finite values. The batch's ``keys``/``values`` stay views ``[:B, :, :n]`` of them, so
every batch operation (``rollout.batch``) works unchanged, and an operation that replaces a
view (rows leaving or joining, compaction) is copied back into the same buffer at the next
update or :meth:`StaticLayer.views`. The eager forward fills it like the growing cache (a
prefill, an eager step); the compiled step writes its new columns through
:meth:`StaticLayer.views` and then sets the views over them (:meth:`StaticLayer.set_views`).
"""
from __future__ import annotations

import torch

from .batch import GrowingLayer, KVCache

__all__ = ["StaticLayer", "StaticKVCache", "row_bucket", "round_up", "preallocated_bytes"]


def row_bucket(rows: int) -> int:
    """``rows`` rounded up to a power of two (1, 2, 4, 8, ...): the rows of the buffers and
    of a compiled step, so that a batch losing or gaining a few rows keeps its graph."""
    return 1 << max(0, (rows - 1).bit_length())


def round_up(n: int, step: int) -> int:
    """``n`` rounded up to a multiple of ``step`` (the buffers' columns grow by 64 at a
    time, so that a longer rollout reallocates rarely)."""
    return -(-n // step) * step


class StaticLayer(GrowingLayer):
    """A :class:`GrowingLayer` whose buffers are preallocated to ``length`` columns and a
    power-of-two number of rows (at least ``rows``), zero-filled, and reused when rows leave
    or join: ``keys``/``values`` are views ``[:B, :, :n]`` of them."""

    def __init__(self, length: int = 0, rows: int = 1):
        super().__init__()
        self.length, self.rows = length, rows

    def _backs(self, buf, view) -> bool:
        return (buf is not None and view.data_ptr() == buf.data_ptr()
                and view.shape[1] == buf.shape[1] and view.stride() == buf.stride()
                and view.shape[0] <= buf.shape[0] and view.shape[2] <= buf.shape[2])

    def _room(self, view, buf, need: int, rows: int = 0) -> torch.Tensor:
        rows = max(rows, row_bucket(view.shape[0]))
        if self._backs(buf, view) and buf.shape[2] >= need and buf.shape[0] >= rows:
            return buf
        if buf is None or buf.shape[0] < rows or buf.shape[2] < need:
            shape = (max(rows, row_bucket(self.rows)), view.shape[1],
                     max(self.length, round_up(need, 64)), view.shape[3])
            buf = view.new_zeros(shape)
        elif view.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr():
            view = view.clone()  # a shifted view of this very buffer (trim_left)
        buf[:view.shape[0], :, :view.shape[2]] = view
        return buf

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
            self._buf_k = self._buf_v = self._mine = None
        b, n, m = key_states.shape[0], self.keys.shape[2], key_states.shape[2]
        if self.keys is not self._mine or self._buf_k.shape[2] < n + m:
            self._buf_k = self._room(self.keys, self._buf_k, n + m)
            self._buf_v = self._room(self.values, self._buf_v, n + m)
        self._buf_k[:b, :, n:n + m] = key_states
        self._buf_v[:b, :, n:n + m] = value_states
        self.set_views(b, n + m)
        return self.keys, self.values

    def set_views(self, rows: int, cols: int) -> None:
        """The batch's ``keys``/``values`` become the buffers' ``[:rows, :, :cols]`` (after
        the compiled step wrote its new columns into them)."""
        self.keys, self.values = self._buf_k[:rows, :, :cols], self._buf_v[:rows, :, :cols]
        self._mine = self.keys

    def views(self, rows: int, cols: int):
        """Views ``[rows, :, :cols]`` of the buffers for the compiled step, the batch's
        current keys/values moved into them first if needed."""
        if (self.keys is not self._mine or self._buf_k.shape[0] < rows
                or self._buf_k.shape[2] < cols):
            self._buf_k = self._room(self.keys, self._buf_k, cols, rows)
            self._buf_v = self._room(self.values, self._buf_v, cols, rows)
        return self._buf_k[:rows, :, :cols], self._buf_v[:rows, :, :cols]

    @property
    def buffers(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The preallocated keys and values buffers ``[row bucket, kv heads, length, head
        dim]`` (read-only; ``(None, None)`` before the first update). ``keys``/``values`` are
        views of them until an operation replaces those; the next update or :meth:`views`
        copies such a replacement back into them (a new buffer only when it must grow)."""
        if not self.is_initialized:
            return None, None
        return self._buf_k, self._buf_v

    @property
    def nbytes(self) -> int:
        """The bytes its two buffers hold."""
        return sum(b.numel() * b.element_size() for b in (self._buf_k, self._buf_v)
                   if b is not None)


class StaticKVCache(KVCache):
    """:class:`KVCache` of :class:`StaticLayer` preallocated to ``length`` columns and
    ``rows`` rows (rounded up to a power of two)."""

    def __init__(self, length: int = 0, rows: int = 1):
        super().__init__()
        self.length, self.rows = length, rows

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        while len(self.layers) <= layer_idx:
            self.layers.append(StaticLayer(self.length, self.rows))
        return self.layers[layer_idx].update(key_states, value_states)


def preallocated_bytes(cache) -> int:
    """The bytes a :class:`StaticKVCache`'s buffers hold (keys and values, every layer)."""
    return sum(layer.nbytes for layer in cache.layers if isinstance(layer, StaticLayer))
