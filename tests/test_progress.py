"""workbench.progress: bars that a saved notebook shows in their final state."""
import nbformat
import papermill
from workbench.progress import DisplayLine, in_notebook_kernel, tqdm

LOOP = """from workbench.progress import tqdm
for i in tqdm(range(30), desc="outer", unit="it"):
    for j in tqdm(range(3), desc="inner", leave=False):
        pass
for i in tqdm(range(5), desc="hidden", disable=True):
    pass
print("done")"""


def _outputs(tmp_path, source):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "in.ipynb")
    papermill.execute_notebook(tmp_path / "in.ipynb", tmp_path / "out.ipynb",
                               kernel_name="python3", progress_bar=False)
    return nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0].outputs


def test_saved_notebook_keeps_each_bar_final_state_and_blanks_inner_bars(tmp_path):
    outputs = _outputs(tmp_path, LOOP)
    shown = [o["data"]["text/plain"] for o in outputs if o.output_type == "display_data"]
    # the outer bar at 100%, then ONE shared output for all 30 inner bars, blanked at the end
    assert len(shown) == 2, shown
    assert shown[0].startswith("outer: 100%|") and "30/30" in shown[0]
    assert shown[1] == ""
    assert not [o for o in outputs if "application/vnd.jupyter.widget-view+json"
                in o.get("data", {})]
    assert outputs[-1].text == "done\n"


def test_outside_a_kernel_it_is_the_standard_bar_on_stderr(capsys):
    assert not in_notebook_kernel()
    for _ in tqdm(range(4), desc="cli", mininterval=0):
        pass
    err = capsys.readouterr().err
    assert "cli: 100%" in err and "4/4" in err


def test_display_line_keeps_only_the_last_line(monkeypatch):
    shown = []

    class Handle:
        def update(self, bundle, raw):
            shown.append(bundle["text/plain"])

    import IPython.display
    monkeypatch.setattr(IPython.display, "display",
                        lambda bundle, raw, display_id: shown.append(bundle["text/plain"])
                        or Handle())
    line = DisplayLine()
    line.write("\r")                      # tqdm's clearing writes show nothing
    assert line.handle is None and shown == []
    line.write("\rbar:  50%|#    | 1/2")
    line.write("\n\x1b[A\rbar: 100%|#####| 2/2")
    assert shown == ["bar:  50%|#    | 1/2", "bar: 100%|#####| 2/2"]
    assert line.text == "bar: 100%|#####| 2/2"
