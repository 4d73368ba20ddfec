"""The per-row KV bookkeeping of a decoding batch: dropping rows, trimming, compaction."""
import torch
from transformers import DynamicCache

from workbench.rollout.batch import DecodeBatch


def _batch_with_holes(seed=0, rows=3, width=40, heads=2, dim=4):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) > 0.5).long()
    mask[:, :3] = 0                     # left padding common to every row
    cache = DynamicCache()
    for layer in range(2):
        keys = torch.randn(rows, heads, width, dim, generator=g, dtype=torch.float64)
        cache.update(keys, keys * 2, layer)
    batch = DecodeBatch(list(range(rows)), mask, (mask.cumsum(1) - 1).clamp(min=0), mask.sum(1),
                        torch.zeros(rows, dtype=torch.long), cache)
    return batch


def _visible(batch):
    return [[layer.keys[r][:, batch.mask[r].bool()].clone() for layer in batch.cache.layers]
            for r in range(batch.size)]


def test_compact_keeps_every_rows_visible_entries_in_order():
    batch = _batch_with_holes()
    before = _visible(batch)
    width_before = batch.mask.shape[1]
    batch.compact(min_holes=1)
    assert batch.mask.shape[1] == int(batch.mask.sum(1).max()) < width_before
    for row, layers in zip(_visible(batch), before):
        for a, b in zip(row, layers):
            assert torch.equal(a, b)
    assert torch.equal(batch.cache.layers[0].values, 2 * batch.cache.layers[0].keys)


def test_keep_rows_drops_rows_and_trims_shared_left_padding():
    batch = _batch_with_holes()
    before = _visible(batch)
    batch.keep_rows([2, 1])
    assert batch.request_ids == [2, 1] and batch.size == 2
    assert batch.mask[:, 0].any()  # leading columns nobody sees were trimmed
    after = _visible(batch)
    for a, b in zip(after[0] + after[1], before[2] + before[1]):
        assert torch.equal(a, b)


def test_append_ragged_right_aligns_new_tokens_and_counts_positions():
    batch = DecodeBatch.empty(3, "cpu")
    ids, pos = batch.append_ragged([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert batch.mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert pos[0].tolist() == [0, 1, 2] and pos[1, 2] == 0
    assert batch.next_pos.tolist() == [3, 1, 0]
    batch.append_columns(2)
    batch.next_pos += 2
    batch.crop_right(2)
    assert batch.mask.shape[1] == 3 and batch.next_pos.tolist() == [3, 1, 0]


def test_trim_right_drops_only_trailing_columns_no_row_sees():
    batch = _batch_with_holes()
    batch.mask[:, -4:] = 0              # four drafts every row rejected
    batch.mask[0, -6] = 1               # row 0 kept this one: it and everything left of it stay
    batch.mask[:, -5] = 0
    before, pos = _visible(batch), batch.next_pos.clone()
    width = batch.mask.shape[1]
    batch.trim_right()
    assert batch.mask.shape[1] == width - 5
    assert batch.cache.layers[1].keys.shape[2] == width - 5
    assert torch.equal(batch.next_pos, pos)
    for row, layers in zip(_visible(batch), before):
        for a, b in zip(row, layers):
            assert torch.equal(a, b)
    batch.trim_right()                  # nothing left to trim
    assert batch.mask.shape[1] == width - 5


def test_growing_cache_appends_in_place_and_survives_trims_drops_and_joins():
    """KVCache writes each step into spare room; whatever the batch does to its columns and
    rows in between, the visible keys equal those of HF's concatenating DynamicCache."""
    from workbench.rollout.batch import KVCache
    g = torch.Generator().manual_seed(1)
    grow, ref = KVCache(), DynamicCache()

    def append(n, rows):
        k = torch.randn(rows, 2, n, 4, generator=g, dtype=torch.float64)
        ref.update(k, -k, 0)
        return grow.update(k, -k, 0)[0]

    first = append(5, 3)  # a view of the layer's buffer, which has room to spare
    out = append(1, 3)
    assert out.data_ptr() == first.data_ptr()  # written in place, no copy
    for c in (grow, ref):  # the batch's own column and row operations, on both caches
        batch = DecodeBatch(list(range(3)), torch.ones(3, 6, dtype=torch.long),
                            torch.arange(6).expand(3, -1), torch.full((3,), 6),
                            torch.zeros(3, dtype=torch.long), c)
        batch.mask[:, -1] = 0
        batch.trim_right()      # a prefix view: the next append overwrites the dropped column
    append(2, 3)
    for c in (grow, ref):
        DecodeBatch(list(range(3)), torch.ones(3, 7, dtype=torch.long),
                    torch.arange(7).expand(3, -1), torch.full((3,), 7),
                    torch.zeros(3, dtype=torch.long), c).keep_rows([2, 0])
    append(3, 2)
    assert torch.equal(grow.layers[0].keys, ref.layers[0].keys)
    assert torch.equal(grow.layers[0].values, ref.layers[0].values)
    assert grow.layers[0].keys.shape == (2, 2, 10, 4)
