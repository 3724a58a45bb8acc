"""Complete Kubernetes workloads for pods that run many ranks, in the two shapes docs/
kubernetes.md explains:

- sidecar: the agent runs inside every training pod (a native sidecar: an init container
  with restartPolicy Always, so a Job still completes). The pod is one network namespace, so
  the ranks keep binding 127.0.0.1 and the agent reaches them there; they share file_sd
  through an emptyDir. `node` is the pod's name: loopback ports are unique per pod, not per
  machine, so that is the scope in which two processes can never collide.
- daemonset: one agent per machine, reading a hostPath directory that every training pod on
  the machine also mounts. The agent cannot reach another pod's loopback, so the ranks bind
  0.0.0.0 and advertise their pod IP (downward API); `node` is the machine's name.

IMAGE is what the repository's Dockerfile builds (`docker build -t dpobs-otel:<version> .`:
dpobs-otel and the `prometheus` binary), named as that build tags it; push it to your
registry and prefix the name. The trainer's image, the training command and the receiver
URL are your job's own.
"""
from __future__ import annotations

from ..version import __version__

IMAGE = f"dpobs-otel:{__version__}"  # `docker build -t dpobs-otel:<version> .` (Dockerfile)
TRAINER_IMAGE = "ghcr.io/example/grpo-trainer:latest"
REMOTE_WRITE = "http://dpobs-central.monitoring.svc:9090/api/v1/write"
RANKS = 4  # ranks per pod (torchrun --nproc-per-node)
SD_DIR = "/var/run/dpobs/file_sd"
HOST_SD_DIR = "/var/lib/dpobs/file_sd"
HOST_WAL = "/var/lib/dpobs/agent-wal"
UID = 65534  # file_sd files are written 0600: trainer and agent must run as one user
LABELS = {"app.kubernetes.io/part-of": "dpobs"}


def _field_env(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _agent_container(sd_dir: str, node_field: str, extra_args: list[str] = ()) -> dict:
    """`dpobs agent` as the DESIGN.md command line, its WAL on the `wal` volume (kept across
    container restarts, so buffered samples replay)."""
    return {
        "name": "dpobs-agent",
        "image": IMAGE,
        "command": ["dpobs", "agent", "--sd-dir", sd_dir, "--remote-write", REMOTE_WRITE,
                    "--node", "$(NODE_NAME)", "--storage-path", "/var/lib/dpobs-agent/wal",
                    *extra_args],
        "env": [_field_env("NODE_NAME", node_field)],
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                      "limits": {"memory": "512Mi"}},
        "volumeMounts": [{"name": "file-sd", "mountPath": sd_dir, "readOnly": False},
                         {"name": "wal", "mountPath": "/var/lib/dpobs-agent"}],
    }


def _trainer_container(sd_dir: str, env: list[dict], mounts: list[dict] = ()) -> dict:
    return {
        "name": "trainer",
        "image": TRAINER_IMAGE,
        # torchrun sets RANK for each process; dpobs.start() reads it when DPOBS_RANK is unset.
        "command": ["torchrun", f"--nproc-per-node={RANKS}", "train.py"],
        "env": [{"name": "DPOBS_SD_DIR", "value": sd_dir},
                {"name": "DPOBS_JOB", "value": "grpo-run"},
                {"name": "DPOBS_ROLE", "value": "trainer"}, *env],
        "volumeMounts": [{"name": "file-sd", "mountPath": sd_dir}, *mounts],
    }


def _pod_security() -> dict:
    return {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID}


def sidecar_job() -> dict:
    agent = _agent_container(SD_DIR, "metadata.name")
    agent["restartPolicy"] = "Always"  # a native sidecar: runs beside, ends with the pod
    pod = {
        "securityContext": _pod_security(),
        "restartPolicy": "Never",
        "initContainers": [agent],
        "containers": [_trainer_container(SD_DIR, [])],
        "volumes": [{"name": "file-sd", "emptyDir": {"sizeLimit": "16Mi"}},
                    {"name": "wal", "emptyDir": {"sizeLimit": "2Gi"}}],
    }
    labels = LABELS | {"app.kubernetes.io/name": "grpo-trainer"}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "grpo-trainer", "labels": labels},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


TLS_DIR = "/etc/dpobs/tls"
TLS_SECRET = "dpobs-metrics-tls"  # tls.crt / tls.key for the ranks, ca.crt shared
SERVER_NAME = "dpobs-metrics"  # the name in the ranks' certificate (pod IPs change)


def _tls_volume() -> dict:
    return {"name": "tls", "secret": {"secretName": TLS_SECRET, "defaultMode": 0o440}}


def daemonset() -> dict:
    scrape_tls = ["--scrape-ca-file", f"{TLS_DIR}/ca.crt",
                  "--scrape-cert-file", f"{TLS_DIR}/tls.crt",
                  "--scrape-key-file", f"{TLS_DIR}/tls.key",
                  "--scrape-server-name", SERVER_NAME]
    agent = _agent_container(HOST_SD_DIR, "spec.nodeName", scrape_tls)
    agent["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
    labels = LABELS | {"app.kubernetes.io/name": "dpobs-agent"}
    # hostPath directories are created root-owned; the ranks (same user as the agent) must
    # write their target files there, so hand both directories to that user first.
    own = {"name": "own-host-dirs", "image": IMAGE,
           "command": ["chown", f"{UID}:{UID}", "/host/file_sd", "/host/wal"],
           "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
           "volumeMounts": [{"name": "file-sd", "mountPath": "/host/file_sd"},
                            {"name": "wal", "mountPath": "/host/wal"}]}
    pod = {
        "securityContext": _pod_security(),
        "initContainers": [own],
        "containers": [agent],
        "volumes": [
            {"name": "file-sd", "hostPath": {"path": HOST_SD_DIR, "type": "DirectoryOrCreate"}},
            {"name": "wal", "hostPath": {"path": HOST_WAL, "type": "DirectoryOrCreate"}},
            _tls_volume()],
    }
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "dpobs-agent", "labels": labels},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "dpobs-agent"}},
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


def daemonset_job() -> dict:
    """A training Job for the DaemonSet shape: ranks bind 0.0.0.0, advertise the pod IP, and
    serve /metrics over mutual TLS, so only a client holding the agents' certificate can
    read them from the pod network."""
    env = [{"name": "DPOBS_HOST", "value": "0.0.0.0"},
           _field_env("DPOBS_ADVERTISE_HOST", "status.podIP"),
           {"name": "DPOBS_TLS_CERTFILE", "value": f"{TLS_DIR}/tls.crt"},
           {"name": "DPOBS_TLS_KEYFILE", "value": f"{TLS_DIR}/tls.key"},
           {"name": "DPOBS_TLS_CLIENT_CAFILE", "value": f"{TLS_DIR}/ca.crt"}]
    trainer = _trainer_container(HOST_SD_DIR, env, [
        {"name": "tls", "mountPath": TLS_DIR, "readOnly": True}])
    labels = LABELS | {"app.kubernetes.io/name": "grpo-trainer"}
    pod = {
        "securityContext": _pod_security(),
        "restartPolicy": "Never",
        "containers": [trainer],
        "volumes": [
            {"name": "file-sd", "hostPath": {"path": HOST_SD_DIR, "type": "DirectoryOrCreate"}},
            _tls_volume()],
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "grpo-trainer", "labels": labels},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": pod}},
    }
