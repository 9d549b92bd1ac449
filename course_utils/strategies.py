"""One place to build any ``tf.distribute`` strategy by name, with a clear fallback.

Strategies are cached per device set: every new ``MirroredStrategy`` in one process restarts its
collective keys, and a later strategy that issues other all-reduces than an earlier one aborts
TensorFlow ("Shape mismatch in the collective instance 100"). Asking twice for the same strategy
therefore returns the same object, and strategies over different device sets (1, 2 and 4
replicas in one notebook) get collective keys of their own, so they can all train, beside one
``tf.distribute.MirroredStrategy(...)`` built by hand (it keeps TensorFlow's own key range).
"""

from __future__ import annotations

import json
import os
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["STRATEGY_NAMES", "replica_devices", "make_strategy"]

STRATEGY_NAMES = (
    "default",
    "one_device",
    "mirrored",
    "multi_worker",
    "parameter_server",
    "tpu",
    "auto",
)

_CACHE: dict[tuple, Any] = {}


def _say(message: str, verbose: bool) -> None:
    if verbose:
        print(message)


def replica_devices(num_replicas: int | None = None) -> list[str]:
    """The devices a data-parallel strategy should use here: every GPU, else every logical CPU.

    With ``num_replicas``, the first that many; asking for more than exist raises ValueError.
    """
    tf = _tf()
    devices = [d.name for d in tf.config.list_logical_devices("GPU")]
    if not devices:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if num_replicas is None:
        return devices
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    if num_replicas > len(devices):
        raise ValueError(
            f"asked for {num_replicas} replicas but only {len(devices)} device(s) exist here "
            f"({', '.join(devices)}). Create more logical devices with "
            f"cu.setup(logical_devices={num_replicas}) in a fresh kernel."
        )
    return devices[:num_replicas]


#: Collective group keys reserved for each device set (TensorFlow's own tests use this step).
_COLLECTIVE_KEY_STEP = 100_000


def _mirrored(num_replicas: int | None, verbose: bool) -> Any:
    tf = _tf()
    devices = tuple(replica_devices(num_replicas))
    key = ("mirrored", devices)
    if key not in _CACHE:
        # Every MirroredStrategy numbers its collective groups from the same start, so a
        # strategy over 2 devices and one over 4 would both use group 1: after the 4-device
        # one has all-reduced, the 2-device one's first all-reduce fails with InternalError
        # ("... is joining a group with size2, but that group has size 4 (group_key=1)", as
        # TensorFlow 2.21 prints it). Give each device set its own range;
        # range 0 stays free for one strategy a lesson builds by hand with the raw API.
        strategy_class = tf.distribute.MirroredStrategy
        previous = strategy_class._collective_key_base  # noqa: SLF001
        strategy_class._collective_key_base = _COLLECTIVE_KEY_STEP * (1 + sum(  # noqa: SLF001
            1 for cached in _CACHE if cached[0] == "mirrored"))
        try:
            _CACHE[key] = strategy_class(devices=list(devices))
        finally:
            strategy_class._collective_key_base = previous  # noqa: SLF001
    _say(f"MirroredStrategy over {len(devices)} device(s): {', '.join(devices)}", verbose)
    return _CACHE[key]


def _tpu_system_initialized() -> bool:
    """Whether this process already initialized a TPU system (lesson 05's raw cell does).

    ``initialize_tpu_system`` run twice reinitializes the TPU ("Reinitializing the TPU can cause
    previously created variables on TPU to be lost", ``tensorflow/python/tpu/
    tpu_strategy_util.py``), which keeps the systems it initialized in the table read here.
    """
    try:
        from tensorflow.python.tpu.tpu_strategy_util import get_initialized_tpu_systems
    except ImportError:  # a TensorFlow without it: initialize, as before
        return False
    return bool(get_initialized_tpu_systems())


def _tpu(verbose: bool, fallback: str) -> Any:
    """A TPUStrategy when a TPU is attached; otherwise the ``fallback`` strategy, said plainly."""
    from course_utils.devices import tpu_address

    tf = _tf()
    address = tpu_address()
    if address is None:
        _say(f"No TPU on this machine: falling back to the '{fallback}' strategy.", verbose)
        return make_strategy(fallback, verbose=verbose)
    key = ("tpu", address)
    if key in _CACHE:
        return _CACHE[key]
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
        tf.config.experimental_connect_to_cluster(resolver)
        if not _tpu_system_initialized():  # once per process: again would reset the TPU
            tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    except (ValueError, tf.errors.NotFoundError, tf.errors.UnavailableError) as error:
        from course_utils.tpu import tpu_failure_reason

        reason = tpu_failure_reason(str(error), attached=True)  # the environment says one is
        _say(
            f"TPU at {address!r}: {reason} "
            f"({type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}); "
            f"falling back to the '{fallback}' strategy.",
            verbose,
        )
        return make_strategy(fallback, verbose=verbose)
    _CACHE[key] = strategy
    _say(f"TPUStrategy with {strategy.num_replicas_in_sync} replicas (TPU devices) at {address}",
         verbose)
    return strategy


def _multi_worker(verbose: bool, timeout_seconds: float | None) -> Any:
    tf = _tf()
    tf_config = os.environ.get("TF_CONFIG")
    if not tf_config:
        raise ValueError(
            "the 'multi_worker' strategy needs TF_CONFIG, set before the strategy is created. "
            "In a notebook, run the workers as subprocesses with cu.cluster (lesson 03)."
        )
    key = ("multi_worker", tf_config)
    if key not in _CACHE:
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=timeout_seconds
        )
        _CACHE[key] = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    task = json.loads(tf_config).get("task", {})
    _say(f"MultiWorkerMirroredStrategy as {task.get('type')}:{task.get('index')}", verbose)
    return _CACHE[key]


def _parameter_server(cluster_resolver: Any, verbose: bool) -> Any:
    tf = _tf()
    if cluster_resolver is None:
        if not os.environ.get("TF_CONFIG"):
            raise ValueError(
                "the 'parameter_server' strategy needs a cluster: pass cluster_resolver= (for "
                "example from cu.cluster, lesson 04) or set TF_CONFIG."
            )
        cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)
    _say("ParameterServerStrategy: schedule steps with ClusterCoordinator", verbose)
    return strategy


def make_strategy(
    name: str = "auto",
    num_replicas: int | None = None,
    *,
    verbose: bool = True,
    cluster_resolver: Any = None,
    timeout_seconds: float | None = 60.0,
) -> Any:
    """Build a ``tf.distribute`` strategy by name and say in one line what it is.

    Names: ``default`` (no distribution), ``one_device`` (the first GPU, else the CPU),
    ``mirrored`` (every GPU, else every logical CPU, or the first ``num_replicas``),
    ``multi_worker`` (needs ``TF_CONFIG``), ``parameter_server`` (needs ``cluster_resolver``
    or ``TF_CONFIG``), ``tpu`` (falls back to ``mirrored`` in well under a second when no TPU is
    attached) and ``auto`` (TPU, else several devices mirrored, else default).
    """
    if name not in STRATEGY_NAMES:
        raise ValueError(
            f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGY_NAMES)}"
        )
    tf = _tf()
    if name == "default":
        _say("Default strategy: one device, no distribution", verbose)
        return tf.distribute.get_strategy()
    if name == "one_device":
        device = replica_devices()[0]
        key = ("one_device", device)
        if key not in _CACHE:
            _CACHE[key] = tf.distribute.OneDeviceStrategy(device)
        _say(f"OneDeviceStrategy on {device}", verbose)
        return _CACHE[key]
    if name == "mirrored":
        return _mirrored(num_replicas, verbose)
    if name == "multi_worker":
        return _multi_worker(verbose, timeout_seconds)
    if name == "parameter_server":
        return _parameter_server(cluster_resolver, verbose)
    if name == "tpu":
        return _tpu(verbose, fallback="mirrored")
    # auto
    from course_utils.devices import tpu_available

    if tpu_available():
        return _tpu(verbose, fallback="mirrored")
    if len(replica_devices()) > 1 or num_replicas:
        return _mirrored(num_replicas, verbose)
    _say("One device here: using the default strategy", verbose)
    return tf.distribute.get_strategy()
