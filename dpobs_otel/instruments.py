"""Every instrument dpobs creates is made here, from its row in names.INSTRUMENTS (kind, unit,
description: written there alone, beside the name and the series it derives). The core, row
age, the guard and weights each pass the callback that reads their own numbers."""
from __future__ import annotations

import functools
from typing import Callable

from . import names


def create(meter, name: str, observe: Callable[[], list] | None = None,
           on_error: Callable[[BaseException], None] | None = None):
    """The instrument of `name`'s row on `meter`. An observable one takes `observe`, which
    returns its Observations at collection; an exception in it goes to on_error(exc) and the
    collection gets no points of it: a broken callback must not break the scrape."""
    row = names.INSTRUMENTS[name]
    make = getattr(meter, f"create_{row.kind}")
    if row.kind.startswith("observable_") != (observe is not None and on_error is not None):
        raise ValueError(f"{name}: an observable takes observe and on_error, others neither")
    if observe is None:
        return make(name, unit=row.unit, description=row.description)
    return make(name, callbacks=[_guarded(name, observe, on_error)], unit=row.unit,
                description=row.description)


def _guarded(name: str, observe, on_error):
    def run(options):
        try:
            return observe()
        except Exception as exc:
            on_error(exc)
            return []
    run.__name__ = f"observe_{name}"
    return run


def exported(internal_error: Callable[[str, BaseException], None]):
    """create()'s on_error for a Telemetry's callbacks: a failing callback counts as dpobs's
    own error of component export (the guard counts its own among its failures)."""
    return functools.partial(internal_error, names.COMPONENT_EXPORT)
