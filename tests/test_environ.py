"""environ: variables set for one block, then as they were (set, or unset)."""
import os

import pytest

from workbench.environ import environ


def test_variables_are_set_in_the_block_and_restored_after_it_even_on_error(monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEST_SET", "before")
    monkeypatch.delenv("WORKBENCH_TEST_UNSET", raising=False)
    with pytest.raises(RuntimeError):
        with environ(WORKBENCH_TEST_SET="in", WORKBENCH_TEST_UNSET="in"):
            assert os.environ["WORKBENCH_TEST_SET"] == os.environ["WORKBENCH_TEST_UNSET"] == "in"
            raise RuntimeError("the block fails")
    assert os.environ["WORKBENCH_TEST_SET"] == "before"
    assert "WORKBENCH_TEST_UNSET" not in os.environ
