"""Checks of lesson 00's exercises (set-up): diagnose a step, split a CPU, time a step, prefetch.

* ``check_diagnose_step(diagnose_step)``: from a step's parts and its whole time, name what to
  fix first – the largest part, or ``"synchronisation"`` when the time the parts leave
  unexplained is larger than each of them.
* ``check_split_cpu(split_cpu)``: the fixed version of a broken split into logical devices, run
  in a fresh Python process (this kernel's devices are already fixed) by
  ``run_split_in_fresh_process``, which the exercise also uses to show the broken version's error.
* ``check_step_breakdown(step_breakdown)``: a timed breakdown of a step (input, compute, whole
  step), checked on a fake pipeline and step whose waits are known.
* ``check_overlapped_pipeline(overlapped_pipeline)``: the fixed version of a pipeline whose
  ``prefetch`` overlaps nothing: same batches, in order, and reads that run while the training
  step works (counted, not timed; the speed-up is shown).

Each check builds fresh random inputs, computes the expected result with a reference and hands
both to :func:`run_check`; TensorFlow is imported inside the checks, never at module level.
"""

from __future__ import annotations

import inspect
import json
import textwrap
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from course_utils.child import run_cpu_only
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["check_diagnose_step", "check_overlapped_pipeline", "check_split_cpu",
           "check_step_breakdown", "reference_diagnosis", "run_split_in_fresh_process"]

# --- Exercise 1 · diagnose a step from its numbers -------------------------------------------


def reference_diagnosis(parts: Mapping[str, float], whole_step: float) -> str:
    """What to fix first: the largest part, or "synchronisation" when the unexplained rest
    (``whole_step`` minus the sum of the parts) is larger than every part."""
    unexplained = whole_step - sum(parts.values())
    largest = max(parts, key=parts.__getitem__)
    return "synchronisation" if unexplained > parts[largest] else largest


_PARTS = ("input", "host→device transfer", "compute", "communication")


@register
def check_diagnose_step(fn: Any) -> bool:
    """Check ``diagnose_step(parts, whole_step)`` on fresh random breakdowns of every kind."""
    rng = fresh_rng()
    cases = []
    for culprit in (*_PARTS, "synchronisation", "overlapped"):
        parts = {name: round(rng.uniform(0.5, 3.0), 2) for name in _PARTS}
        if culprit in parts:
            parts[culprit] = round(rng.uniform(8.0, 20.0), 2)
        total = sum(parts.values())
        if culprit == "synchronisation":  # the step takes far longer than its parts
            whole = total + max(parts.values()) + round(rng.uniform(1.0, 10.0), 2)
        elif culprit == "overlapped":  # prefetch hid the input: the step is shorter
            parts["input"] = round(rng.uniform(8.0, 20.0), 2)
            whole = round(sum(parts.values()) - parts["input"] * 0.8, 2)
        else:
            whole = round(total * rng.uniform(1.0, 1.1), 2)
        parts = dict(rng.sample(sorted(parts.items()), len(parts)))  # any order
        cases.append(Case(args=(parts, whole), expected=reference_diagnosis(parts, whole),
                          label=f"({parts}, whole_step={whole})"))
    rng.shuffle(cases)
    return run_check(
        "diagnose_step", fn, cases,
        hint="synchronisation = whole_step - sum(parts.values()); answer 'synchronisation' "
             "when it is larger than every part, else the name of the largest part "
             "(max(parts, key=parts.get)). Lesson 00, section 3, 'What the picture says'.")


# --- Exercise 2 · fix a broken split into logical devices ------------------------------------

_SPLIT_SCRIPT = """
import json, sys
import tensorflow as tf
{source}
names = {name}({num_devices})
print("RESULT " + json.dumps({{"returned": [str(n) for n in names],
      "devices": [d.name for d in tf.config.list_logical_devices("CPU")]}}))
"""


def _holds_stub(fn: Any) -> bool:
    try:
        return "raise NotImplementedError" in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


def run_split_in_fresh_process(fn: Any, num_devices: int) -> dict[str, Any]:
    """Run ``fn(num_devices)`` in a fresh process: what it returned and made, or its error line."""
    source = textwrap.dedent(inspect.getsource(fn))
    script = _SPLIT_SCRIPT.format(source=source, name=fn.__name__, num_devices=num_devices)
    done = run_cpu_only(["-c", script], timeout=120)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    error = done.stderr.strip().splitlines()
    return {"error": error[-1] if error else f"the process ended with code {done.returncode}"}


@register
def check_split_cpu(fn: Any) -> bool:
    """Check ``split_cpu(num_devices)`` in a fresh process: it must create the logical CPUs."""
    if _holds_stub(fn):
        from course_utils.grading.framework import not_attempted

        not_attempted("split_cpu")
        return False
    num_devices = fresh_rng().randint(2, 4)
    expected = [f"/device:CPU:{index}" for index in range(num_devices)]

    def in_fresh_process(count: int) -> dict[str, Any]:
        return run_split_in_fresh_process(fn, count)

    def verify(result: dict[str, Any]) -> str | None:
        if "error" in result:
            return f"in a fresh process it raised: {result['error']}"
        if result["devices"] != expected:
            return (f"expected the logical CPUs {expected}, the process had "
                    f"{result['devices']}")
        if result["returned"] != expected:
            return f"expected it to return {expected}, it returned {result['returned']}"
        return None

    case = Case(args=(num_devices,), label=f"({num_devices}) in a fresh Python process",
                verify=verify)
    return run_check(
        "split_cpu", in_fresh_process, [case],
        hint="list the PHYSICAL devices (tf.config.list_physical_devices('CPU')) – listing "
             "logical ones starts TensorFlow's devices – and split the first physical CPU "
             "before anything else runs. Lesson 00, section 2, the cell run in a fresh process.")


# --- Exercise 3 · a timed breakdown of a step -------------------------------------------------

#: The fake pipeline's and step's waits in ``check_step_breakdown`` (seconds).
INPUT_WAIT_S, COMPUTE_WAIT_S = 0.015, 0.005


@register
def check_step_breakdown(fn: Any) -> bool:
    """Check ``step_breakdown(next_batch, train_step, batch, repeats)`` on known waits."""
    calls = {"next_batch": 0, "train_step": 0}
    repeats = fresh_rng().randint(6, 10)

    def next_batch() -> np.ndarray:
        calls["next_batch"] += 1
        time.sleep(INPUT_WAIT_S)
        return np.full(4, calls["next_batch"])

    def train_step(batch: Any) -> float:
        calls["train_step"] += 1
        time.sleep(COMPUTE_WAIT_S)
        return float(np.sum(batch))

    def verify(result: Any) -> str | None:
        if not isinstance(result, Mapping) or set(result) != {"input", "compute", "whole step"}:
            keys = sorted(result) if isinstance(result, Mapping) else type(result).__name__
            return f"expected a dict with keys 'input', 'compute', 'whole step', got {keys}"
        if calls["next_batch"] < 2 * repeats or calls["train_step"] < 2 * repeats:
            return (f"expected at least {repeats} timed calls for input and for the whole step "
                    f"(next_batch called {calls['next_batch']} times, train_step "
                    f"{calls['train_step']} times)")
        ms = {name: float(value) * 1e3 for name, value in result.items()}
        wanted = {"input": INPUT_WAIT_S, "compute": COMPUTE_WAIT_S,
                  "whole step": INPUT_WAIT_S + COMPUTE_WAIT_S}
        for name, seconds in wanted.items():  # sleeps overshoot on a busy machine, never less
            if not 0.9 * seconds * 1e3 <= ms[name] <= 3 * seconds * 1e3:
                return (f"'{name}' should take about {seconds * 1e3:.0f} ms (in seconds: "
                        f"{seconds}), you measured {ms[name]:.1f} ms; the parts measured: "
                        f"{ {k: round(v, 1) for k, v in ms.items()} } ms")
        return None

    case = Case(args=(next_batch, train_step, np.zeros(4), repeats),
                label=f"(next_batch, train_step, batch, repeats={repeats}) with a "
                      f"{INPUT_WAIT_S * 1e3:.0f} ms input and a {COMPUTE_WAIT_S * 1e3:.0f} ms "
                      "step", verify=verify)
    return run_check(
        "step_breakdown", fn, [case],
        hint="time three functions with cu.bench.time_interleaved: next_batch, "
             "train_step(batch) on the batch given, and train_step(next_batch()); return each "
             "one's median in seconds. Lesson 00, section 3, the cell that times the parts.")


# --- Exercise 4 · fix a prefetch that overlaps nothing -----------------------------------------

#: Per-element read and per-batch step waits in ``check_overlapped_pipeline`` (seconds).
READ_WAIT_S, BATCH_SIZE, STEP_WAIT_S = 0.004, 4, 0.016
#: The share of training steps during which the next reads must already have run.
MIN_READ_AHEAD_SHARE = 0.5


def _counting_reader(seconds: float, reads: dict[str, int]) -> Callable[[Any], Any]:
    """``read``: waits ``seconds``, counts itself in ``reads["done"]``, returns ``7x + 3``."""
    tf = _tf()

    def wait_and_read(value: Any) -> Any:
        time.sleep(seconds)
        reads["done"] += 1
        return np.int64(7 * int(value) + 3)

    def read(index: Any) -> Any:
        record = tf.py_function(wait_and_read, [index], tf.int64)
        record.set_shape([])
        return record

    return read


def _train(dataset: Any, reads: dict[str, int]) -> tuple[float, float]:
    """One epoch with a ``STEP_WAIT_S`` step per batch: (share of steps after which reads of
    later elements had already run, seconds)."""
    reads["done"] = 0
    consumed, ahead, steps = 0, 0, 0
    start = time.perf_counter()
    for batch in dataset:
        consumed += len(batch)
        time.sleep(STEP_WAIT_S)  # the training step
        steps += 1
        ahead += reads["done"] > consumed  # the input read on while the step ran
    seconds = time.perf_counter() - start
    return ahead / max(steps - 1, 1), seconds  # after the last step there is nothing to read


@register
def check_overlapped_pipeline(fn: Any) -> bool:
    """Check ``overlapped_pipeline(records, read, batch_size)``: the same batches in the same
    order, and reads that run while the training step works (tf.data's rewrites off)."""
    tf = _tf()
    from course_utils.data import without_default_optimizations

    rng = fresh_rng()
    first, count = rng.randint(0, 1000), rng.randint(7, 9) * BATCH_SIZE + rng.randint(1, 3)
    reads = {"done": 0}
    read = _counting_reader(READ_WAIT_S, reads)
    expected = 7 * np.arange(first, first + count) + 3

    def records() -> Any:
        return tf.data.Dataset.range(first, first + count)

    def broken() -> Any:
        return records().prefetch(tf.data.AUTOTUNE).map(read).batch(BATCH_SIZE)

    def verify(dataset: Any) -> str | None:
        if not isinstance(dataset, tf.data.Dataset):
            return f"expected a tf.data.Dataset, got {type(dataset).__name__}"
        batches = [np.asarray(batch) for batch in dataset.as_numpy_iterator()]
        sizes = [len(batch) for batch in batches]
        want = [BATCH_SIZE] * (count // BATCH_SIZE) + [count % BATCH_SIZE]
        if sizes != want:
            return f"expected batches of sizes {want}, got {sizes}"
        if not np.array_equal(np.concatenate(batches), expected):
            return "the elements differ from the broken pipeline's, or came in another order"
        share, seconds = _train(without_default_optimizations(fn(records(), read, BATCH_SIZE)),
                                reads)
        _, broken_seconds = _train(without_default_optimizations(broken()), reads)
        if share < MIN_READ_AHEAD_SHARE:
            return (f"reading does not overlap the step: the next reads had run during only "
                    f"{share:.0%} of the training steps (at least {MIN_READ_AHEAD_SHARE:.0%} "
                    "needed; tf.data's automatic rewrites off)")
        print(f"   reads ran during {share:.0%} of the steps; an epoch took "
              f"{seconds:.2f} s, the broken pipeline's {broken_seconds:.2f} s "
              f"(×{broken_seconds / seconds:.2f}, ideal ×2)")
        return None

    case = Case(args=(records(), read, BATCH_SIZE),
                label=f"(range({first}, {first + count}), read, {BATCH_SIZE})", verify=verify)
    return run_check(
        "overlapped_pipeline", fn, [case],
        hint="a prefetch only overlaps what comes BEFORE it: read, batch, then "
             "prefetch(tf.data.AUTOTUNE) as the last step. Lesson 00, section 4.")
