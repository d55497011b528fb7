"""Plotly figures that take the width of the cell they are shown in, and follow it.

plotly's FigureWidget (on anywidget) draws itself before JupyterLab attaches it to the page, when its
element has no width yet: plotly falls back to 700 px and never measures again. `WidthProbe`, a
view-less widget placed in the same box, measures the box in the browser (a ResizeObserver) and
syncs its width to the kernel, which sets it as the figures' layout width.
"""

from __future__ import annotations

import anywidget
import plotly.graph_objects as go
import traitlets

_ESM = """
export default {
  render({ model, el }) {
    const observer = new ResizeObserver((entries) => {
      const width = Math.floor(entries[0].contentRect.width);
      if (width > 0 && width !== model.get("width")) { model.set("width", width); model.save_changes(); }
    });
    // The box is known once the view is attached: look for it frame by frame.
    const attach = () => {
      const box = el.closest(".forge-fit-width");
      if (box) observer.observe(box); else requestAnimationFrame(attach);
    };
    requestAnimationFrame(attach);
    return () => observer.disconnect();
  },
};
"""


class WidthProbe(anywidget.AnyWidget):
    """The width (px) of the closest enclosing box with the class ``forge-fit-width``; 0 until shown."""

    _esm = _ESM
    width = traitlets.Int(0).tag(sync=True)


def fit_width(box, figures: list[go.FigureWidget]):
    """Make `figures` (in `box`, an ipywidgets Box) as wide as `box` -> `box`."""
    probe = WidthProbe(layout={"height": "0px", "width": "0px"})

    def resize(change) -> None:
        for figure in figures:
            figure.update_layout(width=max(320, change["new"] - 8))  # a scrollbar's room

    probe.observe(resize, names="width")
    box.add_class("forge-fit-width")
    box.children = (*box.children, probe)
    return box
