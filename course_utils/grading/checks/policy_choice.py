"""Lesson 08, exercise 1: choose a dtype policy for a model from measurements of its own training.

``check_choose_policy(choose_policy)`` hands the learner's function black-box models (a builder
that reads the global dtype policy in force when it is called) and fresh data, twice. Every
training step of a model waits a time the check drew for its policy times a load drawn per
round (the same for every policy; the last round's is never the median one), and the fastest
policy's first epoch waits longer, once, while the step is traced. In the "overflow" case the
model's inputs come 2^12 times too large and its first layer scales them back (``Rescaling``:
exact in float32 and bfloat16; their cast to float16 is inf from 65520 on) and
``mixed_float16`` is the fastest: its training inputs stay finite (it trains, its training
loss keeps float32's), two held-out rows do not, and its held-out loss is ``inf`` or ``nan``
(a choice by the training loss misses, xf08 L2); in the "coarse" case its inputs lie about
1020 on a grid of halves and its first layer centers them (exact in float16; bfloat16's step
there is 4: the inputs are lost in the cast, the loss stays finite) and ``mixed_bfloat16`` is
the fastest. The next fastest (float32 or the other 16-bit policy, which keeps float32's
quality there) is drawn so that one case's choice is float32 and the other's a 16-bit
policy: the fastest policy, the fastest with a finite loss, every constant and the choice by
the training loss each miss in one; a choice fixed per kind of model (read from its
``Rescaling`` layer) misses in half the checks (xf08 L3).
The waits and the step log sit in ``_PACES`` under an opaque key, not in ``make_model``'s
closure. The model's last layer records every training step (which batch, when it waited, the
first step's logits) and its ``fit`` records when each call began and returned, so the check
reads the work: the start (the first step's logits equal the model's on the first batch from
``initial_weights``), the batches (unshuffled, in order, ``EPOCHS`` epochs of a short last
batch), the interleaving (every round ends before any of the next begins), the timing (each
reported time is the median of that model's timed ``fit`` durations over the steps: a timing
of the steps alone, of the last or all epochs, the mean or the smallest misses), the returned
models (the ones trained), their optimizer (exactly ``Adam(0.01)``) and loss, the dtypes and
the restored global policy; it checks the held-out quality reported for each model against
its own (within what another batching changes in 16 bits) and expects the fastest policy (by
the times reported, each checked against that model's own ``fit`` calls: a stall of the
machine that reorders two policies moves the answer's choice and the check's alike, xf08 R3;
the drawn waits dwarf the machine's own differences) among those whose reported
held-out loss is finite and within the tolerances of float32's.
"""

from __future__ import annotations

import math
import secrets
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks.answer_reach import peeks_refused, plain_number, weights_of
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = ["ACCURACY_TOLERANCE", "BATCH_SIZE", "EPOCHS", "LOSS_TOLERANCE", "POLICIES",
           "check_choose_policy"]

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
#: Epochs per policy (the first traces the step and is not timed), batch size, tolerances.
EPOCHS, BATCH_SIZE = 4, 64
ACCURACY_TOLERANCE, LOSS_TOLERANCE = 0.05, 0.05
#: The fastest policy's wait per step (seconds, drawn); the next waits 2.5-3 times that, the
#: slowest 1.5-2 times the next: differences far above a tiny model's own step time.
FASTEST_WAIT_S, NEXT_FACTOR, LAST_FACTOR = (0.03, 0.04), (2.5, 3.0), (1.5, 2.0)
#: How busy the machine is in each round after the first: every wait of a round is multiplied
#: by one of these, the same for all policies, in an order drawn so that the last round is never
#: the median one (the median, the mean, the last and the smallest round all differ).
ROUND_LOADS = (1.0, 1.5, 2.5)
#: The fastest model's extra wait while its step is traced (its first epoch only).
TRACE_WAIT_S = 1.5
#: A case's waits and step log, by an opaque key: out of make_model's closure (r08 L4).
_PACES: dict[str, dict[str, Any]] = {}
#: The global policies in force when the learner's function is called, one drawn per case.
FOUND_POLICIES = ("bfloat16", "float64", "mixed_bfloat16")
_BOUND = {"clock": time.perf_counter, "sleep": time.sleep}  # bound when the course is imported


def _keras() -> Any:
    from course_utils.quiet import import_tensorflow

    import_tensorflow()
    import keras

    return keras


def _builder(num_features: int, num_classes: int, units: int, kind: str, key: str
             ) -> Callable[[], Any]:
    """An MLP whose training steps wait by the policy in force when it was built and by the
    round, recording each step into ``_PACES[key]["log"]``. ``kind`` "overflow" adds a
    Rescaling by 2^-12 first (its inputs cast to float16 are inf past 65504), "coarse" one
    that centers inputs that lie about 1020 (where bfloat16's step is 4: the inputs are lost in the
    cast that every mixed policy makes, which no graph rewrite removes)."""
    keras = _keras()
    import tensorflow as tf

    now, sleep = _BOUND["clock"], _BOUND["sleep"]

    def make_model() -> Any:
        policy, pace = keras.mixed_precision.global_policy().name, _PACES[key]
        run = {"policy": policy, "steps": [], "fits": [], "first_logits": None}
        pace["log"]["runs"].append(run)
        wait = pace["waits"].get(policy, max(pace["waits"].values()))
        trace, loads, steps = pace["trace"], pace["loads"], pace["steps"]

        class StepRecord(keras.layers.Layer):
            """Returns the logits; in a training step, records the batch and waits."""

            def call(self, inputs: Any, training: bool | None = None) -> Any:
                features, logits = inputs
                if not training:
                    return logits
                if not tf.executing_eagerly():
                    sleep(trace.get(policy, 0.0))  # Python runs once, while it is traced

                def record(batch: Any, out: Any) -> np.ndarray:
                    start = now()
                    if run["first_logits"] is None:
                        run["first_logits"] = np.array(out)
                    epoch = len(run["steps"]) // steps
                    sleep(wait * (loads[epoch - 1] if 0 < epoch <= len(loads) else 1.0))
                    run["steps"].append((start, now(), np.array(batch).sum(axis=1)))
                    return np.float32(0.0)

                zero = tf.py_function(record, [features, logits], tf.float32)
                return logits + tf.reshape(tf.stop_gradient(zero), [])

        inputs = keras.Input((num_features,), name="features")
        hidden = inputs
        if kind == "overflow":  # exact in float32 and bfloat16; inf in float16 (section 1)
            hidden = keras.layers.Rescaling(2.0**-12, name="down")(hidden)
        elif kind == "coarse":  # its inputs lie about 1020: cast to bfloat16, in steps of 4
            hidden = keras.layers.Rescaling(1.0, offset=-1020.0, name="center")(hidden)
        for index in range(2):
            hidden = keras.layers.Dense(units, activation="relu", name=f"dense_{index}")(hidden)
        logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(hidden)
        outputs = StepRecord(dtype="float32", name="record")([inputs, logits])
        model = keras.Model(inputs, outputs)
        fit = model.fit

        def recorded_fit(*args: Any, **kwargs: Any) -> Any:
            began, steps = now(), len(run["steps"])
            try:
                return fit(*args, **kwargs)
            finally:
                run["fits"].append((began, now(), steps, len(run["steps"])))

        model.fit = recorded_fit
        run["model"] = weakref.ref(model)  # the model trained: the one to return (r08 L7)
        return model

    return make_model


def _quality_problem(policy: str, model: Any, loss: float, accuracy: float, x: np.ndarray,
                     y: np.ndarray) -> str | None:
    """The reported held-out loss and accuracy against the model's own on all rows at once.
    A 16-bit policy's matmuls round by the batch's shape (``predict``'s batches of 32 and one
    call on all rows differ by up to about 0.02 in bfloat16), so rows whose two largest logits
    are within 0.05 may fall either way: they widen the accuracy's tolerance."""
    keras = _keras()
    logits = np.asarray(model(x, training=False), np.float32)
    own_loss = float(np.mean(np.asarray(
        keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))))
    own_accuracy = float(np.mean(np.argmax(logits, axis=-1) == y))
    top = np.sort(logits, axis=-1)[:, -2:]
    close = int(np.sum(top[:, 1] - top[:, 0] < (1e-4 if policy == "float32" else 0.05)))
    if not (math.isclose(loss, own_loss, rel_tol=1e-3 if policy == "float32" else 5e-3)
            or (math.isnan(loss) and math.isnan(own_loss))) or not math.isclose(
            accuracy, own_accuracy, abs_tol=(close + 0.5) / len(x)):
        return (f"runs[{policy!r}] reports held-out loss {loss:.4g} and accuracy "
                f"{accuracy:.1%}, but its model gives {own_loss:.4g} and {own_accuracy:.1%} on "
                "held_out_x: evaluate the trained model")
    return None


def _result_problem(result: Any) -> str | None:
    if type(result) is not dict or set(result) != {"policy", "runs"} or type(
            result["runs"]) is not dict or set(result["runs"]) != set(POLICIES):
        return ("expected {'policy': one of " f"{list(POLICIES)}, 'runs': " "{policy: {'model', "
                "'loss', 'accuracy', 'seconds_per_step'}} for each of the three policies}")
    for policy, run in result["runs"].items():
        if type(run) is not dict or set(run) != {"model", "loss", "accuracy",
                                                 "seconds_per_step"}:
            return f"runs[{policy!r}] should be a dict with model, loss, accuracy, seconds_per_step"
        if any(type(plain_number(run[key])) not in (int, float)
               for key in ("loss", "accuracy", "seconds_per_step")):
            return (f"runs[{policy!r}]: loss, accuracy and seconds_per_step should be numbers "
                    "(Python's, NumPy's or scalar tensors, not a subclass of them)")
    if result["policy"] not in POLICIES or type(result["policy"]) is not str:
        return f"'policy' should be one of {list(POLICIES)}, got {result['policy']!r}"
    return None


def _work_problem(log: dict[str, Any], x: np.ndarray, steps: int) -> str | None:
    """Each policy's model built once, trained EPOCHS unshuffled epochs, interleaved."""
    built = [run["policy"] for run in log["runs"]]
    trained = {run["policy"]: run for run in log["runs"] if run["steps"]}
    missing = [p for p in POLICIES if p not in trained]
    if missing or len(trained) != len([run for run in log["runs"] if run["steps"]]):
        return (f"the models you trained were built under {built} (the global policy in force "
                f"when make_model ran): train one model under each of {list(POLICIES)}, built "
                f"inside that policy (missing: {missing or 'none; one policy twice'})")
    order = [x[i:i + BATCH_SIZE].sum(axis=1) for i in range(0, len(x), BATCH_SIZE)]
    for policy, run in trained.items():
        if len(run["steps"]) != EPOCHS * steps:
            return (f"the {policy} model ran {len(run['steps'])} training steps, not "
                    f"{EPOCHS} epochs of {steps}: train each model exactly {EPOCHS} epochs")
        for index, (_, _, rows) in enumerate(run["steps"]):
            if rows.shape != order[index % steps].shape or not np.allclose(
                    rows, order[index % steps], rtol=1e-5, atol=1e-5):
                return (f"the {policy} model's step {index} did not train on batch "
                        f"{index % steps} of x in order: train on the same batches in the same "
                        f"order under every policy (batches of {BATCH_SIZE}, shuffle=False)")
    for k in range(EPOCHS - 1):  # round k (one epoch of each) ends before round k + 1 begins
        ends = {p: run["steps"][(k + 1) * steps - 1][1] for p, run in trained.items()}
        begins = {p: run["steps"][(k + 1) * steps][0] for p, run in trained.items()}
        late = [(a, b) for a in POLICIES for b in POLICIES if ends[a] > begins[b]]
        if late:
            return (f"the {late[0][0]} model's epoch {k + 1} ended after the "
                    f"{late[0][1]} model's epoch {k + 2} began: train and time the policies "
                    "in interleaved rounds (one epoch of each per round, every round), so that "
                    "whatever else the machine does slows all of them alike")
    return None


def _timing_problem(policy: str, run: dict[str, Any], reported: float, steps: int) -> str | None:
    """The reported steady time per step is the median of this model's timed ``fit`` calls'
    durations (each from before the call to its return) over the steps of an epoch: at least
    the wrapped calls' median, at most 2 % + 2 ms per step above it."""
    fits = sorted((end - began) / steps for began, end, first, last in run["fits"]
                  if first >= steps and last - first == steps)
    if len(fits) != EPOCHS - 1:
        return (f"the {policy} model's epochs after the first did not run in calls of its fit "
                "of their own: train and time them with fit, one epoch per call")
    median = float(np.median(fits))
    lower, upper = 0.995 * median, 1.02 * median + 0.002
    if not lower <= reported <= upper:
        return (f"seconds_per_step for {policy} is {reported * 1e3:.2f} ms, but the median of "
                f"that model's {EPOCHS - 1} epochs after the first, from before each fit to its "
                f"return over the {steps} steps of an epoch, is {median * 1e3:.2f} ms (the "
                f"epochs took {', '.join(f'{t * 1e3:.1f}' for t in fits)} ms per step; its "
                "steps wait on purpose, a time drawn per policy and per round, and its first "
                "epoch waits longer while the step is traced)")
    return None


def _model_problem(policy: str, model: Any, run: dict[str, Any], start: Any) -> str | None:
    keras = _keras()
    compute = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
    wrong = [layer.name for layer in model.layers if layer.name.startswith("dense_")
             and layer.compute_dtype != compute[policy]]
    if wrong or any(v.dtype != "float32" for v in model.weights):
        return (f"the {policy} model should compute its hidden layers in {compute[policy]} "
                f"with float32 variables: {wrong} do not (build it inside the policy)")
    optimizer = model.optimizer
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    inner = optimizer.inner_optimizer if scaled else optimizer
    if policy == "mixed_float16" and not scaled:
        return "the mixed_float16 model should train with a LossScaleOptimizer (section 4)"
    asked = {k: v for k, v in keras.optimizers.Adam(0.01).get_config().items() if k != "name"}
    got_config = inner.get_config() if isinstance(inner, keras.optimizers.Optimizer) else {}
    differ = sorted(k for k in asked if k in got_config and got_config[k] != asked[k]
                    and k != "learning_rate")
    if type(inner) is not keras.optimizers.Adam or differ or not math.isclose(
            float(np.asarray(inner.learning_rate)), 0.01, rel_tol=1e-6):
        return (f"the {policy} model should be compiled with keras.optimizers.Adam(0.01), "
                f"nothing else set; it has {type(inner).__name__}"
                + (f" with {', '.join(f'{k}={got_config[k]!r}' for k in differ)}"
                   if differ else ""))
    loss = getattr(model, "loss", None)
    if type(loss) is not keras.losses.SparseCategoricalCrossentropy or (
            loss.get_config().get("from_logits") is not True):
        return (f"the {policy} model should be compiled with "
                "keras.losses.SparseCategoricalCrossentropy(from_logits=True) (its outputs are "
                f"logits), not {loss!r}")
    expected = np.asarray(start(policy), np.float32)
    got = run["first_logits"]
    if got is None or got.shape != expected.shape or not np.allclose(
            got, expected, atol=0.05, rtol=0.05, equal_nan=True):
        return (f"the {policy} model's first training step computed other logits than the "
                "model does on the first batch from initial_weights: start every policy from "
                "initial_weights")
    weights_of(model)  # refuses a get_weights set on the model
    if run["model"]() is not model:
        return (f"runs[{policy!r}]['model'] is not the model your function trained under "
                f"{policy}: return the trained models")
    return None


def _expected(quality: dict[str, tuple[float, float]], waits: dict[str, float]) -> str:
    loss32, accuracy32 = quality["float32"]
    eligible = [p for p, (loss, accuracy) in quality.items() if math.isfinite(loss)
                and abs(loss / loss32 - 1) <= LOSS_TOLERANCE
                and abs(accuracy - accuracy32) <= ACCURACY_TOLERANCE]
    return min(eligible, key=lambda p: waits[p])


class _UnderFoundPolicy:
    """The learner's ``fn``, called with the case's global policy in force first (``func``:
    the framework finds the course's own functions behind it, by identity)."""

    def __init__(self, fn: Any) -> None:
        self.func, self.__wrapped__ = fn, fn

    def __call__(self, found: str, *args: Any) -> Any:
        from course_utils.grading.framework import _is_stub_raise

        _keras().mixed_precision.set_global_policy(found)
        try:
            return self.func(*args)
        except NotImplementedError as error:
            if _is_stub_raise(self.func, error):
                raise
            raise RuntimeError(f"NotImplementedError from a library call: {error}") from error


def _case(rng: Any, kind: str, found: str, float32_next: bool) -> Case:
    """``kind`` "overflow": float16 is the fastest and overflows on held-out rows; "coarse":
    bfloat16 is the fastest and loses the inputs. Next comes float32 (``float32_next``) or the
    other 16-bit policy, which keeps float32's quality there: the choice."""
    from course_utils.grading.checks.overflow import _inputs

    train = 3 * BATCH_SIZE + rng.randint(8, BATCH_SIZE - 8)  # 4 steps, the last one short
    x_all, y_all, num_features, num_classes = _inputs(rng, train + 256)
    if kind == "coarse":  # 1020 + k/2, |k| <= 3: exact in float16 (step 0.5), all 1020 in
        # bfloat16 (step 4; no value halfway between two of its numbers)
        x_all = (1020 + np.clip(np.round(x_all * 1.5), -3, 3) / 2).astype(np.float32)
    else:  # on a grid of sixteenths off the multiples of 1/8: exact in bfloat16
        x_all = (np.floor(x_all * 8) / 8 + 1 / 16).astype(np.float32)
    x, y, held_x, held_y = x_all[:train], y_all[:train], x_all[train:], y_all[train:]
    if kind == "overflow":  # 2^12 times x (at most 2^15: float16 trains), two held-out rows
        # 16 times more, past float16's range (its held-out loss inf or nan); a cast, which
        # no graph rewrite folds away
        grow = 2.0 ** (12 - max(0, math.ceil(math.log2(float(np.max(np.abs(x_all))) / 8))))
        x, held_x = x * grow, held_x * grow
        loud = rng.sample(list(np.flatnonzero(np.max(np.abs(held_x), 1) >= 4096)), 2)
        held_x[loud] *= 16.0  # 16 * 4096 * |x| >= 65536: inf in float16
    units, steps = rng.choice([16, 24, 32]), -(-train // BATCH_SIZE)
    fastest, other = (("mixed_float16", "mixed_bfloat16") if kind == "overflow"
                      else ("mixed_bfloat16", "mixed_float16"))
    order = [fastest, *(["float32", other] if float32_next else [other, "float32"])]
    first = rng.uniform(*FASTEST_WAIT_S)
    second = first * rng.uniform(*NEXT_FACTOR)
    waits = dict(zip(order, (first, second, second * rng.uniform(*LAST_FACTOR)), strict=True))
    loads = rng.sample(ROUND_LOADS, len(ROUND_LOADS))
    while loads[-1] == sorted(ROUND_LOADS)[1]:  # the last round never the median one
        loads = rng.sample(ROUND_LOADS, len(ROUND_LOADS))
    log: dict[str, Any] = {"runs": []}
    key, blank = secrets.token_hex(8), secrets.token_hex(8)
    _PACES[key] = {"waits": waits, "trace": {order[0]: TRACE_WAIT_S}, "loads": loads,
                   "steps": steps, "log": log}
    _PACES[blank] = {**_PACES[key], "trace": {}, "log": {"runs": []}}
    make_model = _builder(num_features, num_classes, units, kind, key)
    keras = _keras()
    keras.mixed_precision.set_global_policy("float32")
    initial_weights = make_model().get_weights()
    log["runs"].clear()

    def start(policy: str) -> Any:
        from course_utils.training.precision import policy_scope

        with policy_scope(policy):
            model = _builder(num_features, num_classes, units, kind, blank)()
        model.set_weights(initial_weights)
        return model(x[:BATCH_SIZE], training=False)

    def verify(result: Any) -> str | None:
        policy_now = keras.mixed_precision.global_policy().name
        if policy_now != found:
            keras.mixed_precision.set_global_policy(found)
            return (f"the global policy was left at {policy_now!r}, not as your function found "
                    f"it ({found!r}, drawn per case): restore what was in force")
        problem = _result_problem(result) or _work_problem(log, x, steps)
        if problem:
            return problem
        runs, trained = result["runs"], {run["policy"]: run for run in log["runs"]
                                         if run["steps"]}
        quality, seconds = {}, {}
        for policy in POLICIES:
            reported = seconds[policy] = float(plain_number(runs[policy]["seconds_per_step"]))
            problem = (_timing_problem(policy, trained[policy], reported, steps)
                       or _model_problem(policy, runs[policy]["model"], trained[policy], start))
            if problem:
                return problem
            loss, accuracy = (float(plain_number(runs[policy][k])) for k in ("loss", "accuracy"))
            problem = _quality_problem(policy, runs[policy]["model"], loss, accuracy, held_x,
                                       held_y)
            if problem:
                return problem
            quality[policy] = (loss, accuracy)  # yours, as close as batching allows to ours
        want = _expected(quality, seconds)  # yours, checked above (xf08 R3)
        if result["policy"] != want:
            return (f"you chose {result['policy']!r}, but the fastest policy whose held-out "
                    f"quality is within the tolerances of float32's is {want!r} (held-out "
                    "loss, accuracy: " + ", ".join(f"{p} {q[0]:.4g}, {q[1]:.1%}" for p, q in
                                                  quality.items()) + ")")
        return None

    label = ("(make_model, initial_weights, x, y, held_out_x, held_out_y; the global policy "
             f"found: {found!r})")
    return Case(args=(found, make_model, initial_weights, x, y, held_x, held_y),
                verify=verify, label=label)


@register
def check_choose_policy(fn: Any) -> bool:
    """Check ``choose_policy(make_model, initial_weights, x, y, held_out_x, held_out_y)``."""
    peeks_refused("choose_policy", fn)
    rng = fresh_rng()
    keras = _keras()
    before = keras.mixed_precision.global_policy()
    found, kinds = rng.sample(FOUND_POLICIES, 2), rng.sample(["overflow", "coarse"], 2)
    flip = rng.randrange(2)  # which case's choice is float32 (the other's a 16-bit policy)
    _PACES.clear()  # the last check's cases only (its models may still be read)
    try:
        cases = [_case(rng, kind, policy, (kind == "overflow") == bool(flip))
                 for kind, policy in zip(kinds, found, strict=True)]
        return run_check("choose_policy", _UnderFoundPolicy(fn), cases, hint=(
            "lesson 08, section 2 (policy_scope), 8 (the same start) and 9 (interleaved "
            "rounds, the first call excluded); section 1 for what float16 and bfloat16 cannot "
            "hold."))
    finally:
        keras.mixed_precision.set_global_policy(before)
