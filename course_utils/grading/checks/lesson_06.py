"""Checks of lesson 06's exercises (registered by name with ``@register``).

* ``check_one_f_one_b_orders(one_f_one_b_orders)``: the learner's 1F1B order per stage, for
  fresh ``(K, M)`` (``M`` below, at and above ``K``). Each stage must run every micro-batch's
  forward and backward once; the orders are turned into time slots by the course's simulator,
  which fails on a deadlock (a pass waiting for an input that never comes); the schedule must
  take no more slots than GPipe's, 2(M + K − 1) (the same bubble), and stage ``s`` must never
  keep more than ``K − s`` micro-batches' activations (GPipe's order keeps ``M``). The course's
  own schedule helpers are refused by the identity of their code objects, entered while the
  answer runs (an alias bound before the check, a wrapper or a lambda are all caught).
* ``check_split_gradients(split_gradients)``: a model split into two and three parts on
  devices the check chooses (never the default first); loss and gradients equal to the unsplit
  model's; then the answer is traced in a ``tf.function`` and the placement of what it built is
  read: every op that makes a gradient of part ``i``'s weights (looked for through Identity
  copies) and every gradient op that reads part ``i``'s weights must ask for ``devices[i]``.
  ``cu.parallel.split_step`` is refused by code identity.
* ``check_shard_dense_rows(shard_dense_rows)``: a dense layer sharded by rows, never whole on
  a device: the kernel made by the check's ``init_kernel`` inside ``dtensor.call_with_layout``
  with the rows layout (the layout of each call is read from the call stack), ``x`` packed by
  features in the mesh's device order, no matrix sent to the mesh replicated
  (``dtensor.pack``/``copy_to_mesh`` watched by code identity), the layouts, the gathered
  values and ``y`` against the unsharded layer; the course's sharding helpers refused by code
  identity.
"""

from __future__ import annotations

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


def _helper_codes(helpers: list[Any]) -> dict[Any, str]:
    """The code objects of ``helpers`` (and of the functions defined inside them), by identity.

    Identity, not equal bytecode: a learner who writes the same loop as the helper wrote it
    themselves; a learner who calls the helper, by any name, runs these very code objects.
    """
    found: dict[Any, str] = {}
    for helper in helpers:
        stack = [helper.__code__]
        while stack:
            code = stack.pop()
            found[code] = helper.__name__
            stack.extend(c for c in code.co_consts if hasattr(c, "co_code"))
    return found


def _raised_by(fn: Any, error: BaseException) -> bool:
    """True when ``error`` was raised by ``fn``'s own body (the exercise stub)."""
    tb, last = error.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    code = getattr(fn, "__code__", None)
    return code is None or (last is not None and last.tb_frame.f_code is code)


def _guarded(fn: Any, helpers: list[Any], why: str, also: Any = None) -> Any:
    """``fn`` refusing the helpers' code (see :class:`_Refusing`); non-functions as they are."""
    return _Refusing(fn, helpers, why, also) if callable(fn) else fn


class _Refusing:
    """``fn``, run so that it fails with ``why`` if it runs the code of one of ``helpers``.

    A guard by identity of what runs: whatever name the helper is bound to (an alias made
    before the check, a wrapper, a lambda), its code object is recognised when entered.
    Has no ``__code__``, so the framework trusts its NotImplementedError: only the learner's
    own stub raise is let through as one.
    """

    def __init__(self, fn: Any, helpers: list[Any], why: str,
                 also: Any = None) -> None:
        self.fn, self.codes, self.why, self.also = fn, _helper_codes(helpers), why, also

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import sys

        entered: list[str] = []

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event != "call":
                return
            if self.also is not None:
                self.also(frame)
            if not entered:
                name = self.codes.get(frame.f_code)
                if name:
                    entered.append(name)

        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            result = self.fn(*args, **kwargs)
        except NotImplementedError as error:
            if _raised_by(self.fn, error):
                raise
            raise RuntimeError(f"NotImplementedError from inside a library call: {error}"
                               ) from error
        finally:
            sys.setprofile(previous)
        if entered:
            raise AssertionError(f"your function ran the course's {entered[0]}: {self.why}")
        return result


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
    from course_utils.parallel import schedules

    helpers = [schedules.one_f_one_b_orders, schedules.one_f_one_b_schedule,
               schedules.interleaved_orders, schedules.interleaved_schedule]
    why = "build the orders yourself (the lesson's helpers already hold the answer)"
    return run_check(
        "one_f_one_b_orders", _guarded(fn, helpers, why), cases,
        hint="stage s first runs K − 1 − s forwards (never more than M), then alternates "
             "one forward and one backward, then runs the backwards left; micro-batches "
             "in order 0, 1, 2 … in each phase (lesson 06, section 3, 1F1B).")


# --- Exercise 2 · a split model's backward pass, part by part ---------------------------------


def _split_problem(rng: Any, num_parts: int) -> dict[str, Any]:
    import keras

    data = np.random.default_rng(rng.randint(0, 2**31 - 1))
    n, width, classes = rng.randint(4, 9), rng.randint(3, 7), rng.randint(2, 4)
    widths = [width] + [rng.randint(4, 10) for _ in range(num_parts - 1)] + [classes]
    parts = [keras.Sequential([keras.Input((widths[i],)),
                               keras.layers.Dense(widths[i + 1],
                                                  "tanh" if i < num_parts - 1 else None)])
             for i in range(num_parts)]
    x = data.normal(size=(n, width)).astype("float32")
    y = data.integers(0, classes, size=(n,)).astype("int32")
    return {"parts": parts, "x": x, "y": y}


def _through_identities(tensor: Any) -> Any:
    """The op that made ``tensor``, looking through Identity copies."""
    op = tensor.op
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    return op


def _placement_of_the_backward(fn: Any, problem: dict[str, Any], loss_fn: Any,
                               devices: list[str]) -> str | None:
    """None when, traced, each part's gradient ops ask for that part's device.

    A gradient op belongs to part ``i`` when it reads one of part ``i``'s weights (the
    gradient of the part's input, ``dy · Wᵀ``) or is where a gradient of part ``i``'s weights
    is made (looked for through Identity copies: a gradient computed elsewhere and copied with
    ``tf.identity`` is found where it was computed).
    """
    tf = _tf()
    parts = problem["parts"]

    def traced(x: Any, y: Any) -> Any:
        return fn(parts, x, y, loss_fn, devices)

    specs = (tf.TensorSpec(problem["x"].shape, tf.float32),
             tf.TensorSpec(problem["y"].shape, tf.int32))
    try:
        concrete = tf.function(traced).get_concrete_function(*specs)
    except Exception as error:  # noqa: BLE001 - the learner's to see
        return ("the check traces split_gradients in a tf.function to read where each "
                f"gradient op was placed, and tracing failed: {type(error).__name__}: "
                f"{str(error).strip().splitlines()[0][:160]}")
    graph = concrete.graph
    owner = {}  # the traced graph's handle of each weight -> its part
    for external, internal in graph.captures:
        for index, part in enumerate(parts):
            if any(external is v.handle for v in part.trainable_variables):
                owner[internal.ref()] = index
    outputs = tf.nest.flatten(graph.structured_outputs)[1:]  # after the loss: the gradients
    expected_part = [i for i, part in enumerate(parts) for _ in part.trainable_variables]
    if len(outputs) != len(expected_part):
        return "return (loss, grads): one gradient per trainable variable, parts in order"
    for output, index in zip(outputs, expected_part, strict=True):
        op = _through_identities(output)
        if not op.name.startswith("gradient_tape"):
            return (f"a gradient of part {index} was not made by tape.gradient (its last op is "
                    f"{op.type})")
        if _short(op.device) != _short(devices[index]):
            return (f"a gradient of part {index}'s weights was computed on "
                    f"{_short(op.device) or 'no device (the default one)'}, expected "
                    f"{_short(devices[index])}, where its weights live")
    for op in graph.get_operations():
        if not op.name.startswith("gradient_tape"):
            continue
        for tensor in op.inputs:
            read = _through_identities(tensor)
            if read.type == "ReadVariableOp" and read.inputs[0].ref() in owner:
                index = owner[read.inputs[0].ref()]
                if _short(op.device) != _short(devices[index]):
                    return (f"part {index}'s backward pass ({op.type} reading its weights) "
                            f"ran on {_short(op.device) or 'no device (the default one)'}, "
                            f"expected {_short(devices[index])}")
    return None


@register
def check_split_gradients(fn: Any) -> bool:
    """Check ``split_gradients(parts, x, y, loss_fn, devices)``: placement traced, values."""
    import keras

    tf = _tf()
    rng = fresh_rng()
    devices = _devices()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def case(chosen: list[str]) -> Case:
        problem = _split_problem(rng, len(chosen))
        parts = problem["parts"]
        variables = [v for part in parts for v in part.trainable_variables]
        with tf.GradientTape() as tape:
            value = problem["x"]
            for part in parts:
                value = part(value)
            expected_loss = loss_fn(problem["y"], value)
        expected = [g.numpy() for g in tape.gradient(expected_loss, variables)]

        def verify(got: Any) -> str | None:
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                return "return (loss, grads): the gradients of every part's weights, in order"
            loss, grads = got
            if not isinstance(grads, (tuple, list)) or len(grads) != len(expected):
                return f"grads must hold {len(expected)} gradients, one per trainable variable"
            error = max(float(np.abs(np.asarray(g) - e).max()) for g, e in zip(grads, expected,
                                                                                strict=True))
            if error > 1e-5 or abs(float(loss) - float(expected_loss)) > 1e-5:
                return f"loss or gradients differ from the unsplit model's (max |Δ| {error:.1e})"
            return _placement_of_the_backward(fn, problem, loss_fn, chosen)

        return Case(args=(parts, problem["x"], problem["y"], loss_fn, list(chosen)),
                    verify=verify,
                    label=f"({len(chosen)} parts on {[_short(d) for d in chosen]})")

    from course_utils.parallel import placement

    chosen = [[devices[2], devices[1]], [devices[-1], devices[1], devices[2]]]  # never CPU:0 first
    guarded = _guarded(fn, [placement.split_step], "write the backward pass yourself")
    return run_check(
        "split_gradients", guarded, [case(c) for c in chosen],
        hint="one tape per part; walk the parts backwards, each part's tape.gradient under "
             "its own tf.device, asking also for the gradient of the part's input and passing "
             "it to the part before as output_gradients= (lesson 06, section 2, for two).")


# --- Exercise 3 · a dense layer sharded by rows, never whole on a device ----------------------


def _whole_copy_watch(whole: list[str]) -> Any:
    """A profile callback that notes each matrix sent to the mesh whole on every device.

    Watched by identity of code: a call of ``dtensor.pack`` or ``dtensor.copy_to_mesh`` with a
    fully replicated layout of rank 2 or more, whatever name it was reached by.
    """
    from tensorflow.dtensor.python import api

    watched = {api.pack.__code__: "dtensor.pack",
               api.copy_to_mesh.__code__: "dtensor.copy_to_mesh"}

    def watch(frame: Any) -> None:
        name = watched.get(frame.f_code)
        layout = frame.f_locals.get("layout") if name else None
        if layout is not None and layout.rank >= 2 and layout.is_fully_replicated():
            whole.append(f"{name} with a replicated rank-{layout.rank} layout")

    return watch


def _kernel_initializer(seed: tuple[int, int]) -> tuple[Any, list[Any]]:
    """An initializer ``init_kernel(shape)``, and the layouts it was called under.

    Each call records the layout of the ``dtensor.call_with_layout`` it runs inside (found on
    the call stack by code identity), or None when it ran outside one (whole, on one device).
    """
    import sys

    from tensorflow.dtensor.python import api

    tf = _tf()
    calls: list[Any] = []

    def init_kernel(shape: Any) -> Any:
        frame, layout = sys._getframe(1), None
        while frame is not None:
            if frame.f_code is api.call_with_layout.__code__:
                layout = frame.f_locals.get("layout")
                break
            frame = frame.f_back
        calls.append(layout)
        return tf.random.stateless_normal(shape, seed=seed)

    return init_kernel, calls


@register
def check_shard_dense_rows(fn: Any) -> bool:
    """Check ``shard_dense_rows(x, init_kernel, kernel_shape, bias, mesh)``: made sharded."""
    from tensorflow.experimental import dtensor

    from course_utils.parallel import mesh as course_mesh

    tf = _tf()
    rng = fresh_rng()
    devices = _devices()
    helpers = [course_mesh.shard, course_mesh.sharded_dense, course_mesh.dense_layouts,
               course_mesh.make_mesh]
    whole: list[str] = []
    guarded = _guarded(fn, helpers, "use DTensor's own API (dtensor.call_with_layout, "
                       "dtensor.pack, dtensor.Layout)", _whole_copy_watch(whole))

    def case() -> Case:
        dim = rng.choice(["model", "tp", "shards"])
        count = rng.choice([n for n in (2, 4) if n <= len(devices)])
        mesh = dtensor.create_mesh([(dim, count)], devices=devices[:count])
        data = np.random.default_rng(rng.randint(0, 2**31 - 1))
        n, d_in, d_out = rng.randint(2, 6), count * rng.randint(2, 5), count * rng.randint(1, 3)
        x = data.normal(size=(n, d_in)).astype("float32")
        bias = data.normal(size=(d_out,)).astype("float32")
        seed = (rng.randint(0, 1000), rng.randint(0, 1000))
        init_kernel, calls = _kernel_initializer(seed)
        whole.clear()
        rows = dtensor.Layout([dim, dtensor.UNSHARDED], mesh)
        replicated = dtensor.Layout.replicated(mesh, rank=2)
        made = dtensor.call_with_layout(tf.function(_kernel_initializer(seed)[0]), rows,
                                        shape=(d_in, d_out))
        kernel = dtensor.relayout(made, replicated).numpy()  # DTensor's own sharded draw
        expected = x @ kernel + bias

        def verify(got: Any) -> str | None:
            if whole:
                return (f"a matrix was put on the mesh whole on every device ({whole[0]}): "
                        "create the kernel with dtensor.call_with_layout and send x's pieces "
                        "with dtensor.pack, each device only its own")
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                return "return (sharded_x, sharded_kernel, y), all three DTensors"
            if not calls:
                return "init_kernel was never called: create the kernel with it"
            if any(layout is None for layout in calls):
                return ("init_kernel ran outside dtensor.call_with_layout: the whole kernel "
                        "was made on one device; run it under call_with_layout")
            if any(list(layout.sharding_specs) != [dim, dtensor.UNSHARDED] for layout in calls):
                return ("init_kernel ran under call_with_layout with layout "
                        f"{list(calls[-1].sharding_specs)}: make it sharded by rows, "
                        f"[{dim!r}, UNSHARDED], on the given mesh")
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
            if any(layout.mesh != mesh for layout in layouts):
                return "a result is not on the given mesh"
            for name, value, want in (("x", got[0], x), ("kernel", got[1], kernel)):
                error = float(np.abs(dtensor.relayout(value, replicated).numpy() - want).max())
                if error > 1e-6:
                    return (f"the sharded {name}, gathered, differs from "
                            f"{'x' if name == 'x' else 'what init_kernel makes sharded'} "
                            f"by {error:.2e}: each device must get its own piece, in the "
                            "mesh's device order")
            values = dtensor.relayout(got[2], dtensor.Layout.replicated(
                mesh, rank=len(layouts[2].sharding_specs))).numpy()
            error = float(np.abs(values - expected).max())
            if error > 1e-4:
                return f"y differs from x @ kernel + bias by {error:.2e}"
            return None

        return Case(args=(x, init_kernel, (d_in, d_out), bias, mesh), verify=verify,
                    label=f"(a {count}-device mesh named {dim!r}, kernel {d_in}×{d_out})")

    return run_check(
        "shard_dense_rows", guarded, [case(), case()],
        hint="the mesh's dimension is mesh.dim_names[0]; the kernel comes from "
             "dtensor.call_with_layout(tf.function(init_kernel), Layout([dim, UNSHARDED], "
             "mesh), shape=kernel_shape); x's pieces (its columns, split in order) go to the "
             "devices with dtensor.pack(pieces, Layout([UNSHARDED, dim], mesh)) "
             "(lesson 06, section 4).")
