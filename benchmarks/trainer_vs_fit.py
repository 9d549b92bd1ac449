"""Step time of course_utils.training.Trainer against Keras ``fit``, and cluster start-up time.

Usage::

    python benchmarks/trainer_vs_fit.py            # 1 device and 2 replicas, then the cluster
    python benchmarks/trainer_vs_fit.py --quick    # fewer steps and repeats

Each configuration runs in its own subprocess (logical devices are fixed once TensorFlow starts).
The same model, optimizer, data and steps are timed with ``model.fit`` and ``Trainer.fit``,
alternately, several times; the ratio of the medians is reported (goal: <= 1.05). The second part
starts a local 2-worker cluster several times and measures the seconds from ``start()`` until a
worker has finished its first training step (budget: <= 20 s), and checks that every process is
gone afterwards. Results go to ``benchmarks/results/trainer_vs_fit.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}


def measure(replicas: int, steps: int, repeats: int, batch: int) -> dict:
    """In this process: time fit and Trainer on ``replicas`` logical CPUs (1 = default strategy)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * max(replicas, 1)
    )
    import keras
    import numpy as np

    from course_utils.training import Trainer

    if replicas == 1:
        strategy = tf.distribute.get_strategy()
    else:
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    features, classes = 256, 10
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 8, features)).astype("float32")
    y = rng.integers(0, classes, size=(batch * 8,)).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    data = data.cache().repeat().prefetch(tf.data.AUTOTUNE)

    def model_fn() -> keras.Model:
        return keras.Sequential(
            [
                keras.Input((features,)),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(classes),
            ]
        )

    def optimizer_fn() -> keras.optimizers.Optimizer:
        return keras.optimizers.SGD(0.01)

    def loss_fn(y_true, logits):
        return keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True)

    with strategy.scope():
        model = model_fn()
        model.compile(
            optimizer=optimizer_fn(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
        )
    trainer = Trainer(model_fn, optimizer_fn, loss_fn, strategy=strategy, verbose=0)

    def run_fit() -> None:
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)

    def run_trainer() -> None:
        trainer.fit(data, epochs=1, steps_per_epoch=steps)

    run_fit()  # warm-up: tracing
    run_trainer()
    fit_times, trainer_times = [], []
    for _ in range(repeats):
        for runner, times in ((run_fit, fit_times), (run_trainer, trainer_times)):
            start = time.perf_counter()
            runner()
            times.append((time.perf_counter() - start) / steps)
    fit_step, trainer_step = statistics.median(fit_times), statistics.median(trainer_times)
    return {
        "replicas": replicas,
        "strategy": type(strategy).__name__,
        "global_batch": batch,
        "steps_per_run": steps,
        "repeats": repeats,
        "fit_step_ms": round(fit_step * 1e3, 3),
        "trainer_step_ms": round(trainer_step * 1e3, 3),
        "ratio_trainer_over_fit": round(trainer_step / fit_step, 3),
        "fit_step_ms_all": [round(t * 1e3, 3) for t in fit_times],
        "trainer_step_ms_all": [round(t * 1e3, 3) for t in trainer_times],
    }


WORKER_SCRIPT = textwrap.dedent(
    """
    import keras, numpy as np, tensorflow as tf
    import course_utils.cluster as cluster
    from course_utils.training import Trainer

    strategy = cluster.worker_strategy()
    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
    trainer = Trainer(
        lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)]),
        lambda: keras.optimizers.SGD(0.1),
        lambda t, p: keras.losses.sparse_categorical_crossentropy(t, p, from_logits=True),
        strategy=strategy, verbose=0,
    )
    trainer.fit(data, epochs=1, steps_per_epoch=1)
    print("first step done", flush=True)
    """
)


def measure_cluster(repeats: int) -> dict:
    """Seconds from LocalCluster start to a finished first step, and what is left after."""
    import psutil

    from course_utils.cluster import LocalCluster

    times, leftovers = [], []
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "worker.py"
        script.write_text(WORKER_SCRIPT)
        for _ in range(repeats):
            with LocalCluster(script, num_workers=2, timeout=120, stream=False) as cluster:
                times.append(cluster.wait_for("first step done", timeout=120))
                cluster.wait()
            leftovers += [p for p in cluster.pids if psutil.pid_exists(p)]
    return {
        "num_workers": 2,
        "repeats": repeats,
        "start_to_first_step_s": round(statistics.median(times), 2),
        "start_to_first_step_s_all": [round(t, 2) for t in times],
        "processes_left": len(leftovers),
        "budget_s": 20,
    }


def main(argv: list[str] | None = None) -> int:
    """Run every configuration in a subprocess and write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--skip-cluster", action="store_true")
    args = parser.parse_args(argv)
    steps = args.steps or (20 if args.quick else 60)
    repeats = args.repeats or (3 if args.quick else 7)
    if args.child is not None:
        print("RESULT " + json.dumps(measure(args.child, steps, repeats, args.batch)), flush=True)
        return 0
    env = dict(os.environ, **QUIET)
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "goal_ratio": 1.05,
        "runs": [],
    }
    for replicas in (1, 2):
        child = subprocess.run(
            [sys.executable, __file__, "--child", str(replicas), "--steps", str(steps),
             "--repeats", str(repeats), "--batch", str(args.batch)],
            capture_output=True, text=True, env=env, check=False,
        )
        lines = [ln for ln in child.stdout.splitlines() if ln.startswith("RESULT ")]
        if child.returncode != 0 or not lines:
            print(child.stdout[-2000:], child.stderr[-4000:], file=sys.stderr)
            return 1
        run = json.loads(lines[-1][len("RESULT ") :])
        results["runs"].append(run)
        print(f"{replicas} replica(s): fit {run['fit_step_ms']} ms/step, Trainer "
              f"{run['trainer_step_ms']} ms/step, ratio {run['ratio_trainer_over_fit']}")
    if not args.skip_cluster:
        results["cluster"] = measure_cluster(2 if args.quick else 3)
        print(f"local 2-worker cluster: {results['cluster']['start_to_first_step_s']} s from start "
              f"to first step; processes left: {results['cluster']['processes_left']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "trainer_vs_fit.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
