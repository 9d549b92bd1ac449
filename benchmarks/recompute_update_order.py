"""How often ``tf.recompute_grad`` and a Keras optimizer's update in one ``tf.function`` give
wrong weights, with and without the update ordered after the gradients.

Usage (on the machine you want figures for)::

    python benchmarks/recompute_update_order.py [--runs 60] [--busy 3]

One training step, in one ``tf.function``: a two-layer model of plain ``tf.Variable`` s run
inside ``tf.recompute_grad``, ``GradientTape``, Keras 3's ``SGD.apply_gradients``, the loss
returned; two steps per run, compared with the same two steps in eager mode. Three ways, each
``--runs`` times in this process while ``--busy`` processes spin the cores
(``tests/tools/busy.py``):

- ``plain``: the step as written above (TensorFlow's defaults);
- ``ordered``: the update inside ``tf.control_dependencies(gradients)``;
- ``no_dependency_optimizer``: the plain step with Grappler's dependency optimizer turned off
  (``tf.config.optimizer.set_experimental_options``), a diagnosis of the cause, not a fix.

The traced graph orders every update after every read of its variable (automatic control
dependencies); the wrong runs are the update of a weight running before the recomputation
read it, so the gradients of the layers below use the new weight. The result, with the
machine, goes to ``benchmarks/reference/recompute_update_order_<cpu>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from determinism_timing import write_reference  # noqa: E402

WAYS = ("plain", "ordered", "no_dependency_optimizer")


def wrong_runs(way: str, runs: int) -> list[float]:
    """The largest weight error of each of ``runs`` runs of the step written ``way``."""
    import keras
    import numpy as np
    import tensorflow as tf

    tf.config.optimizer.set_experimental_options(
        {"dependency_optimization": way != "no_dependency_optimizer"})
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(8, 16)).astype("float32"))
    y = tf.constant(rng.integers(0, 4, 8))
    initial = [rng.normal(size=s).astype("float32") * 0.3 for s in [(16, 32), (32,), (32, 4),
                                                                     (4,)]]

    def loss_of(logits_of: object) -> object:
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits_of(x)))

    def train(in_function: bool) -> list:
        weights = [tf.Variable(w) for w in initial]
        optimizer = keras.optimizers.SGD(0.5)
        optimizer.build(weights)

        def forward(t: object) -> object:
            return tf.nn.relu(t @ weights[0] + weights[1]) @ weights[2] + weights[3]

        def step() -> object:
            with tf.GradientTape() as tape:
                loss = loss_of(tf.recompute_grad(forward) if in_function else forward)
            gradients = tape.gradient(loss, weights)
            with tf.control_dependencies(gradients if way == "ordered" else []):
                optimizer.apply_gradients(zip(gradients, weights, strict=True))
            return loss

        step = tf.function(step) if in_function else step
        for _ in range(2):
            step()
        return [w.numpy() for w in weights]

    truth = train(in_function=False)
    errors = []
    for _ in range(runs):
        trained = train(in_function=True)
        errors.append(max(float(np.max(np.abs(a - b)))
                          for a, b in zip(trained, truth, strict=True)))
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--busy", type=int, default=3, help="processes spinning the cores")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one way, in a child
    args = parser.parse_args()
    if args.way:
        print("RESULT", json.dumps(wrong_runs(args.way, args.runs)))
        return
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    busy = [subprocess.Popen([sys.executable, str(REPO / "tests/tools/busy.py"),
                              "--seconds", "1800", "--max-off", "0.05"])
            for _ in range(args.busy)]
    try:
        ways = {}
        for way in WAYS:  # a fresh process each: Grappler's options are per process
            out = subprocess.run([sys.executable, __file__, "--way", way, "--runs",
                                  str(args.runs)], env=env, check=True, capture_output=True,
                                 text=True).stdout
            errors = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT"))[7:])
            ways[way] = {"runs": len(errors), "wrong": sum(e > 1e-5 for e in errors),
                         "largest_error": max(errors), "load_average": os.getloadavg()}
            print(way, ways[way])
    finally:
        for process in busy:
            process.terminate()
    import keras

    write_reference("recompute_update_order", f"python benchmarks/recompute_update_order.py "
                    f"--runs {args.runs} --busy {args.busy}", keras=keras.__version__, ways=ways)

if __name__ == "__main__":
    main()
