"""`dpobs agent`: the per-node sidecar's config and the Prometheus agent process it runs."""
