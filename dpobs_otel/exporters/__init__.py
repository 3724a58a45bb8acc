"""How series leave a process: the Prometheus reader and its /metrics endpoint (TLS),
file_sd registration."""
