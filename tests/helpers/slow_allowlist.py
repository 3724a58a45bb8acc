"""The tests allowed over helpers/durations.py's limit (60 s), each with its reason: test id ->
why. Filled from the measured runs in docs/development/testing.md: every test over 45 s there
(the 60 s limit with a 15 s margin), serially on a box loaded 2-10 times over and in `make
test`'s four parallel workers, where a test waits for a CPU beside three others. A module's shared live set-up is charged by pytest to the
setup of the module's first test, which is why several ids below are the first of their
module: the reason names the set-up, not the test's own check.

A new entry is a decision: make the test faster first (docs/development/testing.md says where
the time goes), and add it here only with why it cannot be."""
from __future__ import annotations

ALLOWED: dict[str, str] = {
    # -- demo runs ----------------------------------------------------------------------------
    "tests/demo/test_logs.py::test_a_comparison_s_terminal_holds_no_backend_log_line":
        "runs `dpobs demo compare` as the user does: every backend's demo, one after another",
    "tests/demo/test_compare.py::test_every_backend_this_machine_has_is_compared":
        "setup: the module's one `demo compare` run over every backend this machine has, "
        "which every test of the module reads",
    "tests/demo/test_compare_ray.py::test_the_default_is_four_backends_one_column_each":
        "setup: the module's one `compare.collect` over the four default backends (memory, "
        "transferqueue, mooncake, ray), one after another, which every test of the module "
        "reads",
    "tests/demo/test_store_metrics.py::test_with_every_client_measured_coverage_is_1":
        "a demo run with the store's own exporter beside dpobs, scraped by a live Prometheus "
        "until the coverage rule has evaluated over every client",
    "tests/demo/test_store_metrics.py::"
    "test_with_the_rollout_unmeasured_coverage_falls_by_its_share_and_the_alert_fires":
        "a demo run with the rollout unmeasured, scraped by a live Prometheus until the "
        "coverage alert has fired (its `for:` included)",
    "tests/demo/test_demo_prefetch.py::test_demo_prefetch_prints_busy_and_exposed_beside_the_truth":
        "a whole demo run with prefetch, its printed figures compared with the truth",
    "tests/demo/test_weightsync.py::test_a_flipped_weight_and_a_stopped_load_reach_alertmanager":
        "a live weight-sync demo under Prometheus and Alertmanager, until both alerts (a "
        "flipped weight, a stopped load) reach Alertmanager",
    "tests/test_e2e.py::test_every_process_is_an_up_file_sd_target_with_its_role":
        "setup: the module's demo session under the Prometheus + Alertmanager stack, run "
        "until every process has been scraped; the module's tests share it",
    "tests/readback/test_cluster_prometheus.py::"
    "test_prometheus_source_matches_the_truth_and_the_recording_rules":
        "a demo cluster scraped by a live Prometheus until its recording rules have "
        "evaluated over the whole run",
    "tests/test_e2e.py::test_dpobs_demo_stops_everything_on_ctrl_c":
        "a whole `dpobs demo` session with its Prometheus stack, interrupted once every "
        "process is up, then every child process and port checked gone (51 s beside three "
        "other workers' modules)",
    # -- live clusters and receivers ----------------------------------------------------------
    "tests/adapters/transferqueue/test_transferqueue.py::"
    "test_ray_runs_on_loopback_without_dashboard_or_usage_stats":
        "setup: the module's live TransferQueue (a local Ray, its controller and storage "
        "actors), 20 s alone and 64 s beside three other workers starting theirs",
    "tests/test_invisible.py::test_the_program_sees_what_it_sees_without_dpobs[DPOBS_AUTO]":
        "setup: the module's plain run of the program (a subprocess importing torch, Ray, "
        "TransferQueue and Mooncake), then the same program under DPOBS_AUTO=1 (75 s beside "
        "three other workers)",
    "tests/agent/test_multinode.py::test_same_host_port_on_two_nodes_stays_two_processes":
        "setup: the module's simulated cluster (network namespaces, a central Prometheus, an "
        "agent per node, the workload processes) run until final scrapes and rule evaluations",
    "tests/agent/test_node_tier_live.py::test_one_tier_and_two_tier_agree_within_2_percent_live":
        "two live stacks (an agent into a one-tier central, a node-tier server into a "
        "two-tier central) over one workload warmed 10 s before the first scrape, compared "
        "once the windows hold 30 s of steady steps: shorter windows are dominated by when "
        "each layout scraped",
    "tests/agent/test_victoria.py::test_victoriametrics_gets_every_classic_series_and_drops_native":
        "a live VictoriaMetrics fed by a dpobs agent, until every classic series has arrived",
    "tests/agent/test_receivers.py::"
    "test_flagless_prometheus_gets_every_classic_series_and_refuses_only_native":
        "a live Prometheus receiver without the native-histogram flag fed by an agent, until "
        "every classic series has arrived and the native ones are refused",
    "tests/test_switch_matrix.py::test_the_program_gets_what_it_gets_without_dpobs[plain+on]":
        "setup: the module's whole switch matrix (every launcher x switch row as a process) "
        "against one live TransferQueue and one Mooncake master",
    "tests/adapters/ray/test_ray_cluster.py::"
    "test_workers_of_a_ray_start_cluster_are_measured_through_runtime_env":
        "a `ray start` cluster and a job of five workers, each measured through runtime_env "
        "(setup and call 49 s at load 7 in the measured run; 14 s in all at load 2)",
    "tests/adapters/ray/test_ray_verl.py::"
    "test_the_driver_and_every_worker_serve_with_the_actor_class_as_role":
        "setup: the module's live Ray job of verl-style workers, which the module's tests read",
    "tests/adapters/verl/test_verl_gloo.py::"
    "test_bytes_and_tensors_are_exactly_what_moved[opentelemetry-instrument]":
        "setup: verl's gloo checkpoint engine syncing trainer to rollout in separate processes "
        "under `opentelemetry-instrument`",
    "tests/adapters/transferqueue/test_tq_own_e2e.py::"
    "test_transferqueue_own_e2e_tests_pass_with_every_call_counted[guard]":
        "TransferQueue's own e2e suite against a live TransferQueue, every call counted, the "
        "guard on",
    "tests/adapters/transferqueue/test_tq_store_metrics.py::"
    "test_one_call_moves_the_stores_counters_by_the_mapped_amounts[kv.put]":
        "setup: the module's live TransferQueue with its own metrics exporter, read after its "
        "collection interval",
}
