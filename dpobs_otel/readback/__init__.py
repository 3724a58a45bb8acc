"""Everything that reads numbers back: scraping endpoints, the one client of Prometheus's query
API, the cluster per-step view, and the sources `dpobs top`, `dpobs compare` and the demo's
report share."""
