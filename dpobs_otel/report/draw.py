"""The page drawn: one figure, a grid of bar charts (grouped bars per series), each with its
title, labelled axes and a legend, the source in the caption. matplotlib comes with the extra
`report` (its Agg backend: no display needed), as for the timeline's picture."""
from __future__ import annotations

from ..tracing.picture import require_matplotlib as _pyplot  # the extras report and timeline
from .answers import Page, Panel

COLUMNS = 2


def _number(v: float) -> str:
    """A bar's value: counts whole (23,412), small values to three figures."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def _bars(ax, panel: Panel) -> None:
    categories = sorted({c for cats in panel.bars.values() for c in cats})
    width = 0.8 / len(panel.bars)
    for i, (series, cats) in enumerate(sorted(panel.bars.items())):
        xs = [k + (i - (len(panel.bars) - 1) / 2) * width for k in range(len(categories))]
        values = [cats.get(c, 0.0) for c in categories]
        bars = ax.bar(xs, values, width, label=series)
        ax.bar_label(bars, fmt=_number, fontsize=7)
    ax.set_xticks(range(len(categories)), categories, rotation=20 if len(categories) > 4 else 0)
    xlabel, ylabel = panel.axes
    ax.set_title(panel.title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if panel.log:  # p50 and p99 can be decades apart; plain numbers on the ticks
        from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.margins(y=0.15)
    ax.legend(fontsize=8)


def figure(page: Page):
    """The matplotlib Figure of the page (tests read its axes)."""
    plt = _pyplot()
    rows = max(1, -(-len(page.panels) // COLUMNS))
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(12, 3.6 * rows + 1), squeeze=False)
    for ax, panel in zip(axes.flat, page.panels):
        _bars(ax, panel)
    for ax in list(axes.flat)[len(page.panels):]:
        fig.delaxes(ax)
    fig.suptitle(page.title + (f"\n{page.verdict}" if page.verdict else ""), fontsize=12)
    fig.text(0.5, 0.01, page.caption, ha="center", fontsize=9, wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    return fig


def write(page: Page, path: str) -> None:
    fig = figure(page)
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
