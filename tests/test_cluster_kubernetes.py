"""Kubernetes: TFJob manifests the training operator accepts, refusals it would make, their YAML.

Generated manifests are validated against the ``openAPIV3Schema`` of Kubeflow's published TFJob
CRD (vendored in tests/fixtures/kubeflow/, its first line names the source) with unknown fields
an error, as under kubectl's strict validation, and against the operator's own admission rules
(pkg/webhooks/tensorflow/tfjob_webhook.go of the same release).
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

import course_utils.cluster as cluster
from course_utils.cluster import LocalCluster
from course_utils.cluster.kubernetes import RESTART_POLICIES

CRD = Path(__file__).resolve().parent / "fixtures" / "kubeflow" / "kubeflow.org_tfjobs.yaml"
SCRIPTS = Path(__file__).resolve().parent / "cluster_scripts"
COMMAND = ["python", "train.py", "--epochs", "3"]
IMAGE = "tensorflow/tensorflow:2.21.0"


# ---------------------------------------------------------------------------- the CRD's schema
def strict_json_schema(node: Any) -> Any:
    """OpenAPI v3 structural schema to JSON Schema; unknown fields refused as kubectl --strict."""
    if isinstance(node, list):
        return [strict_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: (
            {name: strict_json_schema(sub) for name, sub in value.items()}
            if key == "properties"
            else strict_json_schema(value)
        )
        for key, value in node.items()
        if not key.startswith("x-kubernetes-") and key != "default"
    }
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out.pop("type"), "null"]
    out.pop("nullable", None)
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _int_format(bits: int):
    def check(value: object) -> bool:
        return not isinstance(value, int) or -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)

    return check


@functools.cache
def crd_validator() -> jsonschema.protocols.Validator:
    """A validator for TFJob objects from the vendored CRD (v1), int32/int64 ranges checked."""
    source = CRD.read_text().splitlines()[0]
    assert source.startswith("# Source: repository github.com/kubeflow/training-operator, ref v1.9")
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict_json_schema(version["schema"]["openAPIV3Schema"])
    checker = jsonschema.FormatChecker()
    checker.checks("int32")(_int_format(32))
    checker.checks("int64")(_int_format(64))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema, format_checker=checker)


def schema_errors(manifest: dict) -> list[str]:
    """Every place where ``manifest`` breaks the CRD's schema (empty when valid)."""
    return [
        f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
        for error in crd_validator().iter_errors(manifest)
    ]


DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
REPLICA_TYPES = {"PS", "Worker", "Chief", "Master", "Evaluator"}


def operator_errors(manifest: dict) -> list[str]:
    """What the training operator's admission webhook (v1.9) and ObjectMeta validation refuse."""
    errors = []
    meta = manifest["metadata"]
    if not (len(meta["name"]) <= 63 and DNS1035.fullmatch(meta["name"])):
        errors.append(f"metadata.name {meta['name']!r} is not a DNS-1035 label")
    if "namespace" in meta and not (len(meta["namespace"]) <= 63
                                    and DNS1123.fullmatch(meta["namespace"])):
        errors.append(f"metadata.namespace {meta['namespace']!r} is not a DNS-1123 label")
    if set(meta) - {"name", "namespace", "labels", "annotations"}:
        errors.append(f"unexpected metadata fields {sorted(set(meta))}")
    specs = manifest["spec"].get("tfReplicaSpecs") or {}
    if not specs:
        errors.append("spec.tfReplicaSpecs: must be required")
    if set(specs) - REPLICA_TYPES:
        errors.append(f"unknown replica types {sorted(set(specs) - REPLICA_TYPES)}")
    if len(set(specs) & {"Chief", "Master"}) > 1:
        errors.append("must not have more than 1 Chief or Master role")
    for kind, spec in specs.items():
        containers = spec["template"]["spec"].get("containers") or []
        if not containers:
            errors.append(f"{kind}: containers must be specified")
        if any(not c.get("image") for c in containers):
            errors.append(f"{kind}: image must be required")
        if not any(c.get("name") == "tensorflow" for c in containers):
            errors.append(f"{kind}: must have at least one container with name tensorflow")
        if spec.get("restartPolicy", "Never") not in RESTART_POLICIES:
            errors.append(f"{kind}: unknown restartPolicy {spec['restartPolicy']!r}")
    return errors


VALID = {
    "two workers": dict(num_workers=2),
    "chief and workers": dict(num_workers=3, chief=True),
    "parameter servers": dict(num_workers=2, num_ps=2),
    "gpus cpu memory": dict(num_workers=2, chief=True, gpus_per_worker=2, cpu="500m",
                            memory="4Gi"),
    "env": dict(num_workers=2, env={"TF_CPP_MIN_LOG_LEVEL": "3", "MODE": "no", "N": 10}),
    "everything": dict(num_workers=4, num_ps=1, chief=True, num_evaluators=1, gpus_per_worker=1,
                       cpu=4, memory="16G", namespace="team-ml", env={"A": "y"},
                       restart_policy="ExitCode"),
    "fractional cpu and memory as numbers": dict(num_workers=2, cpu=0.5, memory=1.5e9),
    "a shared volume": dict(num_workers=2, chief=True, shared_volume=("training-data", "/data")),
    "a deadline": dict(num_workers=2, active_deadline_seconds=3600),
}


@pytest.mark.parametrize("kwargs", VALID.values(), ids=VALID.keys())
def test_generated_manifests_pass_the_crd_schema_and_the_operator_rules(kwargs):
    manifest = cluster.tfjob_manifest("mnist-mwms", IMAGE, COMMAND, **kwargs)
    from_yaml = yaml.safe_load(cluster.to_yaml(manifest))
    assert from_yaml == manifest
    assert schema_errors(from_yaml) == []
    assert operator_errors(from_yaml) == []
    specs = from_yaml["spec"]["tfReplicaSpecs"]
    assert specs["Worker"]["replicas"] == kwargs["num_workers"]
    assert from_yaml["spec"]["runPolicy"].get("activeDeadlineSeconds") == kwargs.get(
        "active_deadline_seconds")
    assert ("Chief" in specs) == kwargs.get("chief", False)
    assert specs.get("PS", {}).get("replicas", 0) == kwargs.get("num_ps", 0)
    for kind, spec in specs.items():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow" and container["command"] == COMMAND
        limits = container.get("resources", {}).get("limits", {})
        expected_gpus = kwargs.get("gpus_per_worker", 0) if kind != "PS" else 0
        assert limits.get("nvidia.com/gpu", 0) == expected_gpus
        assert {e["name"]: e["value"] for e in container.get("env", [])} == {
            k: str(v) for k, v in kwargs.get("env", {}).items()
        }


def test_the_schema_check_can_fail():
    good = cluster.tfjob_manifest("job", IMAGE, COMMAND, num_workers=2, cpu="1")
    assert schema_errors(good) == []
    unknown = copy.deepcopy(good)
    unknown["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "imagePullPolicyy"] = "Always"
    assert any("imagePullPolicyy" in e for e in schema_errors(unknown))
    unknown_top = copy.deepcopy(good)
    unknown_top["spec"]["replicas"] = 2
    assert any("replicas" in e for e in schema_errors(unknown_top))
    wrong_type = copy.deepcopy(good)
    wrong_type["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "2"
    assert any("is not of type 'integer'" in e for e in schema_errors(wrong_type))
    too_big = copy.deepcopy(good)
    too_big["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = 2**31
    assert any("int32" in e for e in schema_errors(too_big))
    bad_quantity = copy.deepcopy(good)
    bad_quantity["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]["cpu"] = "lots"
    assert any("does not match" in e for e in schema_errors(bad_quantity))
    renamed = copy.deepcopy(good)
    renamed["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "name"] = "trainer"
    assert schema_errors(renamed) == []  # the schema allows it; the operator does not
    assert operator_errors(renamed) == [
        "Worker: must have at least one container with name tensorflow"
    ]


INVALID = {
    "name starts with a digit": (dict(name="1job"), "DNS-1035"),
    "name with upper case": (dict(name="Bad_Name"), "not a valid Kubernetes name"),
    "name ends with '-'": (dict(name="job-"), "DNS-1035"),
    "name 64 characters": (dict(name="a" * 64), "at most 63 characters"),
    "service name over 63": (dict(name="a" * 60), "Service 'a{60}-worker-1'"),
    "empty name": (dict(name=""), "DNS-1035"),
    "empty image": (dict(image=""), "non-empty image"),
    "blank image": (dict(image="  "), "non-empty image"),
    "image with spaces around": (dict(image=" tf:1"), "leading or trailing spaces"),
    "zero workers": (dict(num_workers=0), "num_workers .* at least 1, got 0"),
    "fractional workers": (dict(num_workers=1.5), "num_workers .* got 1.5"),
    "negative ps": (dict(num_ps=-1), "num_ps must be a whole number of at least 0, got -1"),
    "negative evaluators": (dict(num_evaluators=-2), "num_evaluators .* got -2"),
    "chief count": (dict(chief=2), "chief is one task or none"),
    "negative chief": (dict(chief=-1), "chief is one task or none"),
    "negative gpus": (dict(gpus_per_worker=-1), "gpus_per_worker .* got -1"),
    "restart policy": (dict(restart_policy="OnFailur"), "one of Always, OnFailure, Never, Exit"),
    "restart policy case": (dict(restart_policy="never"), "got 'never'"),
    "TF_CONFIG in env": (dict(env={"TF_CONFIG": "{}"}), "must not set 'TF_CONFIG'"),
    "env name": (dict(env={"1BAD": "x"}), "name '1BAD' is not valid"),
    "env value": (dict(env={"A": None}), r"env\['A'\] must be a string"),
    "namespace upper case": (dict(namespace="Team"), "namespace 'Team' is not a DNS-1123"),
    "namespace too long": (dict(namespace="n" * 64), "DNS-1123"),
    "empty namespace": (dict(namespace=""), "DNS-1123"),
    "cpu": (dict(cpu="two"), "cpu 'two' is not a Kubernetes quantity"),
    "negative memory": (dict(memory="-1Gi"), "memory '-1Gi' is not a Kubernetes quantity"),
    "zero deadline": (dict(active_deadline_seconds=0), "active_deadline_seconds .* got 0"),
    "fractional deadline": (dict(active_deadline_seconds=1.5), "active_deadline_seconds .* 1.5"),
    "command as one string": (dict(command="python train.py"), "list of arguments"),
    "command item": (dict(command=["python", None]), r"command\[1\] must be a string"),
}


@pytest.mark.parametrize("change,match", INVALID.values(), ids=INVALID.keys())
def test_input_the_operator_would_refuse_raises_naming_rule_and_value(change, match):
    arguments = dict(name="job", image=IMAGE, command=COMMAND) | change
    name, image, command = arguments.pop("name"), arguments.pop("image"), arguments.pop("command")
    with pytest.raises(ValueError, match=match):
        cluster.tfjob_manifest(name, image, command, **arguments)


def test_the_longest_accepted_name_still_gives_valid_service_names():
    name = "a" * (63 - len("-worker-9"))
    manifest = cluster.tfjob_manifest(name, IMAGE, COMMAND, num_workers=10)
    assert schema_errors(manifest) == [] and operator_errors(manifest) == []
    with pytest.raises(ValueError, match="too long"):
        cluster.tfjob_manifest(name, IMAGE, COMMAND, num_workers=11)


# Strings a YAML 1.1 reader (kubectl's go-yaml; PyYAML for most of them) would not read as strings.
YAML11_SCALARS = [
    "y", "Y", "n", "N", "yes", "No", "ON", "off", "true", "False", "~", "null", "Null", "",
    "0x10", "0X1F", "0o17", "0O17", "017", "0b101", "0B11", "1_000", "+12", "-3", "089",
    ".inf", "-.Inf", ".nan", "1e3", "1E+3", "-2.5e-3", "3.", ".5", "1_000.5", "12:30",
    "190:20:30", "2026-11-23", "2026-1-5 10:00:00", "=", "<<", "- x", "a: b", "#x", " lead",
    "trail ", "multi\nline", "'quote", '"dq', "@at", "`tick", "%pc", "!bang", "&amp", "*star",
    "[list]", "{map}", "?", "|", ">",
]


def test_yaml_quotes_every_yaml11_scalar_so_kubectl_reads_back_the_same_string():
    env = {f"V{i}": value for i, value in enumerate(YAML11_SCALARS)}
    manifest = cluster.tfjob_manifest("job", IMAGE, ["python", *YAML11_SCALARS], env=env)
    text = cluster.to_yaml(manifest)
    loaded = yaml.safe_load(text)
    container = loaded["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", *YAML11_SCALARS]
    assert all(type(arg) is str for arg in container["command"])
    assert {e["name"]: e["value"] for e in container["env"]} == env
    assert all(type(e["value"]) is str for e in container["env"])
    # Quoted, not just read back right by PyYAML: y/n, 0o17, 1e3 are plain strings to PyYAML
    # but booleans and numbers to go-yaml.
    root = yaml.compose(text)
    plain = []

    def walk(node: yaml.Node) -> None:
        if isinstance(node, yaml.ScalarNode):
            if node.value in YAML11_SCALARS and node.style not in ("'", '"', "|", ">"):
                plain.append(node.value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(key)
                walk(value)

    walk(root)
    assert plain == []
    assert "\n            - 'y'\n" in text and "\n            - '0o17'\n" in text


def test_to_yaml_keeps_numbers_and_booleans_typed_and_the_key_order():
    text = cluster.to_yaml({"b": 1, "a": [True, 2.5, None, "x"]})
    assert text == "b: 1\na:\n- true\n- 2.5\n- null\n- x\n"
    assert yaml.safe_load(text) == {"b": 1, "a": [True, 2.5, None, "x"]}


def test_a_local_cluster_describes_the_same_job_as_a_tfjob():
    local = LocalCluster(SCRIPTS / "bind_port.py", num_workers=3, args=["--x", "no"], start=False)
    job = local.tfjob_manifest("local-job", "my/image:1", chief=True)
    specs = job["spec"]["tfReplicaSpecs"]
    assert specs["Worker"]["replicas"] == 3 and specs["Chief"]["replicas"] == 1
    assert specs["Worker"]["template"]["spec"]["containers"][0]["command"] == [
        "python", "bind_port.py", "--x", "no"]
    assert schema_errors(job) == [] and operator_errors(job) == []
    assert local.processes == []  # nothing was started


def test_a_local_cluster_passes_its_extra_env_to_the_tfjob_but_no_tf_config():
    local = LocalCluster(SCRIPTS / "bind_port.py", num_workers=2,
                         env={"TF_USE_LEGACY_KERAS": "1"}, start=False)
    container = local.tfjob_manifest("local-job", "my/image:1")["spec"]["tfReplicaSpecs"][
        "Worker"]["template"]["spec"]["containers"][0]
    assert container["env"] == [{"name": "TF_USE_LEGACY_KERAS", "value": "1"}]
    overridden = local.tfjob_manifest("local-job", "my/image:1", env={})
    assert "env" not in overridden["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"][0]


def test_a_shared_volume_is_mounted_in_every_pod_from_one_claim():
    manifest = cluster.tfjob_manifest("job", IMAGE, COMMAND, num_workers=2, num_ps=1,
                                      shared_volume=("training-data", "/data"))
    assert schema_errors(manifest) == [] and operator_errors(manifest) == []
    for spec in manifest["spec"]["tfReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        assert pod["volumes"] == [{"name": "shared",
                                   "persistentVolumeClaim": {"claimName": "training-data"}}]
        assert pod["containers"][0]["volumeMounts"] == [{"name": "shared", "mountPath": "/data"}]
    claim = cluster.persistent_volume_claim("training-data", "10Gi", storage_class="nfs")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert yaml.safe_load(cluster.to_yaml(claim)) == claim


@pytest.mark.parametrize("volume, match", [
    ("training-data", "claim name, mount path"), (("Training_Data", "/data"), "DNS-1123"),
    (("data", "data"), "absolute path")])
def test_a_bad_shared_volume_is_refused_naming_the_rule(volume, match):
    with pytest.raises(ValueError, match=match):
        cluster.tfjob_manifest("job", IMAGE, COMMAND, shared_volume=volume)
    with pytest.raises(ValueError, match="quantity"):
        cluster.persistent_volume_claim("data", "ten gigs")
