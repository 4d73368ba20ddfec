"""Progress bars that read well both live and in a saved notebook.

``tqdm.auto`` draws an ipywidgets bar in a notebook. Papermill saves only the text that bar had
when it was first displayed, so an executed notebook opened later shows every bar frozen at
"0%| | 0/128". Here, inside a Jupyter kernel, a bar is tqdm's own text bar written into an
ordinary display output that each refresh replaces in place (a display id, as the explorers'
figures use): live in JupyterLab it moves like any bar, and the executed notebook keeps each
bar's final state ("100%|██████| 128/128 [00:12<00:00, 10.4req/s]"). A bar made with
``leave=False`` (an inner bar, such as one rollout inside an RL step) is blanked when it
closes, and successive ones in a cell share one output, so loops of them leave no wall of lines. Outside a kernel (terminal, CI, pipelines'
own process) it is tqdm's standard bar on stderr.

Use ``from workbench.progress import tqdm`` wherever ``tqdm.auto`` would be used.
"""
from __future__ import annotations

from tqdm.std import tqdm as std_tqdm

__all__ = ["tqdm"]

NOTEBOOK_NCOLS = 100        # the text bar's width in a notebook (no terminal to measure)
NOTEBOOK_MININTERVAL = 0.5  # seconds between refreshes: few messages, still live


def in_notebook_kernel() -> bool:
    """True inside a Jupyter kernel (JupyterLab, papermill), where output is a notebook's."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class DisplayLine:
    """A file for tqdm: each written line replaces one notebook display output.

    tqdm redraws by writing ``"\\r" + line`` (and cursor moves for nested bars); only the line
    is kept. The output is created on the first non-empty line, so a disabled bar shows nothing.
    """

    def __init__(self):
        self.handle = None
        self.text = ""

    def write(self, s: str) -> None:
        text = s.replace("\x1b[A", "").replace("\r", "").replace("\n", "").rstrip()
        if text:
            self.show(text)

    def show(self, text: str) -> None:
        from IPython.display import display
        self.text = text
        bundle = {"text/plain": text}
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)

    def flush(self) -> None:
        pass


_TRANSIENT: dict = {}  # (cell execution count, bar position) -> the DisplayLine they share


def _line_for(leave, position) -> DisplayLine:
    """A fresh output for a bar that stays; the cell's shared one for bars that do not."""
    if leave or leave is None and not position:
        return DisplayLine()
    from IPython import get_ipython
    key = (get_ipython().execution_count, position or 0)
    if key not in _TRANSIENT:
        _TRANSIENT.clear()          # an earlier cell's slot is never written again
        _TRANSIENT[key] = DisplayLine()
    return _TRANSIENT[key]


class tqdm(std_tqdm):  # noqa: N801 - the name everyone imports
    """``tqdm.std.tqdm``, drawn into a replaceable display output inside a notebook kernel."""

    def __init__(self, *args, **kwargs):
        self._line = None
        if kwargs.get("file") is None and in_notebook_kernel():
            self._line = _line_for(kwargs.get("leave", True), kwargs.get("position"))
            kwargs["file"] = self._line
            kwargs.setdefault("ncols", NOTEBOOK_NCOLS)
            kwargs.setdefault("mininterval", NOTEBOOK_MININTERVAL)
            kwargs.setdefault("ascii", False)
        super().__init__(*args, **kwargs)

    def close(self) -> None:
        leave = self.pos == 0 if self.leave is None else self.leave
        super().close()
        if self._line is not None and self._line.handle is not None and not leave:
            self._line.show("")
