"""The answers picture readable where it matters (issue 56): one mismatched row beside tens of
thousands checked is drawn in red with its count; a panel with only zeros (the Ray demo's
"Fraction of step") is left off and named in the caption; the latency axis is linear, so a
bar's height is its value; no two value labels overlap. A page written here by hand."""
from __future__ import annotations

import itertools

from matplotlib.colors import to_rgba

from dpobs_otel.report import answers as a
from dpobs_otel.report.draw import figure

MISMATCH = "tab:red"  # the colour the page gives a mismatch

OPS = {"get": 18.1, "put": 12.9, "list": 5.7, "clear": 5.69, "register": 48.4}


def page() -> a.Page:
    found = {
        a.FRAC: {"data plane (op-seconds)": {"trainer 0": 0.0, "trainer 1": 0.0}},
        a.SHARE: {"share": {"get": 70.0, "put": 30.0}},
        a.LATENCY: {q: {op: v * f for op, v in OPS.items()}
                    for q, f in (("mean", 1.0), ("p50", 0.9), ("p90", 1.2), ("p99", 1.6))},
        a.GUARD: {"rows": {"checked": 23424, "mismatched": 1, "unverified": 3904}},
    }
    return a.page("t", "Source: here", found)


def axes(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def test_a_panel_of_zeros_is_left_off_and_named():
    p = page()
    assert a.FRAC not in [x.title for x in p.panels] and a.FRAC in p.missing
    assert a.FRAC in p.caption


def test_one_mismatched_row_is_red_with_its_count():
    guard = axes(figure(page()))[a.GUARD]
    red = [bar for bar in guard.patches if bar.get_facecolor() == to_rgba(MISMATCH)]
    assert len(red) == 1 and red[0].get_height() == 1
    said = [t for t in guard.texts if t.get_text() == "1 mismatched"]
    assert said and to_rgba(said[0].get_color()) == to_rgba(MISMATCH)
    assert said[0].get_fontsize() >= 10


def test_latency_is_on_a_linear_axis_its_labels_apart():
    fig = figure(page())
    latency = axes(fig)[a.LATENCY]
    assert latency.get_yscale() == "linear" and "log" not in latency.get_ylabel()
    assert latency.get_ylim()[0] == 0  # heights from zero: a bar twice as tall is twice as slow
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in latency.texts if t.get_text()]
    assert len(boxes) == 4 * len(OPS)
    for one, two in itertools.combinations(boxes, 2):
        assert not one.overlaps(two), (one, two)


def test_the_caption_is_wrapped_within_the_page_clear_of_the_panels():
    ops = ("ray_args", "ray_call", "ray_get", "ray_put", "ray_return")  # tick labels aslant
    found = {a.LATENCY: {"p50": dict.fromkeys(ops, 5.0)}, a.BYTES: {"read": {"ray_get": 1.0}}}
    p = a.page("t", "Source: Prometheus http://127.0.0.1:60183, the overview dashboard's "
               "queries over the last 5m", found)  # the Ray demo's page: four panels named
    fig = figure(p)
    fig.canvas.draw()
    caption = next(t for t in fig.texts if t.get_text().startswith("Source"))
    box = caption.get_window_extent()
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width  # wrapped within the page
    top = box.y1
    for ax in fig.axes:
        assert ax.get_tightbbox().y0 > top + 5, ax.get_title()  # a gap, not a touch
