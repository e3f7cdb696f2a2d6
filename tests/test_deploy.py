"""The deployment recipe in deploy/: its Kubernetes manifests validate against the Kubernetes
API schemas (kubernetes-validate from PyPI, strict: unknown fields fail), its settings are
ones duetime accepts, its probes answer on the served API, and the image runs what the
manifests name."""

from __future__ import annotations

import configparser
import dataclasses
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import requests
import yaml

from app.config import Config, load_config
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
# the oldest Kubernetes still supported upstream when this was written, and the newest known
KUBERNETES_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _all() -> list[dict[str, Any]]:
    return [d for path in MANIFESTS for d in _documents(path)]


def _one(kind: str, name: str) -> dict[str, Any]:
    [found] = [d for d in _all() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _container(deployment: str) -> dict[str, Any]:
    [container] = _one("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_strictly(path: Path, version: str) -> None:
    for document in _documents(path):
        kubernetes_validate.validate(document, version, strict=True)


def test_the_validator_refuses_a_misspelt_field() -> None:
    broken = _one("Deployment", "duetime-api")
    broken = {**broken, "spec": {**broken["spec"], "replica": 3}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_settings_are_duetime_settings_and_load() -> None:
    read_directly = set(re.findall(r'"(DUETIME_[A-Z_]+)"', "".join(
        p.read_text() for d in ("app", "workers") for p in (ROOT / d).rglob("*.py"))))
    known = {f"DUETIME_{f.name.upper()}" for f in dataclasses.fields(Config)} | read_directly
    settings = {**_one("ConfigMap", "duetime")["data"],
                **_one("Secret", "duetime-cassandra")["stringData"]}
    assert set(settings) <= known, set(settings) - known
    config = load_config(settings)
    assert config.local_dc == "dc1" and len(config.contact_points) == 3


def test_every_pod_reads_the_settings_and_selectors_match() -> None:
    for workload in [d for d in _all() if d["kind"] in ("Deployment", "Job")]:
        pod = workload["spec"]["template"]
        for container in pod["spec"]["containers"]:
            refs = container["envFrom"]
            assert {"configMapRef": {"name": "duetime"}} in refs, workload["metadata"]
            assert {"secretRef": {"name": "duetime-cassandra"}} in refs, workload["metadata"]
        if workload["kind"] == "Deployment":
            selector = workload["spec"]["selector"]["matchLabels"]
            assert selector.items() <= pod["metadata"]["labels"].items()
    for budget in [d for d in _all() if d["kind"] in ("PodDisruptionBudget", "Service")]:
        selector = budget["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        targets = [d for d in _all() if d["kind"] == "Deployment" and selector.items()
                   <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(targets) == 1, budget["metadata"]


def test_the_api_probes_answer_on_the_served_api(served: str) -> None:
    container = _container("duetime-api")
    settings = _one("ConfigMap", "duetime")["data"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "metrics": int(settings["DUETIME_API_METRICS_PORT"])}
    annotations = _one("Deployment", "duetime-api")["spec"]["template"]["metadata"][
        "annotations"]
    assert annotations["prometheus.io/port"] == str(ports["metrics"])
    service_ports = _one("Service", "duetime-api")["spec"]["ports"]
    assert [p["targetPort"] for p in service_ports] == ["http"]  # tenants never reach metrics
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        path = container[probe]["httpGet"]["path"]
        assert requests.get(served + path, timeout=10).status_code == 200, probe


def test_the_releaser_probe_is_its_metrics_port_and_it_is_woken_where_it_says() -> None:
    container = _container("duetime-releaser")
    settings = _one("ConfigMap", "duetime")["data"]
    ports = {p["name"]: p for p in container["ports"]}
    assert set(ports) == {"metrics", "wake"}
    assert ports["metrics"]["containerPort"] == int(settings["DUETIME_RELEASER_METRICS_PORT"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    env = {e["name"]: e for e in container["env"]}
    assert ports["wake"]["protocol"] == "UDP"
    assert ports["wake"]["containerPort"] == int(env["DUETIME_WAKE_PORT"]["value"])
    assert env["DUETIME_WAKE_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert container["command"][:2] == ["duetime-admin", "releaser"]


def test_the_image_holds_what_the_manifests_run() -> None:
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    copied = [source for line in lines if line.startswith("COPY ")
              for source in line.split()[1:-1]]
    assert all((ROOT / source).exists() for source in copied), copied
    for needed in ("app", "workers", "schema", "setup.cfg", "setup.py"):
        assert needed in copied
    [cmd] = [line for line in lines if line.startswith("CMD ")]
    assert yaml.safe_load(cmd[len("CMD "):]) == _container("duetime-api")["command"]
    assert (ROOT / "app" / "gunicorn_conf.py").exists()
    # the manifests' `duetime-admin schema apply` and `duetime-admin releaser`: the server's
    # own command; the image installs the server alone, which needs nothing of the client
    [install] = [line for line in lines if line.startswith("RUN pip install")]
    assert "." in install.split() and "./clients/python" not in install.split()
    server = configparser.ConfigParser()
    server.read(ROOT / "setup.cfg")
    scripts = server["options.entry_points"]["console_scripts"]
    assert "duetime-admin = app.cli:main" in scripts
    assert "duetime-client" not in server["options"]["install_requires"]
    assert "clients/python" not in copied
