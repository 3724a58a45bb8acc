"""`dpobs demo`: the GRPO-shaped workload (workload.py), its private Prometheus and
Alertmanager (testing/stack.py), and the report that sets the metrics beside the workload's
truth (report.py)."""
