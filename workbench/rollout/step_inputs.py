"""The compiled decode step's per-call inputs (``rollout.compiled``), kept in buffers
preallocated once per graph key and written in place each step.

A compiled step at batch 1 is a few milliseconds, so what its inputs cost in Python counts:
rebuilding them every step (a zeroed tensor per input, padded rows and columns filled, a
new column index) was a tenth of the step on this project's CPU. :class:`StepInputs` holds
them at the key's row bucket and the cache buffers' length; a step copies the batch's rows
into them and hands the graph views ``[:, :Tb]`` of the column-wide ones, so their row
stride is the buffers' (fixed per key, like the cache views': no recompile). Rows past the
batch's (padding up to the bucket) see their column 0 only, so nothing is NaN; they are
rewritten only when the batch shrinks below the rows already padded.

A key's buffers serve one call at a time: a call must run before the next call of the same
key is prepared (the engine's steps do: prepare, compile if needed, run).

:func:`mark_cols` makes a key's first call's columns symbolic; :func:`zeroed_like` gives the
warm-up compile inputs of a call's shapes, strides and symbolic dims to write into.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["StepInputs", "mark_cols", "zeroed_like"]


@dataclass
class StepInputs:
    """One graph key's inputs, preallocated: ``ids``, ``pos`` ``[Bb, q]`` (long); ``vis``
    (bool), ``col_pos`` (long) ``[Bb, L]`` (``L`` the cache buffers' length); ``col``
    ``[q]`` the new columns; ``tree`` ``[Bb, q, L]`` bool or ``None`` (a draft tree's step);
    ``data`` more per-row inputs ``[Bb, ...]`` (an EAGLE draft's parent states).
    ``padded_from``: the first row already padded (rows from there on see column 0 only)."""

    ids: torch.Tensor
    pos: torch.Tensor
    vis: torch.Tensor
    col_pos: torch.Tensor
    col: torch.Tensor
    tree: torch.Tensor | None
    data: list
    padded_from: int

    @classmethod
    def for_step(cls, rows: int, fed: int, length: int, tree: bool, data,
                 device) -> "StepInputs":
        """Zeroed buffers for ``rows`` rows (the bucket) feeding ``fed`` tokens a row over
        ``length`` columns; ``data``: tensors ``[B, ...]`` shaping the extra inputs."""
        def zeros(shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=device)
        made = cls(zeros((rows, fed)), zeros((rows, fed)), zeros((rows, length), torch.bool),
                   zeros((rows, length)), zeros(fed),
                   torch.ones((rows, fed, length), dtype=torch.bool, device=device)
                   if tree else None,
                   [t.new_zeros((rows, *t.shape[1:])) for t in data], rows)
        made.pad(0)
        return made

    def pad(self, rows: int) -> None:
        """Rows from ``rows`` on become padding: token 0 at position 0, seeing column 0."""
        for t in (self.ids, self.pos, self.col_pos, *self.data):
            t[rows:] = 0
        self.vis[rows:] = False
        self.vis[rows:, 0] = True
        self.padded_from = rows

    def fill(self, batch, fed: torch.Tensor, pos: torch.Tensor, tree: torch.Tensor | None,
             cols: int, rope: Callable, data=()) -> tuple:
        """The step's inputs for ``batch`` (``fed``, ``pos`` ``[B, q]``; a drafter's
        ``tree [B, q, m]`` over its last ``m`` columns; ``data`` ``[B, ...]``), written into
        the buffers, over ``cols`` columns (the batch's width, or it rounded up when the
        columns are static): ``(ids, pos, vis, col_pos, col, cos, sin, tree, *data)``, cos and
        sin ``[Bb, q, 1, d]`` from ``rope(pos, width)``."""
        rows, width = batch.size, batch.width
        if rows < self.padded_from:
            self.pad(rows)
        self.padded_from = rows  # rows up to here are the batch's, written below
        self.ids[:rows] = fed
        self.pos[:rows] = pos
        vis, col_pos = self.vis[:, :cols], self.col_pos[:, :cols]
        vis[:rows, :width] = batch.mask
        if cols > width:  # static columns: those past the batch's own are hidden
            vis[:rows, width:] = False
        col_pos[:rows, :width] = batch.col_pos
        torch.arange(width - self.col.shape[0], width, out=self.col)
        full = None
        if self.tree is not None:  # the tree's ancestors among its last columns; all else open
            full = self.tree[:, :, :cols]
            full.fill_(True)
            full[:rows, :, width - tree.shape[-1]:width] = tree
        for buf, t in zip(self.data, data):
            buf[:rows] = t
        cos, sin = rope(self.pos, width)  # a position counts the visible columns before it
        return (self.ids, self.pos, vis, col_pos, self.col, cos.unsqueeze(2), sin.unsqueeze(2),
                full, *self.data)


def mark_cols(args: list, tree_at: int) -> None:
    """Mark the columns of a call's arguments symbolic (``mark_dynamic``): ``vis`` and
    ``col_pos``'s dim 1, the tree's (at ``tree_at``) dim 2, every cache view's dim 2. Only
    a key's first call needs it (its compile, which copies the marks onto scratch inputs):
    the graph then has a symbolic width, and later calls' unmarked inputs match it."""
    for t in args[2], args[3]:
        torch._dynamo.mark_dynamic(t, 1)
    if args[tree_at] is not None:
        torch._dynamo.mark_dynamic(args[tree_at], 2)
    for t in args[-2] + args[-1]:
        torch._dynamo.mark_dynamic(t, 2)


def zeroed_like(view: torch.Tensor) -> torch.Tensor:
    """A zeroed tensor of ``view``'s shape and strides (a warm-up writes into it, not into
    the cache), its dims as symbolic as ``view``'s."""
    return _marked(torch.empty_strided(view.shape, view.stride(), dtype=view.dtype,
                                       device=view.device).zero_(), view)


def _marked(scratch: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``scratch`` with ``like``'s dims marked dynamic (``mark_dynamic``, which a copy does
    not carry): the warm-up then compiles the graph that the step itself runs, not a static
    one that the first real step would replace (a second compile, outside the compile row)."""
    dims = getattr(like, "_dynamo_dynamic_indices", None)
    if dims:
        torch._dynamo.mark_dynamic(scratch, sorted(dims))
    return scratch
