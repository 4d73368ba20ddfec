"""The base of every explorer: ipywidgets controls over one matplotlib figure, redrawn on change.

Why plain re-drawing (not ipympl): the figure is shown as an ordinary PNG output with a display
id, and every redraw replaces that output in place. Under papermill nobody moves a control, yet
the executed notebook keeps the last figure as a plain image, so a saved notebook, the static
HTML report and JupyterLab without a kernel all show it; in a live kernel the same output
follows every slider. Nothing but ipywidgets (a required package) is needed in either
environment.

A subclass builds its controls, then calls ``super().__init__(controls)``; it implements
:meth:`Explorer.draw`, which draws on a cleared figure from the controls' values and returns
the HTML of the side panel (or ``""``). Everything an explorer shows is computed from tables or
run folders, so its logic is tested without a browser: set a control's ``value``, then read
:attr:`Explorer.figure` or :attr:`Explorer.panel`.
"""
from __future__ import annotations

import io

from matplotlib.figure import Figure

__all__ = ["Explorer", "legend_beside"]


def legend_beside(ax, **kwargs):
    """The legend of ``ax`` outside it, at its right, top-aligned: inside the axes a legend
    covers whatever data happens to lie there when a control moves (constrained layout makes
    room for it)."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                     fontsize=7, **kwargs)


class Explorer:
    """Named ipywidgets controls, one figure redrawn whenever a control's value changes.

    Attributes:
        controls: name -> widget; their ``value`` traits are the explorer's state.
        figure: the matplotlib ``Figure`` (not registered with pyplot, so it never shows twice
            and is never leaked by a notebook that makes many explorers).
        panel: an ``ipywidgets.HTML`` beside the figure: what :meth:`draw` returned.
        redraws: how many times the figure was drawn (a cheap check that a change redrew).
    """

    figsize = (10.0, 4.8)

    def __init__(self, controls: dict):
        import ipywidgets as widgets
        self.controls = dict(controls)
        self.panel = widgets.HTML()
        self.figure = Figure(figsize=self.figsize, layout="constrained")
        self.redraws = 0
        self._handle = None
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        self.redraw()

    # ---- what a subclass implements -----------------------------------------------------
    def draw(self, fig: Figure, **values) -> str:
        """Draw on the cleared ``fig`` from the controls' ``values``; return the panel's HTML."""
        raise NotImplementedError

    # ---- state and drawing --------------------------------------------------------------
    @property
    def values(self) -> dict:
        """The controls' current values by name."""
        return {name: control.value for name, control in self.controls.items()}

    def redraw(self) -> None:
        """Clear the figure, draw it from the current values, and update the shown image."""
        self.figure.clear()
        self.panel.value = self.draw(self.figure, **self.values) or ""
        self.redraws += 1
        if self._handle is not None:
            self._handle.update(self.image())

    def _on_change(self, change) -> None:
        self.redraw()

    def png(self) -> bytes:
        """The figure as PNG bytes (what the notebook output shows)."""
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()

    def image(self):
        """The figure as an ``IPython.display.Image``."""
        from IPython.display import Image
        return Image(data=self.png(), format="png")

    def save(self, path):
        """Write the current figure as a PNG, atomically (``viz.save_figure``)."""
        from .timeline import save_figure
        return save_figure(self.figure, path)

    def widget(self):
        """The controls and the side panel as one ipywidgets box (the figure is shown apart)."""
        import ipywidgets as widgets
        return widgets.VBox([widgets.HBox(list(self.controls.values()),
                                          layout=widgets.Layout(flex_flow="row wrap")),
                             self.panel])

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget())
        self._handle = display(self.image(), display_id=True)
