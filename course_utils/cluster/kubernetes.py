"""The same job on Kubernetes: a Kubeflow ``TFJob`` manifest, checked, and its YAML.

:func:`tfjob_manifest` refuses what Kubeflow's training operator (v1.9) or the API server would
refuse, with a ``ValueError`` naming the rule and the bad value, so the engineer learns it here
and not from a failed job. :func:`to_yaml` writes the manifest with PyYAML and quotes every
string that a YAML 1.1 reader (kubectl's) would otherwise read as a boolean, number or null.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

__all__ = ["RESTART_POLICIES", "SHARED_VOLUME", "persistent_volume_claim", "tfjob_manifest",
           "to_yaml"]

#: Restart policies the training operator knows (``kubeflow.org/v1`` ``RestartPolicy``).
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")

_MAX_LABEL = 63
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: The name of the pod volume :func:`tfjob_manifest` mounts for ``shared_volume``.
SHARED_VOLUME = "shared"
# A non-negative Kubernetes quantity ("500m", "2", "4Gi", "1e3"), as the CRD's pattern has it.
_QUANTITY = re.compile(
    r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+))?"
)
_DNS1035_RULE = (
    "a DNS-1035 label: lower-case letters, digits and '-', a letter first, a letter or digit "
    f"last, at most {_MAX_LABEL} characters"
)


def _is_label(text: Any, pattern: re.Pattern[str]) -> bool:
    return isinstance(text, str) and len(text) <= _MAX_LABEL and bool(pattern.fullmatch(text))


def _count(what: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be a whole number of at least {minimum}, got {value!r}")
    return value


def _replica_counts(num_workers: Any, num_ps: Any, chief: Any, num_evaluators: Any) -> dict:
    if chief not in (True, False):  # also accepts 0 and 1
        raise ValueError(f"chief is one task or none (True or False), got {chief!r}")
    counts = {
        "Chief": int(chief),
        "Worker": _count("num_workers (a TFJob needs a worker)", num_workers, 1),
        "PS": _count("num_ps", num_ps, 0),
        "Evaluator": _count("num_evaluators", num_evaluators, 0),
    }
    return {kind: count for kind, count in counts.items() if count}


def _check_names(name: Any, namespace: Any, counts: Mapping[str, int]) -> None:
    if not _is_label(name, _DNS1035):
        raise ValueError(f"job name {name!r} is not a valid Kubernetes name: {_DNS1035_RULE}")
    for kind, count in counts.items():
        service = f"{name}-{kind.lower()}-{count - 1}"  # the operator's Service per replica
        if len(service) > _MAX_LABEL:
            raise ValueError(
                f"job name {name!r} is too long: the operator names a Service {service!r} "
                f"({len(service)} characters) after it, and a Service name is {_DNS1035_RULE}"
            )
    if namespace is not None and not _is_label(namespace, _DNS1123):
        raise ValueError(
            f"namespace {namespace!r} is not a DNS-1123 label: lower-case letters, digits and "
            f"'-', a letter or digit first and last, at most {_MAX_LABEL} characters"
        )


def _string(what: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{what} must be a string (or a number), got {value!r}")
    return str(value)


def _command(command: Any) -> list[str]:
    if isinstance(command, (str, bytes)):
        raise ValueError(
            f"command must be a list of arguments such as ['python', 'train.py'], got {command!r}"
        )
    return [_string(f"command[{i}]", item) for i, item in enumerate(command)]


def _env(env: Mapping[str, Any] | None) -> list[dict[str, str]]:
    variables = []
    for key, value in (env or {}).items():
        if key == "TF_CONFIG":
            raise ValueError(
                "env must not set 'TF_CONFIG': the training operator writes it into every pod "
                "from the TFJob's replicas (a hand-made one would describe the wrong cluster)"
            )
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise ValueError(
                f"environment variable name {key!r} is not valid: letters, digits, '_', '-' "
                "and '.', not starting with a digit"
            )
        variables.append({"name": key, "value": _string(f"env[{key!r}]", value)})
    return variables


def _limits(gpus: Any, cpu: Any, memory: Any) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if _count("gpus_per_worker", gpus, 0):
        limits["nvidia.com/gpu"] = gpus
    for what, value in (("cpu", cpu), ("memory", memory)):
        if value is None:
            continue
        if isinstance(value, bool) or not _QUANTITY.fullmatch(str(value)):
            raise ValueError(
                f"{what} {value!r} is not a Kubernetes quantity: a non-negative number with an "
                "optional suffix, such as '500m', '2', '4Gi'"
            )
        # The CRD allows an integer or a string here: 0.5 would be refused, '0.5' is a quantity.
        limits[what] = value if isinstance(value, int) else str(value)
    return limits


def _shared_volume(shared_volume: Any) -> tuple[str, str] | None:
    """(claim name, mount path) of a PersistentVolumeClaim every pod mounts, checked."""
    if shared_volume is None:
        return None
    if (not isinstance(shared_volume, (tuple, list)) or len(shared_volume) != 2):
        raise ValueError(
            "shared_volume is (claim name, mount path), such as ('training-data', '/data'), "
            f"got {shared_volume!r}"
        )
    claim, path = shared_volume
    if not (isinstance(claim, str) and len(claim) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(claim)):
        raise ValueError(
            f"claim name {claim!r} is not a DNS-1123 subdomain: lower-case letters, digits, '-' "
            "and '.', a letter or digit first and last, at most 253 characters"
        )
    if not (isinstance(path, str) and path.startswith("/") and ":" not in path):
        raise ValueError(f"mount path {path!r} must be an absolute path without ':'")
    return claim, path


def persistent_volume_claim(
    name: str, size: str, *, namespace: str | None = None, storage_class: str | None = None
) -> dict:
    """A ``PersistentVolumeClaim`` (v1) that every pod of a job can mount read-write.

    ``ReadWriteMany``: the chief writes checkpoints that a restarted pod, on any node, reads;
    the storage class must support it (an NFS or a cloud file store, not a node's disk).
    """
    if not (isinstance(name, str) and len(name) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(name)):
        raise ValueError(f"claim name {name!r} is not a DNS-1123 subdomain")
    if isinstance(size, bool) or not _QUANTITY.fullmatch(str(size)):
        raise ValueError(f"size {size!r} is not a Kubernetes quantity such as '10Gi'")
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"],
                            "resources": {"requests": {"storage": str(size)}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata,
            "spec": spec}


def tfjob_manifest(
    name: str,
    image: str,
    command: Sequence[str],
    *,
    num_workers: int = 2,
    num_ps: int = 0,
    chief: bool = False,
    num_evaluators: int = 0,
    namespace: str | None = None,
    gpus_per_worker: int = 0,
    cpu: str | None = None,
    memory: str | None = None,
    env: Mapping[str, str] | None = None,
    restart_policy: str = "OnFailure",
    shared_volume: tuple[str, str] | None = None,
    active_deadline_seconds: int | None = None,
) -> dict:
    """A Kubeflow training-operator ``TFJob`` (kubeflow.org/v1) for the same job.

    The operator sets ``TF_CONFIG`` in every pod, so the script that ran on localhost runs
    unchanged. Write it with :func:`to_yaml` and apply it with ``kubectl apply -f``. GPUs, CPU
    and memory limits go to the chief, the workers and the evaluators, not to parameter servers.
    Raises ``ValueError`` (naming the rule and the value) for input the operator or the API
    server would refuse. ``shared_volume=(claim, path)`` mounts the PersistentVolumeClaim
    ``claim`` (see :func:`persistent_volume_claim`) at ``path`` in every pod: the storage the
    chief checkpoints into and every restarted pod reads. ``active_deadline_seconds`` is the
    job's deadline from outside (``runPolicy.activeDeadlineSeconds``): the operator ends a job
    still running then, a hung worker included.
    """
    counts = _replica_counts(num_workers, num_ps, chief, num_evaluators)
    _check_names(name, namespace, counts)
    if not isinstance(image, str) or not image.strip() or image != image.strip():
        raise ValueError(
            f"image {image!r} is not usable: every container needs a non-empty image name "
            "without leading or trailing spaces"
        )
    if restart_policy not in RESTART_POLICIES:
        raise ValueError(
            f"restart_policy must be one of {', '.join(RESTART_POLICIES)} (the training "
            f"operator's restart policies), got {restart_policy!r}"
        )
    arguments = _command(command)
    variables = _env(env)
    limits = _limits(gpus_per_worker, cpu, memory)
    volume = _shared_volume(shared_volume)
    run_policy: dict[str, Any] = {"cleanPodPolicy": "None"}
    if active_deadline_seconds is not None:
        run_policy["activeDeadlineSeconds"] = _count(
            "active_deadline_seconds", active_deadline_seconds, 1)

    def replica(count: int, with_limits: bool) -> dict:
        container: dict[str, Any] = {
            "name": "tensorflow",  # the training operator requires this container name
            "image": image,
            "command": list(arguments),
        }
        if variables:
            container["env"] = [dict(variable) for variable in variables]
        if limits and with_limits:
            container["resources"] = {"limits": dict(limits)}
        pod: dict[str, Any] = {"containers": [container]}
        if volume is not None:
            container["volumeMounts"] = [{"name": SHARED_VOLUME, "mountPath": volume[1]}]
            pod["volumes"] = [{"name": SHARED_VOLUME,
                               "persistentVolumeClaim": {"claimName": volume[0]}}]
        return {
            "replicas": count,
            "restartPolicy": restart_policy,
            "template": {"spec": pod},
        }

    specs = {kind: replica(count, kind != "PS") for kind, count in counts.items()}
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata,
        "spec": {"runPolicy": run_policy, "tfReplicaSpecs": specs},
    }


class _Yaml11SafeDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting also the YAML 1.1 scalars PyYAML itself reads as strings."""


# PyYAML already quotes yes/no/on/off/true/null/~, 0x10, 017, 1_000, .inf, 12:30 and dates. A
# YAML 1.1 reader such as kubectl's (go-yaml) also reads y/n as booleans and, through Go's number
# parser, 0o17, 0X1F, 0B101 as integers and 1e3 or 089 as floats: those get quoted too.
_Yaml11SafeDumper.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN")
)
_Yaml11SafeDumper.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^[-+]?0(?:[xX][0-9a-fA-F_]+|[oO][0-7_]+|[bB][01_]+)$"),
    list("-+0"),
)
_Yaml11SafeDumper.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9_]+)?$"),
    list("-+.0123456789"),
)


def to_yaml(value: Any) -> str:
    """YAML text of a manifest (PyYAML), every string quoted where YAML 1.1 would misread it."""
    return yaml.dump(
        value, Dumper=_Yaml11SafeDumper, sort_keys=False, default_flow_style=False, width=1000
    )
