"""Checks of lesson 06's exercises (registered by name with ``@register``).

* ``check_budgeted_orders(budgeted_orders)``: 1F1B orders under a memory budget per stage,
  on fresh ``(K, M, budgets)``: every pass once, no deadlock, no stage over its budget, no
  more slots than the fewest the budgets allow. See ``budget_orders``.
* ``check_split_gradients(split_gradients)``: a model split into two and three parts on
  devices the check chooses (never the default first), trained on a few micro-batches; loss
  and gradients of the micro-batches' mean loss equal to the unsplit model's; then the answer
  is traced in a ``tf.function`` (under the same guard, its traced results checked like the
  eager ones) and the placement of what it built is read, by what each op consumes and
  produces, whatever its name: every op that part ``i``'s returned gradients were computed
  from and that neither ``loss_fn``'s results (the forward: the traced answer gets a recording
  ``loss_fn``; one call per micro-batch, given labels and logits only, none made from a
  micro-batch's features and labels both; no op with a body: tf.function, cond, while; no
  stateful op but reads: a variable written, a queue) nor a later part's gradients were (the
  weight-gradient MatMuls, bias sums, the activation's gradient, the adds over micro-batches,
  through Identity copies) must ask for ``devices[i]`` and read no activation but part
  ``i``'s and its input; one reading part ``j``'s weight (a value made from it alone: ``dy ·
  Wⱼᵀ``, the gradient passed back) must ask for ``devices[j]``. Each gradient must be
  made from every micro-batch's own backward: an op, outside the forward, that depends on that
  micro-batch's labels and on no other's inputs (the micro-batches differ in size, so one big
  batch made of them fails on values; weighted to match, every op after its concatenation
  depends on all the micro-batches, however its gradient is then split into shares). The
  lesson's ``split_step`` does one batch, so a copy of it still leaves the accumulation to
  write. Known limits: a copy of ``split_step`` with a ``+ 0`` passes; so does one big batch
  with an op added for show per micro-batch (``0 · yⱼ``: what an op depends on is read, not
  what it adds); an earlier part's backward tied into a later one's, on a forward
  recomputed apart from ``loss_fn``'s (activations not the forward's: not read), each
  weight-reading op placed at home; and patching this module in the learner's kernel forges
  a local pass (the grader imports the checks again before each check cell). Called eagerly,
  each returned gradient must be on its part's device too (an eager branch cannot be the
  colleague's code), and ``tf.gradients`` (in TensorFlow 2 it colocates each gradient with
  its op: one call puts each part's backward on its device) and ``tf.compat.v1.gradients``
  are refused by code identity: the exercise asks for a tape per part.
  ``cu.parallel.split_step`` and the lesson's pipeline (``run_pipeline``, ``run_gpipe``: each
  stage's backward and gradient sum on its device) are refused by code identity and content
  (``refusals``).
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

import numpy as np

from course_utils.grading.checks import head_shards
from course_utils.grading.checks.backward_placement import placement_of_the_backward
from course_utils.grading.checks.dtensor_watch import whole_copy_watch
from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["check_budgeted_orders", "check_shard_attention", "check_split_gradients"]


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


# --- Exercise 2 · a split model's backward pass, part by part ---------------------------------


def _split_problem(rng: Any, num_parts: int) -> dict[str, Any]:
    import keras

    data = np.random.default_rng(rng.randint(0, 2**31 - 1))
    width, classes = rng.randint(3, 7), rng.randint(2, 4)
    sizes = rng.sample(range(2, 8), rng.randint(2, 3))  # unequal: not one big batch
    widths = [width] + [rng.randint(4, 10) for _ in range(num_parts - 1)] + [classes]
    parts = [keras.Sequential([keras.Input((widths[i],)),
                               keras.layers.Dense(widths[i + 1],
                                                  "tanh" if i < num_parts - 1 else None)])
             for i in range(num_parts)]
    micro_batches = [(data.normal(size=(n, width)).astype("float32"),
                      data.integers(0, classes, size=(n,)).astype("int32"))
                     for n in sizes]
    return {"parts": parts, "micro_batches": micro_batches}


@register
def check_split_gradients(fn: Any) -> bool:
    """Check ``split_gradients(parts, micro_batches, loss_fn, devices)``: values, placement."""
    import keras

    tf = _tf()
    rng = fresh_rng()
    devices = _devices()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def case(chosen: list[str]) -> Case:
        problem = _split_problem(rng, len(chosen))
        parts, micro_batches = problem["parts"], problem["micro_batches"]
        variables = [v for part in parts for v in part.trainable_variables]

        def values(batches: Any) -> Any:
            """A verifier of (loss, grads) against the unsplit model on ``batches``, whose
            expected values are computed when it runs (after the answer returned)."""
            def verify_values(got: Any) -> str | None:
                with tf.GradientTape() as tape:
                    losses = []
                    for x, y in batches:
                        value = x
                        for part in parts:
                            value = part(value)
                        losses.append(loss_fn(y, value))
                    expected_loss = tf.add_n(losses) / len(losses)
                expected = [g.numpy() for g in tape.gradient(expected_loss, variables)]
                if not isinstance(got, (tuple, list)) or len(got) != 2:
                    return "return (loss, grads): the gradients of every part's weights, in order"
                loss, grads = got
                if not isinstance(grads, (tuple, list)) or len(grads) != len(expected):
                    return f"grads must hold {len(expected)} gradients, one per trainable variable"
                error = max(float(np.abs(np.asarray(g) - e).max())
                            for g, e in zip(grads, expected, strict=True))
                if error > 1e-5 or abs(float(loss) - float(expected_loss)) > 1e-5:
                    return ("loss or gradients differ from the unsplit model's on the mean of "
                            f"the micro-batches' losses (max |Δ| {error:.1e})")
                return None
            return verify_values

        def eager_devices(got: Any) -> str | None:
            home = [i for i, part in enumerate(parts) for _ in part.trainable_variables]
            for g, i in zip(got[1], home, strict=True):
                where = _short(getattr(g, "device", "") or "")
                if where != _short(chosen[i]):
                    return (f"called eagerly, a gradient of part {i}'s weights is on "
                            f"{where or 'the host'}, expected {_short(chosen[i])}")
            return None

        def verify(got: Any) -> str | None:
            return (values(micro_batches)(got)
                    or placement_of_the_backward(guarded, problem, loss_fn, chosen, values)
                    or eager_devices(got))

        return Case(args=(parts, micro_batches, loss_fn, list(chosen)), verify=verify,
                    label=f"({len(chosen)} parts on {[_short(d) for d in chosen]}, "
                          f"{len(micro_batches)} micro-batches)")

    from course_utils.parallel import pipeline, placement

    chosen = [[devices[2], devices[1]], [devices[-1], devices[1], devices[2]]]  # never CPU:0 first
    # the lesson's pipeline runs each stage's backward on its device and sums the gradients
    # there too: the answer, whatever its loss is weighted by
    from tensorflow.python.ops import gradients_util  # tf.gradients, tf.compat.v1.gradients

    guarded = refusing(fn, [placement.split_step, pipeline.run_pipeline, pipeline.run_gpipe,
                            gradients_util._GradientsHelper, *_the_checks_own()],
                       "write the backward pass yourself, one GradientTape per part (the "
                       "lesson's split_step and run_pipeline already hold it)")
    return run_check(
        "split_gradients", guarded, [case(c) for c in chosen],
        hint="lesson 06, section 2 (manual placement: two parts, each backward on its own "
             "device): what must each part's backward receive from the part after it, and "
             "where is each part's gradient summed over the micro-batches? The message "
             "above names the op that ran elsewhere.")


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
