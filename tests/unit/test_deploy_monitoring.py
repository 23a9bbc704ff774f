"""The compose stack's monitoring, checked by reading: every service serves metrics on its port
from DEFAULT_METRICS_PORTS, the Prometheus scrape config (deploy/prometheus.yml) targets exactly
those and loads the rules, Grafana is provisioned with that Prometheus and the dashboard, every
metric the dashboard (deploy/grafana/dashboards/rollmesh.json) and the rules
(deploy/prometheus/rollmesh.rules.yml) query is one the services export, each panel plots what its
title says, and the real `promtool` checks the rules and runs their tests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from prometheus_client import REGISTRY

import rollmesh.gateway.telemetry
import rollmesh.mesh.metrics
import rollmesh.scheduler.telemetry
import rollmesh.verifier.telemetry
from rollmesh.mesh.config import DEFAULT_METRICS_PORTS
from rollmesh.mesh.config import DEFAULT_PORTS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "rollmesh.json"
RULES = DEPLOY / "prometheus" / "rollmesh.rules.yml"
PROMTOOL = shutil.which("promtool")
_METRIC = re.compile(r"\b(?:rollmesh|grpc_server)_[a-z_]+")


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return data


def _exported() -> set[str]:
    """Every series name the services' metrics can have (a histogram's _bucket/_sum/_count too)."""
    assert rollmesh.gateway.telemetry and rollmesh.mesh.metrics  # (imported for their registrations)
    assert rollmesh.scheduler.telemetry and rollmesh.verifier.telemetry
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
    assert "./prometheus/rollmesh.rules.yml:/etc/prometheus/rollmesh.rules.yml:ro" in prometheus["volumes"]
    assert scrape["rule_files"] == ["rollmesh.rules.yml"]
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
    assert not _missing(exprs), sorted(_missing(exprs))


def _missing(exprs: list[str]) -> set[str]:
    used = {m for e in exprs for m in _METRIC.findall(e)}
    exported = _exported()
    return {m for m in used if m not in exported and m.rsplit("_", 1)[0] not in exported}


def test_each_panel_plots_what_its_title_says() -> None:
    """ "Sink acknowledgements /s" plotted retries too."""
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    acks = [t["expr"] for t in panels["Sink acknowledgements /s"]["targets"]]
    assert acks and all(set(_METRIC.findall(e)) == {"rollmesh_scheduler_sink_acks_total"} for e in acks)
    retries = "rollmesh_scheduler_rollout_retries_total"
    holding = [title for title, p in panels.items() for t in p.get("targets", []) if retries in t["expr"]]
    assert len(holding) == 1 and "retries" in holding[0]


def test_every_metric_the_rules_query_is_exported_and_every_alert_says_what_to_do() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    exprs = [re.sub(r"rollmesh:[a-z_:0-9]+", "", r["expr"]) for r in rules]  # recorded names aside
    assert not _missing(exprs), sorted(_missing(exprs))
    used = {m for r in rules for m in re.findall(r"rollmesh:[a-z_:0-9]+", r["expr"])}
    assert used <= recorded, sorted(used - recorded)
    for needed in (
        "RollmeshEnvironmentDown",
        "RollmeshReplicaDown",
        "RollmeshRolloutFailureRate",
        "RollmeshSinkBackpressure",
        "RollmeshServiceRestarted",
    ):
        assert alerts[needed]["annotations"]["summary"] and alerts[needed]["annotations"]["description"]
        assert alerts[needed]["labels"]["severity"] in ("warning", "critical")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)")
def test_promtool_checks_the_rules_and_runs_their_tests() -> None:
    assert PROMTOOL is not None
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=120, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", RULES.with_name("rollmesh.rules.test.yml").name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULES.parent,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
