"""The timeline explorer: any rollout timeline saved under a folder, its Gantt chart zoomed,
panned and filtered by step kind, and one request's numbers and text beside it.

Why it reads folders, not engines: a finished run (a notebook's ``out_dir``, a pipeline's
``runs/<pipeline>/``) keeps its timelines as parquet tables (``Timeline.save``), so any run can
be explored long after the process that made it is gone, and every number shown comes from
those tables. Built on :class:`~workbench.viz.explorer.Explorer`: under papermill the last
figure stays in the notebook as a static PNG.
"""
from __future__ import annotations

import html
import math
import os
import re
from pathlib import Path

from matplotlib.patches import Rectangle

from ..rollout.chrome_trace import write_chrome_trace
from ..rollout.timeline import STEP_KINDS, Timeline
from .explorer import Explorer
from .timeline import gantt

__all__ = ["TimelineExplorer"]

# files that make a folder one run (rather than a folder of runs): a timeline of its own,
# the metrics a notebook writes, the run.json a pipeline writes
RUN_MARKERS = ("timeline.json", "timeline/timeline.json", "metrics.json", "run.json")
NOT_RECORDED = "text not recorded in this run"


def _natural(name: str) -> list:
    """Sort key that puts ``step9`` before ``step10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _sorted(d: dict) -> dict:
    return dict(sorted(d.items(), key=lambda kv: _natural(kv[0])))


def _timeline_folders(root: Path):
    """Folders under ``root`` holding ``timeline.json``; hidden folders (an atomic write in
    progress, a virtual environment) and a timeline's own subfolders are not walked."""
    for folder, subfolders, files in os.walk(root):
        if "timeline.json" in files:
            subfolders.clear()
            yield Path(folder)
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))


def find_timelines(root) -> dict[str, dict[str, Path]]:
    """``{run: {step: folder}}`` of every timeline saved under ``root``.

    A timeline is a folder holding ``timeline.json`` (written by ``Timeline.save``). ``root``
    is one run, named after itself, when it holds a run's own files (:data:`RUN_MARKERS`);
    otherwise it is a folder of runs and each child folder with timelines below it is a run.
    A step is named by its folder's path inside the run (``timeline``,
    ``timelines/tlt-seed0/step09``; ``.`` when the run folder is the timeline itself). Hidden
    folders are skipped.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{str(root)!r} is not a folder: pass a run folder or a folder "
                                "of run folders")
    single = any((root / marker).is_file() for marker in RUN_MARKERS)
    runs: dict[str, dict[str, Path]] = {}
    for folder in _timeline_folders(root):
        rel = folder.relative_to(root)
        run, step = (root.name, rel) if single else (rel.parts[0], Path(*rel.parts[1:]))
        runs.setdefault(run, {})[step.as_posix()] = folder
    if not runs:
        raise FileNotFoundError(f"no saved timeline under {str(root)!r}: looked for folders "
                                "holding timeline.json (Timeline.save writes it with "
                                "steps.parquet and requests.parquet)")
    return {run: _sorted(steps) for run, steps in _sorted(runs).items()}


def _pick(what: str, value, accepted: list[str], where: str) -> str:
    """``value`` if it is one of ``accepted`` (the first of them when None), else an error."""
    if value is None:
        return accepted[0]
    if value not in accepted:
        raise ValueError(f"{what} {value!r} not found in {where}; accepted: {accepted}")
    return value


def _request_options(requests) -> list[tuple[str, int]]:
    """``(label, uid)`` of every request, longest response first."""
    table = requests.sort_values(["response_tokens", "uid"], ascending=[False, True])
    return [(f"uid {r.uid} · worker {r.worker} · {r.response_tokens} tokens", int(r.uid))
            for r in table.itertuples()]


def _acceptance(r) -> str:
    """Accepted over drafted tokens and tokens per verify step, or why there are none."""
    if not r.verify_steps or not r.drafted:
        return "no speculative steps"
    return (f"{r.accepted}/{r.drafted} drafted tokens accepted ({r.accepted / r.drafted:.0%}), "
            f"{r.emitted / r.verify_steps:.2f} tokens per verify step "
            f"({r.verify_steps} verify steps)")


def request_panel(r) -> str:
    """HTML (every value escaped) of one requests-table row: its facts, then its text."""
    if r is None:
        return "<i>no request in this timeline</i>"
    facts = {"worker": r.worker, "prompt / sample": f"{r.prompt_id} / {r.sample_idx}",
             "start → end": f"{r.start_s:.3f} s → {r.end_s:.3f} s "
                            f"({r.end_s - r.start_s:.3f} s)",
             "response tokens": f"{r.response_tokens} (finish: {r.finish})",
             "prompt tokens": r.prompt_tokens, "acceptance": _acceptance(r),
             "reward": "not scored" if math.isnan(r.reward) else f"{r.reward:g}"}
    rows = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
                   f"<td>{html.escape(str(v))}</td></tr>" for k, v in facts.items())
    recorded = isinstance(r.text, str)
    text = (f"<pre style='white-space:pre-wrap;max-height:14em;overflow:auto'>"
            f"{html.escape(r.text)}</pre>" if recorded else f"<p><i>{NOT_RECORDED}</i></p>")
    return f"<b>request {html.escape(str(r.uid))}</b><table>{rows}</table>{text}"


class TimelineExplorer(Explorer):
    """Explore the rollout timelines saved under ``root`` (a run folder or a folder of runs).

    Controls: ``run`` and ``step`` pick a timeline (:func:`find_timelines` names them; the
    step list follows the run), ``window`` zooms and pans the time axis, ``kinds`` shades
    only the step kinds selected, ``request`` (longest first) is outlined on the chart and
    described in the panel: worker, start and end, length, acceptance, reward and text.
    Beside them, ``export trace`` writes the shown timeline as a Chrome trace (Perfetto UI,
    chrome://tracing; docs/chrome_trace.md) to the path typed (:meth:`export_trace`).
    """

    figsize = (11.0, 4.8)

    def __init__(self, root, run: str | None = None, step: str | None = None):
        import ipywidgets as widgets
        self.root = Path(root)
        self.runs = find_timelines(self.root)
        run = _pick("run", run, list(self.runs), f"{str(self.root)!r}")
        step = _pick("step", step, list(self.runs[run]), f"run {run!r}")
        wide = widgets.Layout(width="440px")
        self.controls = {
            "run": widgets.Dropdown(options=list(self.runs), value=run, description="run",
                                    layout=wide),
            "step": widgets.Dropdown(description="step", layout=wide),
            "window": widgets.FloatRangeSlider(description="window (s)", readout_format=".2f",
                                               continuous_update=False, layout=wide),
            "kinds": widgets.SelectMultiple(description="step kinds"),
            "request": widgets.Dropdown(description="request", layout=wide),
        }
        self._syncing = False
        self._select(run, step)
        # not controls: a click writes a file, it changes nothing the figure is drawn from
        self.export_path = widgets.Text(placeholder=self.default_trace_path(),
                                        description="trace file", layout=wide)
        self.export_button = widgets.Button(description="export trace",
                                            tooltip="write the shown timeline as a Chrome "
                                            "trace for Perfetto UI or chrome://tracing")
        self.export_status = widgets.HTML()
        self.export_button.on_click(lambda _: self._export_clicked())
        super().__init__(self.controls)

    # ---- keeping the dependent controls in step -----------------------------------------
    def _on_change(self, change) -> None:
        """Redraw once per user change: a new run or step first refits the other controls,
        whose own change events are ignored meanwhile."""
        if self._syncing:
            return
        if change["owner"] is self.controls["run"]:
            self._select(change["new"])
        elif change["owner"] is self.controls["step"]:
            self._select(self.controls["run"].value, change["new"])
        self.export_path.placeholder = self.default_trace_path()
        super()._on_change(change)

    def _select(self, run: str, step: str | None = None) -> None:
        """Load ``step`` of ``run`` (its first when None) and fit every control to it."""
        self._syncing = True
        try:
            c, steps = self.controls, list(self.runs[run])
            if list(c["step"].options) != steps:
                c["step"].options = steps
            c["step"].value = step if step in steps else steps[0]
            self.timeline = Timeline.load(self.runs[run][c["step"].value])
            self._fit(self.timeline)
        finally:
            self._syncing = False

    def _fit(self, tl: Timeline) -> None:
        """Window over the whole makespan, the same kinds hidden, the longest request."""
        c = self.controls
        end = tl.makespan_s or 1.0
        c["window"].max = end
        c["window"].value = (0.0, end)
        c["window"].step = end / 500
        hidden = set(c["kinds"].options) - set(c["kinds"].value)
        kinds = [k for k in STEP_KINDS if k in set(tl.steps["kind"])]
        c["kinds"].options = kinds
        c["kinds"].rows = max(1, len(kinds))
        c["kinds"].value = tuple(k for k in kinds if k not in hidden)
        options = _request_options(tl.requests)
        c["request"].options = options
        c["request"].value = options[0][1] if options else None

    # ---- the Chrome trace of the shown timeline -----------------------------------------
    def default_trace_path(self) -> str:
        """``<run>-<step>.chrome_trace.json`` in the working folder (``/`` made ``-``)."""
        c = self.controls
        name = f"{c['run'].value}-{c['step'].value}".replace("/", "-").replace(".", "-")
        return f"{name}.chrome_trace.json"

    def export_trace(self, path=None) -> Path:
        """Write the shown timeline (run and step) as a Chrome trace to ``path`` (the typed
        path when None, else :meth:`default_trace_path`), atomically; return the path."""
        path = path or self.export_path.value.strip() or self.default_trace_path()
        return write_chrome_trace({self.controls["step"].value: self.timeline}, path)

    def _export_clicked(self) -> None:
        try:
            path = self.export_trace()
        except (ValueError, OSError) as exc:
            self.export_status.value = f"<b>not written</b>: {html.escape(str(exc))}"
            return
        self.export_status.value = (f"wrote {html.escape(str(path))}: open it in "
                                    "ui.perfetto.dev (Open trace file) or chrome://tracing")

    def widget(self):
        """The controls, the export row and the side panel as one box."""
        import ipywidgets as widgets
        box = super().widget()
        row = widgets.HBox([self.export_path, self.export_button, self.export_status])
        return widgets.VBox([box.children[0], row, *box.children[1:]])

    # ---- drawing ------------------------------------------------------------------------
    def _row(self, uid):
        """The requests-table row of ``uid`` (None when there is none)."""
        rows = self.timeline.requests[self.timeline.requests["uid"] == uid]
        return next(rows.itertuples(), None)

    def draw(self, fig, run, step, window, kinds, request) -> str:
        tl = self.timeline
        fig.set_size_inches(self.figsize[0], min(12.0, max(self.figsize[1],
                                                           1.8 + 0.5 * tl.num_workers)))
        ax = fig.subplots()
        gantt(tl, ax=ax, kinds=kinds)
        lo, hi = window
        ax.set_xlim(lo, max(hi, lo + 1e-9))
        fig.suptitle(f"run {run} · step {step}", fontsize=10)
        r = self._row(request)
        if r is not None:
            ax.add_patch(Rectangle((r.start_s, r.worker + 0.04), r.end_s - r.start_s, 0.92,
                                   fill=False, edgecolor="crimson", linewidth=2, zorder=4,
                                   gid="selected-request"))
        return request_panel(r)
