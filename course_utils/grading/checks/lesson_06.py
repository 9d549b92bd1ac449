"""Checks of lesson 06's exercises (registered by name with ``@register``).

* ``check_budgeted_orders(budgeted_orders)``: 1F1B orders under a memory budget per stage,
  on fresh ``(K, M, budgets)``: every pass once, no deadlock, no stage over its budget, no
  more slots than the fewest the budgets allow. See ``budget_orders``.
* ``check_fixed_part_step(fixed_part_step)``: the colleague's micro-batched step over many
  parts, fixed: values, where the backward ran, what stays alive. See ``part_steps``.
* ``check_shard_attention(shard_attention)``: an attention block sharded by heads (Megatron's
  attention), never whole on a device: the weights made by the check's ``init_weight`` inside
  ``dtensor.call_with_layout`` with the heads axis sharded, nothing copied from the host and
  nothing gathered (``dtensor_watch``), the probabilities sharded by heads (each device's piece
  its own heads'), the output replicated and equal to the unsharded block's; see
  ``head_shards``; the course's sharding helpers refused.
"""

from __future__ import annotations

import sys
from typing import Any

from course_utils.grading.checks import head_shards
from course_utils.grading.checks.dtensor_watch import whole_copy_watch
from course_utils.grading.checks.part_steps import check_fixed_part_step
from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["check_budgeted_orders", "check_fixed_part_step", "check_shard_attention"]


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


# --- Exercise 3 · attention sharded by heads, never whole on a device -------------------------


@register
def check_shard_attention(fn: Any) -> bool:
    """Check ``shard_attention(x, init_weight, num_heads, head_dim, mesh)``: by heads."""
    from course_utils.parallel import mesh as course_mesh

    if str(getattr(fn, "__module__", "")).split(".")[0] == "course_utils":  # bound as is
        raise AssertionError(f"shard_attention: the function you passed is the course's "
                             f"{getattr(fn, '__qualname__', fn)}, not yours: write it yourself")
    rng = fresh_rng()
    devices = _devices()
    helpers = [course_mesh.shard, course_mesh.sharded_dense, course_mesh.dense_layouts,
               course_mesh.make_mesh, *_the_checks_own(),
               *own_functions(head_shards, but=["weight_initializer"])]
    whole: list[str] = []
    copied: list[tuple[str, int, bool, Any]] = []
    guarded = refusing(fn, helpers, "use DTensor's own API, as lesson 06, section 4 does",
                       whole_copy_watch(whole, copied))
    cases = [head_shards.attention_case(rng, devices, whole, copied) for _ in range(2)]
    return run_check(
        "shard_attention", guarded, cases,
        hint="lesson 06, section 4: which axis of a weight did the column and the row layers "
             "shard, and which axis of attention is computed without the others? Create each "
             "weight in its pieces, as the lesson created its kernel.")
