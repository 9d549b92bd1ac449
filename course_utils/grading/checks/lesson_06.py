"""Checks of lesson 06's exercises (registered by name with ``@register``).

* ``check_place_two_towers(place_two_towers)``: two fresh towers and a head, run with the
  towers on two devices the check chooses; placement read from the returned tensors' devices,
  the output compared with the unplaced model.
* ``check_gpipe_bubble(gpipe_bubble)``: the GPipe formula (K−1)/(M+K−1), exactly.
* ``check_bubble_from_events(bubble_from_events)``: the idle fraction from timestamps. Exact on
  simulated schedules (a deterministic proxy: equal tasks in GPipe's slots give the formula),
  and on a real run of the check's own 2 stages with one micro-batch: equal to the course's
  count from the same timestamps (1e-9), and never below the formula (a one-sided, structural
  tolerance: with one micro-batch at most one stage works at a time, so the idle fraction is at
  least (K−1)/K whatever the load). How far above the formula it lands is not graded: on a
  busy machine it measured 0.651 against 0.500 during a loaded ``make test``.
* ``check_shard_dense_rows(shard_dense_rows)``: a dense kernel sharded by rows on the check's
  mesh: the kernel's layout, the result's mesh and values against the unsharded layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_utils.environment import import_tensorflow as _tf  # quiet, on first use
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = [
    "check_bubble_from_events",
    "check_gpipe_bubble",
    "check_place_two_towers",
    "check_shard_dense_rows",
]

def _devices() -> list[str]:
    tf = _tf()
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < 2:
        raise AssertionError("this check needs at least 2 logical devices: run the set-up cell "
                             "(cu.setup(logical_devices=4, ...)) first, in a fresh kernel")
    return devices


def _short(name: str) -> str:
    return name.rsplit("device:", 1)[-1]


# --- Exercise 1 · two towers on two devices ----------------------------------------------------


def _tower_problem(rng: Any) -> dict[str, Any]:
    import keras

    data = np.random.default_rng(rng.randint(0, 2**31 - 1))
    n, a_in, b_in = rng.randint(3, 9), rng.randint(3, 8), rng.randint(3, 8)
    units = rng.randint(4, 10)
    tower_a = keras.Sequential([keras.Input((a_in,)), keras.layers.Dense(units, "relu")])
    tower_b = keras.Sequential([keras.Input((b_in,)), keras.layers.Dense(units, "tanh")])
    head = keras.Sequential([keras.Input((2 * units,)), keras.layers.Dense(rng.randint(1, 4))])
    x_a = data.normal(size=(n, a_in)).astype("float32")
    x_b = data.normal(size=(n, b_in)).astype("float32")
    return {"towers": (tower_a, tower_b, head), "x": (x_a, x_b)}


@register
def check_place_two_towers(fn: Any) -> bool:
    """Check ``place_two_towers(tower_a, tower_b, head, x_a, x_b, devices)``"""
    tf = _tf()
    rng = fresh_rng()
    devices = _devices()

    def case(pair: tuple[str, str]) -> Case:
        problem = _tower_problem(rng)
        tower_a, tower_b, head = problem["towers"]
        x_a, x_b = problem["x"]
        expected = head(tf.concat([tower_a(x_a), tower_b(x_b)], axis=1)).numpy()

        def verify(got: Any) -> str | None:
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                return "return the three tensors (embedding_a, embedding_b, output)"
            wanted = [pair[0], pair[1], pair[1]]
            names = ["embedding_a", "embedding_b", "output"]
            for name, tensor, device in zip(names, got, wanted, strict=True):
                where = _short(getattr(tensor, "device", "") or "")
                if where != _short(device):
                    return (f"TensorFlow says {name} was computed on {where or 'no device'}, "
                            f"expected {_short(device)} (tensor.device of an eager tensor)")
            error = float(np.abs(np.asarray(got[2]) - expected).max())
            if error > 1e-5:
                return f"the output differs from head(concat(tower_a, tower_b)) by {error:.2e}"
            return None

        return Case(args=(tower_a, tower_b, head, x_a, x_b, list(pair)), verify=verify,
                    label=f"(devices={[_short(d) for d in pair]})")

    pairs = [(devices[0], devices[1]), (devices[-1], devices[0])]
    return run_check(
        "place_two_towers", fn, [case(p) for p in pairs],
        hint="run tower_a under `with tf.device(devices[0])`, tower_b and the head (on the "
             "concatenated embeddings, axis 1) under `with tf.device(devices[1])` "
             "(lesson 06, section 2).")


# --- Exercise 2 · the bubble: formula and measurement -----------------------------------------


@register
def check_gpipe_bubble(fn: Any) -> bool:
    """Check ``gpipe_bubble(num_stages, num_micro_batches)``: (K−1)/(M+K−1) exactly."""
    rng = fresh_rng()
    pairs = [(4, 4), (1, 5), (2, 1)] + [(rng.randint(2, 16), rng.randint(1, 64)) for _ in range(4)]
    cases = [Case(args=(k, m), expected=(k - 1) / (m + k - 1)) for k, m in pairs]
    return run_check("gpipe_bubble", fn, cases, rtol=1e-12,
                     hint="a stage works M slots out of M + K − 1 (lesson 06, section 3).")


def _simulated_events(k: int, m: int, duration: float, gap: float) -> list[Any]:
    """GPipe's schedule as events: every task ``duration`` long, slots ``duration + gap`` apart."""
    from course_utils.parallel.pipeline import Event, gpipe_schedule

    return [Event(t.stage, t.micro_batch, t.phase, t.slot * (duration + gap),
                  t.slot * (duration + gap) + duration) for t in gpipe_schedule(k, m)]


def _real_run(k: int, m: int) -> list[Any]:
    """Events of a real GPipe run of fresh dense stages on the first ``k`` logical devices."""
    import keras

    from course_utils.parallel.pipeline import run_gpipe

    tf = _tf()
    devices = _devices()[:k]
    stages = []
    for device in devices:
        with tf.device(device):
            stages.append(keras.Sequential([keras.Input((256,)), keras.layers.Dense(256, "relu")]))
    batches = tf.split(tf.random.normal((256 * m, 256)), m)
    run_gpipe(stages, devices, batches)  # warm-up
    return run_gpipe(stages, devices, batches).events


@register
def check_bubble_from_events(fn: Any) -> bool:
    """Check ``bubble_from_events(events, num_stages)``: idle fraction from per-stage timestamps."""
    from course_utils.parallel.pipeline import bubble_fraction, measured_bubble

    rng = fresh_rng()
    cases = []
    for _ in range(3):  # deterministic proxy: simulated schedules, exact answers
        k, m = rng.randint(2, 6), rng.randint(1, 9)
        duration = rng.choice([0.5, 1.0, 2.0])
        gap = rng.choice([0.0, 0.0, 0.25])
        events = _simulated_events(k, m, duration, gap)
        cases.append(Case(args=(events, k), expected=measured_bubble(events, k),
                          label=f"(a simulated GPipe run, K={k}, M={m}, gap {gap})"))
    k = min(2, len(_devices()))
    events = _real_run(k, 1)
    reference = measured_bubble(events, k)
    formula = bubble_fraction(k, 1)

    def verify(got: Any) -> str | None:
        try:
            value = float(got)
        except (TypeError, ValueError):
            return f"return a number, got {type(got).__name__}"
        if value < formula - 1e-9:
            return (f"with one micro-batch at most one stage works at a time, so the idle "
                    f"fraction cannot be below the formula {formula:.2f}; got {value:.4f}")
        if abs(value - reference) > 1e-9:
            return f"from these timestamps the idle fraction is {reference:.4f}, got {value:.4f}"
        return None

    cases.append(Case(args=(events, k), verify=verify,
                      label=f"(a real run of {k} stages, 1 micro-batch, formula {formula:.2f})"))
    return run_check(
        "bubble_from_events", fn, cases, rtol=1e-9,
        hint="span = last end − first start; busy = sum of (end − start) over the events; "
             "bubble = 1 − busy / (num_stages × span) (lesson 06, section 3).")


# --- Exercise 3 · a dense layer sharded by rows with DTensor ----------------------------------


@register
def check_shard_dense_rows(fn: Any) -> bool:
    """Check ``shard_dense_rows(x, kernel, bias, mesh)``: kernel layout by rows, equal result."""
    from tensorflow.experimental import dtensor

    from course_utils.parallel.mesh import make_mesh, unshard

    rng = fresh_rng()
    devices = _devices()

    def case() -> Case:
        dim = rng.choice(["model", "tp", "shards"])
        count = rng.choice([n for n in (2, 4) if n <= len(devices)])
        mesh = make_mesh(devices[:count], dim=dim)
        data = np.random.default_rng(rng.randint(0, 2**31 - 1))
        n, d_in, d_out = rng.randint(2, 6), count * rng.randint(2, 5), count * rng.randint(1, 3)
        x = data.normal(size=(n, d_in)).astype("float32")
        kernel = data.normal(size=(d_in, d_out)).astype("float32")
        bias = data.normal(size=(d_out,)).astype("float32")
        expected = x @ kernel + bias

        def verify(got: Any) -> str | None:
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                return "return (sharded_kernel, y), both DTensors"
            try:
                kernel_specs = list(dtensor.fetch_layout(got[0]).sharding_specs)
                y_layout = dtensor.fetch_layout(got[1])
            except Exception as error:  # a plain tensor has no layout
                return f"both results must be DTensors on the mesh ({type(error).__name__})"
            if kernel_specs != [dim, dtensor.UNSHARDED]:
                return (f"the kernel's layout is {kernel_specs}, expected [{dim!r}, "
                        "'unsharded'] (rows split along the mesh dimension)")
            if y_layout.mesh != mesh:
                return "y is not on the given mesh"
            error = float(np.abs(unshard(got[1]) - expected).max())
            if error > 1e-4:
                return f"y differs from x @ kernel + bias by {error:.2e}"
            return None

        return Case(args=(x, kernel, bias, mesh), verify=verify,
                    label=f"(a {count}-device mesh named {dim!r}, kernel {d_in}×{d_out})")

    return run_check(
        "shard_dense_rows", fn, [case(), case()],
        hint="use the mesh's own dimension name (mesh.dim_names[0]); the kernel's layout is "
             "[dim, UNSHARDED] and x's is [UNSHARDED, dim]; copy_to_mesh with a replicated "
             "layout, then relayout (lesson 06, section 4).")
