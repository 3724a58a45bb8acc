"""docker-compose.yml is checked structurally (no Docker here): it parses, mounts only files the
repository has, every host:port one service uses to reach another is that service's, and
nothing is open by accident (ports on loopback unless the user says otherwise, no default or
anonymous Grafana access)."""
from __future__ import annotations

import argparse
import importlib
import re
import tomllib
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def prometheus_config() -> dict:
    return yaml.safe_load(PROMETHEUS_YML.read_text())


def service(compose: dict, host: str) -> dict:
    """The service a container on the compose network reaches as `host`."""
    for name, svc in compose["services"].items():
        if host in (name, svc.get("hostname")):
            return svc
    raise AssertionError(f"no compose service answers to {host!r}")


def mounts(svc: dict) -> dict[str, str]:
    """Container path -> host path or named volume (short syntax)."""
    out = {}
    for spec in svc.get("volumes", []):
        src, dest = spec.split(":")[:2]
        out[dest.rstrip("/")] = src
    return out


def flag(svc: dict, name: str) -> str | None:
    """A flag's value from a service's command, as --name=value or --name value."""
    args = svc.get("command", [])
    for i, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(args):
            return args[i + 1]
    return None


def listen_port(svc: dict) -> int:
    address = flag(svc, "web.listen-address")
    assert address, f"{svc.get('image')}: pin --web.listen-address so the port is explicit"
    return int(address.rsplit(":", 1)[1])


def reach(compose: dict, address: str) -> None:
    host, port = address.rsplit(":", 1)
    assert listen_port(service(compose, host)) == int(port), f"nothing listens on {address}"


def mounted_source(svc: dict, container_dir: str) -> str:
    container_dir = container_dir.rstrip("/")
    assert container_dir in mounts(svc), f"{container_dir} is not mounted"
    return mounts(svc)[container_dir]


def test_compose_parses_and_pins_images(compose):
    assert {"prometheus", "alertmanager", "grafana", "demo"} <= compose["services"].keys()
    for name, svc in compose["services"].items():
        if "image" in svc:
            tag = svc["image"].rpartition(":")[2]
            assert "/" not in tag and tag not in ("", "latest"), f"{name}: unpinned image"
        else:
            assert "build" in svc, f"{name}: neither image nor build"
        # YAML 1.1 turns bare off/on/yes/no into booleans; arguments must stay strings.
        assert all(isinstance(a, str) for a in svc.get("command", [])), f"{name}: {svc['command']}"


def test_every_mount_and_build_input_exists(compose):
    named = set(compose.get("volumes") or {})
    for name, svc in compose["services"].items():
        for dest, src in mounts(svc).items():
            if src.startswith((".", "/")):
                assert (ROOT / src).exists(), f"{name}: mounts missing {src} at {dest}"
            else:
                assert src in named, f"{name}: undeclared volume {src}"
        if "build" in svc:
            context = svc["build"] if isinstance(svc["build"], str) else svc["build"]["context"]
            assert (ROOT / context / "Dockerfile").is_file(), f"{name}: no Dockerfile"


def test_dockerfile_copies_what_pip_install_needs():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in dockerfile
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # `COPY . .` then `pip install .` reads these; none may be missing or ignored.
    for needed in ("pyproject.toml", "dpobs_otel", project.get("readme", "pyproject.toml")):
        assert (ROOT / needed).exists(), f"the image build needs {needed}"
        assert needed not in ignored, f".dockerignore drops {needed}"


def test_prometheus_reaches_alertmanager(compose, prometheus_config):
    targets = [t for am in prometheus_config["alerting"]["alertmanagers"]
               for sc in am.get("static_configs", []) for t in sc["targets"]]
    assert targets, "prometheus.yml names no Alertmanager"
    for address in targets:
        reach(compose, address)
    alertmanager = service(compose, targets[0].rsplit(":", 1)[0])
    config = flag(alertmanager, "config.file")
    assert mounted_source(alertmanager, config) == "./deploy/alertmanager/alertmanager.yml"


def test_prometheus_gets_its_config_rules_and_file_sd(compose, prometheus_config):
    prom = compose["services"]["prometheus"]
    config = flag(prom, "config.file")
    assert mounted_source(prom, config) == "./deploy/prometheus/prometheus.yml"
    for pattern in prometheus_config.get("rule_files", []):
        pattern = PurePosixPath(pattern)
        src = mounted_source(prom, str(pattern.parent))
        assert list((ROOT / src).glob(pattern.name)), f"no rule file matches {pattern}"
    sd_dirs = {str(PurePosixPath(f).parent) for sc in prometheus_config["scrape_configs"]
               for sd in sc.get("file_sd_configs", []) for f in sd["files"]}
    assert sd_dirs, "prometheus.yml has no file_sd_configs"
    demo = compose["services"]["demo"]
    for sd_dir in sd_dirs:
        volume = mounted_source(prom, sd_dir)
        assert mounted_source(demo, flag(demo, "sd-dir")) == volume, (
            f"demo writes targets where Prometheus does not read them ({sd_dir})")


def test_prometheus_can_read_what_demo_writes(compose):
    # Target files are private (0600) to their writer and Prometheus runs as nobody.
    assert re.search(r"^USER 65534(:65534)?$", (ROOT / "Dockerfile").read_text(), re.M)
    prom = compose["services"]["prometheus"]
    assert prom.get("user", "65534").split(":")[0] in ("65534", "nobody")
    assert "demo" in prom["depends_on"], "the volume must be created from the demo's dir"


def test_demo_targets_are_reachable(compose):
    demo = compose["services"]["demo"]
    assert flag(demo, "stack") == "off" and flag(demo, "host") == "0.0.0.0"
    advertised = flag(demo, "advertise-host")
    assert service(compose, advertised) is demo, f"{advertised} does not resolve to demo"
    parser = argparse.ArgumentParser()
    importlib.import_module("dpobs_otel.demo.command").add_arguments(parser)
    parser.parse_args(demo["command"][1:])  # exits (SystemExit) on an unknown flag


def test_grafana_reaches_prometheus(compose, prometheus_config):
    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    (ds,) = sources["datasources"]
    assert ds["type"] == "prometheus" and ds["uid"] == "dpobs-prometheus"
    assert ds["url"] == "http://prometheus:9090"
    reach(compose, ds["url"].removeprefix("http://"))
    scrape = prometheus_config.get("global", {}).get("scrape_interval", "1m")
    assert ds["jsonData"]["timeInterval"] == scrape, "$__rate_interval would miss scrapes"


def test_grafana_loads_provisioning_and_dashboards(compose):
    grafana = compose["services"]["grafana"]
    assert mounted_source(grafana, "/etc/grafana/provisioning") == "./deploy/grafana/provisioning"
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "dpobs.yaml").read_text())
    for provider in providers["providers"]:
        src = mounted_source(grafana, provider["options"]["path"])
        assert src == "./dashboards" and list((ROOT / src).glob("*.json"))
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / mounted_source(grafana, str(PurePosixPath(home).parent))
            / PurePosixPath(home).name).is_file()


_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error} and ${VAR?error},
    resolved against `env` as `docker compose` would; a required variable missing raises."""
    def one(m):
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        unset = name not in env or (op.startswith(":") and env[name] == "")
        if op.endswith("?") and unset:
            raise LookupError(f"{name}: {arg}")
        return arg if op.endswith("-") and unset else env.get(name, "")
    return _VAR.sub(one, text)


def published(compose: dict, env: dict[str, str]) -> dict[str, list[tuple[str, str]]]:
    """{service: [(host ip, host port)]} of every published port, short or long syntax."""
    out = {}
    for name, svc in compose["services"].items():
        for spec in svc.get("ports", []):
            if isinstance(spec, dict):
                ip, port = interpolate(spec.get("host_ip", ""), env), str(spec["published"])
            else:
                parts = interpolate(str(spec), env).split(":")
                assert len(parts) == 3, f"{name}: {spec!r} binds every interface (no host ip)"
                ip, port = parts[0], parts[1]
            out.setdefault(name, []).append((ip, port))
    return out


def test_every_published_port_is_on_loopback_by_default(compose):
    ports = published(compose, {})
    assert {"prometheus", "alertmanager", "grafana"} <= ports.keys()
    assert all(ip == "127.0.0.1" for each in ports.values() for ip, _ in each), ports
    assert all("network_mode" not in svc for svc in compose["services"].values())


def test_the_user_opens_the_ports_deliberately(compose):
    wide = published(compose, {"DPOBS_BIND": "0.0.0.0"})
    assert all(ip == "0.0.0.0" for each in wide.values() for ip, _ in each), wide
    docs = (ROOT / "docs" / "guides" / "compose.md").read_text()
    assert "DPOBS_BIND" in docs and "GF_ADMIN_PASSWORD" in docs


def test_grafana_has_no_default_password_and_no_anonymous_access(compose):
    env = compose["services"]["grafana"].get("environment", {})
    assert str(env.get("GF_AUTH_ANONYMOUS_ENABLED", "false")).lower() == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in env
    assert "GF_SECURITY_ADMIN_PASSWORD__FILE" in env or "GF_SECURITY_ADMIN_PASSWORD" in env, (
        "without either Grafana falls back to its built-in admin/admin")
    password = env.get("GF_SECURITY_ADMIN_PASSWORD")
    if password is not None:
        with pytest.raises(LookupError):  # compose refuses to start without one
            interpolate(str(password), {})
        assert interpolate(str(password), {"GF_ADMIN_PASSWORD": "s3cret"}) == "s3cret"
