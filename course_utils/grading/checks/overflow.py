"""Lesson 08, exercise 3: where does float16 overflow first? (registered with ``@register``).

``check_first_overflowing_layer(first_overflowing_layer)``: fresh mixed_float16 MLPs whose
activations grow layer by layer, on batches with two outlier rows scaled so that the same model
overflows at different layers (or nowhere): the answer depends on the outputs, not on the
weights. In the first model, layers without weights (``Rescaling``) do the growing, so an answer
that recomputes the outputs from the Dense layers' weights misses it; the second grows in its
kernels and has a decoy: the layer with by far the largest (negative, float16-finite) weights,
whose output is finite wherever its input is (ReLU makes its negative pre-activations 0). Every
batch also holds two loud rows, which ReLU zeroes in the first layer (the largest examples of every
batch but those whose outlier rows are scaled past them): an answer that looks only at the largest
example misses the overflow. Each model also gets up to two batches with every row but the loud ones
scaled (two in each of 455 draws; one model none in 1 of 46 before the layers' names changed), each
by its own factor and below them: the row left to overflow is one that does so at the smallest size
(the largest gain), the others are scaled to just below overflow; in the first, 9 to 15 of them
shrink below it (fewer where under 10 would stay above it): no row stands out, so an answer that
looks only at the rows far above the others, or at the k largest, or at the k largest with the k
smallest (k up to 8), misses the overflow (in 640 draws of the first model's batch, then 70 of each
model's, it was never among the 12 largest, nor the 8 smallest, by max or L2 norm); in the second, 0
to 3 shrink below it, so an answer that drops the k smallest rows misses it (every row but the 8
smallest passed 20 draws in 20 before, but the 12 smallest 10; with it 0 in 30 each, but the 4
smallest 3 in 30). Each model's two outlier rows lie in one half of the batch and at one parity, the
other model's in the other half at the other parity: an answer that looks at a fixed half of the
batch (``x[:16]``, ``x[16:]``, ``x[::2]``, ``x[1::2]``) or a slice of one misses one model's
overflow. Last, each model gets ``ONE_ROW_CASES`` batches in which one row is scaled to overflow
(the batch's first and last rows first, then rows drawn, at a layer drawn in turn) and every other
row is left alone, harmless even 1.78 times larger: an answer that looks at part of the batch passes
each only where its part holds that row (a random 3/4 of the rows passed 15 draws in 40 before, 0 in
80 with them; ``x[::3]``, ``x[:24]``, the rows not 3 mod 4: 0 in 80); and two batches with two rows
scaled, every other row left alone: a row of one half overflowing first at a later layer than a row
of the other half, in the first half in one batch and in the second in the other, the larger of the
two (by max and L2 norm, where it can be) in one and the smaller in the other, the later one even in
one and odd in the other (where it can be), so an answer that loops over the rows outside the layers
in one order (one by one, in chunks, in halves, in strided halves, from either end, or by size) and
returns the first overflowing layer it meets misses one (with one batch, from the first quarter to
the last: two halves the second's answer first, chunks of 8 the last first and the rows reversed
passed 18, 6 and 1 draws in 34; 0 in 100 with both; ``x[::2]``'s answer first, or ``x[1::2]``'s, 2
and 3 in 16 before the parities, 2 and 0 in 100 with them). In the second of them a third row
overflows first at the later row's layer: the layer most rows overflow at is not the answer (it
passed 2 draws in 16 before, 0 in 100). The hidden layers are named each with its own drawn tag
first (``ko_dense``, ``ri_amplify``), in one model in alphabetical order, in the other in reverse:
neither the smallest nor the largest name among the rows' (or the halves', strided halves', chunks')
answers is the earliest layer in both models (the largest passed 7 to 15 draws in 46 before, every
such merge 0 in 44 with it). Still passes at times, not a mistake a learner writes (40 draws): the
rows ranked by another measure (the 8 farthest from the batch's mean: 1) and the few largest rows
with many of the smallest (the 4 largest with the 12 smallest: 5; with the smaller half of the
batch: 36, the overflowing row of the first every-row batch being the 10th to 19th smallest by max,
and the one-row batches' row among the largest but the two loud ones). The rows walked largest
first, first overflow found: 1 draw in 100 by max, 1 by L2 norm (where no two rows of either model
can be scaled so that the larger overflows later: a fifth of the models). Every row but the smallest
one or two by max: 92 and 58 in 100 (the row that overflows in an every-row batch is seldom the
smallest); dropping one or two rows is no lesson's mistake. The cases are built in a function of
their own; each case's answer is found after the learner's function returned, from the model and a
copy of the batch (a frame walk finds no answer while it runs), and the model's weights must be
unchanged. Last, ``overflow_rounding``'s two float16-edge batches. """

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks import overflow_rounding, overflow_rows
from course_utils.grading.checks.answer_reach import guarded, weights_of
from course_utils.grading.checks.overflow_rows import (
    one_row_cases,
    outputs_model,
    overflow_cases,
    row_firsts,
    two_row_case,
)
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["DECOY_PEAK", "GROWTH", "LOUD_INPUT", "LOUD_LOGITS", "ONE_ROW_CASES",
           "check_first_overflowing_layer"]


def _inputs(rng: Any, num_examples: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Fresh inputs of a learnable task (a random teacher), with its sizes."""
    from course_utils.data import teacher_classification

    num_features, num_classes = rng.choice([8, 12, 16]), rng.choice([3, 4, 5])
    x, y = teacher_classification(num_examples, num_features, num_classes,
                                  seed=rng.randint(0, 10_000))
    return x, y, num_features, num_classes


def _keras() -> Any:
    _tf()
    import keras

    return keras


# --- Exercise 3 · where does float16 overflow first? -----------------------------------------

#: Every hidden layer of the check's models multiplies its input by about this (its kernel
#: scaled, or a ``Rescaling`` layer after it): activations grow layer by layer, so how far a
#: batch gets before float16 overflows (65504) depends on its inputs.
GROWTH = 8.0

#: The decoy layer's kernel is made negative with this largest magnitude: far above every other
#: weight, yet finite in float16 (a kernel that is -inf in float16 would give 0 * -inf = nan).
#: Its pre-activations are large and negative, and ReLU turns them into 0, a finite output.
DECOY_PEAK = 2.0 ** 15

#: Two loud rows per batch: this value in one feature, where every first kernel is negative:
#: ReLU makes them 0, so the largest examples are not where the overflow starts.
LOUD_INPUT = 60_000.0

#: A third model's float32 logits peak here: above 65504, finite in float32; no layer overflows.
LOUD_LOGITS = 1e6

#: Batches of each model in which one row, drawn, overflows and every other row is harmless:
#: an answer that looks at a random 3/4 of the rows passes each with probability 3/4 at most.
ONE_ROW_CASES = 8

def _first_overflowing(model: Any, batch: np.ndarray) -> str | None:
    """The reference: the first layer whose output on ``batch`` is not finite anywhere."""
    layers, every_output = outputs_model(model)
    for layer, output in zip(layers, every_output(batch), strict=True):
        if not np.all(np.isfinite(np.asarray(output, np.float32))):
            return layer.name
    return None


def _weights_digest(model: Any) -> str:
    return hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in weights_of(model))
                          ).hexdigest()


def _overflow_verifier(model: Any, batch: np.ndarray, order: list[str], decoy: str | None,
                       scale: float, scaled: str = "outlier rows",
                       ) -> Callable[[Any], str | None]:
    """The case's verdict. Its answer is found after the learner's function returned, from
    the model and a copy of the batch (bytes: nothing the check holds while the learner's
    function runs names the answer)."""
    raw, shape, dtype, digest = batch.tobytes(), batch.shape, batch.dtype, _weights_digest(model)

    def verify(got: Any) -> str | None:
        # the type first, and exactly str: an object (or a str subclass) whose == is always
        # True would pass the comparison below
        if got is not None and type(got) is not str:
            return f"return a layer's name (a str) or None, not {type(got).__name__}"
        if _weights_digest(model) != digest:
            return "your function changed the model's weights: read them, never assign them"
        expected = _first_overflowing(model, np.frombuffer(raw, dtype).reshape(shape))
        if got == expected:
            return None
        if got is not None and got not in order:
            return f"{got!r} is not a layer of this model (its layers: {order})"
        if got is not None and got == decoy and (  # finite wherever its input is
                expected is None or order.index(got) < order.index(expected)):
            return (f"{got!r} has by far the largest weights, yet its output on this x is "
                    "finite: its pre-activations are large and negative, and ReLU makes them "
                    "0. The weights alone do not tell where an output overflows")
        if expected is None:
            return (f"on this x ({scaled} times {scale:.3g}) every layer's output is "
                    f"finite in its own dtype (float16, float32 for the logits), you answered "
                    f"{got!r}: return None then")
        if got is None:
            return (f"on this x ({scaled} times {scale:.3g}) {expected!r} outputs inf or "
                    "nan in float16 and you answered None: did you look at every example, in "
                    "the model's own (mixed_float16) dtypes?")
        if order.index(got) > order.index(expected):
            return (f"{expected!r}, before {got!r}, already is not finite on this x "
                    f"({scaled} times {scale:.3g}), in one example at least: return the "
                    "first, over every example")
        return (f"{got!r}'s output is finite on this x ({scaled} times {scale:.3g}); the "
                f"first layer whose output is not finite is {expected!r}. The same model "
                "overflows at different layers on different inputs")
    return verify


@register
def check_first_overflowing_layer(fn: Any) -> bool:
    """Check ``first_overflowing_layer(model, x)`` on fresh models and batches (answers differ)."""
    fn = guarded("first_overflowing_layer", fn, [sys.modules[__name__], overflow_rows,
                                               overflow_rounding],
                 "find the layer with your own forward pass (section 3), not the check's")
    cases = _overflow_cases(fresh_rng())  # built in a frame of their own, gone by now
    return run_check(
        "first_overflowing_layer", fn, cases,
        hint="lesson 08, section 1 (float16's range) and section 3 (a hidden layer's output, "
             "read): in which dtype does each layer compute, which layers' outputs did your "
             "answer look at, and which examples of the batch?")


def _overflow_cases(rng: Any) -> list[Case]:
    """The check's cases: only their inputs, labels and verdicts (see the module's text)."""
    from course_utils.training.precision import policy_scope

    x, _, num_features, num_classes = _inputs(rng, 32)
    depth, units = rng.choice([4, 5]), rng.choice([16, 24, 32])
    rows_by_model = _outlier_rows(rng, len(x))
    backwards = rng.randrange(2)  # this model's layer names sort in reverse layer order
    loud_rows = rng.sample([row for row in range(1, len(x) - 1)  # never an end of the batch
                            if row not in sum(rows_by_model, [])], 2)
    dead_feature = rng.randrange(num_features)
    x[loud_rows] = 0.0
    x[loud_rows, dead_feature] = LOUD_INPUT
    cases, one_row = [], []
    for with_decoy, rows in zip((False, True), rows_by_model, strict=True):
        tags = _tags(rng, depth * (1 if with_decoy else 2), backwards == with_decoy)
        with policy_scope("mixed_float16"):
            model = (_deep_mlp(num_features, num_classes, units, tags) if with_decoy
                     else _weightless_growth_mlp(num_features, num_classes, units, tags))
        hidden = [layer for layer in model.layers if layer.weights][:-1]
        _zero_the_loud_row(hidden[0], dead_feature)
        decoy = None
        if with_decoy:  # the kernels grow; the last hidden layer: huge, negative weights
            for layer in hidden:
                layer.kernel.assign(layer.kernel * GROWTH)
            decoy = hidden[-1].name
            kernel = np.abs(hidden[-1].kernel.numpy())
            hidden[-1].kernel.assign(-kernel / kernel.max() * DECOY_PEAK)
        order = [layer.name for layer in outputs_model(model)[0]]
        grows = ("one with huge negative weights" if decoy
                 else "each followed by a layer without weights that amplifies")
        for batch, _, scale in overflow_cases(model, x, rows, rng, decoy):
            label = (f"(mixed_float16 MLP, {depth} hidden layers, {grows}; x with 2 "
                     f"outlier rows times {scale:.3g})")
            cases.append(Case(args=(model, batch), label=label,
                              verify=_overflow_verifier(model, batch, order, decoy, scale)))
        # every row but the loud ones scaled: no outlier row to spot, the loud ones stay the
        # largest examples (an answer looking at the largest sees no overflow) and the overflow
        # is in a middling row
        others = [row for row in range(len(x)) if row not in loud_rows]
        quieter = np.max(np.abs(x[others]))
        firsts = row_firsts(model, x, others)
        named = [case for case in overflow_cases(model, x, others, rng, None, firsts)
                 if case[1] and case[1] != decoy and case[2] * quieter < LOUD_INPUT]
        # twice: the row that overflows with 9 to 15 rows shrunk below it, then with 0 to 3
        # (an answer that drops the k smallest rows misses the second)
        wanted = {(9, 15): "neither among the largest nor the smallest",
                  (0, 3): "near the smallest"}
        for batch, expected, scale in sorted(named, key=lambda case: case[2]):
            for below, where in list(wanted.items()):
                louder = _quiet_rows_louder(model, batch, expected, others, rng, below)
                if louder is None:
                    continue
                del wanted[below]
                cases.append(Case(args=(model, louder[0]), label=(
                    f"(mixed_float16 MLP, {depth} hidden layers, {grows}; x with every row "
                    f"but two scaled, each by its own factor, the overflow in a row {where})"),
                    verify=_overflow_verifier(
                        model, louder[0], order, decoy, scale * louder[1],
                        "every row but two scaled, each by its own factor; the row where "
                        "the overflow starts")))
            if not wanted:
                break
        # one row, drawn, scaled to overflow, every other row left alone: an answer that
        # looks at part of the batch misses the one row that overflows
        for batch, _, scale in one_row_cases(firsts[0], x, firsts[2], others, rng,
                                                     ONE_ROW_CASES):
            one_row.append(Case(args=(model, batch), verify=_overflow_verifier(
                model, batch, order, decoy, scale, "one row"), label=(
                f"(mixed_float16 MLP, {depth} hidden layers, {grows}; x with one row "
                f"times {scale:.3g}, every other row left alone)")))
        # two rows scaled, one in each half of the batch, the one overflowing later once early
        # in the batch and once late, once the larger and once the smaller: an answer that
        # loops over the rows outside the layers, in one order, and returns the first
        # overflowing layer it meets answers the other row's layer in one of them
        for batch, _, scale, count in two_row_case(firsts[0], x, firsts[2], others,
                                                           rng):
            third = "" if count == 2 else " and a third row"
            one_row.append(Case(args=(model, batch), verify=_overflow_verifier(
                model, batch, order, decoy, scale,
                f"a row of each half{third} scaled, each by its own factor; the row that "
                "overflows first,"),
                label=(f"(mixed_float16 MLP, {depth} hidden layers, {grows}; x with a row of "
                       f"each half{third} scaled, every other row left alone)")))
    cases += _loud_logits_case(num_features, num_classes, units, depth, x, rows_by_model[0], rng,
                               dead_feature)
    with policy_scope("mixed_float16"):  # float16 rounding against exact arithmetic
        edge = _deep_mlp(num_features, num_classes, units, _tags(rng, depth, False))
    cases += [Case(args=(m, b), verify=v, label="(mixed_float16 MLP, a row at float16's edge)")
              for m, b, v in overflow_rounding.rounding_cases(edge, x, rng, lambda *a: (
                  _overflow_verifier(edge, *a)))]
    return cases + one_row  # last: an answer refused earlier is refused as fast as before


def _outlier_rows(rng: Any, num_examples: int) -> list[list[int]]:
    """Two outlier rows for each model, never the first example: the first model's both in one
    half of the batch and at one parity (drawn), the second's in the other half at the other
    parity, so that an answer that looks at a fixed half of the batch (``x[:16]``, ``x[16:]``,
    ``x[::2]``, ``x[1::2]``) or a smaller slice of one misses the outlier rows of one model."""
    half, parity = rng.randrange(2), rng.randrange(2)
    middle = num_examples // 2
    quarters = [[row for row in range(1, num_examples)
                 if (row >= middle) == bool(h) and row % 2 == p]
                for h, p in ((half, parity), (1 - half, 1 - parity))]
    return [rng.sample(quarter, 2) for quarter in quarters]


def _quiet_rows_louder(model: Any, batch: np.ndarray, expected: str, scaled: list[int],
                       rng: Any, below: tuple[int, int] = (9, 15),
                       ) -> tuple[np.ndarray, float] | None:
    """``batch`` where the overflow at ``expected`` starts in one middling row only.

    The model is positively homogeneous (ReLU, zero biases, ``Rescaling``): a row times c gives
    every layer's output times c. The row kept to overflow is one with the largest gain at
    ``expected`` (its output there over its largest input), rescaled so that its output there is
    10% past float16's rounding edge (65520), those before it a factor 1.21 below that (10%
    below 65520: no kernel's rounding moves the answer); every other scaled row is rescaled so
    that its largest output up to ``expected`` is 10% below 65504 (finite there), each below
    ``LOUD_INPUT``: overflowing at a smaller size than any other row can, the kept row is not
    among the largest, and some rows shrink below it (``_some_rows_below``; see the module's
    docstring). Tries the 3 rows of largest gain; returns the batch and the kept row's factor,
    or None where none gives ``expected`` as the first layer that overflows (the check then
    takes another batch).
    """
    layers, every_output = outputs_model(model)
    stop = [layer.name for layer in layers].index(expected) + 1
    shrink = 2.0 ** -12  # exact in float16; the outputs of the shrunk batch are finite
    by_layer = np.stack([np.max(np.abs(np.asarray(output, np.float32)).reshape(
        len(batch), -1), axis=1) for output in every_output(batch * shrink)[:stop]],
        axis=1) / shrink
    peaks, before = by_layer.max(axis=1), by_layer[:, :-1].max(axis=1, initial=0.0)
    sizes = np.max(np.abs(batch), axis=1)
    if not np.all(np.isfinite(peaks[scaled])):
        return None
    gain = by_layer[:, -1] / np.maximum(sizes, 1e-30)
    candidates = sorted((row for row in scaled if sizes[row] and by_layer[row, -1]
                         and before[row] * 1.21 <= by_layer[row, -1]),
                        key=lambda row: -gain[row])
    for keep in candidates[:3]:
        kept = 1.1 * 65520 / by_layer[keep, -1]  # 10% past float16's rounding edge
        if sizes[keep] * kept >= LOUD_INPUT:
            continue
        louder = batch.copy()
        louder[keep] *= kept
        for row in scaled:
            if row != keep and sizes[row]:
                louder[row] *= min(0.9 * LOUD_INPUT / sizes[row], 65504 / 1.1 / peaks[row]
                                   if peaks[row] else np.inf)
        _some_rows_below(louder, keep, [row for row in scaled if row != keep], rng, below)
        finite = [np.all(np.isfinite(np.asarray(output, np.float32)))
                  for output in every_output(louder)]
        first = next((layer.name for layer, ok in zip(layers, finite, strict=True)
                      if not ok), None)
        if first == expected:
            return louder, float(kept)
    return None


def _some_rows_below(batch: np.ndarray, keep: int, others: list[int], rng: Any,
                     target_range: tuple[int, int] = (9, 15), least: int = 10) -> None:
    """Shrink rows of ``others`` (drawn in turn) below row ``keep`` by max and L2 norm, until a
    drawn number of them (in ``target_range``) are below it in both, or moving one more would
    leave fewer than ``least`` above it in either: with 9 to 15, the row that overflows is
    neither among the largest nor among the smallest, nor at a fixed rank; with 0 to 3, few
    rows are smaller."""
    target = rng.randint(*target_range)
    for row in rng.sample(others, len(others)):
        size, norm = np.max(np.abs(batch), axis=1), np.linalg.norm(batch, axis=1)
        below = min(np.sum(size[others] < size[keep]), np.sum(norm[others] < norm[keep]))
        above = min(np.sum(size[others] > size[keep]), np.sum(norm[others] > norm[keep]))
        if below >= target or above <= least:
            return
        if size[row] >= size[keep] or norm[row] >= norm[keep]:
            batch[row] *= rng.uniform(0.3, 0.9) * min(size[keep] / size[row],
                                                      norm[keep] / norm[row])


def _zero_the_loud_row(first: Any, feature: int) -> None:
    """Make ``first``'s kernel negative in ``feature``: the loud row's pre-activations are all
    negative, and ReLU outputs 0 for it."""
    kernel = first.kernel.numpy()
    kernel[feature] = -np.abs(kernel[feature])
    first.kernel.assign(kernel)


def _loud_logits_case(num_features: int, num_classes: int, units: int, depth: int,
                      x: np.ndarray, rows: list[int], rng: Any,
                      dead_feature: int) -> list[Case]:
    """One more model, whose float32 logits peak at ``LOUD_LOGITS`` on a batch where every
    float16 layer is finite: the answer is None, which an answer that computes every layer in
    float16 (or reads only how large the logits are) misses."""
    from course_utils.training.precision import policy_scope

    with policy_scope("mixed_float16"):
        model = _deep_mlp(num_features, num_classes, units, _tags(rng, depth, False))
    dense = [layer for layer in model.layers if layer.weights]
    _zero_the_loud_row(dense[0], dead_feature)
    for layer in dense[:-1]:
        layer.kernel.assign(layer.kernel * GROWTH)
    # a batch on which every layer is finite; where even the rows left alone overflow (1 model
    # in 100), the first kernel shrinks: with ReLU and zero biases every output shrinks alike
    quiet: list[tuple[np.ndarray, str | None, float]] = []
    for _ in range(8):
        quiet = [case for case in overflow_cases(model, x, rows, rng, None)
                 if case[1] is None]
        if quiet:
            break
        dense[0].kernel.assign(dense[0].kernel / GROWTH**2)
    if not quiet:
        return []
    batch, _, scale = quiet[0]
    peak = float(np.max(np.abs(model(batch).numpy())))
    if not peak:
        return []
    dense[-1].kernel.assign(dense[-1].kernel * (LOUD_LOGITS / peak))  # bias: zeros
    logits = model(batch).numpy()
    if not (np.all(np.isfinite(logits)) and np.max(np.abs(logits)) > 65504):
        return []
    order = [layer.name for layer in outputs_model(model)[0]]
    return [Case(args=(model, batch), verify=_overflow_verifier(model, batch, order, None, scale),
                 label=f"(mixed_float16 MLP, {depth} hidden layers, float32 logits up to "
                       f"{LOUD_LOGITS:.0e}; x with 2 outlier rows times {scale:.3g})")]


def _tags(rng: Any, count: int, backwards: bool) -> list[str]:
    """``count`` drawn syllables, one for each hidden layer (a Dense and the layer after it
    each get their own), sorted: names start with them, so one model's names descend in layer
    order (``backwards``) and the other's ascend. The smallest name is the earliest layer in
    one model, the largest in the other: merging answers by either misses one model."""
    return sorted(rng.sample([c + v for c in "bdfgkmprstvz" for v in "aeiou"], count),
                  reverse=backwards)


def _deep_mlp(num_features: int, num_classes: int, units: int, tags: list[str]) -> Any:
    """Hidden Dense+ReLU layers named ``<tag>_dense``, then float32 logits."""
    keras = _keras()
    inputs = keras.Input(shape=(num_features,), name="features")
    hidden = inputs
    for tag in tags:
        hidden = keras.layers.Dense(units, activation="relu", name=f"{tag}_dense")(hidden)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(hidden)
    return keras.Model(inputs, outputs, name="mlp")


def _weightless_growth_mlp(num_features: int, num_classes: int, units: int,
                           tags: list[str]) -> Any:
    """An MLP whose hidden Dense+ReLU layers are each followed by ``Rescaling(GROWTH)``, a
    layer without weights (float16 under the policy), then float32 logits; ``tags``: two for
    each pair (``<tag>_dense``, ``<tag>_amplify``)."""
    keras = _keras()
    inputs = keras.Input(shape=(num_features,), name="features")
    hidden = inputs
    for dense, amplify in zip(tags[::2], tags[1::2], strict=True):
        hidden = keras.layers.Dense(units, activation="relu", name=f"{dense}_dense")(hidden)
        hidden = keras.layers.Rescaling(GROWTH, name=f"{amplify}_amplify")(hidden)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(hidden)
    return keras.Model(inputs, outputs, name="mlp")
