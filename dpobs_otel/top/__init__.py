"""`dpobs top`: the answers in a terminal. model (what is shown), prometheus and direct (the
two sources: a Prometheus's recording rules, or the endpoints of a file_sd directory
scraped directly), weights (the weight-sync lines, from either), view (rich rendering),
command (the CLI). Needs the `top` extra (rich)."""
