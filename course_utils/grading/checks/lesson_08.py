"""Checks of lesson 08's exercises (registered by name with ``@register``).

* ``check_train_with_policy(train_with_policy)``: the same model trained under ``"float32"`` and
  ``"mixed_float16"`` from the same initial weights on fresh data; each run trained, really
  applied its policy (16-bit compute in the hidden layers, float32 variables and outputs, a
  LossScaleOptimizer for float16), started from the given weights (equal to a reference run),
  reports its own losses per epoch (equal to the reference run's history, at the weights'
  tolerance: typed-in losses fail) and its accuracy, restored the global policy (the check
  calls each run with another of ``FOUND_POLICIES`` in force, drawn per run: a restore to any
  typed policy fails), and reports a steady-state
  time per step that is a timing of its own steps: the check's model sleeps in every training
  step (a time drawn per run, 60 to 400 ms; 2 to 2.5 times that, drawn, in the epochs between
  the first and the last) and longer while tracing, sleeps between the timed epochs (a
  callback its ``fit`` adds: the steps' own times leave it out; a share of the timed steps'
  waits, small in one run and large in the other, drawn: no one factor on a mean of per-batch
  times fits both runs), and logs when its steps
  ran and when its ``fit`` returned (into an OS pipe whose read end a child process holds until
  the check reads it: no descriptor in the learner's process reads the log back; see
  ``pipe_log``), so the learner's figure must lie
  between the span of the timed steps and the time from the first epoch's end to the last
  ``fit``'s return – bounds taken from the same run, which the machine's load moves together
  with the learner's timing. Then the two runs' final loss and accuracy must agree within
  tolerances.
* ``check_loss_scaled_train_step(loss_scaled_train_step)``: steps of a mixed_float16 model with
  a ``LossScaleOptimizer`` and a global-norm clip (below the gradients' norm, so that it
  changes the updates) on fresh inputs equal a reference step that clips the UNSCALED
  gradients (weights, loss, norm, loss scale, which steps were skipped), and a batch planted to
  overflow is skipped (weights unchanged, scale halved). The loss is weighted by ``LOSS_WEIGHT``
  (2^-18): its true gradients underflow float16, so a step that never computes them at the loss
  scale differs. The scale starts at the largest power of two at which the first batch's
  gradients are finite and doubles after every finite step (``GROWTH_STEPS``), so later steps
  overflow in the backward pass and must be skipped: a step that computes its gradients at a
  fixed loss scale of its own (the optimizer's scale used only to apply) is applied there.
* ``check_first_overflowing_layer(first_overflowing_layer)``: fresh mixed_float16 MLPs whose
  activations grow layer by layer, on batches with two outlier rows scaled so that the same
  model overflows at different layers (or nowhere): the answer depends on the outputs, not on
  the weights. One model grows in layers without weights (a recomputation from the Dense
  weights misses it); another has a decoy: the layer with by far the largest (negative) weights,
  whose output is finite wherever its input is (ReLU makes its pre-activations 0); every batch
  holds two loud rows that never overflow (the largest examples, but where the outlier rows are
  scaled past them), and up to two batches of each model have every row but the loud ones
  scaled, each by its own factor and
  below them, the overflow starting in a row of middling size (no outlier rows, nor the k
  largest, to pick out: never among the 12 largest, nor the 8 smallest, by max or L2 norm). Each
  model's outlier rows lie in one half and parity of the batch, the other model's in the other
  half and parity: an answer that looks at a fixed half of the batch misses one model's. Last,
  8 batches of each model in which one drawn row alone overflows (every other row left alone):
  an answer that looks at a random 3/4 of the rows passes each with probability 3/4.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.equality import largest_difference
from course_utils.grading.checks.answer_reach import peeks_refused, plain_number, weights_of
from course_utils.grading.checks.loss_scaling import (  # noqa: F401
    GROWTH_STEPS,
    LOSS_WEIGHT,
    OVERFLOW_FACTOR,
    _keras,
    _model_builder,
    check_loss_scaled_train_step,
)
from course_utils.grading.checks.overflow import _inputs as _task
from course_utils.grading.checks.overflow import check_first_overflowing_layer  # noqa: F401
from course_utils.grading.checks.pipe_log import delayed_model_builder, pipe_log
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = ["ACCURACY_TOLERANCE", "BATCH_SIZE", "EPOCHS", "GROWTH_STEPS", "LOSS_TOLERANCE",
           "LOSS_WEIGHT",
           "OVERFLOW_FACTOR",
           "check_first_overflowing_layer",
           "check_loss_scaled_train_step", "check_train_with_policy"]

# --- Exercise 1 · regular versus mixed-precision training, from the same start ----------------

#: Exercise 1's batch size, epochs and tolerances of the quality comparison.
BATCH_SIZE, EPOCHS = 64, 3
ACCURACY_TOLERANCE, LOSS_TOLERANCE = 0.05, 0.05
#: Each run's model waits a time drawn log-uniformly from this range in every training step
#: (one draw per run, unknown to the learner), so that only a timing of that run matches.
DELAY_RANGE_S = (0.06, 0.4)
#: The epochs between the first and the last wait longer, by a factor drawn from this range
#: per run: a timing of the last epoch alone (or of the middle ones) misses the bounds of the
#: epochs after the first as a whole (the last epoch alone passed before).
MIDDLE_EPOCHS_SLOWER = (2.0, 2.5)
#: The model's fit sleeps between the epochs after the first (after each but the first and the
#: last), in all a share of the timed steps' waits drawn per run from one of these ranges, the
#: other run from the other (which run gets which, drawn): a mean of per-batch times scaled by
#: any one factor misses one run's bounds (a mean times 1 + 1/n passed 4 runs in 7 when every
#: epoch ended with a pause of one step's wait, a fixed share of the epochs' span: r08 L1).
PAUSE_SHARES = ((0.02, 0.08), (0.25, 0.4))
#: The global policies in force when the learner's function is called (neither of the two it
#: is asked to train under), one drawn per run and a different one for each run: it must find
#: its run's there again, which no typed policy ("float32", "mixed_bfloat16") does every time.
FOUND_POLICIES = ("mixed_bfloat16", "bfloat16", "float64")


class _UnderFoundPolicy:
    """The learner's ``fn``, called with the global policy its case found in force (the
    case's first argument): ``fn`` must leave it as it found it. No ``__code__``, so the
    framework trusts its NotImplementedError: only the learner's own stub raise passes as one."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__wrapped__ = fn  # the framework's introspection guard reads the learner's code

    def __call__(self, found: str, *args: Any) -> Any:
        from course_utils.grading.framework import _is_stub_raise

        _keras().mixed_precision.set_global_policy(found)
        try:
            return self.fn(*args)
        except NotImplementedError as error:
            if _is_stub_raise(self.fn, error):
                raise
            raise RuntimeError(f"NotImplementedError from inside a library call: {error}"
                               ) from error


def _policy_problem(model: Any, policy: str, x: np.ndarray) -> str | None:
    """What is wrong with the dtypes of a model trained under ``policy`` (None if nothing)."""
    keras = _keras()
    compute = "float16" if policy == "mixed_float16" else "float32"
    hidden = [layer for layer in model.layers if layer.weights][:-1]
    wrong = [f"{layer.name}: {layer.compute_dtype}" for layer in hidden
             if layer.compute_dtype != compute]
    if wrong:
        return (f"under {policy!r} the hidden layers should compute in {compute}, got "
                f"{', '.join(wrong)} (section 2: when does a layer take its policy?)")
    not_float32 = [v.path for v in model.weights if v.dtype != "float32"]
    if not_float32:
        return f"every variable should stay float32, got other dtypes for {not_float32[:3]}"
    output_dtype = keras.backend.standardize_dtype(model(x[:4]).dtype)
    if output_dtype != "float32":
        return f"the model's output should be float32 (for the loss), got {output_dtype}"
    scaled = isinstance(getattr(model, "optimizer", None), keras.optimizers.LossScaleOptimizer)
    if policy == "mixed_float16" and not scaled:
        return ("under 'mixed_float16' the model should be compiled with a LossScaleOptimizer "
                "(compile wraps the optimizer when the model itself was made under "
                "'mixed_float16': it reads the model's own dtype policy, not the global one)")
    return None


def _reference_run(make_model: Callable[[], Any], policy: str, weights: list[np.ndarray],
                   x: np.ndarray, y: np.ndarray) -> tuple[Any, list[float]]:
    """The exercise done right (without timing): the model after EPOCHS epochs and its
    losses per epoch (its fit's history)."""
    from course_utils.training.precision import policy_scope

    keras = _keras()
    with policy_scope(policy):
        model = make_model()
    model.set_weights(weights)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=BATCH_SIZE, epochs=EPOCHS, shuffle=False, verbose=0)
    return model, [float(v) for v in history.history["loss"]]


def _accuracy(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=-1) == y))


def _run_problem(result: Any, policy: str, x: np.ndarray, y: np.ndarray,
                 reference: tuple[Any, list[float]], found: str) -> str | None:
    """What is wrong with one run's result (None if nothing), timing aside; ``reference`` is
    ``_reference_run``'s model and losses, ``found`` the global policy the run was called
    under. The reported losses must be the run's own (the quality comparison reads them)."""
    keras = _keras()
    if keras.mixed_precision.global_policy().name != found:
        name = keras.mixed_precision.global_policy().name
        keras.mixed_precision.set_global_policy(found)
        return (f"the global policy was left at {name!r}, not as your function found it "
                f"({found!r}: the check sets another one, drawn afresh, before each call), "
                "even where building fails: what did it hold when your function began?")
    if isinstance(result, str):  # what _plain_result found wrong
        return result
    losses = result["losses"]
    if len(losses) != EPOCHS:
        return f"expected one loss per epoch ({EPOCHS}), got {len(losses)}"
    if not all(math.isfinite(v) for v in losses) or not losses[-1] < losses[0]:
        return f"the model did not train: losses per epoch {losses}"
    reference_model, reference_losses = reference
    tolerance = 1e-3 if policy == "float32" else 2e-2
    problem = _policy_problem(result["model"], policy, x)
    if problem:
        return problem
    error = largest_difference(weights_of(result["model"]), reference_model.get_weights())
    if not error < tolerance:
        return (f"after training, the weights differ from a run that starts from "
                f"initial_weights by up to {error:.3g} ({EPOCHS} epochs of batches of "
                f"{BATCH_SIZE}, unshuffled): which of these did your run change?")
    # the weights first: a run from another start also reports other losses
    if not all(math.isclose(got, want, rel_tol=tolerance)
               for got, want in zip(losses, reference_losses, strict=True)):
        return (f"'losses' are {[round(v, 4) for v in losses]}, but a run from "
                f"initial_weights gives {[round(v, 4) for v in reference_losses]} per epoch: "
                "report the losses your own fit returned (its history), one per epoch")
    accuracy = _accuracy(result["model"], x, y)
    if not math.isclose(result["accuracy"], accuracy, abs_tol=1.5 / len(x)):
        return (f"'accuracy' is {result['accuracy']!r}, but the trained model classifies "
                f"{accuracy:.1%} of x correctly: measure it after training")
    return None


def _plain_result(result: Any) -> dict[str, Any] | str:
    """The run's result, its numbers read at once as Python's own (``plain_number``: exact
    types, so that no code of the learner's runs once the check's reference and bounds exist:
    a float subclass's ``__float__`` passed before); a message when it is not that."""
    keys = {"model", "losses", "accuracy", "seconds_per_step"}
    if type(result) is not dict or not all(type(key) is str for key in result) or set(
            result) != keys:
        return (f"expected a dict with the keys {sorted(keys)}, got {type(result).__name__} "
                f"{sorted(map(str, result)) if type(result) is dict else ''}")
    found = result["losses"]
    losses = [plain_number(v) for v in found] if type(found) in (list, tuple, np.ndarray) else []
    numbers = {key: plain_number(result[key]) for key in ("accuracy", "seconds_per_step")}
    if not losses or any(type(v) not in (int, float) for v in [*losses, *numbers.values()]):
        return ("'losses' (a list), 'accuracy' and 'seconds_per_step' should be numbers: "
                "Python's or NumPy's, or scalar tensors, not a subclass of them")
    return {"model": result["model"], "losses": [float(v) for v in losses], **numbers}


def _timing_bounds(log: dict[str, list[Any]] | str, steps_per_epoch: int,
                   epochs: int) -> tuple[float, float] | str:
    """The seconds per step that a timing of this run's epochs after the first can give:
    at least the span of those steps' waits, at most from the end of the first epoch's last
    wait to the return of the ``fit`` that ran the last step (both per timed step). A message
    instead when the run did not make ``epochs`` epochs of training steps (or when ``log`` is
    one: what was wrong with the log)."""
    if isinstance(log, str):
        return log
    steps, timed = log["steps"], (epochs - 1) * steps_per_epoch
    if len(steps) != epochs * steps_per_epoch:
        return (f"the model you were given ran {len(steps)} training steps, not {epochs} epochs "
                f"of {steps_per_epoch}: train it exactly {epochs} epochs")
    last_end = steps[-1][1]
    fit_end = min((t for t in log["fit_ends"] if t >= last_end), default=None)
    if fit_end is None:
        return "train with the model's own fit, as the exercise says"
    lower = (last_end - steps[steps_per_epoch][0]) / timed
    upper = (fit_end - steps[steps_per_epoch - 1][1]) / timed
    return lower, upper


def _timing_problem(step: Any, bounds: tuple[float, float] | str) -> str | None:
    """Whether the learner's seconds per step is a timing of this run's steady steps."""
    if isinstance(bounds, str):
        return bounds
    if type(step) not in (int, float):  # exact, read at once by _plain_result
        return f"seconds_per_step should be a number of seconds, got {type(step).__name__}"
    lower, upper = bounds
    if not 0.98 * lower <= step <= 1.02 * upper + 0.001:
        return (f"seconds_per_step is {float(step) * 1e3:.1f} ms, but this run's epochs after "
                f"the first took between {lower * 1e3:.1f} and {upper * 1e3:.1f} ms per step "
                "(the check's model logs when its steps ran; it waits a different, unknown "
                "time in every run). Which steps did your timing include, and what did you "
                "divide by? (section 9)")
    return None


@register
def check_train_with_policy(fn: Any) -> bool:
    """Check ``train_with_policy(make_model, policy, x, y, epochs, initial_weights)``."""
    peeks_refused("train_with_policy", fn)
    rng = fresh_rng()
    x, y, num_features, num_classes = _task(rng, 4 * BATCH_SIZE)
    units = rng.choice([32, 48])
    policies = ("float32", "mixed_float16")
    low, high = (math.log(s) for s in DELAY_RANGE_S)
    pipes = {p: pipe_log() for p in policies}  # (write-only log, reader, closer) per run
    steps_per_epoch = -(-len(x) // BATCH_SIZE)
    middle = (steps_per_epoch, (EPOCHS - 1) * steps_per_epoch)  # epochs 2 to EPOCHS - 1
    shares = dict(zip(policies, rng.sample(PAUSE_SHARES, len(policies)), strict=True))
    builders = {}
    for p in policies:
        delay, factor = math.exp(rng.uniform(low, high)), rng.uniform(*MIDDLE_EPOCHS_SLOWER)
        timed = steps_per_epoch * delay * (factor * (EPOCHS - 2) + 1)  # the steps' waits
        pause = rng.uniform(*shares[p]) * timed / max(EPOCHS - 2, 1)  # per epoch between
        builders[p] = delayed_model_builder(num_features, num_classes, units, delay,
                                            pipes[p][0], slower=(*middle, factor),
                                            pause=(1, EPOCHS - 1, pause))
    initial_weights = _model_builder(num_features, num_classes, units)().get_weights()
    found = dict(zip(policies, rng.sample(FOUND_POLICIES, len(policies)), strict=True))
    runs: dict[str, dict[str, Any]] = {}

    def verifier(policy: str) -> Callable[[Any], str | None]:
        def verify(result: Any) -> str | None:
            result = _plain_result(result)  # before the reference run and the bounds exist
            reference = _reference_run(_model_builder(num_features, num_classes, units), policy,
                                       initial_weights, x, y)
            problem = _run_problem(result, policy, x, y, reference, found[policy])
            if problem:
                return problem
            bounds = _timing_bounds(pipes[policy][1](), steps_per_epoch, EPOCHS)
            problem = _timing_problem(result["seconds_per_step"], bounds)
            if problem:
                return problem
            runs[policy] = {"loss": float(result["losses"][-1]),
                            "accuracy": float(result["accuracy"]),
                            "ms": float(result["seconds_per_step"]) * 1e3}
            if len(runs) < len(policies):
                return None
            return _quality_problem(runs)

        return verify

    cases = [Case(args=(found[policy], builders[policy], policy, x, y, EPOCHS,
                        initial_weights),
                  verify=verifier(policy),
                  label=f"(make_model, {policy!r}, x, y, epochs={EPOCHS}, initial_weights; "
                        f"the global policy found: {found[policy]!r})")
             for policy in policies]
    found_before = _keras().mixed_precision.global_policy()
    try:
        passed = run_check(
            "train_with_policy", _UnderFoundPolicy(fn), cases,
                hint="lesson 08, section 2 (dtype policies), section 4 (LossScaleOptimizer in "
                 "fit) and section 8 (same start, same quality): the message above says where "
                 "your run first differed from the exercise's.")
    finally:
        _keras().mixed_precision.set_global_policy(found_before)
        for _log, _read, close in pipes.values():
            close()
    if passed:
        for policy, run in runs.items():
            print(f"   {policy}: final loss {run['loss']:.4f}, accuracy {run['accuracy']:.1%}, "
                  f"{run['ms']:.1f} ms per step (this check's model waits on purpose)")
    return passed


def _quality_problem(runs: dict[str, dict[str, Any]]) -> str | None:
    """Whether mixed precision matched float32's final loss and accuracy, same start."""
    float32, mixed = runs["float32"], runs["mixed_float16"]
    accuracy_gap = abs(mixed["accuracy"] - float32["accuracy"])
    loss_gap = abs(mixed["loss"] / float32["loss"] - 1)
    if accuracy_gap > ACCURACY_TOLERANCE or loss_gap > LOSS_TOLERANCE:
        return (f"from the same start, mixed_float16 ended at loss {mixed['loss']:.4f} and "
                f"accuracy {mixed['accuracy']:.1%}, float32 at {float32['loss']:.4f} and "
                f"{float32['accuracy']:.1%}: more apart than the tolerances "
                f"({ACCURACY_TOLERANCE:.0%} accuracy, {LOSS_TOLERANCE:.0%} loss)")
    return None
