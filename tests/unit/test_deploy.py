"""The artefacts of ``deploy/`` (docs/deploy.md), read and checked for what they must carry:
the systemd unit (and ``systemd-analyze verify`` where it exists), the container files, the
compose file, the Kubernetes manifests and the Grafana dashboard. Docker cannot run here, so
nothing is built; ``tests/interop/test_deploy_commands.py`` runs the compose file's commands
against the real server without a container."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from corral._child_env import Sandbox
from corral.actors._metrics import METRICS
from corral.cli._output import EXIT_USAGE
from corral.cli._up import FRESH_CONFIG
from corral.config import BUILTIN, Config, listen_address, parse_config
from corral.tools.sandbox import wrap

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
STATE_DIR = "/var/lib/corral"
#: Names of settings that hold a credential: none may be given a value in an artefact.
SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY", re.IGNORECASE)


def stop_budget(config: Config) -> float:
    """How long a host may take from SIGTERM to exit: the drain, then every actor and the
    control plane stopped one after another, each up to its shutdown timeout."""
    supervisor = config.supervisor
    return supervisor.drain_timeout_s + (len(BUILTIN) + 1) * supervisor.shutdown_timeout_s


def service_config() -> Config:
    return parse_config(tomllib.loads((DEPLOY / "corral.toml").read_text()))


def test_the_service_config_is_a_valid_corral_toml_that_drains_and_serves_metrics() -> None:
    config = service_config()
    assert config.state_dir == STATE_DIR
    assert config.workspace is not None and config.workspace.startswith(STATE_DIR + "/")
    assert config.supervisor.drain_timeout_s > 0
    assert config.metrics.listen is not None
    assert listen_address(config.metrics.listen)[1] == 9464
    # As safe as a fresh state dir's config: the embedded control plane asks before a shell.
    fresh = tomllib.loads(FRESH_CONFIG)["server"]["policies"]
    assert [msgspec.to_builtins(p) for p in config.server.policies] == [
        {"phase": "PHASE_TOOL_CALL", **rule} for rule in fresh
    ]


# --- systemd -----------------------------------------------------------------------------


def unit_directives(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections → directive → its values (a directive may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"a directive before any section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not a directive: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)\s*(s|min)?", value)
    assert match, value
    return float(match.group(1)) * (60 if match.group(2) == "min" else 1)


def test_the_unit_is_a_hardened_notify_service_that_keeps_sandboxes_working() -> None:
    unit = unit_directives((DEPLOY / "systemd" / "corral.service").read_text())
    service = {k: v[-1] for k, v in unit["Service"].items()}
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"
    assert seconds(service["WatchdogSec"]) > 0
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == str(EXIT_USAGE), "a bad config: no loop"
    exec_start = service["ExecStart"].split()
    assert exec_start[0].endswith("/corral") and exec_start[1] == "up"
    state_dir = exec_start[exec_start.index("--state-dir") + 1]
    assert state_dir == f"/var/lib/{service['StateDirectory']}"
    assert service["User"] not in ("root", "0") and "DynamicUser" not in service
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "KillMode": "mixed",  # SIGTERM to the host alone: it drains, then stops the actors
        "CapabilityBoundingSet": "",
    }.items():
        assert service.get(key) == value, key
    # What would break bubblewrap (docs/deploy.md) stays off.
    for key in ("ProtectKernelTunables", "ProtectProc", "ProcSubset", "RestrictNamespaces"):
        assert key not in service, key
    for key in ("PrivateUsers", "SystemCallFilter", "MemoryDenyWriteExecute"):
        assert key not in service, key
    assert "AF_NETLINK" in service["RestrictAddressFamilies"].split()
    assert seconds(service["TimeoutStopSec"]) > stop_budget(service_config())
    # The token comes from a root-only file, never from the unit.
    assert service["EnvironmentFile"].lstrip("-") == "/etc/corral/corral.env"
    assert not any(SECRET.search(v) for v in unit["Service"].get("Environment", []))
    sysusers = (DEPLOY / "systemd" / "corral.sysusers").read_text()
    assert re.search(rf"^u {service['User']} - .* {STATE_DIR} ", sysusers, re.MULTILINE)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verifies_the_unit_and_rates_its_exposure(tmp_path: Path) -> None:
    # verify wants ExecStart's program to exist: this checkout's corral stands in for
    # /opt/corral/bin/corral.
    corral = Path(sys.executable).with_name("corral")
    unit = tmp_path / "corral.service"
    text = (DEPLOY / "systemd" / "corral.service").read_text()
    unit.write_text(text.replace("/opt/corral/bin/corral", str(corral)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    rated = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    exposure = re.search(r"Overall exposure level for corral.service: ([\d.]+)", rated.stdout)
    if rated.returncode == 0 and exposure:  # --offline needs systemd >= 250
        assert float(exposure.group(1)) <= 5.0, rated.stdout


@pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("bwrap")),
    reason="needs root, setpriv and bwrap to take a user's privileges away",
)
def test_a_sandbox_runs_under_the_units_privilege_limits() -> None:
    """What the unit takes away (no new privileges, no capability, not root) leaves corral's
    bubblewrap sandboxes working: they are unprivileged user namespaces."""
    unit = unit_directives((DEPLOY / "systemd" / "corral.service").read_text())["Service"]
    assert unit["NoNewPrivileges"] == ["yes"] and unit["CapabilityBoundingSet"] == [""]
    work = Path(tempfile.mkdtemp(prefix="corral-unit-"))
    try:
        work.chmod(0o777)  # the unprivileged user below works there
        argv = wrap(
            ["/bin/sh", "-c", "echo inside > out; grep -c . /proc/self/status >> out"],
            Sandbox(),
            cwd=work,
            env={"PATH": "/usr/bin:/bin", "HOME": str(work)},
        )
        limits = ["--no-new-privs", "--bounding-set=-all", "--inh-caps=-all"]
        user = ["--reuid=65534", "--regid=65534", "--clear-groups"]
        done = subprocess.run(
            ["setpriv", *user, *limits, *argv], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert (work / "out").read_text().splitlines()[0] == "inside"
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- container files ---------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """A Containerfile's instructions: (KEYWORD, arguments), continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def test_the_container_runs_as_a_user_on_a_state_volume_with_a_healthcheck_and_no_secret() -> None:
    steps = instructions(DEPLOY / "Containerfile")
    final = steps[max(i for i, (k, _) in enumerate(steps) if k == "FROM") :]
    users = [a for k, a in final if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    kinds = [k for k, _ in final]
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN")
    assert [json.loads(a) for k, a in final if k == "VOLUME"] == [[STATE_DIR]]
    env = " ".join(a for k, a in final if k == "ENV")
    assert f"CORRAL_STATE_DIR={STATE_DIR}" in env
    health = next(a for k, a in final if k == "HEALTHCHECK")
    command = json.loads(health.split("CMD", 1)[1])
    assert command[:2] == ["corral", "status"]
    assert json.loads(next(a for k, a in final if k == "ENTRYPOINT"))[-1] == "corral"
    assert json.loads(next(a for k, a in final if k == "CMD")) == ["up"]
    assert next(a for k, a in final if k == "EXPOSE") == str(
        listen_address(service_config().metrics.listen or "")[1]
    )
    for keyword, args in steps:
        if keyword in ("ENV", "ARG", "LABEL"):
            assert not SECRET.search(args), f"{keyword} {args}"
        if keyword in ("COPY", "ADD"):
            sources = [s for s in args.split()[:-1] if not s.startswith("--")]
            assert not any(".env" in s or SECRET.search(s) for s in sources), args
            assert all((REPO / s).exists() for s in sources if "from=" not in args), args


def test_each_image_is_built_from_only_what_it_copies() -> None:
    """The build context (the checkout's root) holds the venv and maybe a state dir: each
    container file's ignore file lets through only what it copies."""
    for name in ("Containerfile", "omnigent.Containerfile"):
        rules = [
            line
            for line in (DEPLOY / f"{name}.dockerignore").read_text().splitlines()
            if line and not line.startswith("#")
        ]
        assert rules[0] == "*", name
        allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
        copied = {
            source.rstrip("/")
            for keyword, args in instructions(DEPLOY / name)
            if keyword == "COPY" and "--from=" not in args
            for source in args.split()[:-1]
        }
        assert copied == allowed, name


def test_the_omnigent_image_is_the_version_the_interop_suite_runs() -> None:
    pinned = re.search(r"^VERSION=(\S+)$", (REPO / ".ci" / "omnigent-venv").read_text(), re.M)
    assert pinned
    steps = instructions(DEPLOY / "omnigent.Containerfile")
    assert any(k == "RUN" and f'"omnigent=={pinned.group(1)}"' in a for k, a in steps)
    assert next(a for k, a in steps if k == "USER") not in ("root", "0")
    entry = json.loads(next(a for k, a in steps if k == "ENTRYPOINT"))
    assert entry[:2] == ["omnigent", "server"]


def test_compose_runs_the_server_and_a_host_bound_to_it() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    server, host = services["omnigent"], services["corral"]
    for service in (server, host):
        assert (DEPLOY / ".." / service["build"]["dockerfile"]).exists()
    server_entry = json.loads(
        next(a for k, a in instructions(DEPLOY / "omnigent.Containerfile") if k == "ENTRYPOINT")
    )
    port = server_entry[server_entry.index("--port") + 1]
    command = host["command"]
    assert command[:2] == ["up", "--server"]
    assert command[2] == f"http://omnigent:{port}"
    assert host["depends_on"]["omnigent"]["condition"] == "service_healthy"
    assert "healthcheck" in server
    token = host["environment"]["CORRAL_RUNNER_TOKEN"]
    assert re.fullmatch(r"\$\{CORRAL_RUNNER_TOKEN(:\?[^}]*)?\}", token), "from the environment"
    assert f"corral-state:{STATE_DIR}" in host["volumes"]
    assert seconds(host["stop_grace_period"]) > stop_budget(service_config())
    assert "seccomp=unconfined" in host["security_opt"]  # bubblewrap's namespaces


# --- Kubernetes ----------------------------------------------------------------------------


def manifests() -> dict[str, dict[str, Any]]:
    """Every object of ``deploy/k8s``, by kind."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["apiVersion"] and doc["metadata"]["name"], path
            found[doc["kind"]] = doc
    return found


def test_the_statefulset_runs_one_host_per_pod_with_its_own_volume_and_identity() -> None:
    objects = manifests()
    sts, service, config_map = objects["StatefulSet"], objects["Service"], objects["ConfigMap"]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert spec["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (claim,) = spec["volumeClaimTemplates"]
    assert mounts[claim["metadata"]["name"]] == STATE_DIR
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    config = parse_config(tomllib.loads(config_map["data"]["corral.toml"]))
    assert config.state_dir == STATE_DIR
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    env = {e["name"]: e for e in container["env"]}
    assert env["CORRAL_CONFIG"]["value"] == f"{config_mount['mountPath']}/corral.toml"
    # The runner's identity: the token from a Secret, joined with the pod's own name.
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    token = env["CORRAL_RUNNER_TOKEN"]["value"]
    refs = re.findall(r"\$\((\w+)\)", token)
    assert "POD_NAME" in refs
    secret_refs = [r for r in refs if "secretKeyRef" in env[r].get("valueFrom", {})]
    assert secret_refs, "part of the token comes from a Secret"
    names = [e["name"] for e in container["env"]]
    assert all(names.index(r) < names.index("CORRAL_RUNNER_TOKEN") for r in refs)
    assert container["args"][:2] == ["up", "--server"]
    for e in container["env"]:
        if SECRET.search(e["name"]) and "value" in e:
            assert re.fullmatch(r"(\$\(\w+\)|[.\-])+", e["value"]), f"a literal {e['name']}"
    # Probes ask the host itself; stopping is a drain that the grace period covers.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"][:2] == ["corral", "status"], probe
    assert pod["terminationGracePeriodSeconds"] > stop_budget(config)
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    port = next(p for p in container["ports"] if p["name"] == "metrics")["containerPort"]
    assert listen_address(config.metrics.listen or "")[1] == port
    assert any(p["targetPort"] == "metrics" for p in service["spec"]["ports"])


# --- the dashboard -----------------------------------------------------------------------


def test_the_dashboard_queries_exactly_the_metrics_the_host_exposes() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    used = set()
    for expr in exprs:
        for name in re.findall(r"\bcorral_\w+", expr):
            family = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in METRICS or (family in METRICS and METRICS[family][0] == "histogram"), (
                f"{name} is not exposed ({expr})"
            )
            used.add(name if name in METRICS else family)
    assert used == set(METRICS), f"not shown: {set(METRICS) - used}"
