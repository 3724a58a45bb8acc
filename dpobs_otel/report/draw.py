"""The page drawn: one figure, a grid of bar charts (grouped bars per series), each with its
title, labelled axes and a legend, the source in the caption. matplotlib comes with the extra
`report` (its Agg backend: no display needed), as for the timeline's picture."""
from __future__ import annotations

import textwrap

from ..tracing.picture import require_matplotlib as _pyplot  # the extras report and timeline
from .answers import GUARD, Page, Panel

COLUMNS = 2
CAPTION_CHARS = 170  # a line of the caption at 9 pt across the 12-inch page


def _number(v: float) -> str:
    """A bar's value: counts whole (23,412), small values to three figures."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


MISMATCH = "tab:red"  # the guard's mismatched rows: the one bar a reader must not miss


def _bars(ax, panel: Panel) -> None:
    """Grouped bars on linear axes (a bar's height is its value); only the categories a
    series has get a bar and a label; with three series or more the labels stand upright,
    so neighbours never overlap."""
    categories = sorted({c for cats in panel.bars.values() for c in cats})
    width = 0.8 / len(panel.bars)
    upright = len(panel.bars) > 2
    for i, (series, cats) in enumerate(sorted(panel.bars.items())):
        at = [k for k, c in enumerate(categories) if c in cats]
        xs = [k + (i - (len(panel.bars) - 1) / 2) * width for k in at]
        bars = ax.bar(xs, [cats[categories[k]] for k in at], width, label=series)
        ax.bar_label(bars, fmt=_number, fontsize=7, padding=2,
                     rotation=90 if upright else 0)
        if panel.title == GUARD:
            _mismatch(ax, bars, [categories[k] for k in at], [cats[categories[k]] for k in at])
    ax.set_xticks(range(len(categories)), categories, rotation=20 if len(categories) > 4 else 0)
    xlabel, ylabel = panel.axes
    ax.set_title(panel.title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, max(v for c in panel.bars.values() for v in c.values()) * (
        1.3 if upright else 1.15))
    if len(panel.bars) > 1:
        ax.legend(fontsize=8)


def _mismatch(ax, bars, categories, values) -> None:
    """The mismatched rows in red, their count in large red type above the bar: one row
    against tens of thousands checked is a bar too thin to see."""
    for bar, category, value in zip(bars, categories, values):
        if category == "mismatched" and value > 0:
            bar.set_color(MISMATCH)
            bar.set_edgecolor(MISMATCH)
            bar.set_linewidth(2)  # a hairline bar still shows as a red line
            ax.annotate(f"{_number(value)} mismatched", (bar.get_x() + bar.get_width() / 2,
                        0), xytext=(0, 24), textcoords="offset points", ha="center",
                        color=MISMATCH, fontsize=12, fontweight="bold")


def figure(page: Page):
    """The matplotlib Figure of the page (tests read its axes)."""
    plt = _pyplot()
    rows = max(1, -(-len(page.panels) // COLUMNS))
    height = 3.6 * rows + 1
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(12, height), squeeze=False)
    for ax, panel in zip(axes.flat, page.panels):
        _bars(ax, panel)
    for ax in list(axes.flat)[len(page.panels):]:
        fig.delaxes(ax)
    fig.suptitle(page.title + (f"\n{page.verdict}" if page.verdict else ""), fontsize=12)
    # wrapped here, not by matplotlib at draw time, so the caption's height is known
    fig.text(0.5, 0.01, textwrap.fill(page.caption, CAPTION_CHARS), ha="center", fontsize=9)
    # half an inch under the panels for the caption's two lines, whatever the page's height
    fig.tight_layout(rect=(0, 0.5 / height, 1, 1 - 0.5 / height))
    return fig


def write(page: Page, path: str) -> None:
    fig = figure(page)
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
