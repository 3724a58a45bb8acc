"""Loopback launchers of real backends for the demo, the benchmarks and the tests: TransferQueue
on a local Ray, a Mooncake master, Prometheus stacks (central, agents, nodes). Importing any of
them changes nothing (no environment variable, no process): each acts only when called."""
