"""Checks of lesson 00's exercises (set-up): diagnose a step, split a CPU, time a step, overlap.

* ``check_diagnose_step(diagnose_step)``: from each part's timed calls and the whole step's
  (noisy: some calls disturbed, compute's first call a tracing), name what to fix first – the
  part with the largest median, or ``"synchronisation"`` when the time the medians leave
  unexplained is larger than each of them; the answer runs in a copy of the process forked
  before the cases exist. Each case's answer is the one it was made to have (its medians are
  exact by construction and the rule's margins wide); no function here diagnoses timings,
  since the package is installed for learners.
* ``check_split_cpu(split_cpu)``: a split into logical devices that survives a re-run, called
  four times in one fresh TensorFlow (this kernel's devices are already fixed) by
  ``run_splits_in_fresh_process``: the split, the same split again (returns the devices), another
  number (a RuntimeError that says to restart), the first number again; then, where those were
  right, in another fresh TensorFlow, an op first and ``split_cpu(1)`` (the one CPU device
  exists, as asked: its name); in a third, split into ``k`` by the check: 1 and another number
  raise, ``k`` returns (a number trusted, not counted, fails); no course package. All are children
  forked from one kept process that imported TensorFlow and made no device
  (``checks/splits.py``): one TensorFlow import per kernel, however often the check runs.
* ``check_step_breakdown(step_breakdown)``: a timed breakdown of a step (input, compute, whole
  step) written by hand (the course's timing helpers, ``time_interleaved``, ``time_function``
  and the rest of ``cu.bench``'s clocks, are recognised by their code objects),
  timed in turns (the order of the calls is recorded), on a fake pipeline and step whose waits
  are fresh: two cases, with waits so far apart that no fixed answer fits both; a step on a
  fresh batch waits longer than one on the batch given (its copy), so the whole step must be
  timed, not summed; the fast case runs three times, its calls disturbed (every fifth
  next_batch call, from a phase drawn per run, three different ones; and a third of the steps
  on the batch given, by their index, in a phase per run: the three runs together disturb
  every compute index once): a median ignores them; a mean does not, nor does one call kept
  per part, whatever its index (its compute call is disturbed in one run). Every part is
  called in turns with the others (the parts called in a row are counted). The waits happen
  in a thread of the checking process; the answer runs in a copy forked before they are drawn,
  and its ``next_batch``/``train_step`` only ask that thread (``checks/step_waits.py``): no
  closure or frame of the answer's process holds a wait.
* ``check_overlapped_pipeline(overlapped_pipeline)``: a colleague's pipeline batches the
  records, reads each batch in one call (a wait per record), augments each batch (a wait per
  batch) and ends with the lesson's one prefetch, so read and augment still run one after the
  other, together slower than the step – with tf.data's default options too (no default
  rewrite reaches a ``map`` after ``batch``; the per-record ``map`` directly before ``batch``
  that map_and_batch_fusion would overlap reads a call per record, not the colleague's one per
  batch). The fix: the same batches, in order (in the epoch checked and in the epoch trained
  on, a fresh call's, as returned: tf.data's options untouched, its functions run by a pool of 2
  threads whatever the machine; no ``deterministic=False``),
  each batch read and augmented once while it is iterated, with sizes and waits drawn afresh
  (a batch's reads and the augment each shorter than the step plus the other, together longer
  than the step), and three mechanisms counted in one epoch of 16 ms steps (calls in flight,
  not seconds: ``checks/stage_overlap.py``): during most augments a read of a later batch was
  in flight (the stages overlap each other: never where one thread pulls both, the colleague's
  or one that reads a batch ahead), by the end of most steps the next batch's augment had started (a
  prefetch after the augment, the answer's or tf.data's injected one), and during most steps
  that began with records unread a read started (not everything read before the first step).
  Every read and augment is made by the returned dataset's own graph (their ``py_function``
  tokens): work handed on from a thread or pipeline of the answer's own, by a generator,
  iterator or queue, fails (a cache in a file, its filename a constant, is rebuilt to cache in
  memory). The speed-up over the colleague's pipeline is shown, not judged. ``read`` and
  ``augment`` are plain functions; the recorder behind them is checked unchanged.

Each check builds fresh random inputs with their expected results (made to have them, or
computed) and hands both to :func:`run_check`; TensorFlow is imported inside the checks, never
at module level.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from course_utils.grading.checks import diagnose_step_cases
from course_utils.grading.checks.batch_shapes import (
    fresh_caches,
    handed_on,
    py_function_tokens,
)
from course_utils.grading.checks.call_guard import REMOVED
from course_utils.grading.checks.forked_call import ForkedCall
from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.checks.registry import register
from course_utils.grading.checks.splits import (
    run_split_answers,
    run_split_in_fresh_process,
    run_splits_in_fresh_process,
    split_verdict,
)
from course_utils.grading.checks.stage_overlap import (
    GRACE_S,
    StageCalls,
    batches_problem,
    draw_waits,
    epoch_summary,
    expected_batches,
    overlap_problem,
    tampered,
    train_epoch,
)
from course_utils.grading.checks.static_batches import order_problem
from course_utils.grading.checks.step_waits import WaitServer, parts_called, whole_steps_timed
from course_utils.grading.framework import (
    Case,
    expect_function,
    fresh_rng,
    grader_introspection,
    run_check,
)
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["check_diagnose_step", "check_overlapped_pipeline", "check_split_cpu",
           "check_step_breakdown", "run_split_in_fresh_process",
           "run_split_answers", "run_splits_in_fresh_process", "split_verdict"]

# --- Exercise 1 · diagnose a step from its numbers -------------------------------------------


@register
def check_diagnose_step(fn: Any) -> bool:
    """Check ``diagnose_step(timings, whole_step)`` on fresh noisy timings of every kind: each
    case has a part whose disturbed calls make its mean (and its slowest call) the largest, and
    a compute part whose first call (the tracing) is the slowest of all. The function runs in a
    copy of this process forked before the cases (and their expected answers) exist: no frame,
    closure or object there holds an answer (``checks/forked_call.py``)."""
    expect_function("diagnose_step", fn)
    if _holds_stub(fn):
        from course_utils.grading.framework import not_attempted

        not_attempted("diagnose_step")
        return False
    # the check's own functions are not the learner's to call (nor are the cases' makers)
    guarded = refusing(fn, [*own_functions(sys.modules[__name__]),
                            *own_functions(diagnose_step_cases)],
                       "compute the medians and compare them yourself")
    with ForkedCall(guarded) as in_a_copy:
        return _diagnose_in(in_a_copy)


def _diagnose_in(in_a_copy: Any) -> bool:
    """``check_diagnose_step``'s cases, drawn now, each answered by ``in_a_copy``."""
    return run_check(
        "diagnose_step", in_a_copy, diagnose_step_cases.diagnose_cases(fresh_rng()),
        hint="a few calls of a part were disturbed by other programs, and compute's first call "
             "traced the function: summarise each part by a number those calls cannot sway "
             "(lesson 00, section 3: the table of medians), then compare as the lesson does: "
             "the unexplained time (whole step minus the parts) against every part.")


# --- Exercise 2 · a split into logical devices that survives a re-run -------------------------

def _holds_stub(fn: Any) -> bool:
    try:
        return "raise NotImplementedError" in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


@register
def check_split_cpu(fn: Any) -> bool:
    """Check ``split_cpu(num_devices)`` in a fresh process: split, re-run, refuse another split."""
    from course_utils.devices import configure_logical_devices as helper
    from course_utils.grading.framework import not_attempted

    if _holds_stub(fn):
        return not_attempted("split_cpu") or False
    if fn is helper or getattr(fn, "__code__", None) is helper.__code__:
        raise AssertionError(
            "split_cpu: that is the course's cu.configure_logical_devices under another name; "
            "write the split with tf.config yourself")
    num_devices = (rng := fresh_rng()).randint(3, 5)  # never the set-up cell's 2
    made = rng.randint(2, 5)  # a split the answer did not make (the set-up cell's), then:
    asked = [rng.choice([m for m in range(2, 7) if m != made]), 1, made]
    case = Case(args=([num_devices, num_devices, num_devices + 1, num_devices],),
                label=f"split_cpu({num_devices}) twice, then ({num_devices + 1}), then "
                      f"({num_devices}) again, in a fresh Python process; in another, an op, "
                      f"then (1); in a third, split into {made} by the check, then "
                      f"({asked[0]}), (1), ({made})",
                verify=lambda results: split_verdict(results, num_devices))
    return run_check(
        "split_cpu", lambda calls: run_splits_in_fresh_process(
            fn, calls, after_an_op=1,  # needed only where the first four calls were right
            only_where=lambda first: split_verdict(first, num_devices) is None,
            after_a_split=(made, asked)),
        [case],
        hint="which device is split – and does anything before the split make TensorFlow "
             "create its devices (listing logical ones does)? When the split fails because "
             "the devices exist, how many are there, and what was asked? Lesson 00, section "
             "2. The fresh process has tf.config, tf.errors and Python's built-ins only.")


# --- Exercise 3 · a timed breakdown of a step -------------------------------------------------

#: Every ``DISTURBED_EVERY``-th call of the fake pipeline waits ``DISTURBANCE_S`` longer: other
#: programs on the machine. A median ignores them; a mean or a total does not.
DISTURBED_EVERY, DISTURBANCE_S = 5, 0.35


#: The waits (seconds) of ``check_step_breakdown``'s two cases, drawn per case: (input, step).
#: Their accepted ranges (``_accepted``) do not overlap, so no fixed answer fits both.
STEP_CASES = (((0.010, 0.015), (0.006, 0.009)), ((0.065, 0.075), (0.050, 0.060)))
#: Per case: the range of ``repeats``. The first (fast) case's disturbances reject a mean (or
#: a total) and one call kept per part; the second only rejects constants that fit the first,
#: so it needs neither disturbed calls nor as many turns (each of its turns waits four times
#: as long).
STEP_REPEATS = ((6, 8), (4, 5))
#: Per case: what a step on a fresh batch waits beyond the step on the batch given (its copy to
#: the device, lesson 00's host→device part), as a share of input + compute. So the whole step
#: is measured, not summed: input + compute falls below the first case's accepted range by
#: 0.98 × (input + compute), 15 ms or more, far beyond two medians' late wake-ups. In the slow
#: case it exceeds the input + 25 ms and the compute + 25 ms, so a part never timed alone, the
#: whole step less the other, is outside its range (xf00 L2). The ranges of the two cases'
#: whole steps still do not overlap (at most 150 ms, at least 207 ms).
STEP_TRANSFER = ((1.2, 1.6), (1.0, 1.2))
#: Seconds a disturbed step on the batch given waits beyond the step where the case disturbs:
#: a third of those calls, by index, in a phase drawn per run; the fast case runs once per
#: phase, so any one compute call kept is disturbed in one of its runs, and lands outside the
#: accepted range (a median ignores a third).
TRACING_S = 0.05
#: The phases of the fast case's three runs (in a fresh order): every step index once.
STEP_PHASES = (0, 1, 2)


def _accepted(seconds: float) -> tuple[float, float]:
    """The milliseconds a median of sleeps of ``seconds`` may measure: sleeps never end early;
    on a busy machine they end late, by the few ms it takes to wake a thread (seen up to ×3 of
    a 10 ms sleep with the cores oversubscribed): twice the wait plus 25 ms."""
    return 0.9 * seconds * 1e3, 2 * seconds * 1e3 + 25


@register
def check_step_breakdown(fn: Any) -> bool:
    """Check ``step_breakdown(next_batch, train_step, batch, repeats)`` on fresh known waits,
    with disturbed calls, written by hand (no course helper), timed in turns: two cases whose
    waits differ by far more than the measurement may, so that no constants fit both."""
    expect_function("step_breakdown", fn)
    if _holds_stub(fn):
        from course_utils.grading.framework import not_attempted

        not_attempted("step_breakdown")
        return False
    server = WaitServer(DISTURBED_EVERY, DISTURBANCE_S)
    try:
        with ForkedCall(server.answer(fn), timeout_s=120) as in_a_copy:
            return _step_breakdown_in(in_a_copy, server)
    finally:
        server.close()


def _step_breakdown_in(in_a_copy: Any, server: WaitServer) -> bool:
    """``check_step_breakdown``'s cases, drawn now, each timed by ``in_a_copy``: the fast
    case in its three disturbance phases (case 1, 3, 4), the slow one (case 2)."""
    rng = fresh_rng()

    def case(input_s: float, compute_s: float, transfer: float, repeats: int,
             disturb: Any) -> Case:
        calls: list[str] = []
        transfer_s = transfer * (input_s + compute_s)

        def verify(answered: Any) -> str | None:
            result, switched_off, called_helper, events = answered
            return _breakdown_problem(result, calls, (switched_off, called_helper), repeats, {
                "input": input_s, "compute": compute_s,
                "whole step": input_s + compute_s + transfer_s}, disturbed=disturb,
                events=events)

        return Case(args=(repeats,),
                    label=f"(next_batch, train_step, batch, repeats={repeats}) with a "
                          f"{input_s * 1e3:.1f} ms input, a {compute_s * 1e3:.1f} ms step, "
                          f"{transfer_s * 1e3:.1f} ms more for a fresh batch's copy "
                          + (f"and every {DISTURBED_EVERY}th input call, every third step on "
                             f"the batch given from call {-disturb[1] % 3 + 1} on, "
                             "disturbed" if disturb else "and no call disturbed"),
                    verify=verify), (input_s, compute_s, disturb, calls, transfer_s, repeats)

    drawn_waits = [(rng.uniform(*inputs), rng.uniform(*steps), rng.uniform(*transfer),
                    rng.randint(*repeats))
                   for (inputs, steps), transfer, repeats
                   in zip(STEP_CASES, STEP_TRANSFER, STEP_REPEATS, strict=True)]
    phases = rng.sample(STEP_PHASES, len(STEP_PHASES))  # the same waits and repeats in each
    inputs = rng.sample(range(DISTURBED_EVERY), len(phases))
    runs = [(0, (inputs[0], phases[0])), (1, False)] + [
        (0, each) for each in zip(inputs[1:], phases[1:], strict=True)]
    drawn = [case(*drawn_waits[which], disturb) for which, disturb in runs]

    def timed(repeats: int) -> Any:  # the case whose repeats these are: its waits served
        for each, waits in drawn:
            if each.args == (repeats,) and not waits[3]:
                server.serve(*waits, first_last_s=TRACING_S)
                break
        return in_a_copy(repeats)

    return run_check(
        "step_breakdown", timed, [each for each, _ in drawn],
        hint="were the three timed in turns, each call on its own, and summarised by a "
             "number a few disturbed calls cannot sway, in seconds? Lesson 00, section 3, "
             "the cell that times the parts in turns.")


def _breakdown_problem(result: Any, calls: list[str], recorded: tuple[Any, Any],
                       repeats: int, wanted: Mapping[str, float], disturbed: bool = True,
                       events: str | None = None) -> str | None:
    """What is wrong with one case's ``result``, given the calls it made, whether the recorder
    was switched off or saw a timing helper called (``recorded``), the waits, and the
    answer's calls and clock reads in order (``events``, see ``step_waits``)."""
    switched_off, called_helper = recorded
    if isinstance(switched_off, str) and not switched_off.startswith(REMOVED):
        return switched_off  # a thread or process the check cannot watch, its record changed
    if switched_off:
        return ("it switched the check's call recorder off (sys.setprofile): nothing it "
                "called was recorded")
    if called_helper:
        helper = called_helper if isinstance(called_helper, str) else "time_interleaved"
        return (f"it called cu.bench.{helper}: this exercise writes the timing loop by hand, "
                "each call timed with time.perf_counter(), no course timing helper")
    if not isinstance(result, Mapping) or set(result) != {"input", "compute", "whole step"}:
        keys = sorted(result) if isinstance(result, Mapping) else type(result).__name__
        return f"expected a dict with keys 'input', 'compute', 'whole step', got {keys}"
    steps = [call for call in calls if call in "cw"]
    if steps.count("c") < repeats or steps.count("w") < repeats or calls.count(
            "i") < 2 * repeats:
        return (f"expected at least {repeats} timed calls of each (next_batch called "
                f"{calls.count('i')} times, train_step {steps.count('c')} times on the "
                f"batch given and {steps.count('w')} times on a fresh one)")
    parts = parts_called(calls)
    repeated = sum(a == b for a, b in zip(parts[:-1], parts[1:], strict=True))
    if repeated > (repeats - 1) // 2:
        return (f"the parts were not timed in turns: of {len(parts)} calls (input, compute, "
                f"whole step), {repeated} came right after a call of the same part "
                f"(sequence {''.join(parts[:12])}..., I input, C compute, W whole step): a "
                "disturbance would hit one part only")
    if events is not None:
        fresh, timed = whole_steps_timed(events)
        if timed < repeats:
            return (f"the whole step was not timed as one: of its {fresh} train_step calls on "
                    f"a fresh batch, {timed} ran right after the next_batch that made their "
                    "batch with no clock read in between (at least "
                    f"{repeats} needed; sequence {events[:24]}..., i next_batch, c and w "
                    "train_step on the batch given and on a fresh one, x on an older batch, "
                    "t a clock read): a sum of pieces timed apart is not what the real loop's "
                    "step costs")
    ms = {name: float(value) * 1e3 for name, value in result.items()}
    # one disturbed input call (every order of the parts disturbs one in 5 turns or fewer)
    # moves a mean of at most 8 calls by 44 ms or more: outside the first case's input range
    # (at most 40 ms above its wait), so a mean fails there; the first and the last compute
    # call, 50 ms late, are outside its compute range (at most 34 ms above its wait)
    # a third of the compute calls, disturbed by index in each of the fast case's three runs,
    # put any one compute call kept outside its range in one of them (see TRACING_S)
    for name, seconds in wanted.items():
        low, high = _accepted(seconds)
        if not low <= ms[name] <= high:
            return (f"'{name}' should take about {seconds * 1e3:.1f} ms (in seconds: "
                    f"{seconds:.4f}), you measured {ms[name]:.1f} ms; "
                    + (f"every {DISTURBED_EVERY}th next_batch call was disturbed by "
                       f"{DISTURBANCE_S * 1e3:.0f} ms, every third step on the batch given "
                       f"by {TRACING_S * 1e3:.0f} ms: a median ignores them, one call per "
                       "part does not; "
                       if disturbed
                       else "no call was disturbed; ")
                    + f"the parts measured: { {k: round(v, 1) for k, v in ms.items()} } ms")
    return None


# --- Exercise 4 · overlap a pipeline with two slow stages --------------------------------------

#: Names that reach the recorder behind ``read`` and ``augment`` (a bound method's object, a
#: function's module), refused in the answer's code, strings included.
RECORDER_READERS = frozenset({"__self__", "__func__", "__globals__", "StageCalls",
                              "stage_overlap", "tampered"})

@register
def check_overlapped_pipeline(fn: Any) -> bool:
    """Check ``overlapped_pipeline(records, read, augment, batch_size)``: the colleague's
    batches in the same order, read and augment side by side and both beside the training
    step, counted in one epoch (tf.data's default options) with fresh sizes and waits."""
    tf = _tf()

    waits = draw_waits(fresh_rng())
    first, count, size = waits["first"], waits["count"], waits["batch_size"]
    calls, drawn = StageCalls(waits), dict(waits)
    read, augment = calls.functions()  # plain functions: no __self__ to the recorder
    expected = expected_batches(first, count, size)
    peeks = grader_introspection(fn, constants=True, also=RECORDER_READERS) if callable(
        fn) else []
    if peeks:
        raise AssertionError(
            f"overlapped_pipeline: your function uses {', '.join(peeks)}, which reaches the "
            "check's recorder behind read and augment: call them, in a pipeline of yours")

    def records() -> Any:
        return tf.data.Dataset.range(first, first + count)

    def colleague() -> Any:  # one prefetch, at the end: the lesson's
        return (records().batch(size).map(calls.read).map(calls.augment)
                .prefetch(tf.data.AUTOTUNE))

    def verify(dataset: Any) -> str | None:
        if not isinstance(dataset, tf.data.Dataset):
            return f"expected a tf.data.Dataset, got {type(dataset).__name__}"
        problem = tampered(calls, drawn) or batches_problem(
            [np.asarray(batch) for batch in fresh_caches(dataset).as_numpy_iterator()],
            expected) or order_problem(dataset)  # equal waits keep most orders: the graph
        if problem:
            return problem
        trained = fn(records(), read, augment, size)  # the epoch trained on
        if not isinstance(trained, tf.data.Dataset):
            return f"a second call returned a {type(trained).__name__}, not a tf.data.Dataset"
        # a cache of its own in a file (a constant filename) caches in memory: it starts empty
        source, trained = trained, fresh_caches(trained)  # and this pipeline's calls fill it
        shares, seconds, got = train_epoch(trained, calls, GRACE_S)
        problem = tampered(calls, drawn)  # before its counts are read
        if problem:
            return problem
        problem = batches_problem(got, expected) or order_problem(source)
        if problem:
            return f"in the epoch trained on (a second call's dataset): {problem}"
        if calls.reads != len(expected) or calls.augments != len(expected):
            return (f"during an epoch of {count} records in {len(expected)} batches, read "
                    f"was called {calls.reads} times and augment {calls.augments} times: the "
                    "pipeline you return reads each batch in one call of read (as the "
                    "colleague's does: one request per batch, not one per record) and "
                    "augments each batch once, while it is iterated")
        problem = overlap_problem(shares)
        if problem:
            return problem
        inside = py_function_tokens(trained)
        outside = sum(calls.ops[op] not in inside for op in calls.by)
        own, pulls = handed_on(trained, set(calls.ops))  # a call that never runs
        if outside or own or pulls:  # beside a generator, an iterator, a queue a thread fills
            return (f"the dataset you returned runs {own} Python function(s) of its own, pulls "
                    f"from {pulls} iterator(s), queue(s) or other state made outside it, and "
                    f"{outside} of {len(calls.by)} reads and augments ran outside it: does it "
                    "hand on the work of a thread or pipeline of yours? Where does tf.data's "
                    "overlap go?")
        waited = calls.waited  # the grace a busy machine's late calls were given
        colleague_s = train_epoch(colleague(), calls)[1]
        print(epoch_summary(shares, seconds, waited, colleague_s, waits))
        return None

    case = Case(args=(records(), read, augment, size),
                label=f"(range({first}, {first + count}), read, augment, {size})",
                verify=verify)
    return run_check(
        "overlapped_pipeline", fn, [case],
        hint="time a batch's reads and one augment against the step. One prefetch at the end "
             "overlaps the input with the step, but inside the input, what still runs one "
             "after the other? Lesson 00, section 4: a pipeline runs at the pace of its "
             "slowest stage.")
