"""Checks of lesson 06's exercises (registered by name with ``@register``).

* ``check_one_f_one_b_orders(one_f_one_b_orders)``: the learner's 1F1B order per stage, for
  fresh ``(K, M)`` (``M`` below, at and above ``K``). Each stage must run every micro-batch's
  forward and backward once; the orders are turned into time slots by the course's simulator,
  which fails on a deadlock (a pass waiting for an input that never comes); the schedule must
  take no more slots than GPipe's, 2(M + K − 1) (the same bubble), and stage ``s`` must never
  keep more than ``K − s`` micro-batches' activations (GPipe's order keeps ``M``). The course's
  own ``cu.parallel.one_f_one_b_orders`` is switched off while the check runs.
* ``check_split_gradients(split_gradients)``: a split model's loss and gradients, with each
  part's gradients computed on its own device (read from the returned tensors' ``.device``),
  on devices the check chooses (never the default device), equal to the unsplit reference.
* ``check_shard_dense_rows(shard_dense_rows)``: a dense layer sharded by rows with DTensor's own
  API: ``x``'s layout (split by features) and the kernel's (split by rows) on the check's mesh,
  whose dimension name varies, ``y`` against the unsharded layer, and, traced in a
  ``tf.function``, that ``y``'s matmul multiplies the returned sharded ``x`` and kernel (a ``y``
  computed whole and copied onto the mesh fails). The course's ``cu.parallel`` sharding helpers
  are switched off while the check runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["check_one_f_one_b_orders", "check_shard_dense_rows", "check_split_gradients"]


def _devices() -> list[str]:
    tf = _tf()
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < 3:
        raise AssertionError("this check needs at least 3 logical devices: run the set-up cell "
                             "(cu.setup(logical_devices=4, ...)) first, in a fresh kernel")
    return devices


def _short(name: str) -> str:
    return name.rsplit("device:", 1)[-1]


@contextlib.contextmanager
def _helpers_switched_off(module_names: list[str], names: list[str], why: str) -> Iterator[None]:
    """Replace course helpers by functions that fail with ``why`` while the block runs."""
    import importlib

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(why)

    saved = []
    for module_name in module_names:
        module = importlib.import_module(module_name)
        for name in names:
            if hasattr(module, name):
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, refuse)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


# --- Exercise 1 · a 1F1B schedule ---------------------------------------------------------------


def _verify_orders(got: Any, k: int, m: int) -> str | None:
    from course_utils.parallel.schedules import (
        check_orders,
        peak_in_flight,
        schedule_from_orders,
    )

    if not isinstance(got, (list, tuple)) or len(got) != k:
        return f"return one order (a list) per stage: {k} lists, got {type(got).__name__}"
    try:
        orders = [[(str(phase), int(b)) for phase, b in order] for order in got]
        check_orders(orders, m)
        tasks = schedule_from_orders(orders)
    except (TypeError, ValueError) as error:
        return str(error)
    slots = max(task.slot for task in tasks) + 1
    if slots > 2 * (m + k - 1):
        return (f"the orders take {slots} time slots, more than GPipe's 2(M+K−1) = "
                f"{2 * (m + k - 1)}: a stage waits where it could work")
    peaks = peak_in_flight(tasks, k)
    for stage, peak in enumerate(peaks):
        if peak > k - stage:
            return (f"stage {stage} keeps up to {peak} micro-batches' activations at once "
                    f"(forwarded, not yet backwarded); 1F1B keeps at most K − s = {k - stage}. "
                    f"Per stage: {peaks}")
    return None


@register
def check_one_f_one_b_orders(fn: Any) -> bool:
    """Check ``one_f_one_b_orders(num_stages, num_micro_batches)``: orders, slots, activations."""
    rng = fresh_rng()
    pairs = [(4, 8), (3, 3), (4, 2), (1, 3), (rng.randint(2, 6), rng.randint(7, 12))]
    cases = [Case(args=(k, m), verify=lambda got, k=k, m=m: _verify_orders(got, k, m),
                  label=f"(num_stages={k}, num_micro_batches={m})") for k, m in pairs]
    why = ("build the orders yourself: cu.parallel.one_f_one_b_orders is the lesson's answer, "
           "switched off during this check")
    with _helpers_switched_off(["course_utils.parallel", "course_utils.parallel.schedules"],
                               ["one_f_one_b_orders", "one_f_one_b_schedule"], why):
        return run_check(
            "one_f_one_b_orders", fn, cases,
            hint="stage s first runs K − 1 − s forwards (never more than M), then alternates "
                 "one forward and one backward, then runs the backwards left; micro-batches "
                 "in order 0, 1, 2 … in each phase (lesson 06, section 3, 1F1B).")


# --- Exercise 2 · fix a split model's backward pass ------------------------------------------


def _split_problem(rng: Any) -> dict[str, Any]:
    import keras

    data = np.random.default_rng(rng.randint(0, 2**31 - 1))
    n, features, units = rng.randint(4, 9), rng.randint(3, 7), rng.randint(4, 10)
    classes = rng.randint(2, 4)
    part_a = keras.Sequential([keras.Input((features,)), keras.layers.Dense(units, "tanh")])
    part_b = keras.Sequential([keras.Input((units,)), keras.layers.Dense(classes)])
    x = data.normal(size=(n, features)).astype("float32")
    y = data.integers(0, classes, size=(n,)).astype("int32")
    return {"parts": (part_a, part_b), "x": x, "y": y}


@register
def check_split_gradients(fn: Any) -> bool:
    """Check ``split_gradients(part_a, part_b, x, y, loss_fn, devices)``: placement and values."""
    import keras

    tf = _tf()
    rng = fresh_rng()
    devices = _devices()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def case(pair: tuple[str, str]) -> Case:
        problem = _split_problem(rng)
        part_a, part_b = problem["parts"]
        variables = part_a.trainable_variables + part_b.trainable_variables
        with tf.GradientTape() as tape:
            expected_loss = loss_fn(problem["y"], part_b(part_a(problem["x"])))
        expected = [g.numpy() for g in tape.gradient(expected_loss, variables)]

        def verify(got: Any) -> str | None:
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                return "return (loss, grads): grads of part_a's variables, then part_b's"
            loss, grads = got
            if not isinstance(grads, (tuple, list)) or len(grads) != len(expected):
                return f"grads must hold {len(expected)} gradients, one per trainable variable"
            wanted = ([pair[0]] * len(part_a.trainable_variables)
                      + [pair[1]] * len(part_b.trainable_variables))
            for index, (grad, device) in enumerate(zip(grads, wanted, strict=True)):
                where = _short(getattr(grad, "device", "") or "")
                part = "part_a" if index < len(part_a.trainable_variables) else "part_b"
                if where != _short(device):
                    return (f"a gradient of {part} was computed on {where or 'no device'}, "
                            f"expected {_short(device)}, where its weights live")
            error = max(float(np.abs(np.asarray(g) - e).max()) for g, e in zip(grads, expected,
                                                                                strict=True))
            if error > 1e-5 or abs(float(loss) - float(expected_loss)) > 1e-5:
                return f"loss or gradients differ from the unsplit model's (max |Δ| {error:.1e})"
            return None

        return Case(args=(part_a, part_b, problem["x"], problem["y"], loss_fn, list(pair)),
                    verify=verify, label=f"(devices={[_short(d) for d in pair]})")

    pairs = [(devices[2], devices[1]), (devices[-1], devices[-2])]  # never the default CPU:0 pair
    return run_check(
        "split_gradients", fn, [case(p) for p in pairs],
        hint="one tape per part; part_b's backward under tf.device(devices[1]) gives the gradient "
             "of its input too, which part_a's tape takes as output_gradients= under "
             "tf.device(devices[0]) (lesson 06, section 2).")


# --- Exercise 3 · a dense layer sharded by rows with DTensor ----------------------------------


_MATMUL_OPS = frozenset({"MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"})


def _ancestors(tensor: Any) -> set[Any]:
    """References to every graph tensor ``tensor`` is computed from, itself included."""
    seen: set[Any] = set()
    stack = [tensor]
    while stack:
        current = stack.pop()
        if current.ref() not in seen:
            seen.add(current.ref())
            stack.extend(current.op.inputs)
    return seen


def _matmul_of_the_shards(fn: Any, arrays: tuple[Any, ...], mesh: Any) -> str | None:
    """None when, traced in a tf.function, y's matmul consumes the returned sharded x and kernel.

    Right values prove nothing here: ``x @ kernel`` computed whole and copied onto the mesh
    has them too. The traced graph shows what the matmul actually multiplies.
    """
    tf = _tf()
    found: dict[str, Any] = {}

    def traced(x: Any, kernel: Any, bias: Any) -> Any:
        x_sharded, kernel_sharded, y = fn(x, kernel, bias, mesh)
        found["ok"] = any(
            len(op.inputs) >= 2
            and x_sharded.ref() in _ancestors(op.inputs[0])
            and kernel_sharded.ref() in _ancestors(op.inputs[1])
            for op in {ref.deref().op for ref in _ancestors(y)} if op.type in _MATMUL_OPS)
        return y

    specs = [tf.TensorSpec(array.shape, tf.float32) for array in arrays]
    try:
        tf.function(traced).get_concrete_function(*specs)
    except Exception as error:  # noqa: BLE001 - any failure is the learner's to see
        return ("the check traces shard_dense_rows in a tf.function to see what the matmul "
                "multiplies, and tracing failed: "
                f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]} "
                "(keep to TensorFlow ops: tf.convert_to_tensor, not tf.constant or .numpy())")
    if not found.get("ok"):
        return ("y is not the matmul of the sharded x and kernel you returned: compute "
                "y from them (a y computed whole and copied onto the mesh has the right "
                "values but shards nothing)")
    return None


@register
def check_shard_dense_rows(fn: Any) -> bool:
    """Check ``shard_dense_rows(x, kernel, bias, mesh)``: x's and the kernel's layouts, y."""
    from tensorflow.experimental import dtensor

    rng = fresh_rng()
    devices = _devices()

    def case() -> Case:
        dim = rng.choice(["model", "tp", "shards"])
        count = rng.choice([n for n in (2, 4) if n <= len(devices)])
        mesh = dtensor.create_mesh([(dim, count)], devices=devices[:count])
        data = np.random.default_rng(rng.randint(0, 2**31 - 1))
        n, d_in, d_out = rng.randint(2, 6), count * rng.randint(2, 5), count * rng.randint(1, 3)
        x = data.normal(size=(n, d_in)).astype("float32")
        kernel = data.normal(size=(d_in, d_out)).astype("float32")
        bias = data.normal(size=(d_out,)).astype("float32")
        expected = x @ kernel + bias

        def verify(got: Any) -> str | None:
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                return "return (sharded_x, sharded_kernel, y), all three DTensors"
            try:
                layouts = [dtensor.fetch_layout(value) for value in got]
            except Exception as error:  # a plain tensor has no layout
                return f"all three results must be DTensors on the mesh ({type(error).__name__})"
            wanted = {"x": [dtensor.UNSHARDED, dim], "kernel": [dim, dtensor.UNSHARDED]}
            for name, layout in zip(("x", "kernel"), layouts, strict=False):
                specs = list(layout.sharding_specs)
                if specs != wanted[name]:
                    return (f"{name}'s layout is {specs}, expected {wanted[name]} (the mesh's "
                            f"dimension is {dim!r})")
            if layouts[2].mesh != mesh:
                return "y is not on the given mesh"
            replicated = dtensor.Layout.replicated(mesh, rank=2)
            values = dtensor.relayout(got[2], replicated).numpy()
            error = float(np.abs(values - expected).max())
            if error > 1e-4:
                return f"y differs from x @ kernel + bias by {error:.2e}"
            return _matmul_of_the_shards(fn, (x, kernel, bias), mesh)

        return Case(args=(x, kernel, bias, mesh), verify=verify,
                    label=f"(a {count}-device mesh named {dim!r}, kernel {d_in}×{d_out})")

    why = ("use DTensor's own API (dtensor.copy_to_mesh, dtensor.relayout, dtensor.Layout): "
           "the course's cu.parallel sharding helpers are switched off during this check")
    with _helpers_switched_off(["course_utils.parallel", "course_utils.parallel.mesh"],
                               ["shard", "sharded_dense", "dense_layouts", "make_mesh"], why):
        return run_check(
            "shard_dense_rows", fn, [case(), case()],
            hint="use the mesh's own dimension name (mesh.dim_names[0]); the kernel's layout "
                 "is [dim, UNSHARDED], x's [UNSHARDED, dim]; copy_to_mesh with a replicated "
                 "layout, then relayout (lesson 06, section 4).")
