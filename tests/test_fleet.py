"""The fleet's files (middleware/connlist/deploy/) checked with the real tools, and on a real Prometheus.

``promtool`` checks the rules and runs their unit tests
(``tests/prometheus/connlist-rules.test.yml``); the dashboard is checked
against the metrics and recording rules that exist.  The live test starts
Prometheus on 127.0.0.1 (1 s scrape and evaluation intervals, the rules with
their ``for:`` shortened) scraping three servers: gunicorn with 2 workers
and ``uvicorn --workers 2`` as the two instances of job ``connlist``, and a
server with the integration off as job ``connlist-off``.  A slowloris runs
against the uvicorn one.

Without ``prometheus``/``promtool`` (Debian's ``prometheus`` package) these
tests are skipped, unless ``CONNLIST_REQUIRE_PROMETHEUS=1`` (CI) fails them.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("yaml")
pytest.importorskip("prometheus_client")

import yaml
from prometheus_client import CollectorRegistry

from connlist.prometheus import ConnlistMetrics
from tests.servers import INTEGRATED, PLAIN, connect, read_response
from tests.subprocesses import (
    PYTHON,
    ROOT,
    Process,
    free_port,
    get_json,
    gunicorn_command,
    run_server,
    server_env,
    stop,
)

DEPLOY = ROOT / "middleware" / "connlist" / "deploy"
RULES = DEPLOY / "prometheus" / "connlist-rules.yml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "connlist-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "connlist-dashboard.json"
FLEET_DOC = ROOT / "docs" / "fleet.md"
DOCS_URL = "https://connlist.github.io/connlist/fleet/"

HEADERS_TIMEOUT = 0.5
INTERVAL = 0.1
# The live Prometheus: scrape and evaluate every second, alerts fire after 2 s.
SCRAPE = "1s"
FOR = "2s"
# How long the live test waits for anything Prometheus should see.
LIMIT = 30.0


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CONNLIST_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(
                f"{name} is not installed (apt-get install prometheus) and CONNLIST_REQUIRE_PROMETHEUS=1"
            )
        pytest.skip(f"{name} is not installed (apt-get install prometheus)")
    return path


def load_rules() -> dict[str, Any]:
    rules: dict[str, Any] = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return rules


def alerts(rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def recorded(rules: dict[str, Any]) -> set[str]:
    return {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}


def exported_metrics() -> set[str]:
    """The series names connlist.prometheus exports (counters with ``_total``)."""
    registry = CollectorRegistry()
    ConnlistMetrics(registry)
    return {sample.name for family in registry.collect() for sample in family.samples}


def run_tool(*args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# -- the files, with promtool ----------------------------------------------------


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    promtool = tool("promtool")
    rule_count = sum(len(group["rules"]) for group in load_rules()["groups"])
    assert f"SUCCESS: {rule_count} rules found" in run_tool(promtool, "check", "rules", str(RULES))
    assert "SUCCESS" in run_tool(promtool, "test", "rules", str(RULE_TESTS))


def test_every_alert_is_unit_tested_and_documented() -> None:
    rules = load_rules()
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    cases = [case for test in tests["tests"] for case in test.get("alert_rule_test", [])]
    anchors = {slug(line.lstrip("#").strip()) for line in FLEET_DOC.read_text("utf-8").splitlines() if
               line.startswith("#")}  # fmt: skip
    names = [rule["alert"] for rule in alerts(rules)]
    assert len(names) >= 5 and len(set(names)) == len(names)
    for rule in alerts(rules):
        name = rule["alert"]
        fired = [case for case in cases if case["alertname"] == name and case["exp_alerts"]]
        quiet = [case for case in cases if case["alertname"] == name and not case["exp_alerts"]]
        assert fired and quiet, f"{name}: a unit test where it fires and one where it does not"
        # It fires on one instance of the fleet: the others in that test are quiet.
        assert all(len(case["exp_alerts"]) < len(instances_in(tests, case)) for case in fired), name
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        url, _, anchor = annotations["runbook_url"].partition("#")
        assert url == DOCS_URL and anchor in anchors, (
            f"{name}: {annotations['runbook_url']} not in docs/fleet.md"
        )
        # Realistic for a real fleet (the live test shortens them).
        assert re.fullmatch(r"\d+m", rule["for"]), (name, rule["for"])


def instances_in(tests: dict[str, Any], case: dict[str, Any]) -> set[str]:
    test = next(test for test in tests["tests"] if case in test.get("alert_rule_test", []))
    return {m for series in test["input_series"] for m in re.findall(r'instance="([^"]+)"', series["series"])}


def slug(heading: str) -> str:
    """The anchor the docs site gives a heading (Python-Markdown's toc, which Zensical runs)."""
    from markdown.extensions.toc import slugify

    return str(slugify(heading, "-"))


# -- the dashboard -----------------------------------------------------------------


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_is_grafanas_json_on_series_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    variables = {var["name"]: var for var in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    source = {"type": "prometheus", "uid": "${datasource}"}
    assert variables["job"]["query"] == "label_values(connlist_connections, job)"
    assert variables["instance"]["query"] == 'label_values(connlist_connections{job=~"$job"}, instance)'
    for name in ("job", "instance"):
        assert variables[name]["type"] == "query" and variables[name]["datasource"] == source
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    names = exported_metrics() | recorded(load_rules())
    titles = [panel["title"] for panel in dashboard["panels"]]
    assert len(set(titles)) == len(titles)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in dashboard["panels"]:
        assert panel["type"] in ("timeseries", "state-timeline", "stat"), panel["title"]
        assert panel["datasource"] == source and set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        refs = [target["refId"] for target in panel["targets"]]
        assert panel["targets"] and len(set(refs)) == len(refs)
    for title, expr in dashboard_exprs(dashboard):
        # Every selector is narrowed by both variables, and names a series that exists.
        selectors = re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr)
        assert selectors, (title, expr)
        for metric, matchers in selectors:
            assert metric in names, f"{title}: {metric} is neither exported nor recorded"
            assert 'job=~"$job"' in matchers and 'instance=~"$instance"' in matchers, (title, expr)
    # What the panels show: phases, cuts by kind, pressure and budget, the integration.
    shown = " ".join(expr for _, expr in dashboard_exprs(dashboard))
    for needed in ("by (state)", "connlist_timeouts", "pressure", "connlist_max_connections", "integration"):
        assert needed in shown, needed


# -- a real Prometheus ---------------------------------------------------------------


def test_rules_for_the_live_test_only_shorten_for() -> None:
    shipped, live = load_rules(), live_rules()
    assert all(rule["for"] == FOR for rule in alerts(live))
    for rule in alerts(shipped):
        rule["for"] = FOR
    assert live == shipped


def live_rules() -> dict[str, Any]:
    """The shipped rules with every ``for:`` at ``FOR``: one source, not a second copy to keep in step."""
    rules = load_rules()
    for rule in alerts(rules):
        rule["for"] = FOR
    return rules


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.load(response)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def value(self, expr: str) -> float:
        result = self.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    def values(self, expr: str, label: str) -> dict[str, float]:
        return {series["metric"][label]: float(series["value"][1]) for series in self.query(expr)}

    def firing(self) -> list[dict[str, Any]]:
        return [alert for alert in self.api("alerts")["alerts"] if alert["state"] == "firing"]


@contextlib.contextmanager
def prometheus(tmp_path: Path, targets: dict[str, list[int]]) -> Iterator[Prometheus]:
    binary = tool("prometheus")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(live_rules(), sort_keys=False), encoding="utf-8")
    config = {
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE, "scrape_timeout": "900ms"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in ports]}]}
            for job, ports in targets.items()
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Prometheus(port)
    try:
        n_targets = sum(len(ports) for ports in targets.values())

        def all_up() -> bool:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            with contextlib.suppress(OSError):
                return sum(server.values("up == 1", "instance").values()) == n_targets
            return False

        assert wait(all_up), log_path.read_text(errors="replace")
        yield server
    finally:
        stop(proc)


def wait(predicate: Any, limit: float = LIMIT) -> bool:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class Slowloris:
    """``n`` connections that send a request's headers a byte at a time; each one cut is opened again."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sock.setblocking(False)
        self.opened += 1
        return sock

    def _run(self) -> None:
        socks = [self._open() for _ in range(self.n)]
        deadline = time.monotonic() + 2 * LIMIT  # bounded even if never stopped
        while not self._stop.is_set() and time.monotonic() < deadline:
            for i, sock in enumerate(socks):
                try:
                    if sock.recv(4096) == b"":
                        raise ConnectionResetError
                except BlockingIOError:  # still open, nothing said: one more byte
                    with contextlib.suppress(OSError):
                        sock.send(b"a")
                    continue
                except OSError:
                    pass
                sock.close()  # the server answered (408) or closed: come back
                socks[i] = self._open()
            self._stop.wait(0.05)
        for sock in socks:
            sock.close()

    def __enter__(self) -> Slowloris:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def rfc3339(stamp: str) -> float:
    """Prometheus's time (nanoseconds, ``Z``) as a Unix time."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.timezone.utc).timestamp() + float(
        f"0.{fraction or 0}"
    )


def view(port: int) -> dict[str, Any]:
    answer: dict[str, Any] = get_json(port, "/_connections?format=json&workers=all")
    return answer


def hold_idle(port: int, n: int) -> list[socket.socket]:
    """``n`` keep-alive connections, each idle after one request."""
    held = []
    for _ in range(n):
        sock = connect(port)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).endswith(b"hello")
        held.append(sock)
    return held


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[dict[str, Process]]:
    """gunicorn with 2 workers and uvicorn --workers 2 (job connlist), a server with the integration off."""
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn_worker")
    tool("prometheus")
    common = {"CONNLIST_HEADERS_TIMEOUT": str(HEADERS_TIMEOUT), "CONNLIST_METRICS_INTERVAL": str(INTERVAL)}

    def multiproc(name: str) -> str:
        path = tmp_path / name
        path.mkdir()
        return str(path)

    def uvicorn(http: str, *options: str) -> Any:
        def args(port: int) -> list[str]:
            return [PYTHON, "-m", "uvicorn", "tests.fleet_app:app", "--http", http, "--host", "127.0.0.1",
                    "--port", str(port), "--timeout-keep-alive", "30", *options]  # fmt: skip

        return args

    def every_worker_seen(port: int) -> bool:
        # Each worker has had a connection: its mode is known (and in its gauge).
        return len({get_json(port, "/_connections")["pid"] for _ in range(10)}) == 2

    with contextlib.ExitStack() as stack:
        servers = {
            "gunicorn": stack.enter_context(
                run_server(
                    lambda port: gunicorn_command(
                        port, "tests.fleet_app:app", "--keep-alive", "30", workers=2
                    ),
                    tmp_path / "gunicorn.log",
                    env=server_env(PROMETHEUS_MULTIPROC_DIR=multiproc("gunicorn"), **common),
                    ready=every_worker_seen,
                )
            ),
            "uvicorn": stack.enter_context(
                run_server(
                    uvicorn(INTEGRATED["httptools"], "--workers", "2"),
                    tmp_path / "uvicorn.log",
                    env=server_env(PROMETHEUS_MULTIPROC_DIR=multiproc("uvicorn"), **common),
                    ready=every_worker_seen,
                )
            ),
            "off": stack.enter_context(
                run_server(
                    uvicorn(PLAIN["h11"]),
                    tmp_path / "off.log",
                    env=server_env(CONNLIST_FLEET_INTEGRATION="off", **common),
                )
            ),
        }
        yield servers


def instance(server: Process) -> str:
    return f"127.0.0.1:{server.port}"


PHASES = ("reading", "writing", "waiting", "timed_out")
KINDS = ("headers", "request", "rate", "send", "keepalive")
BUDGET = ("idle", "headers", "body", "refused")


def test_a_fleet_on_a_real_prometheus(fleet: dict[str, Process], tmp_path: Path) -> None:
    gunicorn, uvicorn, off = fleet["gunicorn"], fleet["uvicorn"], fleet["off"]
    assert {worker["mode"] for worker in view(uvicorn.port)["workers"]} == {"uvicorn-httptools"}
    assert {worker["mode"] for worker in view(gunicorn.port)["workers"]} == {"uvicorn-httptools"}
    assert view(off.port)["workers"][0]["mode"] == "asgi"
    held = hold_idle(gunicorn.port, 3) + hold_idle(uvicorn.port, 2)
    targets = {"connlist": [gunicorn.port, uvicorn.port], "connlist-off": [off.port]}
    with prometheus(tmp_path, targets) as prom:
        attacked, quiet = instance(uvicorn), instance(gunicorn)

        def fired(alertname: str) -> set[str]:
            return {a["labels"]["instance"] for a in prom.firing() if a["labels"]["alertname"] == alertname}

        # The slowloris: the attack alert fires for that instance (headers timeouts).
        attack_start = time.time()
        with Slowloris(uvicorn.port, 30) as attack:
            assert wait(lambda: attacked in fired("ConnlistSlowClientAttack")), prom.firing()
        assert attack.opened > 30
        assert wait(lambda: instance(off) in fired("ConnlistServerIntegrationOff")), prom.firing()
        # The attack's connections are gone: what is left holds still but for the scrapes.
        assert wait(lambda: view(uvicorn.port)["counts"]["reading"] == 0, limit=5)

        # -- the fleet's totals against the servers' own views --------------------------
        # Views first, then a scrape of both after them (the other workers'
        # numbers are up to INTERVAL old) and a rule evaluation after that.
        views = [view(gunicorn.port), view(uvicorn.port)]
        since = time.time() + 3 * INTERVAL
        assert wait(lambda: prom.value('min(timestamp(up{job="connlist"}))') > since)
        scraped = prom.value('max(timestamp(up{job="connlist"}))')
        assert wait(
            lambda: prom.value('timestamp(job:connlist_requests_total:sum{job="connlist"})') > scraped
        )
        fleet_totals = {
            "accepted": prom.value('job:connlist_connections_accepted_total:sum{job="connlist"}'),
            "requests": prom.value('job:connlist_requests_total:sum{job="connlist"}'),
            "accept_failures": prom.value('job:connlist_accept_failures_total:sum{job="connlist"}'),
            "timeouts": prom.values('job_kind:connlist_timeouts_total:sum{job="connlist"}', "kind"),
            "budget": prom.values('job_kind:connlist_budget_total:sum{job="connlist"}', "kind"),
            "phases": prom.values('job_state:connlist_connections:sum{job="connlist"}', "state"),
        }
        after = [view(gunicorn.port), view(uvicorn.port)]
        sums = {
            "accepted": sum(v["totals"]["connections"] for v in views),
            "requests": sum(v["totals"]["requests"] for v in views),
            "accept_failures": sum(v["totals"]["accept_failures"] for v in views),
            "timeouts": {kind: sum(v["totals"][f"{kind}_timeouts"] for v in views) for kind in KINDS},
            "budget": {kind: sum(v["totals"][BUDGET_COUNTERS[kind]] for v in views) for kind in BUDGET},
            "phases": {phase: sum(v["counts"][phase] for v in views) for phase in PHASES},
        }
        print("\nfleet totals (Prometheus, job connlist) beside the sum of the two servers' views:")
        for name, total in fleet_totals.items():
            print(f"  {name}: {total}  views: {sums[name]}")
        # The counters that hold still are equal: the attack's cuts, every kind.
        assert fleet_totals["timeouts"] == sums["timeouts"]
        assert sums["timeouts"]["headers"] >= attack.opened - 30 - 2
        assert fleet_totals["budget"] == sums["budget"]
        assert fleet_totals["accept_failures"] == sums["accept_failures"]
        # Connections and requests grow with each scrape and view: between the views before and after.
        for name, key in (("accepted", "connections"), ("requests", "requests")):
            later = sum(v["totals"][key] for v in after) - len(after)  # less the later views themselves
            assert sums[name] <= fleet_totals[name] <= later, (name, sums[name], fleet_totals[name], later)
        # Nothing is being read or cut any more; the held connections wait (the
        # scrape's own answer is writing; a view counts itself writing).
        assert fleet_totals["phases"]["reading"] == sums["phases"]["reading"] == 0
        assert fleet_totals["phases"]["timed_out"] == sums["phases"]["timed_out"] == 0
        # At each scrape, Prometheus's own connection is the one writing.
        assert fleet_totals["phases"]["waiting"] == len(held)
        assert fleet_totals["phases"]["writing"] == len(views)

        # -- the alerts: which fired, for whom ---------------------------------------------
        ever = prom.query("max by (alertname, instance) (max_over_time(ALERTS[10m]))")
        pairs = {(series["metric"]["alertname"], series["metric"]["instance"]) for series in ever}
        assert pairs == {
            ("ConnlistSlowClientAttack", attacked),
            ("ConnlistServerIntegrationOff", instance(off)),
        }
        assert quiet not in fired("ConnlistSlowClientAttack")
        alerts = prom.firing()
        first: dict[tuple[str, str], float] = {}

        def firing_since() -> bool:
            # An alert the API calls firing has its first firing sample in ALERTS; one that
            # fired in the last second may stand after the subquery's last step: asked again.
            series = prom.query(
                'min by (alertname, instance) (min_over_time(timestamp(ALERTS{alertstate="firing"})[10m:1s]))'
            )
            for s in series:
                first[s["metric"]["alertname"], s["metric"]["instance"]] = float(s["value"][1])
            return all((a["labels"]["alertname"], a["labels"]["instance"]) in first for a in alerts)

        assert wait(firing_since, limit=5), (alerts, first)
        print("alerts, in seconds from the slowloris's start (pending from, firing from):")
        for alert in alerts:
            labels, key = alert["labels"], (alert["labels"]["alertname"], alert["labels"]["instance"])
            pending, firing = rfc3339(alert["activeAt"]) - attack_start, first[key] - attack_start
            print(f"  {key[0]} on {key[1]} {labels.get('kind', '')}: {pending:+.1f}, {firing:+.1f}")

        # -- the dashboard's queries, on this Prometheus ----------------------------------
        dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
        assert set(prom.api("label/job/values", **{"match[]": "connlist_connections"})) == set(targets)
        instances = prom.api("label/instance/values", **{"match[]": 'connlist_connections{job=~"connlist"}'})
        assert set(instances) == {attacked, quiet}
        # A PromQL string needs its regex's backslashes doubled.
        for job, where in ((".*", ".*"), ("connlist", re.escape(attacked).replace("\\", "\\\\"))):
            for title, expr in dashboard_exprs(dashboard):
                query = expr.replace("$job", job).replace("$instance", where)
                assert prom.query(query), f"{title}: {query} returned no series"
    for sock in held:
        sock.close()


BUDGET_COUNTERS = {"idle": "idle_evictions", "headers": "headers_evictions", "body": "body_evictions",
                   "refused": "refused"}  # fmt: skip
