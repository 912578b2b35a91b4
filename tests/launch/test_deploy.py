"""Deployment files, checked offline: the Kubernetes manifests in deploy/ against the Kubernetes
JSON schemas (kubernetes-validate, strict) and against the server's own settings; the Dockerfile
with hadolint (both pinned in the `test` extra); the keys reach the launcher by environment (a
Secret, `docker run -e`, make's environment), never a command line."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from rose_backend.launch.deployment import DEFAULT_REPOSITORY, Ports
from rose_backend.launch.supervision import EXIT_MARGIN_S, KILL_MARGIN_S, drain_timeout_of

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.33.0"


def documents():
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    for name in kust["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            if doc:
                yield name, doc


def by_kind(kind):
    return [d for _, d in documents() if d["kind"] == kind]


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kust["kind"] == "Kustomization"
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kust["resources"]) == sorted(on_disk)


@pytest.mark.parametrize("name,doc", list(documents()), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_manifest_matches_the_kubernetes_schema(name, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_schema_validation_catches_a_mistake():
    (dep,) = by_kind("Deployment")
    bad = yaml.safe_load(yaml.safe_dump(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_deployment_fits_the_server():
    (dep,) = by_kind("Deployment")
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    (c,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    default = Ports()
    assert (ports["grpc"], ports["http"], ports["metrics"], ports["gateway"]) == (default.grpc, default.http, default.metrics, 8080)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    stop_bound = drain_timeout_of(DEFAULT_REPOSITORY) + EXIT_MARGIN_S + KILL_MARGIN_S
    assert spec["terminationGracePeriodSeconds"] > pre_stop + stop_bound
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == default.metrics
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["dshm"] == "/dev/shm" and volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert mounts["compile-cache"] == env["ROSE_CACHE_DIR"]
    docker = (ROOT / "docker" / "Dockerfile").read_text()
    assert f"ROSE_CACHE_DIR={env['ROSE_CACHE_DIR']}" in docker


def test_services_and_autoscaler_point_at_real_things():
    (dep,) = by_kind("Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    names = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    services = by_kind("Service")
    assert {s["metadata"]["name"] for s in services} == {"rose-grpc", "rose-gateway"}
    for s in services:
        assert s["spec"]["selector"].items() <= labels.items()
        assert all(p["targetPort"] in names for p in s["spec"]["ports"])
    (hpa,) = by_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    served = (ROOT / "rose_backend" / "triton" / "rose_model.py").read_text()
    assert f'"{name}"' in served                                   # a gauge rose exports
    (cm,) = by_kind("ConfigMap")
    assert re.search(rf"seriesQuery: '{name}\{{", cm["data"]["config.yaml"])


def test_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    out = subprocess.run([str(hadolint), "--no-color", str(ROOT / "docker" / "Dockerfile")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_keys_come_from_a_secret_never_a_literal():
    """API_KEY and ADMIN_KEY (the names the launcher reads) come from the Secret rose-keys; the API
    key is required (the pod does not start open), the admin key optional (else random per start)."""
    (dep,) = by_kind("Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    for name, key in (("API_KEY", "api-key"), ("ADMIN_KEY", "admin-key")):
        assert "value" not in env[name], name
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("rose-keys", key)
    assert env["API_KEY"]["valueFrom"]["secretKeyRef"].get("optional", False) is False
    assert env["ADMIN_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert not by_kind("Secret")                               # created by the operator, never committed


def test_the_image_takes_its_keys_from_the_environment():
    docker = (ROOT / "docker" / "Dockerfile").read_text()
    (entry,) = [json.loads(line.split(None, 1)[1]) for line in docker.splitlines() if line.startswith("ENTRYPOINT")]
    assert entry[:3] == ["python3", "-m", "rose_backend.launch"] and "--address" in entry
    assert not any("key" in a.lower() for a in entry)
    readme = (ROOT / "docker" / "README.md").read_text()
    runs = [line for line in readme.splitlines() if line.strip().startswith("docker run")]
    assert runs and all(" -e API_KEY " in line + " " for line in runs), runs       # the caller's variable
    assert "-p 8080:8080" in readme and "API_KEY=" not in " ".join(runs)           # never the key itself


def make_serve(*args, env=None) -> subprocess.CompletedProcess:
    """`make serve`'s commands as make would run them (-n), without the install step."""
    return subprocess.run(["make", "-n", "-o", ".venv/.installed", "serve", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**{k: v for k, v in os.environ.items()
                                                        if k not in ("API_KEY", "ADMIN_KEY")}, **(env or {})})


@pytest.mark.skipif(subprocess.run(["which", "make"], capture_output=True).returncode != 0, reason="no make")
def test_make_serve_keeps_keys_out_of_command_lines(tmp_path):
    key = "a-key-for-make-serve-1"
    r = make_serve(env={"API_KEY": key, "ADMIN_KEY": key + "x"})
    assert r.returncode == 0 and "rose_backend.launch" in r.stdout, r.stderr
    assert key not in r.stdout + r.stderr                  # the recipe never names a key: it goes by environment
    r = make_serve(f"API_KEY_FILE={tmp_path / 'key'}")
    assert f'--api-key-file "{tmp_path / "key"}"' in r.stdout
    r = make_serve(f"API_KEY={key}")                        # on make's own command line: ps shows it
    assert "API_KEY on make's command line shows in process listings" in r.stderr
    assert key not in r.stdout
