"""Panel and variable factories for the dpobs dashboards.

Each factory takes what differs between panels (title, how to read it, unit, queries) and
applies what must not differ: the `${datasource}` variable on the panel and on every target,
a legend, and a stable refId per query. dashboards.py only composes them.
"""
from __future__ import annotations

from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import (dashboard, heatmap, prometheus, stat, table,
                                             timeseries)
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode

DATASOURCE = common.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Grafana units. Rates of a seconds counter are seconds per second (how many processes'
# worth of wall clock went there), which Grafana has no built-in unit for.
SECONDS_PER_SECOND = "suffix: s/s"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


def _targets(queries: tuple[Query, ...], fmt: pm.PromQueryFormat | None = None,
             instant: bool = False) -> list:
    out = []
    for ref, q in zip("ABCDEFGH", queries, strict=False):
        t = prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(ref)
        t = t.datasource(DATASOURCE)
        t = t.instant() if instant else t.range()
        out.append(t.format(fmt) if fmt else t)
    return out


def _base(panel, title: str, description: str, unit: str, queries: tuple[Query, ...],
          width: int, height: int, repeat: str | None = None):
    """`repeat`: one copy of the panel per selected value of that variable, side by side
    (for stacked panels, whose stacks would otherwise pile several jobs into one)."""
    assert queries, f"panel {title!r} has no query"
    if repeat:
        title = f"{title}: ${repeat}"
        panel = panel.repeat(repeat).repeat_direction("h").max_per_row(4)
    return (panel.title(title).description(description).unit(unit).datasource(DATASOURCE)
            .span(width).height(height))


def _legend(table: bool = True) -> cb.VizLegendOptions:
    mode = common.LegendDisplayMode.TABLE if table else common.LegendDisplayMode.LIST
    legend = cb.VizLegendOptions().show_legend(True).display_mode(mode)
    legend = legend.placement(common.LegendPlacement.BOTTOM)
    return legend.calcs(["mean", "max", "lastNotNull"]) if table else legend


def thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    """Absolute thresholds; the first step's value must be None (the base color)."""
    return dashboard.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in steps])


def timeseries_panel(title: str, description: str, unit: str, *queries: Query,
                     stacked: bool = False, width: int = 12, height: int = 8,
                     log_scale: bool = False, max_value: float | None = None,
                     repeat: str | None = None):
    panel = _base(timeseries.Panel(), title, description, unit, queries, width, height, repeat)
    panel = panel.targets(_targets(queries)).legend(_legend()).fill_opacity(
        40 if stacked else 10)
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
    if log_scale:  # latencies span decades; a log axis keeps p50 and p99 both readable
        panel = panel.scale_distribution(
            cb.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10))
    else:
        panel = panel.min(0)
    return panel.max(max_value) if max_value is not None else panel


def stat_panel(title: str, description: str, unit: str, *queries: Query,
               steps: dashboard.ThresholdsConfig | None = None, color: str | None = None,
               no_value: str | None = None, width: int = 6, height: int = 6):
    """A current value with its sparkline. `color` fixes one color (the red mismatch
    count must never turn a reassuring green); otherwise `steps` colors by value."""
    panel = _base(stat.Panel(), title, description, unit, queries, width, height)
    panel = panel.targets(_targets(queries)).graph_mode(common.BigValueGraphMode.AREA)
    panel = panel.reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    if color:
        panel = panel.color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.FIXED)
                                   .fixed_color(color))
    elif steps:
        panel = panel.thresholds(steps).color_scheme(
            dashboard.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
    return panel.no_value(no_value) if no_value else panel


def checked_stat(title: str, description: str, query: Query, **kw):
    """A count of checked or failed items (guard rows, weight tensors)."""
    # No data means nobody checked, which must not read as a clean zero.
    return stat_panel(title, description + " Empty means not checked, not clean.", "short",
                      query, no_value="not checked", **kw)


def counted(series: str, sel: str, *labels: str) -> str:
    """Increase over the interval summed by job (and `labels`), counting a series born
    inside it in full: OpenTelemetry creates a counter series at its first increment,
    which increase() alone never sees (the recording rules and alerts do the same over 5m)."""
    s, by = f"{series}{sel}", ", ".join(("job", *labels))
    return (f"sum by ({by}) (({s} unless {s} offset $__rate_interval) "
            f"or increase({s}[$__rate_interval]))")


def heatmap_panel(title: str, description: str, unit: str, query: Query,
                  width: int = 12, height: int = 8, repeat: str | None = None):
    """Buckets as Grafana computes them from `le` (the query must sum by le), or from a
    native histogram (Grafana reads its buckets itself)."""
    queries = (query,)
    panel = _base(heatmap.Panel(), title, description, unit, queries, width, height, repeat)
    return (panel.targets(_targets(queries, pm.PromQueryFormat.HEATMAP)).calculate(False)
            .y_axis(heatmap.YAxisConfig().unit(unit))
            .rows_frame(heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.LE))
            .color(heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("Oranges")
                   .exponent(0.5).steps(64))
            .show_legend())


def table_panel(title: str, description: str, unit: str, query: Query, columns: list[str],
                width: int = 24, height: int = 8):
    """One row per series of an instant query: its `columns` labels, then its value
    (sorted, largest first); the other labels and the timestamp are hidden."""
    queries = (query,)
    panel = _base(table.Panel(), title, description, unit, queries, width, height)
    order = {name: i for i, name in enumerate([*columns, "Value"])}
    organize = dm.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {"Time": True, "__name__": True},
        "indexByName": order, "renameByName": {"Value": title}})
    labels_only = dm.DataTransformerConfig(id_val="filterFieldsByName", options={
        "include": {"names": [*columns, "Value"]}})
    return (panel.targets(_targets(queries, pm.PromQueryFormat.TABLE, instant=True))
            .with_transformation(labels_only).with_transformation(organize)
            .sort_by([cb.TableSortByFieldState().display_name(title).desc(True)]))


def matrix_panel(title: str, description: str, unit: str, query: Query, rows: str,
                 columns: str, width: int = 12, height: int = 8):
    """A matrix of an instant query's values: one row per value of label `rows`, one
    column per value of label `columns` (Grafana's grouping-to-matrix), empty cells blank."""
    queries = (query,)
    panel = _base(table.Panel(), title, description, unit, queries, width, height)
    matrix = dm.DataTransformerConfig(id_val="groupingToMatrix", options={
        "rowField": rows, "columnField": columns, "valueField": "Value",
        "emptyValue": "empty"})
    return (panel.targets(_targets(queries, pm.PromQueryFormat.TABLE, instant=True))
            .with_transformation(matrix))


def row(title: str) -> dashboard.Row:
    return dashboard.Row(title)


def dashboard_link(title: str, uid: str, tooltip: str) -> dashboard.DashboardLink:
    """A link to the other dpobs dashboard that carries the time range and the variables
    (same names on both), so a drill-down opens on the same jobs and window."""
    return (dashboard.DashboardLink(title).type(dm.DashboardLinkType.LINK).url(f"/d/{uid}")
            .tooltip(tooltip).icon("dashboard").include_vars(True).keep_time(True)
            .target_blank(False).as_dropdown(False))


def datasource_variable() -> dashboard.DatasourceVariable:
    return dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")


def label_variable(name: str, query: str, label: str) -> dashboard.QueryVariable:
    """A multi-select over a label's values, "All" matching everything (regex .*)."""
    return (dashboard.QueryVariable(name).label(label).datasource(DATASOURCE)
            .query({"query": query, "refId": f"{name}-values"}).definition(query)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(
                dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"])))
