"""Training-step time of float32 and mixed precision, with TF32 and XLA, measured with TensorFlow.

Usage (one command, on the machine you want figures for)::

    python benchmarks/mixed_precision.py            # every model below
    python benchmarks/mixed_precision.py --quick    # the small MLP only, fewer rounds

Each model is a Keras MLP trained by a custom ``tf.function`` step (lesson 08's
``make_loss_scaled_step``: ``scale_loss`` then ``apply``; a ``LossScaleOptimizer`` under
``mixed_float16``), built once per variant: policy (float32, mixed_float16, mixed_bfloat16) x
``jit_compile`` (off, on); on a GPU also float32 with TensorFloat-32 off (TensorFlow turns TF32 on
by default, so plain "float32" on an Ampere or later GPU already uses the tensor cores). Every
step is traced and called ``--warmup`` times first (the first call, which traces and compiles,
is never timed), then the variants are timed in interleaved rounds and the median counts; a
variant more than ``SLOW_RATIO`` times slower than the fastest is timed outside the rounds, by
the faster of two calls (``timed_rounds`` 1 in the result).

The result is written to ``benchmarks/reference/mixed_precision_<hardware>.json`` (committed:
lesson 08 shows the file that matches the learner's hardware) and names the machine: CPU model
and 16-bit flags, whether TensorFlow's oneDNN ops were on (and why), GPU name, TensorFlow and Keras
versions, and the load average while it ran. Run it with TensorFlow's defaults: leave
``TF_ENABLE_ONEDNN_OPTS`` unset unless you mean to measure the other setting.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

#: name: (input features, hidden units, classes, batch size)
MODELS = {
    "MLP 256-1024-1024-4, batch 512 (lesson 08)": (256, (1024, 1024), 4, 512),
    "MLP 512-2048-2048-10, batch 1024": (512, (2048, 2048), 10, 1024),
}
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
#: A variant more than this many times slower than the fastest is timed by the faster of two
#: calls after its warm-up, not in the rounds (``course_utils.bench.time_interleaved``'s
#: ``slow_ratio``).
SLOW_RATIO = 20


def onednn_as_tensorflow_reports_it() -> dict:
    """Whether TensorFlow's oneDNN ops are on in this process, read before the course sets any.

    ``IsMklEnabled`` reads ``TF_ENABLE_ONEDNN_OPTS`` once and keeps its answer, so asking it
    first, before ``course_utils`` is imported, fixes the process on TensorFlow's own choice.
    """
    setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    import tensorflow  # noqa: F401
    from tensorflow.python.util import _pywrap_util_port  # private, so not in a lesson

    return {"enabled": bool(_pywrap_util_port.IsMklEnabled()),
            "TF_ENABLE_ONEDNN_OPTS": setting}


def hardware(onednn: dict) -> dict:
    """The machine the figures belong to: GPU name, or CPU model with its 16-bit flags."""
    import tensorflow as tf

    from course_utils import mixed_precision

    gpus = tf.config.list_physical_devices("GPU")
    gpu_names = [tf.config.experimental.get_device_details(g).get("device_name", "GPU")
                 for g in gpus]
    cpu = mixed_precision.cpu_model_name()
    flags = [f for f, found in mixed_precision.cpu_precision_features().items() if found]
    environ = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if onednn["TF_ENABLE_ONEDNN_OPTS"] is not None:
        environ["TF_ENABLE_ONEDNN_OPTS"] = onednn["TF_ENABLE_ONEDNN_OPTS"]
    rule = mixed_precision.onednn_state(environ=environ)
    assert rule["enabled"] in (None, onednn["enabled"]), (rule, onednn)  # the rule holds
    onednn = {**onednn, "why": rule["reason"]}
    return {"hardware": gpu_names[0] if gpu_names else cpu, "gpus": gpu_names, "cpu": cpu,
            "cpu_16bit_flags": flags, "onednn": onednn, "cpu_count": os.cpu_count(),
            "tensorflow": tf.__version__, "keras": __import__("keras").__version__}


def make_step(policy: str, sizes: tuple, jit: bool):
    """A traced training step of a fresh MLP under ``policy``, and its batch."""
    import keras
    import tensorflow as tf

    import course_utils as cu

    features, hidden, classes, batch = sizes
    with cu.training.policy_scope(policy):
        model = cu.models.mlp(features, classes, hidden_units=hidden)
    optimizer = keras.optimizers.SGD(0.01)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = cu.data.teacher_classification(batch, features, classes)
    x, y = tf.constant(x), tf.constant(y)

    @tf.function(jit_compile=jit)
    def train_step():
        with tf.GradientTape() as tape:
            loss = loss_object(y, model(x, training=True))
            scaled_loss = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        return loss

    return train_step


def with_tf32(step, enabled: bool):
    """The step, run with TensorFloat-32 switched on or off (and the switch checked)."""
    import tensorflow as tf

    def run():
        tf.config.experimental.enable_tensor_float_32_execution(enabled)
        assert tf.config.experimental.tensor_float_32_execution_enabled() == enabled
        return step()

    return run


def measure(sizes: tuple, rounds: int, calls: int, warmup: int, gpu: bool) -> list[dict]:
    """Median milliseconds per step of every variant of one model."""
    from course_utils import bench

    variants = {}
    for policy in POLICIES:
        for jit in (False, True):
            tf32_choices = (False, True) if gpu and policy == "float32" else (True,)
            for tf32 in tf32_choices:
                variants[(policy, jit, tf32)] = with_tf32(make_step(policy, sizes, jit), tf32)
    timings = bench.time_interleaved({str(k): fn for k, fn in variants.items()}, repeats=rounds,
                                     warmup=warmup, calls_per_repeat=calls,
                                     slow_ratio=SLOW_RATIO)
    baseline_key = str(("float32", False, False if gpu else True))
    baseline = timings[baseline_key].median
    return [{"policy": policy, "jit_compile": jit, "tf32": tf32 if gpu else None,
             "ms_per_step": round(timings[str(key)].median * 1e3, 3),
             "speedup": round(baseline / timings[str(key)].median, 3),
             "timed_rounds": len(timings[str(key)].times)}
            for key in variants for policy, jit, tf32 in [key]]


def slug(name: str) -> str:
    """A file-name-safe form of a hardware name."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def result_name(machine: dict) -> str:
    """The result's file stem: the hardware, and on a CPU its 16-bit flags and oneDNN state."""
    if machine["gpus"]:
        return slug(machine["hardware"])
    flags = "_".join(machine["cpu_16bit_flags"]) or "no_16bit"
    onednn = "onednn_ops_on" if machine["onednn"]["enabled"] else "onednn_ops_off"
    return slug(f"{machine['hardware']} {flags} {onednn}")


def main(argv: list[str] | None = None) -> pathlib.Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small MLP only, fewer rounds")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="output file (default benchmarks/reference/mixed_precision_<hw>.json)")
    args = parser.parse_args(argv)

    onednn = onednn_as_tensorflow_reports_it()
    from course_utils.environment import import_tensorflow

    tf = import_tensorflow()
    machine = hardware(onednn)
    gpu = bool(machine["gpus"])
    models = dict(list(MODELS.items())[:1]) if args.quick else MODELS
    rounds, calls, warmup = (5, 3, 2) if args.quick else (7, 5, 3)
    start_load = os.getloadavg()[0]
    results = {}
    for name, sizes in models.items():
        print(f"timing {name} ...", flush=True)
        results[name] = measure(sizes, rounds, calls, warmup, gpu)
    tf.config.experimental.enable_tensor_float_32_execution(True)  # TensorFlow's default
    machine["load_average_1min"] = [round(start_load, 2), round(os.getloadavg()[0], 2)]
    command = "python benchmarks/mixed_precision.py" + (" --quick" if args.quick else "")
    payload = {"benchmark": "mixed_precision", "date": time.strftime("%Y-%m-%d"),
               "command": command,
               "machine": machine, "method": {"rounds": rounds, "calls_per_round": calls,
                                              "warmup_calls": warmup, "statistic": "median",
                                              "slow_ratio": SLOW_RATIO},
               "baseline": "float32, no XLA" + (", TF32 off" if gpu else ""),
               "results": results}
    out = args.out or REPO / "benchmarks" / "reference" / (
        f"mixed_precision_{result_name(machine)}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
