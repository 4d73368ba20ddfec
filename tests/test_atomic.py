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


# ---- reading back: a damaged torch file names itself and the remedy ------------------------
def _saved(tmp_path):
    import torch
    path = tmp_path / "state.pt"
    torch.save({"weights": torch.arange(2000, dtype=torch.float64), "step": 7}, path)
    return path


def test_a_whole_torch_file_loads(tmp_path):
    state = atomic.load_torch_file(_saved(tmp_path), "the state")
    assert state["step"] == 7 and state["weights"].sum().item() == sum(range(2000))


@pytest.mark.parametrize("kept", ["none", "one byte", "half", "all but 10 bytes"])
def test_an_empty_or_truncated_torch_file_is_named_with_the_remedy(tmp_path, kept):
    path = _saved(tmp_path)
    data = path.read_bytes()
    keep = {"none": 0, "one byte": 1, "half": len(data) // 2,
            "all but 10 bytes": len(data) - 10}[kept]
    path.write_bytes(data[:keep])
    with pytest.raises(atomic.DamagedFileError) as err:
        atomic.load_torch_file(path, "the trainer checkpoint",
                               f"delete the folder {str(tmp_path)!r} to start over")
    message = str(err.value)
    assert message.startswith(f"the trainer checkpoint {str(path)!r} is damaged: ")
    assert ("empty (0 bytes)" if keep == 0 else "truncated or not a torch file") in message
    assert message.endswith(f"delete the folder {str(tmp_path)!r} to start over")
    assert isinstance(err.value, ValueError)  # bad input: a ValueError like every other


def test_a_file_that_is_not_a_torch_file_and_the_default_remedy(tmp_path):
    path = tmp_path / "head.pt"
    path.write_text("not a checkpoint")
    with pytest.raises(atomic.DamagedFileError, match=r"head\.pt' is damaged: it is truncated or "
                                                      r"not a torch file \(16 bytes.*delete it "
                                                      r"\(or its folder, to start over\) or "
                                                      r"restore it from a copy"):
        atomic.load_torch_file(path, "the head")


def test_a_whole_archive_whose_contents_do_not_read_is_named_too(tmp_path):
    import zipfile
    path = tmp_path / "state.pt"
    with zipfile.ZipFile(path, "w") as z:  # a complete zip, but no torch data inside
        z.writestr("archive/data.pkl", b"\x80\x02garbage")
    with pytest.raises(atomic.DamagedFileError, match=r"state\.pt' cannot be read \(.*\): it is "
                                                      r"damaged or not what the workbench saved"):
        atomic.load_torch_file(path, "the RL checkpoint", weights_only=False)


def test_a_missing_torch_file_is_not_called_damaged(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"the head .*nope\.pt' does not exist"):
        atomic.load_torch_file(tmp_path / "nope.pt", "the head")
