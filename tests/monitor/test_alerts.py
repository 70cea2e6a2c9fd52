"""The shipped alert rules and Grafana dashboard work against the broker's ``/metrics``:
``promtool check rules`` and ``promtool test rules`` (Debian's ``prometheus`` package), every
Grafana query parsed by promtool, every metric they use exported by a live broker, and the
exposition itself linted by ``promtool check metrics``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests._broker import BrokerProcess
from tests._helpers import free_port
from tests.monitor._helpers import Ledger, RawGroup, fill

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "conf" / "prometheus-alerts.yml"
GRAFANA = ROOT / "conf" / "grafana-dashboard.json"
METRIC = re.compile(r"\bpymetaq_[a-z0-9_]+")

pytestmark = pytest.mark.integration  # promtool and a broker are processes


def promtool(*args: str, stdin: str | None = None) -> str:
    if shutil.which("promtool") is None:
        raise AssertionError("promtool is missing: apt-get install prometheus")
    out = subprocess.run(
        ["promtool", *args], input=stdin, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def grafana_exprs() -> list[str]:
    dashboard = json.loads(GRAFANA.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_alert_rules_check_and_fire_on_their_cases() -> None:
    assert "SUCCESS: 7 rules found" in promtool("check", "rules", str(ALERTS))
    assert "SUCCESS" in promtool("test", "rules", "tests/monitor/alerts_test.yml")


def test_the_scrape_config_of_the_monitoring_page_checks(tmp_path: Path) -> None:
    """docs/monitoring.md's Prometheus config (its rule file beside it, as the comment says)."""
    page = (ROOT / "docs" / "monitoring.md").read_text(encoding="utf-8")
    (config,) = re.findall(r"```yaml\n(.*?)```", page, flags=re.S)
    assert "prometheus-alerts.yml" in config and "job_name: pymetaq" in config
    (tmp_path / "prometheus.yml").write_text(config)
    shutil.copy(ALERTS, tmp_path / "prometheus-alerts.yml")
    out = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert "SUCCESS: 7 rules found" in out, out


def test_grafana_queries_parse(tmp_path: Path) -> None:
    exprs = grafana_exprs()
    assert len(exprs) >= 20
    rules = {
        "groups": [
            {
                "name": "grafana",
                "rules": [
                    {
                        "record": f"grafana:panel_{i}",
                        "expr": e.replace("$__rate_interval", "5m").replace("$instance", ".*"),
                    }
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "grafana-rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    assert f"SUCCESS: {len(exprs)} rules found" in promtool("check", "rules", str(path))


def test_every_metric_they_use_is_exported(tmp_path: Path, seed: int) -> None:
    import random

    used = set(METRIC.findall(ALERTS.read_text())) | set(METRIC.findall(" ".join(grafana_exprs())))
    # a deletePolicy=consumed topic (offsets in SQLite): its named group's loss counters
    system = {
        "dashboardHttpPort": free_port(),
        "offsetStorage": "sql",
        "offsetStorageUrl": f"sqlite:///{tmp_path / 'offsets.db'}",
    }
    topics = {"test": {}, "kept": {"deletePolicy": "consumed,billing"}}
    with BrokerProcess.start(tmp_path, system=system, topics=topics) as broker:
        fill(broker.address, Ledger(), "test", 1, 5, random.Random(seed))
        group = RawGroup(broker.address, "g")
        group.fetch("test", 0)
        group.close()
        with urllib.request.urlopen(broker.http_url + "metrics", timeout=30) as reply:
            text = reply.read().decode()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    assert used <= exported, sorted(used - exported)
    promtool("check", "metrics", stdin=text)  # naming and HELP conventions
