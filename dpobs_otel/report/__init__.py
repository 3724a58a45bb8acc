"""`dpobs report`: one PNG page of the overview dashboard's answers, for people without
Grafana and for the README. The numbers come from the overview's own queries
(dpobs_otel/mixin/dashboards.py, run against Prometheus: queries.py) or, with no Prometheus,
from the cluster view of a file_sd directory (readback/cluster.py); the caption says which.

    answers.py  the page as data: panels of labelled bars, from either source
    queries.py  the overview's panel queries, variables filled in
    draw.py     the page drawn with matplotlib (the extra `report`)
    command.py  `dpobs report --prometheus URL | --sd-dir DIR --png FILE`; the demo's hook
"""
