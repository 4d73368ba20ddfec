"""The compiled step's own arithmetic (``rollout.step_graph``): a one-row projection written
as a multiply-and-sum equals ``F.linear``, and one-query attention written out equals SDPA
with grouped heads, holes in the mask and a window's cut, in float64. (The engine-level
checks that the compiled step's tokens equal the eager step's are
tests/test_compiled_decode.py and tests/test_compiled_lossless.py.)"""
import pytest
import torch
import torch.nn.functional as F

from workbench.rollout.step_graph import attend, project

torch.manual_seed(0)


@pytest.mark.parametrize("shape", [(1, 1, 24), (24,), (3, 1, 24), (2, 4, 24)])
@pytest.mark.parametrize("bias", [False, True])
def test_project_equals_linear(shape, bias):
    """One row (any leading shape of ones) through the multiply-and-sum; more through
    ``F.linear``: the same values either way."""
    x = torch.randn(shape, dtype=torch.float64)
    w = torch.randn(40, 24, dtype=torch.float64)
    b = torch.randn(40, dtype=torch.float64) if bias else None
    out = project(x, w, b)
    assert out.shape == (*shape[:-1], 40)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_q,n_kv", [(4, 2), (4, 1), (3, 3)])  # GQA, MQA, MHA
@pytest.mark.parametrize("n_new", [1, 2, 3])  # a plain step; verify passes of 6 and 9 rows
def test_attend_equals_sdpa_with_holes(n_q, n_kv, n_new):
    rows, width, d = 3, 11, 6
    q = torch.randn(rows, n_new, n_q, d, dtype=torch.float64)
    k, v = (torch.randn(rows, n_kv, width, d, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(rows, 1, n_new, width) > 0.4
    mask[..., 0] = True  # every query sees a column (the engine's padded rows see column 0)
    mask[0, ..., :5] = False  # a window's cut on row 0
    out = attend(q, k, v, mask, 0.3)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, scale=0.3,
                                          enable_gqa=True).transpose(1, 2)
    assert out.shape == (rows, n_new, n_q, d)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    # a masked column weighs exactly 0: changing its values changes nothing
    k2, v2 = k.clone(), v.clone()
    hidden = ~mask[:, 0].any(1)  # [rows, width]: columns no query of the row sees
    k2.transpose(1, 2)[hidden], v2.transpose(1, 2)[hidden] = 1e3, -1e3
    torch.testing.assert_close(attend(q, k2, v2, mask, 0.3), out, rtol=0, atol=1e-12)
