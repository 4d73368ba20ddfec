"""Verification as a pure function of tensors and one sampling mode (``rollout.verify``,
``rollout.sampling_mode``): no decoder in sight, the uniforms a mode keys to its rows are the
documented ``(seed, uid, position)`` draws, and a step's draft input is frozen."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from workbench.rollout.drafts import DraftInput
from workbench.rollout.sampling import SamplingParams, Stream, coupled_uniforms
from workbench.rollout.sampling_mode import SamplingMode
from workbench.rollout.verify import verify_chain, verify_tree


def rows(*lengths, uid0=7):
    return [SimpleNamespace(uid=uid0 + r, tokens=[0] * n, prompt_ids=[1, 2])
            for r, n in enumerate(lengths)]


def peaked(targets, vocab=6):
    """Logits ``[B, F, V]`` whose argmax at fed index ``j`` of row ``b`` is ``targets[b][j]``."""
    out = torch.zeros(len(targets), len(targets[0]), vocab)
    for b, row in enumerate(targets):
        for j, t in enumerate(row):
            out[b, j, t] = 5.0
    return out


def test_a_greedy_chain_keeps_the_drafts_equal_to_the_argmax_then_the_policy_token():
    mode = SamplingMode.of(SamplingParams())
    drafts = torch.tensor([[3, 4, 5], [3, 1, 5]])
    logits = peaked([[3, 4, 2, 0], [3, 4, 5, 1]])                        # [B, k+1, V]
    hidden = torch.arange(2 * 4 * 2.0).reshape(2, 4, 2)                  # [B, k+1, H]
    v = verify_chain(drafts, None, logits, hidden, mode)
    assert v.accepted == [2, 1]
    assert v.tokens == [[3, 4, 2], [3, 4]]
    assert v.keep.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert torch.equal(v.states[1], hidden[1, :2])
    with pytest.raises(AssertionError):                                  # shapes checked at entry
        verify_chain(drafts, None, logits[:, :3], hidden, mode)


def test_a_greedy_tree_walks_the_branch_the_argmax_takes():
    mode = SamplingMode.of(SamplingParams())
    tokens, parents = torch.tensor([[2, 3, 4]]), torch.tensor([[-1, -1, 1]])  # 3 below 0's child 3
    depth = torch.tensor([[0, 1, 1, 2]])
    v = verify_tree(tokens, parents, depth, peaked([[3, 0, 4, 1]]), torch.zeros(1, 4, 2), mode)
    assert v.accepted == [2] and v.tokens == [[3, 4, 1]]
    assert v.keep.tolist() == [[1, 0, 1, 1]]


def test_a_coupled_mode_keys_the_documented_uniforms_to_its_rows():
    params = SamplingParams(temperature=1.0, seed=11)
    live = rows(3, 5)
    mode = SamplingMode.of(params, "speculative").at(live, [1, 0])
    assert mode.uids.tolist() == [8, 7] and mode.lengths.tolist() == [5, 3]
    want = coupled_uniforms(11, [[8, 8], [7, 7]], [[5 + 1, 5 + 2], [3 + 1, 3 + 2]], Stream.TOKEN)
    np.testing.assert_array_equal(mode.token_uniforms(torch.tensor([1, 2])), want)
    # a draft of depth d and sibling rank i is tested at position len + d - 1 + i * 2**32
    got = mode.accept_uniforms(np.array([[1, 2], [1, 1]]), np.array([[0, 0], [0, 1]]))
    want = coupled_uniforms(11, [[8, 8], [7, 7]], [[5, 6], [3, 3 + 2**32]], Stream.ACCEPT)
    np.testing.assert_array_equal(got, want)
    greedy = SamplingMode.of(SamplingParams())
    assert greedy.at(live, [0, 1]) is greedy                            # reads no row


def test_a_draft_input_is_frozen_and_reads_the_rows_it_was_given():
    live = rows(2, 4)
    ctx = DraftInput(live, [1], None, SamplingMode.of(SamplingParams()), "cpu", lambda s: None)
    assert ctx.sequences == [[1, 2, 0, 0, 0, 0]] and ctx.uids == [8]
    assert ctx.response_lengths == [4] and not ctx.needs_logq
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.hidden = []
