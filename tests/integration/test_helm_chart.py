"""The Helm chart, linted and rendered by Helm itself (helm-python-sdk bundles Helm's Go SDK), its
core objects validated with kubernetes-validate (Kubernetes 1.30 schemas) and its monitoring
objects against kube-prometheus-stack's CRD schemas (openAPIV3Schema extracted into
tests/data/crds/, with their source recorded in each file). No cluster or API server is involved.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from rlmon.service import helm_schema
from rlmon.service.config import Settings, load_config
from rlmon.service.dashboards import DASHBOARDS
from rlmon.service.dashboards.artifacts import chart_path
from tests.support.alerting_support import need_binary
from tests.support.paths import DATA, REPO

ROOT = REPO
CHART = ROOT / "helm" / "rlmon"
CRDS = DATA / "crds"
KUBE = "1.30.0"
NAMESPACE = "monitoring"
RULES = ROOT / "dashboards" / "prometheus-rules.yaml"


def render(values: dict[str, Any] | None = None, name: str = "rlmon") -> dict[str, Any]:
    """Rendered objects by (kind, name), and NOTES.txt under "NOTES"."""
    chart = helm_python.Chart.load(str(CHART))
    try:
        out = chart.render(values or {}, name=name, namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    objects: dict[str, Any] = {}
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            objects["NOTES"] = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objects


def of_kind(objects: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [o for k, o in objects.items() if k.split("/")[0] == kind]


def container(objects: dict[str, Any]) -> dict[str, Any]:
    (deploy,) = of_kind(objects, "Deployment")
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return c


def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    schema = json.loads((CRDS / f"{kind}.json").read_text())["openAPIV3Schema"]
    return jsonschema.Draft7Validator(schema)


VARIANTS: list[dict[str, Any]] = [
    {},
    {"ray": {"headAddress": "head.ray.svc.cluster.local:6379", "serviceResource": "rlmon_svc"},
     "secrets": {"slack": {"existingSecret": "rlmon-slack"},
                 "pagerduty": {"existingSecret": "rlmon-pd", "key": "key"}},
     "persistence": {"enabled": True}, "serviceMonitor": {"enabled": True},
     "podMonitor": {"enabled": False}, "kubePrometheusStack": {"release": ""},
     "dashboards": {"namespace": "grafana", "annotations": {"grafana_folder": "rlmon"}}},
]


def test_lint_strict() -> None:
    result = helm_python.lint(str(CHART), strict=True, kube_version="v" + KUBE)
    assert result["errors"] == []
    assert result["messages"] == []


@pytest.mark.parametrize("values", VARIANTS, ids=["defaults", "explicit-address-and-secrets"])
def test_render_validates(values: dict[str, Any]) -> None:
    objects = render(values)
    core = [o for o in objects.values()
            if isinstance(o, dict) and o["apiVersion"] != "monitoring.coreos.com/v1"]
    assert {o["kind"] for o in core} >= {"Deployment", "Service", "ConfigMap", "ServiceAccount"}
    for obj in core:
        kubernetes_validate.validate(obj, KUBE, strict=True)
    monitoring = [o for o in objects.values()
                  if isinstance(o, dict) and o["apiVersion"] == "monitoring.coreos.com/v1"]
    assert monitoring
    for obj in monitoring:
        errors = list(crd_validator(obj["kind"]).iter_errors(obj))
        assert not errors, (obj["kind"], [e.message for e in errors])


def test_validators_catch_bad_objects() -> None:
    objects = render()
    (deploy,) = of_kind(objects, "Deployment")
    deploy["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deploy, KUBE, strict=True)
    (monitor,) = of_kind(objects, "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "fifteen"
    assert list(crd_validator("PodMonitor").iter_errors(monitor))


def script(c: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The container's `ray start ...` and `rlmon serve ...` commands, as argv lists."""
    assert c["command"] == ["/bin/sh", "-c"]
    (text,) = c["args"]
    start, serve = text.split(" && ")
    serve_argv = shlex.split(serve)
    assert serve_argv[0] == "exec"  # rlmon serve is PID 1's successor: it gets SIGTERM
    return shlex.split(start), serve_argv[1:]


def flag(argv: list[str], name: str) -> str:
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name:
            return argv[i + 1]
    raise AssertionError(f"{name} not in {argv}")


def test_pod_joins_the_raycluster_and_hosts_the_service() -> None:
    """The service actor (exporter, notifiers, outbox) must run in this pod, where the config,
    Secrets, state volume and probes are: the pod joins the cluster as a 0-CPU node offering the
    service resource, and `rlmon serve` pins the service actor to it."""
    objects = render()
    c = container(objects)
    start, serve = script(c)
    assert start[:2] == ["ray", "start"]
    assert flag(start, "--address") == (
        f"raycluster-kuberay-head-svc.{NAMESPACE}.svc.cluster.local:6379")
    assert flag(start, "--num-cpus") == "0"
    assert json.loads(flag(start, "--resources")) == {"rlmon_service": 1}
    assert serve[:2] == ["rlmon", "serve"]
    assert flag(serve, "--address") == "auto"  # the pod's own Ray node, not Ray Client
    assert flag(serve, "--service-resource") == "rlmon_service"
    assert flag(serve, "--port") == "9464"
    # `rlmon serve` binds loopback unless asked: the pod asks for its own address explicitly
    assert flag(serve, "--host") == "0.0.0.0"
    assert flag(serve, "--config") == "/etc/rlmon/config.yaml"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert flag(serve, "--state-dir") == mounts["state"] == "/var/lib/rlmon"
    assert mounts["config"] == "/etc/rlmon"
    assert c["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["resources"]["requests"] == {"cpu": "250m", "memory": "768Mi"}
    other = container(render({"ray": {"kuberay": {"clusterName": "rc", "namespace": "ray"}}}))
    assert flag(script(other)[0], "--address") == "rc-head-svc.ray.svc.cluster.local:6379"
    explicit_start, explicit_serve = script(container(render(VARIANTS[1])))
    assert flag(explicit_start, "--address") == "head.ray.svc.cluster.local:6379"
    assert json.loads(flag(explicit_start, "--resources")) == {"rlmon_svc": 1}
    assert flag(explicit_serve, "--service-resource") == "rlmon_svc"
    assert "rlmon_service" in objects["NOTES"] and "ray://" not in objects["NOTES"]


def test_serve_accepts_the_charts_command_line() -> None:
    from rlmon.cli import build_parser

    _, serve = script(container(render()))
    args = build_parser().parse_args(serve[1:])
    assert args.service_resource == "rlmon_service"
    assert args.state_dir == "/var/lib/rlmon"
    assert args.address == "auto"


def test_secrets_are_referenced_never_inlined() -> None:
    objects = render(VARIANTS[1])
    env = {e["name"]: e for e in container(objects)["env"]}
    assert env["RLMON_SLACK_WEBHOOK_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "rlmon-slack", "key": "webhook-url"}}
    assert env["RLMON_PAGERDUTY_ROUTING_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "rlmon-pd", "key": "key"}}
    assert "value" not in env["RLMON_SLACK_WEBHOOK_URL"]
    assert not of_kind(objects, "Secret")
    names = {e["name"] for e in container(render())["env"]}
    assert "RLMON_SLACK_WEBHOOK_URL" not in names  # not configured: no reference at all
    secret_url = "https://hooks.slack.com/services/T000/B000/XXXX"
    with pytest.raises(helm_python.HelmValuesError, match="notifiers/slack"):
        render({"config": {"notifiers": {"slack": {"webhook_url": secret_url}}}})
    with pytest.raises(helm_python.HelmValuesError, match="notifiers/webhook"):
        render({"config": {"notifiers": {"webhook": {"url": "https://h.example/x?api_key=k"}}}})
    hooked = render({"secrets": {"webhook": {"existingSecret": "rlmon-hook", "key": "url"}}})
    env = {e["name"]: e for e in container(hooked)["env"]}
    assert env["RLMON_WEBHOOK_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "rlmon-hook", "key": "url"}}


def test_values_schema_rejects_bad_values() -> None:
    for bad in ({"port": 70000}, {"ray": {"headAddress": "http://head:10001"}},
                {"ray": {"headAddress": "ray://head:10001"}},
                {"ray": {"serviceResource": "rlmon service"}},
                {"podMonitor": {"enabled": True, "interval": "fifteen"}}, {"unknown": 1},
                {"secrets": {"slack": {"existingSecret": "Not_A_Name", "key": "k"},
                             "pagerduty": {"existingSecret": "", "key": "k"}}}):
        with pytest.raises(helm_python.HelmValuesError):
            render(bad)


def test_config_map_is_a_valid_rlmon_config(tmp_path: Path) -> None:
    (cm,) = [o for o in of_kind(render(), "ConfigMap") if o["metadata"]["name"].endswith("-config")]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    settings = load_config(path)
    assert settings.routing.critical == ["pagerduty", "slack"]
    # the outbox follows --state-dir, the state volume's mount
    assert settings.outbox.path is None
    from rlmon.service.alerting.notify.factory import outbox_path

    _, serve = script(container(render()))
    state = Path(flag(serve, "--state-dir"))
    assert outbox_path(settings, state) == state / "outbox.sqlite"


def test_monitoring_objects_carry_the_release_label() -> None:
    objects = render({"kubePrometheusStack": {"release": "prom"}})
    (pod_monitor,) = of_kind(objects, "PodMonitor")
    (rule,) = of_kind(objects, "PrometheusRule")
    for obj in (pod_monitor, rule):
        assert obj["metadata"]["labels"]["release"] == "prom"
    (deploy,) = of_kind(objects, "Deployment")
    selector = deploy["spec"]["selector"]["matchLabels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"] == selector
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert not of_kind(objects, "ServiceMonitor")  # KubeRay's advice: a PodMonitor, not both
    unlabelled = render({"kubePrometheusStack": {"release": ""}})
    assert "release" not in of_kind(unlabelled, "PodMonitor")[0]["metadata"]["labels"]


def test_dashboard_config_maps_hold_the_generated_json() -> None:
    objects = render(VARIANTS[1])
    maps = [o for o in of_kind(objects, "ConfigMap")
            if o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert len(maps) == len(DASHBOARDS)
    for dash in DASHBOARDS:
        filename = Path(dash.path).name
        (cm,) = [m for m in maps if filename in m["data"]]
        original = (ROOT / dash.path).read_text(encoding="utf-8")
        assert cm["data"][filename] == original.rstrip("\n")  # a `|-` block drops the newline
        assert json.loads(cm["data"][filename])["uid"] == dash.uid
        assert cm["metadata"]["namespace"] == "grafana"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "rlmon"}


def test_chart_copies_equal_the_originals() -> None:
    for original in [*(ROOT / d.path for d in DASHBOARDS), RULES]:
        copy = ROOT / chart_path(str(original.relative_to(ROOT)))
        assert copy.read_bytes() == original.read_bytes(), f"{copy} differs: rlmon generate"


def test_prometheus_rule_carries_the_dead_mans_switch_and_the_target_down_rule() -> None:
    """The monitor's own liveness (issue 23): an always-firing Watchdog, and a rule on rlmon's
    scrape job, which the PodMonitor names after the chart (jobLabel)."""
    (rule,) = of_kind(render(), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts["Watchdog"]["expr"] == "vector(1)"
    assert 'up{job="rlmon"} == 0' in alerts["RlmonDown"]["expr"]
    assert {"RunStalled", "RunDied"} <= set(alerts)
    (pod_monitor,) = of_kind(render(), "PodMonitor")
    assert pod_monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
    (deploy,) = of_kind(render(), "Deployment")
    assert deploy["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "rlmon"


def test_prometheus_rule_is_the_generated_rule_file() -> None:
    (rule,) = of_kind(render(), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert not of_kind(render({"prometheusRule": {"enabled": False}}), "PrometheusRule")


@pytest.mark.integration
def test_prometheus_rule_groups_pass_promtool(tmp_path: Path) -> None:
    promtool = need_binary("promtool")
    (rule,) = of_kind(render(), "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_notes_explain_release_label_and_secrets() -> None:
    notes = render()["NOTES"]
    assert "release: kube-prometheus-stack" in notes
    assert "kubectl -n monitoring create secret generic rlmon-slack" in notes
    configured = render(VARIANTS[1])["NOTES"]
    assert "from secret rlmon-slack" in configured


def test_the_config_value_is_checked_against_the_settings_model() -> None:
    """``config`` becomes the pod's rlmon config: Helm refuses what ``rlmon serve`` would refuse
    (the schema is generated from the settings model), before anything crash-loops."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    block = page.split("```yaml\n# rlmon.yaml", 1)[1].split("```", 1)[0]
    example = yaml.safe_load("# rlmon.yaml" + block)
    assert example["notifiers"] and example["retention"]  # the docs' full example
    objects = render({"config": example})  # accepted, and it is the pod's config
    (cm,) = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-config")]
    assert yaml.safe_load(cm["data"]["config.yaml"])["retention"] == example["retention"]
    for bad in ({"routng": {"critical": ["slack"]}},  # a misspelt section
                {"retention": {"history_dayz": 30}},  # a misspelt field
                {"retention": {"history_days": "thirty"}},  # a wrong type
                {"exporter": {"port": 70000}},  # out of range
                {"routing": {"critical": ["email"]}},  # no such destination
                {"notifiers": {"slack": {"webhook_url": "https://hooks.slack.example/x"}}},
                {"notifiers": {"pagerduty": {"routing_key": "k"}}},
                {"notifiers": {"webhook": {"token": "t"}}}):
        with pytest.raises(helm_python.HelmValuesError):
            render({"config": bad})


def test_the_config_schema_is_generated_and_the_rest_of_the_file_kept() -> None:
    (art,) = helm_schema.artifacts()
    current = (ROOT / art.path).read_text()
    doc = json.loads(current)
    assert set(doc["properties"]["config"]["properties"]) == set(Settings.model_fields)
    edited = json.loads(current)
    del edited["properties"]["config"]["properties"]["retention"]  # stale: a field missing
    edited["properties"]["port"]["maximum"] = 65535  # hand-written: kept as it is
    stale = json.dumps(edited, indent=2) + "\n"
    assert art.expected(stale) == current
    edited["properties"]["port"]["maximum"] = 1024
    assert json.loads(art.expected(json.dumps(edited)))["properties"]["port"]["maximum"] == 1024


def _docker_context() -> set[str]:
    """The top-level paths ``.dockerignore`` lets into the build context (it excludes everything,
    then names what to include)."""
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    assert "*" in lines
    return {ln[1:] for ln in lines if ln.startswith("!")}


def test_the_dockerfile_builds_rlmon_from_its_context(tmp_path: Path) -> None:
    """No Docker engine runs here: the test checks what the image build depends on. Every COPY
    source is in the build context, the copied files alone build a wheel that holds the package
    and its data, and the image's user is the one the chart runs as."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    context = _docker_context()
    src = tmp_path / "src"
    src.mkdir()
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            *sources, _dest = line.split()[1:]
            for source in sources:
                assert source in context and (ROOT / source).exists(), source
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, src / source,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / source, src / source)
    wheels = tmp_path / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    (wheel,) = wheels.glob("rlmon-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert {"rlmon/__main__.py", "rlmon/data/example_run.jsonl", "rlmon/py.typed"} <= names
    assert "rlmon = " in entry_points
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    user = values["podSecurityContext"]["runAsUser"]
    assert f"useradd -u {user} " in dockerfile and f"USER {user}" in dockerfile
    assert 'pip install --no-cache-dir "/src[service]" "ray[default]==${RAY_VERSION}"' \
        in dockerfile
