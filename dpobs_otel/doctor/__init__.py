"""`dpobs doctor`: the chain from a job's processes to its alerts, checked link by link, one
line per check with what to do when it fails.

    checks.py   each link as a function of what it reads (a file_sd directory's scrape, the
                Prometheus query API through readback/prometheus.py); a Check per link
    command.py  `dpobs doctor [--sd-dir DIR] [--prometheus URL] [--alertmanager URL]
                [--job NAME]`: the checks its arguments allow, printed; exit 0 when all hold
"""
