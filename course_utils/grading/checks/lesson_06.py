"""Checks of lesson 06's exercises (registered by name with ``@register``).

* ``check_budgeted_orders(budgeted_orders)``: 1F1B orders under a memory budget per stage,
  on fresh ``(K, M, budgets)``: every pass once, no deadlock, no stage over its budget, no
  more slots than the fewest the budgets allow. See ``budget_orders``.
* ``check_fixed_part_step(fixed_part_step)``: the colleague's micro-batched step over many
  parts, fixed: values, where the backward ran, what stays alive. See ``part_steps``.
* ``check_shard_dense_rows(shard_dense_rows)``: a dense layer sharded by rows, never whole on
  a device: the kernel made by the check's ``init_kernel`` inside ``dtensor.call_with_layout``
  with the rows layout (the layout of each call is read from the call stack), ``x`` packed by
  features in the mesh's device order, no matrix whole on every device or gathered to the
  host on the way (``dtensor.pack``, ``call_with_layout``, ``copy_to_mesh``, ``relayout``,
  ``relayout_like``, ``unpack`` and ``.numpy()`` watched by code identity, see
  ``dtensor_watch``; a sharded ``pack`` piece neither of ``x`` nor the bias: ``np.asarray``
  reads in C, its result comes back so), the layouts, the gathered values and ``y`` against
  the unsharded layer; the bias replicated (no pack of its pieces), ``y`` too; a host
  ``tf.Variable`` given to or read in a ``call_with_layout`` function counts as its data
  (``dtensor_watch``); the course's sharding helpers refused. Known limit: DTensor may
  relayout inside an op (a reshape across the sharded axis, or ``eye @ kernel`` with ``eye``
  sharded, gathers the kernel onto every device); no Python call shows it, so it passes.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from course_utils.grading.checks.dtensor_watch import kernel_initializer, whole_copy_watch
from course_utils.grading.checks.part_steps import check_fixed_part_step
from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["check_budgeted_orders", "check_fixed_part_step", "check_shard_dense_rows"]


def _devices() -> list[str]:
    tf = _tf()
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < 3:
        raise AssertionError("this check needs at least 3 logical devices: run the set-up cell "
                             "(cu.setup(logical_devices=4, ...)) first, in a fresh kernel")
    return devices


def _the_checks_own() -> list[Any]:
    """Every function of this module (its expected answers among them), refused while the
    learner's function runs (the initializer it hands the learner lives in ``dtensor_watch``)."""
    return own_functions(sys.modules[__name__])


def _short(name: str) -> str:
    return name.rsplit("device:", 1)[-1]


# --- Exercise 1 · 1F1B under a memory budget per stage ----------------------------------------


@register
def check_budgeted_orders(fn: Any) -> bool:
    """Check ``budgeted_orders(num_stages, num_micro_batches, max_in_flight)``: orders, slots
    and activations under a budget per stage (``budget_orders``)."""
    from course_utils.grading.checks import budget_orders
    from course_utils.parallel import schedules

    note, cases = budget_orders.budget_cases(fresh_rng(), fn)
    helpers = [schedules.one_f_one_b_orders, schedules.one_f_one_b_schedule,
               schedules.interleaved_orders, schedules.interleaved_schedule,
               *own_functions(budget_orders), *_the_checks_own()]
    why = "build the orders yourself (the lesson's helpers have no budget)"
    return run_check(
        "budgeted_orders", refusing(fn, helpers, why, note), cases,
        hint="lesson 06, section 3 (1F1B): a stage keeps what it forwarded until the "
             "backward comes back. With a budget per stage, what can stage s hold when the "
             "stage before it holds fewer? Rather than fix each order in advance, decide slot "
             "by slot what each stage can run.")


# --- Exercise 2 · the colleague's micro-batched step, fixed: ``part_steps`` ---------------


# --- Exercise 3 · a dense layer sharded by rows, never whole on a device ----------------------


@register
def check_shard_dense_rows(fn: Any) -> bool:
    """Check ``shard_dense_rows(x, init_kernel, kernel_shape, bias, mesh)``: made sharded."""
    from tensorflow.experimental import dtensor

    from course_utils.parallel import mesh as course_mesh

    tf = _tf()
    rng = fresh_rng()
    devices = _devices()
    helpers = [course_mesh.shard, course_mesh.sharded_dense, course_mesh.dense_layouts,
               course_mesh.make_mesh, *_the_checks_own()]
    whole: list[str] = []
    copied: list[tuple[str, int, bool, Any]] = []
    guarded = refusing(fn, helpers, "use DTensor's own API, as lesson 06, section 4 does",
                       whole_copy_watch(whole, copied))

    def case() -> Case:
        dim = rng.choice(["model", "tp", "shards"])
        count = rng.choice([n for n in (2, 4) if n <= len(devices)])
        mesh = dtensor.create_mesh([(dim, count)], devices=devices[:count])
        data = np.random.default_rng(rng.randint(0, 2**31 - 1))
        n, d_in, d_out = rng.randint(2, 6), count * rng.randint(2, 5), count * rng.randint(1, 3)
        x = data.normal(size=(n, d_in)).astype("float32")
        bias = data.normal(size=(d_out,)).astype("float32")
        seed = (rng.randint(0, 1000), rng.randint(0, 1000))
        init_kernel, calls = kernel_initializer(seed)
        whole.clear()
        rows = dtensor.Layout([dim, dtensor.UNSHARDED], mesh)
        replicated = dtensor.Layout.replicated(mesh, rank=2)
        made = dtensor.call_with_layout(tf.function(kernel_initializer(seed)[0]), rows,
                                        shape=(d_in, d_out))
        kernel = dtensor.relayout(made, replicated).numpy()  # DTensor's own sharded draw
        expected = x @ kernel + bias

        def verify(got: Any) -> str | None:
            try:
                return check(got)
            finally:
                whole.clear()
                copied.clear()

        def held_whole() -> str | None:
            """What went onto the mesh, by count of numbers: whole on every device, no more
            than the bias; on one device, no more than its piece of x (or the bias)."""
            distinct = {(k if k is not None else i): (w, n)
                        for i, (w, n, spread, k) in enumerate(copied) if spread}
            everywhere = sum(n for _, n in distinct.values())
            piece = max(x.size // count, bias.size)
            if everywhere > bias.size:
                what = sorted({w for w, n in distinct.values() if n})
                return (f"{everywhere} numbers were copied whole onto every device of the mesh "
                        f"({', '.join(what)}); only the bias ({bias.size}) may be: x, the "
                        "kernel and y must reach and stay on the devices in pieces")
            for what, n, spread, _ in copied:
                if not spread and n > piece:
                    return (f"{what} gave one device {n} numbers, more than its piece of x "
                            f"({x.size // count}): each device holds only its own")
            allowed = [*np.split(x, count, axis=1), bias]

            def known(content: Any, allowed: Any = allowed) -> bool:
                try:
                    got = np.frombuffer(content[2], dtype=content[0]).reshape(content[1])
                    return any(got.shape == a.shape and np.allclose(got, a) for a in allowed)
                except (TypeError, ValueError):  # strings, objects: not x's numbers
                    return False

            for what, _, spread, content in copied:
                if not spread and content is not None and known(content, np.split(bias, count)):
                    return (f"{what} gave a device a piece of the bias: the bias is replicated "
                            "(whole on every device), as the task says")
                if not spread and content is not None and not known(content):
                    return (f"{what} gave a device numbers that are neither its piece of x "
                            "nor the bias (computed on the host?): only x and bias come")
            return None

        def check(got: Any) -> str | None:
            if whole:
                return (f"a matrix was whole on every device, or gathered ({whole[0]}): "
                        "x, the kernel and y must reach and stay on the devices in pieces, "
                        "each device only its own (section 4)")
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                return "return (sharded_x, sharded_kernel, y), all three DTensors"
            if not calls:
                return "init_kernel was never called: the kernel must be what it makes"
            if any(layout is None for layout in calls):
                return ("init_kernel ran outside dtensor.call_with_layout: the whole kernel "
                        "was made on one device (section 4: a tensor created sharded)")
            reason = held_whole()
            if reason:
                return reason
            if any(list(layout.sharding_specs) != [dim, dtensor.UNSHARDED] for layout in calls):
                return ("init_kernel ran under call_with_layout with layout "
                        f"{list(calls[-1].sharding_specs)}: not sharded by rows over the "
                        f"mesh's dimension {dim!r}")
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
            if not layouts[2].is_fully_replicated():
                return (f"y's layout is {list(layouts[2].sharding_specs)}: with the bias "
                        "replicated, x @ kernel + bias is replicated (each device adds up the "
                        "partial sums)")
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
        hint="lesson 06, section 4: how the lesson created its column-sharded kernel and "
             "packed its batch. Which dimension of the kernel, and of x, does a rows split "
             "of the kernel cut, and how does a tensor come into being already in pieces?")
