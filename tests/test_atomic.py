"""An interrupted write leaves the previous file or folder intact."""
import os

import pytest

from workbench import atomic
from workbench.atomic import atomic_dir, atomic_file, write_json, write_text


class Interrupted(Exception):
    pass


def test_interrupted_file_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "metrics.json"
    write_json(path, {"a": 1})
    with pytest.raises(Interrupted):
        with atomic_file(path) as tmp:
            tmp.write_text('{"a": 2, "half')
            raise Interrupted
    assert path.read_text() == '{\n  "a": 1\n}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]  # no temp left


def test_interrupted_folder_write_keeps_the_previous_folder(tmp_path):
    path = tmp_path / "head"
    with atomic_dir(path) as tmp:
        (tmp / "weights").write_text("old")
    with pytest.raises(Interrupted):
        with atomic_dir(path) as tmp:
            (tmp / "weights").write_text("new, half written")
            raise Interrupted
    assert (path / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]


def test_folder_swap_interrupted_between_renames_is_recovered(tmp_path, monkeypatch):
    path = tmp_path / "model"
    with atomic_dir(path) as tmp:
        (tmp / "weights").write_text("old")
    real_replace = os.replace
    calls = []

    def crash_on_second(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # the old folder is aside, the new one not yet in place
            raise Interrupted
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", crash_on_second)
    with pytest.raises(Interrupted):
        with atomic_dir(path) as tmp:
            (tmp / "weights").write_text("new")
    monkeypatch.setattr(atomic.os, "replace", real_replace)
    assert not path.exists()  # the crash window: only the renamed-aside copy exists
    atomic.recover_dir(path)
    assert (path / "weights").read_text() == "old"
    with atomic_dir(path) as tmp:  # and the next write goes through
        (tmp / "weights").write_text("new")
    assert (path / "weights").read_text() == "new"


def test_writing_a_file_over_a_folder_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(FileExistsError, match="existing folder"):
        write_text(tmp_path / "x", "hi")
    (tmp_path / "y").write_text("keep")
    with pytest.raises(FileExistsError, match="existing file"):
        with atomic_dir(tmp_path / "y"):
            pass
    assert (tmp_path / "y").read_text() == "keep"
