"""Checks of lesson 09's exercises (registered by name with ``@register``).

Both profile real distributed runs here: a ``tf.function`` step under ``MirroredStrategy``
(over up to 2 devices), fed by a tf.data pipeline, captured with ``cu.profiling.capture``.

* ``check_find_bottleneck(find_bottleneck)``: the learner's function names the bottleneck of the
  trace events of one fresh real run (input-bound: its pipeline sleeps per batch, its step is
  cheap; or compute-bound: cached data, a heavy step) and of twelve traces built to order
  (``profile_traces``): input the largest part but under half the step, the pipeline busy in the
  background; compute the largest with input at a third; input, or the all-reduce, leading by a
  little; compute leading by a little with input, or the all-reduce, at 40 % of the step (no
  threshold on one share names them all); a communication-bound step (collective and NCCL ops,
  compute above half of them); input-bound steps with compute before (a warm-up) and between them,
  or followed by compute after the last of them; steps that differ (one long input-bound step
  between compute-bound ones); compute through most of each input wait (an edited copy of
  ``step_breakdown``, which gives a shared instant to input, fails) – in a random order, all six
  orders of the parts; an op running past a step's end, get-next waits before the first
  step and twin spans of one part (xf09 L2-L4) among them. The verdict is the exercise's
  rule (``profile_traces.rule_verdict``); the learner's function may not call into
  ``cu.profiling`` (the guard below). A threshold on one
  share, "the part over half of them, else ...", two comparisons that skip a pair of parts, a
  reading that ignores the step windows, the ``tf_data`` threads or either kind of collective,
  or reads one step (or a vote) each fails.
* ``check_remove_input_bottleneck(remove_input_bottleneck)``: the learner's pipeline asks the
  colleague's ``keep`` (a random hold-out, drawn afresh at every call: ``held_out``) once per
  record, from the call of the learner's function through two epochs, and every epoch yields
  exactly the examples those draws kept, in full batches; ``read`` ran on no held-out example
  and once on each kept one (it decodes the stored record, so a pipeline that never reads gets
  the wrong features); each example freshly augmented each epoch (noise on each example's
  features, not others' copied or mixed in the ways ``pipeline_probe`` names, one augment's
  spread), every example yielded what a call of the ``augment`` given returned (its generator's
  state moved); the pipeline works ahead by itself: with tf.data's injected prefetch and
  autotuning off, some example it yields was augmented while the consumer waited between
  batches (``runs_ahead``); and a profile of its second epoch shows the step waiting for input
  less than ``FAST_INPUT_SHARE`` of the time (up to ``BASELINE_ATTEMPTS`` profiles, the least
  kept), where the colleague's ``slow_pipeline`` (given ``keep``'s draws as a lookup) waits
  more than ``SLOW_INPUT_SHARE`` (the same profiled step, up to ``BASELINE_ATTEMPTS`` times
  until it does, each retry with the disk's wait doubled). Both read the pipeline on the
  step's own thread (the distributed iterator's thread can hide a wait as "other").
  ``cu.data.make_pipeline`` is refused, under any name, and on a thread of TensorFlow's
  (``watched_build``).
* ``check_write_report(write_report, my_results)``: the learner's report on their own
  benchmark (every strategy × micro-batch count ``k``, one update of the global batch per
  call, checked to be that: ``report_cases.own_run_problem``) and on five fresh ones
  (``report_cases.SCENARIOS``: the memory budget flips the strategy the lesson's order picks,
  a larger ``k`` than the first that fits is faster, the buffer decides, one step fits, none
  does), with fresh models, budgets, replica counts and option names: the fastest measured
  pair whose step fits, its bytes and examples/s, the runner-up, the turns the choice won
  against it, or ``ValueError``.

Nothing the checks of exercises 1 and 3 hold while the learner's function runs says what it
should return: each case keeps its inputs and a label that names no answer, in a fresh order
(drawn in helpers whose frames are gone), and its verdict counts the answer after the call, with
``rule_verdict`` or ``report_reference`` (an answer that walked the stack to the running case
and read its verify's closure passed before). Exercise 1's guard compares code objects' files:
any call into ``course_utils/profiling.py`` while the learner's function runs is caught, under
whatever name it was bound. Exercise 3's guard does the same for the check's own
reference, ``report_cases.report_reference``, by identity or as a copy.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks import pipeline_probe
from course_utils.grading.checks.answer_reach import peeks_refused
from course_utils.grading.checks.call_guard import CallsInto, watching_problem
from course_utils.grading.checks.pipeline_probe import (
    BASELINE_ATTEMPTS,
    FAST_INPUT_SHARE,
    SLOW_INPUT_SHARE,
    slow_baseline,
    watched_build,
)
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["BASELINE_ATTEMPTS", "FAST_INPUT_SHARE", "READ_SECONDS", "SLOW_INPUT_SHARE",
           "check_find_bottleneck", "check_remove_input_bottleneck", "check_write_report",
           "slow_baseline", "slow_pipeline"]

#: Seconds the check's "disk" takes to read one example (a sleep: it occupies no core).
READ_SECONDS = 0.01
_FEATURES = 32  # the check's examples: 32 features, and the example's index as its label
_WIDEN = 64  # the heavy step's layers are 64 times wider than the examples
_BOTTLENECKS = ("input", "compute", "communication")


def slow_pipeline(records: Any, read: Callable[..., Any], keep: Callable[..., Any],
                  augment: Callable[..., Any], batch_size: int) -> Any:
    """The colleague's input-bound pipeline: read every record every epoch, keep the training
    examples, augment, batch."""
    return records.map(read).filter(keep).map(augment).batch(batch_size)


# --- a profiled distributed run ----------------------------------------------------------------


def _strategy() -> Any:
    from course_utils.strategies import make_strategy, replica_devices

    return make_strategy("mirrored", num_replicas=min(2, len(replica_devices())), verbose=False)


def _profile(dataset: Any, *, heavy: int, steps: int, warmup: int,
             distribute: bool = True) -> list[dict]:
    """Trace events of ``steps`` distributed steps on ``dataset`` after ``warmup`` ones.

    ``dataset`` must hold exactly ``warmup + steps`` batches: an iterator left with a sleeping
    ``py_function`` in flight would hang the interpreter's exit. ``distribute=False`` feeds
    every replica the whole batch from a plain iterator on the step's own thread: the
    distributed iterator's generator thread (``MultiDeviceIterator``) can make the step wait
    outside any get-next op, which reads as "other" (seen under load in CI).
    """
    import keras

    from course_utils.profiling import capture, trace_events

    tf = _tf()
    strategy = _strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((_FEATURES,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
    width = _FEATURES * _WIDEN  # each of ``heavy`` layers: 2 * width**2 FLOP per example
    weights = tf.constant(np.random.default_rng(0).normal(size=(width, width))
                          .astype(np.float32) / width**0.5)
    distributed = strategy.experimental_distribute_dataset(dataset) if distribute else dataset

    @tf.function
    def train_step(batch: Any) -> Any:
        def replica_step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                hidden = tf.tile(x, [1, _WIDEN])
                for _ in range(heavy):
                    hidden = tf.tanh(hidden @ weights)
                loss = tf.reduce_mean((model(hidden[:, :_FEATURES]) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(replica_step, args=batch)

    # Trace first, then start the iterator: else it prefetches while the function is traced
    train_step.get_concrete_function(distributed.element_spec)
    iterator = iter(distributed)
    # next() outside the tf.function: a function that captured the iterator would keep it
    # alive until the interpreter's exit, whose clean-up then waits for its threads
    with tempfile.TemporaryDirectory() as logdir:
        return trace_events(capture(lambda step: train_step(next(iterator)), steps, logdir,
                                    warmup=warmup))


def _examples(rng: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    data = np.random.default_rng(rng.randint(0, 2**31 - 1))
    return (data.normal(size=(n, _FEATURES)).astype(np.float32),
            np.arange(n, dtype=np.float32).reshape(n, 1))


def _bound_run(rng: Any, kind: str, steps: int = 3, strength: int = 1) -> list[dict]:
    """A fresh input-bound (sleeping pipeline, cheap step) or compute-bound run's events;
    ``strength`` multiplies the sleep or the number of heavy layers (a second try)."""
    from course_utils.data import add_latency

    tf = _tf()
    if kind == "input":  # 30-50 ms of waiting per batch, almost nothing to compute
        batch = rng.choice([16, 32])
        data = tf.data.Dataset.from_tensor_slices(_examples(rng, batch * (steps + 1)))
        latency = strength * rng.choice([0.03, 0.04, 0.05])
        # read on the step's own thread: the wait is the step's get-next, whatever the load
        return _profile(add_latency(data.batch(batch), latency),
                        heavy=0, steps=steps, warmup=1, distribute=False)
    batch = rng.choice([16, 32])  # ~10-30 ms of matrix products per step, data in memory
    data = tf.data.Dataset.from_tensor_slices(_examples(rng, batch))
    return _profile(data.batch(batch).cache().repeat().prefetch(4),
                    heavy=strength * rng.randint(3, 5), steps=steps, warmup=1)


# --- Exercise 1 · find the bottleneck in a trace -----------------------------------------------


def _course_profiling_file() -> str:
    from course_utils import profiling
    return profiling.step_breakdown.__code__.co_filename


def _verifier(events: list[dict], guard: CallsInto) -> Callable[[Any], str | None]:
    """The case's verdict, its answer counted by the exercise's rule after the learner's
    function returned (nothing the check holds while it runs says which part leads)."""
    def verify(got: Any) -> str | None:
        from course_utils.grading.checks.profile_traces import rule_verdict

        called = guard.take()
        if watching_problem(called):
            return watching_problem(called)
        if called:
            return (f"find_bottleneck called cu.profiling ({', '.join(called)}): it must read "
                    "the events itself, by the exercise's rules")
        kind, table = rule_verdict(events)  # the check's own calls, now
        own = guard.take()  # drops the check's own calls just made from the next verdict
        if type(got) not in (str, np.str_):  # exactly: a subclass brings its own == (x09 L1)
            return f"returned {type(got).__name__}; return a str, one of {_BOTTLENECKS}"
        got = str.__str__(got)  # a plain str: the comparisons below are str's own
        if watching_problem(own) or got == kind:
            return watching_problem(own)
        if got not in _BOTTLENECKS:
            return f"returned {got!r}; return one of {', '.join(map(repr, _BOTTLENECKS))}"
        return (f"returned {got!r}, but this trace is {kind}-bound; each part's union inside "
                f"the steps, on its own (an instant two parts share counts in both):\n{table}")
    return verify


def _real_events(rng: Any) -> list[dict] | None:
    """A fresh real run's events, input- or compute-bound as drawn (``step_breakdown`` and the
    exercise's rule agree); None when three tries (each with a stronger effect) all came out
    otherwise: a busy machine must not fail the learner; the built traces hold every kind."""
    from course_utils.grading.checks.profile_traces import rule_verdict
    from course_utils.profiling import format_breakdown, step_breakdown

    kind = rng.choice(["input", "compute"])
    for attempt in range(3):  # on a busy machine, try again with a stronger effect
        events = _bound_run(rng, kind, strength=1 + attempt)
        breakdown = step_breakdown(events)
        if breakdown.bottleneck() == kind == rule_verdict(events)[0]:
            return events
    print(f"(this machine is busy: the check's {kind}-bound run did not come out {kind}-bound "
          f"in 3 tries, so only the built traces are read this time)\n"
          f"{format_breakdown(breakdown)}")
    return None


def _bottleneck_traces() -> list[tuple[list[dict], str]]:
    """Each case's events and a label that names no part, in a fresh order: one real run (if
    it came out as drawn) and ``BOTTLENECK_CASES``, each checked against the rule.
    What each case is and its answer are forgotten when this returns (finding L1)."""
    from course_utils.grading.checks.profile_traces import BOTTLENECK_CASES as CASES
    from course_utils.grading.checks.profile_traces import rule_verdict, trace_case

    rng = fresh_rng()
    real = _real_events(rng)
    traces = [(real, "a real run profiled here")] if real is not None else []
    for description in CASES:
        kind, events = trace_case(rng, description)
        assert rule_verdict(events)[0] == kind, description  # the check's own
        traces.append((events, "a trace built to order"))
    rng.shuffle(traces)
    return traces


@register
def check_find_bottleneck(fn: Any) -> bool:
    """Check ``find_bottleneck(events)`` on one real run profiled here and twelve traces built
    to order (mid-range input shares, narrow leads, a communication-bound step, compute through
    the input wait, distractors)."""
    peeks_refused("find_bottleneck", fn)
    guard = CallsInto(_course_profiling_file())
    cases = [Case(args=(events,), verify=_verifier(events, guard),
                  label=f"({what}: {len(events)} events)")
             for events, what in _bottleneck_traces()]
    with guard:
        return run_check(
            "find_bottleneck", fn, cases,
            hint="lesson 09, section 6 (Profile): the table above is each part's time by the "
                 "exercise's rules. Which spans did your reading give to the wrong part, "
                 "count twice, or count outside a step? The rules say which spans count where.")


# --- Exercise 2 · remove the input bottleneck --------------------------------------------------


@register
def check_remove_input_bottleneck(fn: Any) -> bool:
    """Check ``remove_input_bottleneck(records, read, keep, augment, batch_size)``: the examples
    keep's one draw per record kept, none held out read, fresh augmentation every epoch, and
    an input share under ``FAST_INPUT_SHARE`` (``held_out.verifier``)."""
    from course_utils.grading.checks import held_out
    from course_utils.profiling import step_breakdown

    tf = _tf()
    rng = fresh_rng()
    batch_size = rng.choice([8, 16])
    features, labels = _examples(rng, batch_size * rng.choice([4, 5]))
    records = tf.data.Dataset.from_tensor_slices(
        (features - pipeline_probe.STORED_OFFSET, labels))
    calls: list[int] = []
    read_labels: list[int] = []
    augmented: list[Any] = []
    draws: list[Any] = []
    delay = [READ_SECONDS]  # the disk's wait; the slow baseline's retries make it longer
    read = pipeline_probe.counting_read(delay, calls, read_labels)
    keep = held_out.drawing_keep(rng.randint(0, 2**31 - 1), draws)
    augment = pipeline_probe.augment(rng.randint(0, 2**31 - 1), augmented)
    label = (f"({len(features)} records, about {held_out.HOLD_OUT:.0%} held out, read "
             f"{READ_SECONDS * 1e3:g} ms each, batch_size={batch_size})")

    def profiles(dataset: Any, kept: list[int]) -> tuple[Any, Any]:
        batches = -(-len(kept) // batch_size)

        def profile(dataset: Any) -> Any:  # the second epoch, after one that fills caches
            # distribute=False: the iterator's thread hides a wait as "other" (docstring)
            return step_breakdown(_profile(dataset.repeat(2), heavy=3, steps=batches,
                                           warmup=batches, distribute=False))

        tries: list[int] = []
        frozen = held_out.frozen_keep(kept, len(features))  # the draws kept, every epoch

        def slow_profile() -> Any:  # each retry doubles the disk's wait: a busy machine's
            delay[0] = READ_SECONDS * 2 ** len(tries)  # slower compute cannot hide it
            tries.append(1)
            try:
                return profile(slow_pipeline(records, read, frozen, augment, batch_size))
            finally:
                delay[0] = READ_SECONDS

        return (pipeline_probe.least_input(lambda: profile(dataset)),
                slow_baseline(slow_profile))

    built, course_pipeline = watched_build(fn, calls, augmented, draws)  # make_pipeline no
    verify = held_out.verifier(features, batch_size, (calls, read_labels), augment,
                               augmented, draws, profiles, course_pipeline)
    return run_check(
        "remove_input_bottleneck", built,
        [Case(args=(records, read, keep, augment, batch_size), verify=verify, label=label)],
        hint="lesson 09, sections 7 and 8 (cache() after prefetch) and lesson 01, sections 4 "
             "and 5: which of your steps must give the same result every epoch, which must "
             "differ, which can run before read, and what does the step wait for in the "
             "second epoch?")


# --- Exercise 3 · your report, from your run ----------------------------------------------


def _report_cases(my_results: Any) -> list[Any]:
    """The learner's own benchmark's case (unless ``_FRESH_ONLY``) and one fresh case of each
    ``report_cases.SCENARIOS``, in a fresh order; what each tests and its answer are
    forgotten when this returns (the verdicts count them again after each call: finding L2)."""
    from course_utils.grading.checks.report_cases import fresh_cases, own_case, own_run_problem

    rng = fresh_rng()
    cases = []
    if my_results is not _FRESH_ONLY:
        problem = own_run_problem(my_results)
        if problem:
            raise AssertionError(f"check_write_report(write_report, my_results): my_results "
                                 f"{problem}")
        cases.append(own_case(rng, my_results))
    cases += fresh_cases(rng)
    rng.shuffle(cases)
    return cases


#: ``check_write_report``'s default: no benchmark of the learner's given (the unit tests); any
#: value passed, ``None`` included, must be the learner's own benchmark.
_FRESH_ONLY = object()


@register
def check_write_report(fn: Any, my_results: Any = _FRESH_ONLY) -> bool:
    """Check ``write_report(results, model, global_batch, replicas, budget_bytes)``: on the
    learner's own benchmark ``my_results`` (a fresh model, replica count and budget) and on a
    fresh benchmark of each ``report_cases.SCENARIOS``, the report ``report_reference``
    counts: the fastest measured (strategy, k) whose step fits, its bytes and examples/s, the
    runner-up and the turns the choice won against it; ``ValueError`` where none fits.
    ``my_results`` not the benchmark cell's list (``own_run_problem``) fails the check."""
    from course_utils.grading.checks.report_cases import report_reference

    peeks_refused("write_report", fn)
    cases = _report_cases(my_results)
    guard = CallsInto(report_reference.__code__)  # the check's own reference, under any name

    def guarded(verify: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        def check(got: Any) -> str | None:
            called = guard.take()
            if watching_problem(called):
                return watching_problem(called)
            if called:
                return ("write_report called the check's own reference (report_reference): "
                        "compute the report from the benchmark yourself")
            reason = verify(got)  # the reference report, counted now
            return watching_problem(guard.take()) or reason  # its calls are the check's
        return check

    cases = [dataclasses.replace(case, verify=guarded(case.verify)) for case in cases]
    with guard:
        return run_check(
            "write_report", fn, cases,
            hint="lesson 09, sections 3-4 (the benchmark, memory and k): the message names "
                 "what differs. Does your pair fit on its own strategy's replicas? Is a "
                 "larger k slower, measured? Which turns were taken together?")
