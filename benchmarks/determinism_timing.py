"""Lesson 07, section 6's timing with op determinism on and off, each in a fresh process.

Usage (on the machine you want figures for)::

    python benchmarks/determinism_timing.py [--pairs 4]

Lesson 07 times its accumulation loop (``k`` = 1, 2, 4, 8 micro-batches per update of 1024
examples, the lesson's MLP, plain SGD, two ``tf.function``s called from Python) in the same
process as its comparisons, which need op determinism on; TensorFlow has no public switch to turn
it off again. This script runs that timing in fresh processes, alternately with TensorFlow's
defaults and with ``tf.config.experimental.enable_op_determinism()``, ``--pairs`` times, each run
15 interleaved rounds, median kept. Everything else is TensorFlow's defaults. The result, with
the machine (CPU model, TensorFlow version, load average), goes to
``benchmarks/reference/determinism_timing_<cpu>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import numpy as np
import course_utils as cu
cu.setup(seed=42, deterministic=sys.argv[1] == "on")
import tensorflow as tf, keras
features, labels = cu.data.teacher_classification(1024, 32, 10)
loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
def make(k):
    model = cu.models.mlp(32, 10, hidden_units=(256, 256)); opt = keras.optimizers.SGD(0.1)
    sums = [tf.Variable(tf.zeros_like(v), trainable=False) for v in model.trainable_variables]
    @tf.function
    def accumulate(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_object(y, model(x, training=True))) / k
        for s, g in zip(sums, tape.gradient(loss, model.trainable_variables)):
            s.assign_add(g)
    @tf.function
    def apply():
        opt.apply_gradients(zip([tf.identity(s) for s in sums], model.trainable_variables))
        for s in sums:
            s.assign(tf.zeros_like(s))
    micro = list(tf.data.Dataset.from_tensor_slices((features, labels)).batch(1024 // k))
    def one():
        for x, y in micro:
            accumulate(x, y)
        apply()
        tf.test.experimental.sync_devices()
    one()
    return one
updates = {k: make(k) for k in [1, 2, 4, 8]}
seconds = {k: [] for k in updates}
for _ in range(15):
    for k, one in updates.items():
        start = time.perf_counter(); one(); seconds[k].append(time.perf_counter() - start)
print("RESULT", json.dumps({k: 1e3 * float(np.median(s)) for k, s in seconds.items()}))
"""


def cpu_model() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def write_reference(stem: str, command: str, **fields: object) -> pathlib.Path:
    """Write ``fields`` with the command and the machine (CPU model, cores, TensorFlow) to
    ``benchmarks/reference/<stem>_<cpu>.json``; return its path."""
    import tensorflow as tf

    result = {"command": command, "cpu": cpu_model(), "cpu_count": os.cpu_count(),
              "tensorflow": tf.__version__, **fields}
    name = re.sub(r"[^a-z0-9]+", "_", cpu_model().lower()).strip("_")
    path = REPO / "benchmarks" / "reference" / f"{stem}_{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    pairs = parser.parse_args().pairs
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    runs = []
    for index in range(pairs):
        order = ("off", "on") if index % 2 == 0 else ("on", "off")  # alternate who goes first
        for mode in order:
            out = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, check=True,
                                 capture_output=True, text=True).stdout
            line = next(x for x in out.splitlines() if x.startswith("RESULT"))
            runs.append({"determinism": mode, "median_ms_by_k": json.loads(line[7:]),
                         "load_average": os.getloadavg()})
            print(runs[-1])
    write_reference("determinism_timing",
                    "python benchmarks/determinism_timing.py --pairs " + str(pairs), runs=runs)

if __name__ == "__main__":
    main()
