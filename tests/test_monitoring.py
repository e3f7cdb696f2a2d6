"""The alert rules and the Grafana dashboard in docs/monitoring use only metrics and labels
that duetime exports (app.ops.metrics): a renamed metric fails here, not silently in production."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.metrics import MetricWrapperBase

from app.ops import metrics

DOCS = Path(__file__).resolve().parent.parent / "docs" / "monitoring"
SERIES = re.compile(r"\b(duetime_[a-z_]+)\b(?:\{([^}]*)\})?")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported() -> dict[str, set[str]]:
    """Every series name duetime exports, with the labels it may carry."""
    names: dict[str, set[str]] = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            for suffix in SUFFIXES[metric._type]:
                labels = set(metric._labelnames) | ({"le"} if suffix == "_bucket" else set())
                names[metric._name + suffix] = labels
    return names


def expressions() -> list[str]:
    rules = yaml.safe_load((DOCS / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return exprs


def test_every_metric_and_label_in_the_alerts_and_dashboard_exists() -> None:
    names = exported()
    assert "duetime_messages_enqueued_total" in names  # the reading of app.ops.metrics works
    used = 0
    for expr in expressions():
        for name, selector in SERIES.findall(expr):
            assert name in names, f"{name} in {expr!r} is not exported"
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector or ""):
                assert label in names[name], f"{name} has no label {label}: {expr!r}"
            used += 1
        for group in re.findall(r"by \(([^)]*)\)", expr):
            series = [n for n, _ in SERIES.findall(expr)]
            for label in (x.strip() for x in group.split(",")):
                assert any(label in names[n] for n in series), f"no {label} in {expr!r}"
    assert used >= 20
