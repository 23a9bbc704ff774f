"""The compose stack's monitoring, checked by reading: every service serves metrics on its port
from DEFAULT_METRICS_PORTS, the Prometheus scrape config (deploy/prometheus.yml) targets exactly
those, Grafana is provisioned with that Prometheus and the dashboard, and every metric the dashboard
(deploy/grafana/dashboards/rollmesh.json) queries is one the services export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from prometheus_client import REGISTRY

import rollmesh.gateway.telemetry
import rollmesh.mesh.metrics
import rollmesh.scheduler.telemetry
import rollmesh.verifier.telemetry
from rollmesh.mesh.config import DEFAULT_METRICS_PORTS, DEFAULT_PORTS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "rollmesh.json"
_METRIC = re.compile(r"\b(?:rollmesh|grpc_server)_[a-z_]+")


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return data


def _exported() -> set[str]:
    """Every series name the services' metrics can have (a histogram's _bucket/_sum/_count too)."""
    del rollmesh.gateway.telemetry, rollmesh.mesh.metrics, rollmesh.scheduler.telemetry
    del rollmesh.verifier.telemetry  # (imported for their registrations)
    return set(REGISTRY._names_to_collectors)  # every name each registered collector describes


def test_each_service_serves_metrics_on_its_port_and_prometheus_scrapes_them() -> None:
    services = _compose()["services"]
    for name, port in DEFAULT_METRICS_PORTS.items():
        assert str(services[name]["environment"]["ROLLMESH_METRICS_PORT"]) == str(port), name
    assert set(DEFAULT_METRICS_PORTS) == set(DEFAULT_PORTS)
    scrape = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = scrape["scrape_configs"]
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert sorted(targets) == sorted(f"{s}:{p}" for s, p in DEFAULT_METRICS_PORTS.items())
    prometheus = services["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert all(p.startswith("${PUBLISH_HOST:-127.0.0.1}:") for p in prometheus["ports"])


def test_grafana_is_provisioned_with_the_prometheus_and_the_dashboard() -> None:
    grafana = _compose()["services"]["grafana"]
    assert grafana["profiles"] == ["monitoring"]
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    sources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["uid"] == "prometheus"
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/rollmesh.yml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    assert all(
        t["datasource"]["uid"] == "prometheus" for p in dashboard["panels"] for t in p.get("targets", [])
    )
    used = {m for e in exprs for m in _METRIC.findall(e)}
    exported = _exported()
    missing = {m for m in used if m not in exported and m.rsplit("_", 1)[0] not in exported}
    assert not missing, sorted(missing)
