"""The Kubernetes manifests in deploy/k8s hold together, offline.

No cluster and no kustomize binary: the kustomization is rendered here the way kustomize renders
this one (its resources, the namespace, the Secret from its env file, the image), and every object
is validated against the Kubernetes 1.31 schemas that ``kubernetes-validate`` bundles, in strict
mode (an unknown field is an error). Then what the product needs is asserted: the probes point at
the ports and paths the processes serve, the workers' grace period covers their drain, the
disruption budgets select the pods they protect, every setting is one the code reads.
"""

from __future__ import annotations

import base64
import copy
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from taskfleet.shared.metrics import ApiMetrics
from taskfleet.shared.settings import WorkerSettings
from tools.reference import setting_variables, settings_classes

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OPTIONAL = K8S / "optional" / "queue-depth-autoscaler"
KUBERNETES_VERSION = "1.31.0"
API_PORT = 8000

#: Kinds that live in a namespace (everything here but the Namespace itself).
CLUSTER_KINDS = {"Namespace"}


def load_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def env_file(path: Path) -> dict[str, str]:
    """A kustomize env file: KEY=value lines, # comments."""
    pairs = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def render(
    kustomization_dir: Path = K8S, secret_env: str = "secret.env.example"
) -> list[dict[str, Any]]:
    """The objects ``kustomize build`` makes of deploy/k8s, with the example secrets.

    Only the features this kustomization uses: resources, namespace, labels (no selectors),
    secretGenerator from env files, images. Anything else is refused, so a new feature gets
    rendered here before it is relied on.
    """
    kustomization = yaml.safe_load((kustomization_dir / "kustomization.yaml").read_text())
    known = {"apiVersion", "kind", "namespace", "labels", "resources", "secretGenerator", "images"}
    assert set(kustomization) <= known, f"render() does not know {set(kustomization) - known}"
    objects = []
    for resource in kustomization["resources"]:
        objects += load_documents(kustomization_dir / resource)
    for generator in kustomization.get("secretGenerator", []):
        data: dict[str, str] = {}
        for name in generator["envs"]:
            source = kustomization_dir / (secret_env if name == "secret.env" else name)
            data.update(env_file(source))
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": generator["name"]},
                "type": "Opaque",
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            }
        )
    images = {i["name"]: f"{i['newName']}:{i['newTag']}" for i in kustomization.get("images", [])}
    for obj in objects:
        metadata = obj.setdefault("metadata", {})
        if obj["kind"] not in CLUSTER_KINDS:
            metadata["namespace"] = kustomization["namespace"]
        for label_set in kustomization.get("labels", []):
            assert label_set.get("includeSelectors") is False
            metadata.setdefault("labels", {}).update(label_set["pairs"])
        for container in containers(obj):
            container["image"] = images.get(container["image"], container["image"])
    return objects


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] in {"Deployment", "Job"}:
        spec: dict[str, Any] = obj["spec"]["template"]["spec"]
        return spec
    return None


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(obj)
    return spec["containers"] if spec else []


def validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render()


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container_port(container: dict[str, Any], port: int | str) -> int:
    """A probe's or a Service's port, by number or by the container port's name."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return int(number)


def config_value(objects: list[dict[str, Any]], variable: str) -> str | None:
    value = one(objects, "ConfigMap", "taskfleet-config")["data"].get(variable)
    return None if value is None else str(value)


# --- schema validation ---------------------------------------------------------------------------


def test_every_manifest_is_listed_in_the_kustomization() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, f"not listed: {on_disk - listed}; missing: {listed - on_disk}"


def test_every_object_validates_against_the_kubernetes_schemas(
    objects: list[dict[str, Any]],
) -> None:
    kinds = {o["kind"] for o in objects}
    assert {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Job",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    } <= kinds
    for obj in objects:
        validate(obj)


def test_the_optional_autoscaler_validates() -> None:
    for path in sorted(OPTIONAL.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for obj in load_documents(path):
                validate(obj)


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("spec", "template", "spec", "containers", 0, "readinessProbe", "httpGet", "paht"), "/x"),
        (("spec", "replicas"), "two"),
        (("spec", "template", "spec", "terminationGracePeriod"), 45),
    ],
    ids=["misspelt field", "wrong type", "unknown field"],
)
def test_the_validation_catches_a_broken_manifest(
    objects: list[dict[str, Any]], where: tuple[str | int, ...], value: object
) -> None:
    broken = copy.deepcopy(one(objects, "Deployment", "taskfleet-worker"))
    node: Any = broken
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


# --- the API -------------------------------------------------------------------------------------


def test_api_deployment_probes_and_replicas(objects: list[dict[str, Any]]) -> None:
    api = one(objects, "Deployment", "taskfleet-api")
    assert api["spec"]["replicas"] == 2
    (container,) = containers(api)
    args = container["args"]
    assert args[0] == "api"
    assert int(args[args.index("--port") + 1]) == API_PORT
    assert args[args.index("--host") + 1] == "0.0.0.0", "reachable from the Service"
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert readiness["httpGet"]["path"] == "/readyz"
    assert liveness["httpGet"]["path"] == "/healthz"
    for probe in (readiness, liveness):
        assert container_port(container, probe["httpGet"]["port"]) == API_PORT
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    assert api["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_api_service_reaches_the_api_pods(objects: list[dict[str, Any]]) -> None:
    api = one(objects, "Deployment", "taskfleet-api")
    service = one(objects, "Service", "taskfleet-api")
    pod_labels = api["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    worker_labels = one(objects, "Deployment", "taskfleet-worker")["spec"]["template"]["metadata"]
    assert not service["spec"]["selector"].items() <= worker_labels["labels"].items()
    (port,) = service["spec"]["ports"]
    (container,) = containers(api)
    assert container_port(container, port["targetPort"]) == API_PORT


# --- the workers ---------------------------------------------------------------------------------


def worker_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = containers(one(objects, "Deployment", "taskfleet-worker"))
    return container


def test_worker_probes_use_the_metrics_port(objects: list[dict[str, Any]]) -> None:
    container = worker_container(objects)
    assert container["args"][0] == "worker"
    metrics_port = int(
        config_value(objects, "TASKFLEET_METRICS_PORT")
        or WorkerSettings.model_fields["metrics_port"].default
    )
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe"):
        port = container[probe]["httpGet"]["port"]
        assert container_port(container, port) == metrics_port, probe
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]


def test_workers_drain_before_kubernetes_kills_them(objects: list[dict[str, Any]]) -> None:
    worker = one(objects, "Deployment", "taskfleet-worker")
    drain_timeout = float(
        config_value(objects, "TASKFLEET_DRAIN_TIMEOUT")
        or WorkerSettings.model_fields["drain_timeout"].default
    )
    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # After the drain the worker still gives unfinished tasks back and marks itself offline.
    assert grace >= drain_timeout + 10, (grace, drain_timeout)


def test_something_reaps_the_workers_orphans(objects: list[dict[str, Any]]) -> None:
    # A process-isolated handler's own children, orphaned when its process group is killed at a
    # timeout, are re-parented to PID 1. The worker never waits for them: as PID 1 it would
    # collect one zombie per such timeout. With a shared process namespace, the pod's pause
    # container is PID 1 and reaps them (compose: `init: true`).
    worker = one(objects, "Deployment", "taskfleet-worker")
    assert worker["spec"]["template"]["spec"].get("shareProcessNamespace") is True


def test_worker_disruption_budget_protects_the_workers(objects: list[dict[str, Any]]) -> None:
    worker = one(objects, "Deployment", "taskfleet-worker")
    pdb = one(objects, "PodDisruptionBudget", "taskfleet-worker")
    pod_labels = worker["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    api_labels = one(objects, "Deployment", "taskfleet-api")["spec"]["template"]["metadata"]
    assert not pdb["spec"]["selector"]["matchLabels"].items() <= api_labels["labels"].items()
    # One at a time, and never a budget that forbids every eviction.
    assert pdb["spec"].get("maxUnavailable") == 1
    assert "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert worker["spec"]["replicas"] > 1


def test_api_disruption_budget_keeps_one_replica(objects: list[dict[str, Any]]) -> None:
    api = one(objects, "Deployment", "taskfleet-api")
    pdb = one(objects, "PodDisruptionBudget", "taskfleet-api")
    pod_labels = api["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert 1 <= pdb["spec"]["minAvailable"] < api["spec"]["replicas"]


# --- what every pod gets -------------------------------------------------------------------------


def test_prometheus_scrapes_the_api_and_every_worker(objects: list[dict[str, Any]]) -> None:
    for name, port in (("taskfleet-api", API_PORT), ("taskfleet-worker", None)):
        deployment = one(objects, "Deployment", name)
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        (container,) = containers(deployment)
        ports = {p["containerPort"] for p in container["ports"]}
        assert int(annotations["prometheus.io/port"]) in ports
        if port is not None:
            assert int(annotations["prometheus.io/port"]) == port


def test_migrate_job_runs_the_migrations(objects: list[dict[str, Any]]) -> None:
    job = one(objects, "Job", "taskfleet-migrate")
    (container,) = containers(job)
    assert container["args"] == ["migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] in {"Never", "OnFailure"}
    assert job["spec"]["backoffLimit"] >= 1


def test_settings_and_secrets_are_ones_the_code_reads(objects: list[dict[str, Any]]) -> None:
    known = {
        v for cls in settings_classes() for n in cls.model_fields for v in setting_variables(cls, n)
    }
    config = one(objects, "ConfigMap", "taskfleet-config")["data"]
    assert set(config) <= known, f"settings no process reads: {set(config) - known}"
    # Values the settings classes accept.
    WorkerSettings(
        database_url="postgresql://localhost/x",
        **{k.removeprefix("TASKFLEET_").lower(): v for k, v in config.items() if v != ""},
    )

    secret = one(objects, "Secret", "taskfleet-secrets")
    example_keys = set(secret["data"])
    assert {"DATABASE_URL", "TASKFLEET_API_TOKENS"} <= example_keys
    for obj in objects:
        for container in containers(obj):
            env = {e["name"]: e for e in container.get("env", [])}
            assert "DATABASE_URL" in env, f"{obj['metadata']['name']} has no database"
            for entry in env.values():
                assert entry["name"] in known, entry["name"]
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                assert ref is not None, f"{entry['name']}: secrets come from the Secret"
                assert ref["name"] == "taskfleet-secrets"
                assert ref["key"] in example_keys or ref.get("optional") is True, ref
                listed = re.search(
                    rf"^#?\s*{ref['key']}=", (K8S / "secret.env.example").read_text(), re.M
                )
                assert listed, f"secret.env.example does not document {ref['key']}"
    api_env = {e["name"] for e in worker_env(objects, "taskfleet-api")}
    assert "TASKFLEET_API_TOKENS" in api_env
    # Both LISTEN (workers: wake-ups and config; the API: config requests) on Postgres itself.
    assert "TASKFLEET_LISTEN_DATABASE_URL" in api_env
    assert "TASKFLEET_LISTEN_DATABASE_URL" in {
        e["name"] for e in worker_env(objects, "taskfleet-worker")
    }
    assert "TASKFLEET_API_TOKENS" not in {
        e["name"] for e in worker_env(objects, "taskfleet-worker")
    }


def worker_env(objects: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    (container,) = containers(one(objects, "Deployment", name))
    env: list[dict[str, Any]] = container.get("env", [])
    return env


def test_real_secrets_stay_out_of_git() -> None:
    ignored = (REPO / ".gitignore").read_text().split()
    assert "deploy/k8s/secret.env" in ignored
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (generator,) = kustomization["secretGenerator"]
    assert generator["envs"] == ["secret.env"], "built from the git-ignored file"


def test_pods_run_unprivileged(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        spec = pod_spec(obj)
        if spec is None:
            continue
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]


def test_image_tag_is_the_package_version(objects: list[dict[str, Any]]) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    images = {c["image"] for o in objects for c in containers(o)}
    assert images == {f"taskfleet:{version}"}


# --- the optional autoscaler ---------------------------------------------------------------------


def test_optional_autoscaler_is_optional_and_targets_the_workers(
    objects: list[dict[str, Any]],
) -> None:
    assert not any(o["kind"] == "HorizontalPodAutoscaler" for o in objects), "not by default"
    component = yaml.safe_load((OPTIONAL / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    (hpa,) = [o for r in component["resources"] for o in load_documents(OPTIONAL / r)]
    worker = one(objects, "Deployment", "taskfleet-worker")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", worker["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 1

    registry = CollectorRegistry()
    ApiMetrics.create(registry)
    exported = {family.name for family in registry.collect()}
    for metric in hpa["spec"]["metrics"]:
        assert metric["type"] == "External"
        assert metric["external"]["metric"]["name"] in exported

    # The HPA owns the replica count: the component drops the Deployment's fixed one.
    (patch,) = component["patches"]
    assert patch["target"]["kind"] == "Deployment"
    assert patch["target"]["name"] == worker["metadata"]["name"]
    assert yaml.safe_load(patch["patch"]) == [{"op": "remove", "path": "/spec/replicas"}]


# --- the real kustomize --------------------------------------------------------------------------


def kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    """``kubectl kustomize`` (kustomize built into kubectl): offline, no cluster involved."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the real kustomize build was not checked here")
    return subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    """deploy/k8s copied, with secret.env made from the example."""
    base = tmp_path / "k8s"
    shutil.copytree(K8S, base, ignore=shutil.ignore_patterns("secret.env"))
    shutil.copy(base / "secret.env.example", base / "secret.env")
    return base


def without_hash(name: str) -> str:
    return re.sub(r"-[a-z0-9]{10}$", "", name)


def test_kustomize_builds_what_the_tests_render(
    deploy_copy: Path, objects: list[dict[str, Any]]
) -> None:
    result = kustomize(deploy_copy)
    assert result.returncode == 0, result.stderr
    built = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    for obj in built:
        validate(obj)
    names = sorted((o["kind"], without_hash(o["metadata"]["name"])) for o in built)
    assert names == sorted((o["kind"], o["metadata"]["name"]) for o in objects)
    # The generated Secret's hashed name is what the pods reference.
    (secret,) = [o for o in built if o["kind"] == "Secret"]
    rendered = one(objects, "Secret", "taskfleet-secrets")["data"]
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == {
        k: base64.b64decode(v) for k, v in rendered.items()
    }
    for obj in built:
        for container in containers(obj):
            assert container["image"] == one_image(objects)
            for entry in container.get("env", []):
                assert entry["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
            assert obj["metadata"]["namespace"] == "taskfleet"


def one_image(objects: list[dict[str, Any]]) -> str:
    (image,) = {str(c["image"]) for o in objects for c in containers(o)}
    return image


def test_kustomize_refuses_to_build_without_the_real_secrets(deploy_copy: Path) -> None:
    (deploy_copy / "secret.env").unlink()
    result = kustomize(deploy_copy)
    assert result.returncode != 0
    assert "secret.env" in result.stderr


def test_the_optional_autoscaler_component_builds(deploy_copy: Path) -> None:
    """Enabled as the kustomization's comment says: by uncommenting its ``components:``."""
    kustomization = deploy_copy / "kustomization.yaml"
    commented = "# components:\n#   - optional/queue-depth-autoscaler\n"
    text = kustomization.read_text()
    assert commented in text, "the kustomization no longer shows how to enable the autoscaler"
    kustomization.write_text(text.replace(commented, commented.replace("# ", "").replace("#", "")))
    result = kustomize(deploy_copy)
    assert result.returncode == 0, result.stderr
    built = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    for obj in built:
        validate(obj)
    (hpa,) = [o for o in built if o["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["metadata"]["namespace"] == "taskfleet"
    worker = one(built, "Deployment", "taskfleet-worker")
    assert "replicas" not in worker["spec"], "the HPA owns the worker count"
    assert one(built, "Deployment", "taskfleet-api")["spec"]["replicas"] == 2
