"""Stored outputs keep what JupyterLab shows after a run: closed widgets (a finished progress bar) go, a widget
with its own picture (the dashboard) is stored as the picture."""

import nbformat

from forge_nb.tools.execute_notebooks import WIDGET_STATE, WIDGET_VIEW, as_pictures, drop_closed_widgets


def view(model_id: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {"model_id": model_id}, "text/plain": "0%"})


def test_closed_widget_outputs_and_unreachable_state_are_dropped():
    bar, board, child, orphan = "a1", "b2", "c3", "d4"
    cell = nbformat.v4.new_code_cell("s.dashboard()")
    cell.outputs = [view(bar), nbformat.v4.new_output("stream", text="hello\n"), view(board)]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["widgets"] = {
        WIDGET_STATE: {
            "state": {
                bar: {"state": {}},
                board: {"state": {"children": [f"IPY_MODEL_{child}"]}},
                child: {"state": {}},
                orphan: {"state": {}},  # the bar's progress child, never closed itself
            }
        }
    }
    assert drop_closed_widgets(nb, closed={bar}) == 1
    assert [o.get("data", {}).get(WIDGET_VIEW, {}).get("model_id") for o in cell.outputs] == [None, board]
    assert set(nb.metadata["widgets"][WIDGET_STATE]["state"]) == {board, child}


def test_no_widget_left_means_no_widget_metadata():
    cell = nbformat.v4.new_code_cell("s.step(10)")
    cell.outputs = [view("a1")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["widgets"] = {WIDGET_STATE: {"state": {"a1": {"state": {}}}}}
    drop_closed_widgets(nb, closed={"a1"})
    assert cell.outputs == [] and "widgets" not in nb.metadata


def test_a_widget_with_its_own_picture_is_stored_as_the_picture():
    board, figure, plain = "b2", "f5", "a1"
    cell = nbformat.v4.new_code_cell("s.dashboard()")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {"model_id": board}, "image/png": "iVBOR"}),
        view(plain),
    ]
    nb = nbformat.v4.new_notebook(cells=[cell])
    state = {board: {"state": {"children": [f"IPY_MODEL_{figure}"]}}, figure: {"state": {"_esm": "x" * 100}}}
    nb.metadata["widgets"] = {WIDGET_STATE: {"state": {**state, plain: {"state": {}}}}}
    assert as_pictures(nb) == 1
    drop_closed_widgets(nb, closed=set())
    assert cell.outputs[0].data == {"image/png": "iVBOR"}
    assert set(nb.metadata["widgets"][WIDGET_STATE]["state"]) == {plain}  # the figure's JavaScript is gone
