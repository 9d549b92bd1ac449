"""Lesson 00's checks (``course_utils/grading/checks/lesson_00.py``): reference solutions pass,
the broken code of each exercise fails with feedback that says what differed, stubs are skipped
(and raise in strict mode)."""

from __future__ import annotations

import inspect
import re
import textwrap
import time

import numpy as np
import pytest

import course_utils as cu
from course_utils.grading.checks import diagnose_step_cases, lesson_00

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def stub(*args):
    raise NotImplementedError()


def test_lesson_00_registers_its_checks():
    for name in lesson_00.__all__:
        if name.startswith("check_"):
            assert getattr(cu.grading, name) is getattr(lesson_00, name)


# --- diagnose_step ---------------------------------------------------------------------------


def diagnose_step(timings, whole_step):
    parts = {part: float(np.median(calls)) for part, calls in timings.items()}
    synchronisation = float(np.median(whole_step)) - sum(parts.values())
    largest = max(parts, key=parts.get)
    return "synchronisation" if synchronisation > parts[largest] else largest


def test_the_tests_rule_names_the_largest_median_or_synchronisation():
    timings = {"input": [10.0, 10.0, 90.0], "compute": [2.0, 50.0, 2.0]}
    assert diagnose_step(timings, [12.5, 12.5, 99.0]) == "input"
    assert diagnose_step(timings, [25.0, 25.0, 1.0]) == "synchronisation"
    assert diagnose_step(timings, [8.0]) == "input"  # overlapped: the input


def test_every_case_is_made_to_have_the_verdict_the_rule_gives():
    """The check holds no diagnosing function (the package is installed for learners): each
    case's verdict is the one it was made to have; the lesson's rule agrees on every draw, and
    the rule's margins hold on the exact medians (the rest 40 % above or 15 % below)."""
    import random

    from course_utils.grading.checks.diagnose_step_cases import diagnose_cases

    rng = random.Random(3)
    for _ in range(1500):
        for case in diagnose_cases(rng):
            assert diagnose_step(*case.args) == case.expected, case.label
    assert not [name for name in vars(lesson_00) if "reference" in name]


def test_diagnose_step_passes_the_reference(capsys):
    assert cu.grading.check_diagnose_step(diagnose_step)
    assert "✅ diagnose_step: 11 cases passed" in capsys.readouterr().out


def _by(summary):  # the lesson's rule, on each part summarised by ``summary``
    def diagnose(timings, whole_step):
        parts = {part: summary(calls) for part, calls in timings.items()}
        unexplained = summary(whole_step) - sum(parts.values())
        largest = max(parts, key=parts.get)
        return "synchronisation" if unexplained > parts[largest] else largest
    return diagnose


def _largest_median_only(timings, whole_step):  # synchronisation forgotten
    return max(timings, key=lambda part: np.median(timings[part]))


def _any_rest_is_synchronisation(timings, whole_step):  # compares with 0, not with the parts
    medians = {part: np.median(calls) for part, calls in timings.items()}
    if np.median(whole_step) > sum(medians.values()):
        return "synchronisation"
    return max(medians, key=medians.get)


def _by_size_alone(timings, whole_step):  # whole_step never read: a small largest part
    parts = {part: float(np.median(calls)) for part, calls in timings.items()}
    largest = max(parts, key=parts.get)
    return "synchronisation" if parts[largest] < 0.005 else largest


def _by_share_of_the_step(timings, whole_step):  # no subtraction: the largest part's share
    parts = {part: float(np.median(calls)) for part, calls in timings.items()}
    largest = max(parts, key=parts.get)
    share = parts[largest] / float(np.median(whole_step))
    return "synchronisation" if share < 0.4 else largest


def _by_spread(timings, whole_step):  # whole_step never read: a part far above the others
    parts = sorted(float(np.median(calls)) for calls in timings.values())
    named = {float(np.median(calls)): part for part, calls in timings.items()}
    return named[parts[-1]] if parts[-1] > 2.5 * parts[-2] else "synchronisation"


def _rest_against(bar):  # the rest compared with ``bar`` of the parts, not with the largest
    def diagnose(timings, whole_step):
        medians = {part: float(np.median(calls)) for part, calls in timings.items()}
        rest = float(np.median(whole_step)) - sum(medians.values())
        largest = max(medians, key=medians.get)
        return "synchronisation" if rest > bar(list(medians.values())) else largest
    return diagnose


def _size_of_the_rest(timings, whole_step):  # abs(): a negative rest (the parts overlapped)
    parts = {part: float(np.median(calls)) for part, calls in timings.items()}  # taken for
    rest = abs(float(np.median(whole_step)) - sum(parts.values()))  # synchronisation (x00 L3)
    largest = max(parts, key=parts.get)
    return "synchronisation" if rest > parts[largest] else largest


def _expected_read_from_the_frames(timings, whole_step):  # by names no scan finds
    import sys

    frame = getattr(sys, "_get" + "frame")(1)
    while frame is not None:
        for value in getattr(frame, "f_loc" + "als").values():
            for case in value if isinstance(value, list) else [value]:
                if getattr(case, "args", None) and case.args[0] is timings:
                    return case.expected
        frame = getattr(frame, "f_ba" + "ck")
    return "compute"


@pytest.mark.parametrize(("wrong", "says"), [
    (lambda timings, whole_step: "input", "expected: '(?!input)"),  # a constant
    (_expected_read_from_the_frames, "expected: '(?!compute)"),
    (_by(np.mean), "expected: "),  # the disturbed calls decide
    (_by(max), "expected: "),  # the slowest call decides
    (_by(lambda calls: calls[0]), "expected: "),  # the first call: compute's tracing
    (_largest_median_only, "expected: 'synchronisation'"),
    (_any_rest_is_synchronisation, "got: +'synchronisation'"),
    (_size_of_the_rest, "got: +'synchronisation'"),  # a rest of -1.3 x the largest part
    (_rest_against(sum), "expected: +'synchronisation'"),  # "larger than all the parts"
    (_rest_against(np.mean), "got: +'synchronisation'"),  # "larger than a typical part"
    (_rest_against(lambda parts: sorted(parts)[-2]), "got: +'synchronisation'"),
    (_by_size_alone, "expected: "),  # an absolute time: each case has a scale of its own
    (_by_share_of_the_step, "expected: "),  # parts alike: the largest, though < 40 %
    (_by_spread, "expected: "),  # parts alike, or one large part under a larger rest
    (lambda timings, whole_step: next(iter(timings)), "expected: "),  # read from the input
    # the check's case maker, called for a verdict of its own cases:
    (lambda timings, whole_step: diagnose_step_cases.diagnose_cases(
        __import__("random").Random(0))[0].expected, "ran the course's .*diagnose_cases"),
])
def test_diagnose_step_catalogue_is_rejected(wrong, says):
    with pytest.raises(AssertionError, match=says):
        cu.grading.check_diagnose_step(wrong)


def test_the_best_call_is_as_robust_as_the_median(capsys):
    assert cu.grading.check_diagnose_step(_by(min))


def test_diagnose_step_stub_is_not_attempted(assert_not_attempted):
    assert_not_attempted(cu.grading.check_diagnose_step, stub)


# --- split_cpu (run in a fresh process) -------------------------------------------------------


def split_cpu(num_devices):
    physical_cpu = tf.config.list_physical_devices("CPU")[0]  # noqa: F821 - the script's tf
    try:
        tf.config.set_logical_device_configuration(  # noqa: F821
            physical_cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)  # noqa: F821
    except RuntimeError:
        if len(tf.config.list_logical_devices("CPU")) != num_devices:  # noqa: F821
            raise RuntimeError("restart the kernel to change the split") from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def split_cpu_broken(num_devices):
    cpus = tf.config.list_logical_devices("CPU")  # noqa: F821 - starts TensorFlow's devices
    tf.config.set_logical_device_configuration(  # noqa: F821
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_devices)  # noqa: F821
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def split_cpu_lesson(num_devices):  # the lesson's call: another number, TensorFlow's message
    physical_cpu = tf.config.list_physical_devices("CPU")[0]  # noqa: F821
    tf.config.set_logical_device_configuration(  # noqa: F821
        physical_cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)  # noqa: F821
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def split_cpu_stub(num_devices):
    raise NotImplementedError()


def test_split_cpu_stub_is_not_attempted_without_starting_a_process(assert_not_attempted):
    assert_not_attempted(cu.grading.check_split_cpu, split_cpu_stub)


def test_split_cpu_refuses_the_course_helper_under_the_answers_name():
    with pytest.raises(AssertionError, match="cu.configure_logical_devices"):
        cu.grading.check_split_cpu(cu.configure_logical_devices)


def split_cpu_in_two(num_devices):  # the lesson's set-up cell, num_devices ignored
    physical_cpu = tf.config.list_physical_devices("CPU")[0]  # noqa: F821
    tf.config.set_logical_device_configuration(  # noqa: F821
        physical_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)  # noqa: F821
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def split_cpu_names_only(num_devices):  # the names made up, nothing split
    return [f"/device:CPU:{index}" for index in range(num_devices)]


def split_cpu_swallows(num_devices):  # every error hidden: another number "works"
    try:
        split_cpu_lesson(num_devices)
    except Exception:
        pass
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def split_cpu_value_error(num_devices):  # says restart, with the wrong kind of error
    physical_cpu = tf.config.list_physical_devices("CPU")[0]  # noqa: F821
    try:
        tf.config.set_logical_device_configuration(  # noqa: F821
            physical_cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)  # noqa: F821
    except RuntimeError:
        raise ValueError("restart the kernel") from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def split_cpu_only_once(num_devices):  # refuses every second call, even the same split
    if getattr(split_cpu_only_once, "done", False):
        raise RuntimeError("restart the kernel")
    split_cpu_only_once.done = True
    return split_cpu_lesson(num_devices)


def split_cpu_with_the_helper(num_devices):  # the course's helper, imported inside
    import course_utils

    return course_utils.configure_logical_devices(num_devices)


def split_cpu_after_an_op(num_devices):  # a harmless-looking op first: too late
    tf.constant(0)  # noqa: F821
    return split_cpu(num_devices)


def split_cpu_restarts_on_every_error(num_devices):  # the devices exist: always "restart"
    physical_cpu = tf.config.list_physical_devices("CPU")[0]  # noqa: F821
    try:
        tf.config.set_logical_device_configuration(  # noqa: F821
            physical_cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)  # noqa: F821
    except RuntimeError:
        raise RuntimeError("restart the kernel to change the split") from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def split_cpu_physical_names(num_devices):  # split right, the wrong names returned
    split_cpu(num_devices)
    return [device.name for device in tf.config.list_physical_devices("CPU")]  # noqa: F821


def split_cpu_forges_the_report(num_devices):  # prints what the check reads, then ends
    import json
    import os

    names = [f"/device:CPU:{index}" for index in range(num_devices)]
    right = {"returned": names, "devices": names}
    refused = {"error": "RuntimeError: restart the kernel", "runtime_error": True}
    one = {"returned": ["/device:CPU:0"], "devices": ["/device:CPU:0"]}
    print("RESULT " + json.dumps([right, right, refused, right]))
    print("RESULT " + json.dumps([{"op": 2}, one]), flush=True)
    os._exit(0)


def split_cpu_writes_the_pipe(num_devices):  # the report written into its pipe, then ends
    import json
    import os
    import stat

    names = [f"/device:CPU:{index}" for index in range(num_devices)]
    right = {"returned": names, "devices": names}
    refused = {"error": "RuntimeError: restart the kernel", "runtime_error": True}
    report = [right, right, refused, right] if num_devices > 1 else [{"op": 2}, right]
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, json.dumps(report).encode())
        except OSError:
            pass
    os._exit(0)


def split_cpu_replaces_the_reader(num_devices):  # tf.config's answer replaced, nothing split
    class Device:
        def __init__(self, name):
            self.name = name

    devices = [Device(f"/device:CPU:{index}") for index in range(num_devices)]
    tf.config.list_logical_devices = lambda *kind: devices  # noqa: F821
    return [device.name for device in devices]


def split_cpu_writes_through_tf_io(num_devices):  # the pipe reached as a file, by TensorFlow
    names = [f"/device:CPU:{index}" for index in range(num_devices)]
    with tf.io.gfile.GFile("/proc/self/fd/5", "w") as pipe:  # noqa: F821
        pipe.write(str(names))
    return names


def split_cpu_built_names(num_devices):  # a module reached by a name built at run time
    os = getattr(tf, "sys" + "config")  # noqa: F821
    return [f"/device:CPU:{index}" for index in range(num_devices)] + [os]


def split_cpu_through_a_frame(num_devices):  # a generator's frame leads to the script's globals
    def frame():
        yield

    running = frame()
    globals_ = running.gi_frame.f_globals
    return [f"/device:CPU:{index}" for index in range(num_devices)] + [globals_]


def split_cpu_tf_handed_on(num_devices):  # tensorflow itself under another name
    everything = tf  # noqa: F821
    return everything.config.list_logical_devices("CPU")


def split_cpu_advises_against_a_restart(num_devices):  # xf00 L1: the word, not the advice
    physical_cpu = tf.config.list_physical_devices("CPU")[0]  # noqa: F821
    try:
        tf.config.set_logical_device_configuration(  # noqa: F821
            physical_cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)  # noqa: F821
    except RuntimeError as error:
        if len(tf.config.list_logical_devices("CPU")) != num_devices:  # noqa: F821
            raise RuntimeError(f"{error} (no need to restart the kernel)") from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def test_the_restart_advice_is_the_advice_not_the_word():
    from course_utils.grading.checks.restart_advice import says_restart

    assert all(map(says_restart, ["2 exist, 3 asked: restart the kernel, then split first",
                                  "Please restart your Jupyter kernel.",
                                  "can't change the devices: restart the kernel"]))
    assert not any(map(says_restart, ["do not restart anything", "[restarted=False]",
                                      "error_code=NORESTARTNEEDED", "don't restart the kernel",
                                      "(no need to restart: just ignore it)"]))


SPLIT_CATALOGUE = [
    (split_cpu_advises_against_a_restart, "must say what to do .*nor advice against it"),
    (split_cpu_forges_the_report, "not run in the fresh process: line \\d+ imports json"),
    (split_cpu_writes_the_pipe, "not run .*imports json"),
    (split_cpu_replaces_the_reader, "not run .*sets the attribute list_logical_devices"),
    (split_cpu_writes_through_tf_io, "not run .*uses tf.io: only tf.config and tf.errors"),
    (split_cpu_built_names, "not run .*uses getattr with a name built at run time"),
    (split_cpu_through_a_frame, "not run .*reads the attribute (gi_frame|f_globals)"),
    (split_cpu_tf_handed_on, "not run .*uses tf itself"),
    (split_cpu_lesson, "must say what to do"),
    (split_cpu_in_two, "expected the logical CPUs"),
    (split_cpu_names_only, "expected the logical CPUs"),
    (split_cpu_swallows, "without an error"),
    (split_cpu_value_error, "raise a RuntimeError"),
    (split_cpu_only_once, "second call .* raised"),
    (split_cpu_with_the_helper, "not run .*imports course_utils: only tensorflow"),
    (split_cpu_after_an_op, "not run .*uses tf.constant: only tf.config and tf.errors"),
    (split_cpu_physical_names, "should return"),
    (split_cpu_restarts_on_every_error, "after TensorFlow had run an op.*there is 1, as asked"),
    (split_cpu_broken, "first call .* raised: ValueError"),
]


@pytest.mark.slow
def test_split_cpu_passes_the_fix_and_rejects_the_catalogue_each_in_a_fresh_tensorflow(capsys):
    # One kept process imports TensorFlow and forks a fresh child per run: the check's own
    # runs of the fix, then each wrong answer with the helpers it calls; the op-first run only
    # where the first four calls were right (as in the check).
    assert cu.grading.check_split_cpu(split_cpu)
    assert "✅ split_cpu: 1 case passed" in capsys.readouterr().out
    shared = "\n".join(textwrap.dedent(inspect.getsource(f))
                       for f in (split_cpu, split_cpu_lesson))
    answers = [(wrong.__name__, shared + "\n" + textwrap.dedent(inspect.getsource(wrong)))
               for wrong, _ in SPLIT_CATALOGUE]
    wrong_results = lesson_00.run_split_answers(
        answers, [3, 3, 4, 3], after_an_op=1,
        only_where=lambda first: lesson_00.split_verdict(first, 3) is None)
    for (wrong, says), results in zip(SPLIT_CATALOGUE, wrong_results, strict=True):
        verdict = lesson_00.split_verdict(results, 3)
        assert verdict is not None and re.search(says, verdict), (wrong.__name__, verdict)



@pytest.mark.slow
def test_split_cpu_limits_hold_in_the_fresh_process_too():
    # the source scan is the first guard; the process itself refuses the same (the forks of
    # the kept TensorFlow above, no new import)
    from course_utils.grading.checks import splits

    with splits._FreshTensorFlow._lock:
        server = splits._FreshTensorFlow.shared()
        piped = server.run(("split_cpu_writes_the_pipe",
                            textwrap.dedent(inspect.getsource(split_cpu_writes_the_pipe)), [3]))
        replaced = server.run(("split_cpu_replaces_the_reader", textwrap.dedent(
            inspect.getsource(split_cpu_replaces_the_reader)), [3]))
    assert "ImportError: only tensorflow can be imported here, not 'json'" in piped[0]["error"]
    assert "tf.config.list_logical_devices was replaced" in replaced[0]["error"]

# --- step_breakdown ---------------------------------------------------------------------------


def _timed_calls(next_batch, train_step, batch, repeats):  # each part's timed calls, in turns
    parts = {"input": next_batch, "compute": lambda: train_step(batch),
             "whole step": lambda: train_step(next_batch())}
    seconds = {name: [] for name in parts}
    for _ in range(repeats):
        for name, call in parts.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def step_breakdown(next_batch, train_step, batch, repeats):
    seconds = _timed_calls(next_batch, train_step, batch, repeats)
    return {name: float(np.median(values)) for name, values in seconds.items()}


@pytest.mark.solution_passes
def test_step_breakdown_passes_the_reference(capsys):
    assert cu.grading.check_step_breakdown(step_breakdown)
    assert "✅ step_breakdown" in capsys.readouterr().out


def _lesson_cell_copied(next_batch, train_step, batch, repeats):  # the course's helper
    timings = cu.bench.time_interleaved({
        "input": next_batch, "compute": lambda: train_step(batch),
        "whole step": lambda: train_step(next_batch())}, repeats=repeats)
    return {name: timing.median for name, timing in timings.items()}


_helper_under_another_name = cu.bench.time_interleaved


def _helper_renamed(next_batch, train_step, batch, repeats):
    timings = _helper_under_another_name({
        "input": next_batch, "compute": lambda: train_step(batch),
        "whole step": lambda: train_step(next_batch())}, repeats=repeats)
    return {name: timing.median for name, timing in timings.items()}


def _exec_copy_of_the_helper():  # the helper's source pasted and exec'd: a new code object
    import inspect
    import textwrap

    namespace = dict(vars(cu.bench))
    exec(compile(textwrap.dedent(inspect.getsource(cu.bench.time_interleaved)),  # noqa: S102
                 "<pasted>", "exec"), namespace)
    return namespace["time_interleaved"]


def _helper_copied(next_batch, train_step, batch, repeats):
    timings = _exec_copy_of_the_helper()({
        "input": next_batch, "compute": lambda: train_step(batch),
        "whole step": lambda: train_step(next_batch())}, repeats=repeats)
    return {name: timing.median for name, timing in timings.items()}


def _helper_in_a_thread(next_batch, train_step, batch, repeats):  # out of sys.setprofile's view
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_lesson_cell_copied, next_batch, train_step, batch, repeats).result()


def _time_function_in_turns(next_batch, train_step, batch, repeats):  # r00 L2: in turns,
    parts = {"input": next_batch, "compute": lambda: train_step(batch),  # a median, but
             "whole step": lambda: train_step(next_batch())}  # each call timed by the course
    seconds = {name: [] for name in parts}
    for _ in range(repeats):
        for name, call in parts.items():
            seconds[name].append(cu.bench.time_function(call, repeats=1, warmup=0).times[0])
    return {name: float(np.median(values)) for name, values in seconds.items()}


def _profiler_switched_off(next_batch, train_step, batch, repeats):
    import sys

    sys.setprofile(None)
    return _lesson_cell_copied(next_batch, train_step, batch, repeats)


def _profiler_switched_off_by_a_built_name(next_batch, train_step, batch, repeats):
    import sys

    getattr(sys, "set" + "profile")(None)  # a name no scan of the source finds
    return _lesson_cell_copied(next_batch, train_step, batch, repeats)


def _in_blocks(next_batch, train_step, batch, repeats):  # all of one part, then the next
    parts = {"input": next_batch, "compute": lambda: train_step(batch),
             "whole step": lambda: train_step(next_batch())}
    result = {}
    for name, call in parts.items():
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
        result[name] = float(np.median(seconds))
    return result


def _means(next_batch, train_step, batch, repeats):  # a disturbed call sways a mean
    parts = {"input": next_batch, "compute": lambda: train_step(batch),
             "whole step": lambda: train_step(next_batch())}
    total = dict.fromkeys(parts, 0.0)
    for _ in range(repeats):
        for name, call in parts.items():
            start = time.perf_counter()
            call()
            total[name] += time.perf_counter() - start
    return {name: seconds / repeats for name, seconds in total.items()}


def _constants(next_batch, train_step, batch, repeats):  # the waits guessed, calls made
    for _ in range(repeats):
        next_batch(), train_step(batch), train_step(next_batch())
    return {"input": 0.015, "compute": 0.005, "whole step": 0.020}


def _constants_of_the_fast_case(next_batch, train_step, batch, repeats):  # fit case 1 only
    for _ in range(repeats):
        next_batch(), train_step(batch), train_step(next_batch())
    return {"input": 0.020, "compute": 0.012, "whole step": 0.060}


def _constants_of_the_slow_case(next_batch, train_step, batch, repeats):  # fit case 2 only
    for _ in range(repeats):
        next_batch(), train_step(batch), train_step(next_batch())
    return {"input": 0.080, "compute": 0.060, "whole step": 0.140}


def test_step_cases_accept_no_common_answer():
    (fast_in, fast_step), (slow_in, slow_step) = lesson_00.STEP_CASES
    (fast_copy, slow_copy) = lesson_00.STEP_TRANSFER
    fast_whole = ((fast_in[0] + fast_step[0]) * (1 + fast_copy[0]),
                  (fast_in[1] + fast_step[1]) * (1 + fast_copy[1]))
    slow_whole = ((slow_in[0] + slow_step[0]) * (1 + slow_copy[0]),
                  (slow_in[1] + slow_step[1]) * (1 + slow_copy[1]))
    for fast, slow in [(fast_in, slow_in), (fast_step, slow_step), (fast_whole, slow_whole)]:
        assert lesson_00._accepted(fast[1])[1] < lesson_00._accepted(slow[0])[0], (fast, slow)
    # the whole step summed from the parts falls below the first case's accepted range by
    # far more than the parts' late wake-ups (15 ms at the least)
    assert min(lesson_00._accepted((i + c) * (1 + fast_copy[0]))[0] - (i + c) * 1e3
               for i in fast_in for c in fast_step) > 15
    # in the slow case a part derived as the whole step less the other part (never timed
    # alone) is above its range by 20 ms or more (xf00 L2)
    for part, other in [(slow_in, slow_step), (slow_step, slow_in)]:
        assert min((p + slow_copy[0] * (p + o)) * 1e3 - lesson_00._accepted(p)[1]
                   for p in part for o in other) > 20


def _input_as_the_whole_step_less_compute(next_batch, train_step, batch, repeats):  # xf00
    seconds = {"compute": [], "whole step": []}  # L2: next_batch called alone, never timed
    for _ in range(repeats):
        next_batch()
        for name, call in [("compute", lambda: train_step(batch)),
                           ("whole step", lambda: train_step(next_batch()))]:
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    medians = {name: float(np.median(values)) for name, values in seconds.items()}
    return {"input": medians["whole step"] - medians["compute"], **medians}


def _in_milliseconds(next_batch, train_step, batch, repeats):
    return {k: v * 1e3 for k, v in step_breakdown(next_batch, train_step, batch,
                                                   repeats).items()}


def _compute_only(next_batch, train_step, batch, repeats):  # skips the input's timing
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        train_step(batch)
        seconds.append(time.perf_counter() - start)
    return {"input": 0.0, "compute": float(np.median(seconds)), "whole step": 0.0}


def _whole_step_on_the_given_batch(next_batch, train_step, batch, repeats):
    return step_breakdown(next_batch, train_step, batch, repeats) | {
        "whole step": step_breakdown(next_batch, lambda b: train_step(batch), batch,
                                     repeats)["compute"]}


def _whole_step_summed(next_batch, train_step, batch, repeats):  # called, never timed
    medians = {name: float(np.median(values)) for name, values in
               _timed_calls(next_batch, train_step, batch, repeats).items()}
    return medians | {"whole step": medians["input"] + medians["compute"]}


def _first_call_only(next_batch, train_step, batch, repeats):  # "one call is enough"
    return {name: values[0] for name, values in
            _timed_calls(next_batch, train_step, batch, repeats).items()}


def _input_in_a_block(next_batch, train_step, batch, repeats):  # then compute/whole in turns
    seconds = {"input": [], "compute": [], "whole step": []}
    for _ in range(repeats):
        start = time.perf_counter()
        next_batch()
        seconds["input"].append(time.perf_counter() - start)
    for _ in range(repeats):
        for name, call in (("compute", lambda: train_step(batch)),
                           ("whole step", lambda: train_step(next_batch()))):
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return {name: float(np.median(values)) for name, values in seconds.items()}


def _waits_read_from_the_closures(next_batch, train_step, batch, repeats):  # built names
    for _ in range(repeats):
        next_batch(), train_step(batch), train_step(next_batch())

    def cells(fn):
        found = {}
        for cell in getattr(fn, "__clo" + "sure__") or ():
            value = getattr(cell, "cell_con" + "tents")
            if isinstance(value, float):
                found[len(found)] = value
        return found

    waits = sorted({**cells(next_batch), **cells(train_step)}.values())
    return {"input": waits[0], "compute": waits[-1], "whole step": sum(waits)}


def _whole_step_in_two_pieces(next_batch, train_step, batch, repeats):  # the input alone,
    seconds = {"input": [], "compute": [], "step": []}  # plus a step on a fresh batch alone
    for _ in range(repeats):
        start = time.perf_counter()
        next_batch()
        seconds["input"].append(time.perf_counter() - start)
        start = time.perf_counter()
        train_step(batch)
        seconds["compute"].append(time.perf_counter() - start)
        fresh = next_batch()
        start = time.perf_counter()
        train_step(fresh)
        seconds["step"].append(time.perf_counter() - start)
    medians = {name: float(np.median(values)) for name, values in seconds.items()}
    return {"input": medians["input"], "compute": medians["compute"],
            "whole step": medians["input"] + medians["step"]}


def _step_again_on_the_inputs_batch(next_batch, train_step, batch, repeats):  # the input's
    seconds = {"input": [], "compute": [], "step": []}  # batch stepped on a second time
    for _ in range(repeats):
        next_batch()
        start = time.perf_counter()
        made = next_batch()
        seconds["input"].append(time.perf_counter() - start)
        start = time.perf_counter()
        train_step(made)
        seconds["step"].append(time.perf_counter() - start)
        start = time.perf_counter()
        train_step(batch)
        seconds["compute"].append(time.perf_counter() - start)
    medians = {name: float(np.median(values)) for name, values in seconds.items()}
    return {"input": medians["input"], "compute": medians["compute"],
            "whole step": medians["input"] + medians["step"]}


def _second_call_only(next_batch, train_step, batch, repeats):  # nb31-0A L1: in turns,
    seconds = _timed_calls(next_batch, train_step, batch, repeats)  # one call kept per part
    return {name: values[1] for name, values in seconds.items()}


def _fourth_call_only(next_batch, train_step, batch, repeats):
    seconds = _timed_calls(next_batch, train_step, batch, repeats)
    return {name: values[3] for name, values in seconds.items()}


def _middle_call_only(next_batch, train_step, batch, repeats):
    seconds = _timed_calls(next_batch, train_step, batch, repeats)
    return {name: values[repeats // 2] for name, values in seconds.items()}


@pytest.mark.parametrize(("wrong", "says"), [
    (_whole_step_in_two_pieces, "whole step was not timed as one"),
    (_step_again_on_the_inputs_batch, "whole step was not timed as one"),
    (_waits_read_from_the_closures, "raised .*IndexError|should take about"),
    (_lesson_cell_copied, "it called cu.bench.time_interleaved"),
    (_helper_renamed, "it called cu.bench.time_interleaved"),
    (_helper_copied, "it called cu.bench.time_interleaved"),
    (_helper_in_a_thread, "it called cu.bench.time_interleaved"),
    (_time_function_in_turns, "it called cu.bench.time_function"),
    (_profiler_switched_off, "switched the check's call recorder off|uses setprofile"),
    (_profiler_switched_off_by_a_built_name, "switched the check's call recorder off"),
    (_in_blocks, "not timed in turns"),
    (_means, "a median ignores them"),
    (_whole_step_summed, "'whole step' should take about"),
    (_input_as_the_whole_step_less_compute, "case 2 .*'input' should take about"),
    (_first_call_only, "should take about"),
    (_second_call_only, "one call per part does not"),
    (_fourth_call_only, "one call per part does not"),
    (_middle_call_only, "one call per part does not"),
    (_input_in_a_block, "not timed in turns"),
    (_constants, "should take about"),
    (_constants_of_the_fast_case, "case 2 .*should take about"),
    (_constants_of_the_slow_case, "case 1 .*should take about"),
    (_in_milliseconds, "should take about"),
    (_compute_only, "timed calls"),
    (_whole_step_on_the_given_batch, "timed calls|should take about"),
])
def test_step_breakdown_catalogue_is_rejected_with_its_reason(wrong, says):
    with pytest.raises(AssertionError, match=says):
        cu.grading.check_step_breakdown(wrong)


# --- overlapped_pipeline ----------------------------------------------------------------------


def overlapped_pipeline(records, read, augment, batch_size):
    import tensorflow as tf  # a prefetch after each slow stage: reads run while a batch is

    batches = records.batch(batch_size).map(read).prefetch(tf.data.AUTOTUNE)  # augmented,
    return batches.map(augment).prefetch(tf.data.AUTOTUNE)  # augments while the step runs


def test_overlapped_pipeline_passes_the_fix(capsys):
    assert cu.grading.check_overlapped_pipeline(overlapped_pipeline)
    assert "reads overlapped augments in" in capsys.readouterr().out


def _prefetched_reads_and_a_cache_file(records, read, augment, batch_size):  # right: the
    import os  # reads prefetched before the augment, explicit buffers, and a cache in a file
    import tempfile  # (the same one every call) that this pipeline's reads write

    cached = records.batch(batch_size).map(read).cache(
        os.path.join(tempfile.gettempdir(), "overlapped_pipeline_cache"))
    return cached.prefetch(2).map(augment).prefetch(1)


def _augmented_in_parallel(records, read, augment, batch_size):  # right: a parallel map
    import tensorflow as tf  # (lesson 01) pulls the next batches while it augments

    augmented = records.batch(batch_size).map(read).map(augment, num_parallel_calls=2)
    return augmented.prefetch(tf.data.AUTOTUNE)


def _prefetched_between_the_stages_only(records, read, augment, batch_size):  # right under
    import tensorflow as tf  # tf.data's defaults: inject_prefetch adds the prefetch after the

    return records.batch(batch_size).map(read).prefetch(tf.data.AUTOTUNE).map(augment)  # map


def _read_in_parallel_on_sixteen_threads(records, read, augment, batch_size):  # right (xf00
    import tensorflow as tf  # R1, R2): AUTOTUNE starts at 16 where 16 threads run tf.data (a

    options = tf.data.Options()  # 16-core laptop's default): every batch read before the
    options.threading.private_threadpool_size = 16  # first augment, unless the check's pool
    read_ahead = records.batch(batch_size).map(read, num_parallel_calls=tf.data.AUTOTUNE)
    return read_ahead.map(augment).prefetch(tf.data.AUTOTUNE).with_options(options)  # rules;
    # and the step's own pull starts a read just before the step: in flight, counted


@pytest.mark.parametrize("right", [_prefetched_reads_and_a_cache_file,
                                   _augmented_in_parallel,
                                   _prefetched_between_the_stages_only,
                                   _read_in_parallel_on_sixteen_threads])
def test_overlapped_pipeline_passes_right_variants(right, capsys):
    assert cu.grading.check_overlapped_pipeline(right)
    assert "reads overlapped augments in" in capsys.readouterr().out


def test_overlapped_pipeline_stub_is_not_attempted(assert_not_attempted):
    assert_not_attempted(cu.grading.check_overlapped_pipeline, stub)


def _constant(records, read, augment, batch_size):  # a dataset, not the records'
    import tensorflow as tf

    return tf.data.Dataset.range(12).batch(batch_size)


def _the_colleagues_pipeline(records, read, augment, batch_size):  # the exercise's cell: one
    import tensorflow as tf  # prefetch at the end; read and augment one after the other

    return records.batch(batch_size).map(read).map(augment).prefetch(tf.data.AUTOTUNE)


def _read_per_record_fused(records, read, augment, batch_size):  # a read per record, map
    import tensorflow as tf  # then batch: map_and_batch_fusion overlaps it, a call per record

    return records.map(read).batch(batch_size).map(augment).prefetch(tf.data.AUTOTUNE)


def _augment_dropped(records, read, augment, batch_size):  # the slow stage skipped (the old
    import tensorflow as tf  # exercise's answer)

    return records.batch(batch_size).map(read).prefetch(tf.data.AUTOTUNE)


def _augmented_per_record(records, read, augment, batch_size):  # augment before the batch
    import tensorflow as tf

    read_ahead = records.batch(batch_size).map(read).unbatch().prefetch(tf.data.AUTOTUNE)
    return read_ahead.map(augment).batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _no_prefetch(records, read, augment, batch_size):  # the prefetch taken out: the stages
    return records.batch(batch_size).map(read).map(augment)  # never overlap


def _read_everything_first(records, read, augment, batch_size):  # every read before step 1,
    import tensorflow as tf  # inside tf.data: later steps find them done

    everything = records.batch(batch_size).map(read).unbatch().batch(1_000_000).unbatch()
    return everything.batch(batch_size).map(augment).prefetch(tf.data.AUTOTUNE)


def _read_in_python_first(records, read, augment, batch_size):  # right values, read eagerly
    import tensorflow as tf  # while the pipeline is built, not while it is iterated

    values = [read(batch) for batch in records.batch(batch_size)]
    read_ahead = tf.data.Dataset.from_tensor_slices(tf.concat(values, 0)).batch(batch_size)
    return read_ahead.prefetch(1).map(augment).prefetch(tf.data.AUTOTUNE)


def _prefetched_handed_on_by_a_generator(records, read, augment, batch_size):  # the fix,
    import tensorflow as tf  # iterated by a pipeline of its own and handed on

    own = overlapped_pipeline(records, read, augment, batch_size)
    handed = tf.data.Dataset.from_generator(own.as_numpy_iterator,
                                            output_signature=tf.TensorSpec([None], tf.int64))
    return handed.prefetch(tf.data.AUTOTUNE).concatenate(own.take(0))


def _parallel_and_out_of_order(records, read, augment, batch_size):  # equal waits keep most
    import tensorflow as tf  # of the order, but not all of it

    batches = records.batch(batch_size).map(read).prefetch(tf.data.AUTOTUNE)
    return batches.map(augment, num_parallel_calls=2, deterministic=False).prefetch(1)


def _short_batch_dropped(records, read, augment, batch_size):
    import tensorflow as tf

    batches = records.batch(batch_size, drop_remainder=True).map(read)
    return batches.prefetch(tf.data.AUTOTUNE).map(augment).prefetch(tf.data.AUTOTUNE)


def _fixed_when_checked_colleagues_when_trained(records, read, augment, batch_size,
                                                _calls=[]):  # noqa: B006
    _calls.append(None)  # the check's first call gets the fix, the second (trained on) not
    if len(_calls) % 2:
        return overlapped_pipeline(records, read, augment, batch_size)
    return _the_colleagues_pipeline(records, read, augment, batch_size)


def _read_on_the_side(records, read, augment, batch_size):  # counted reads in a thread of its
    import threading  # own, beside the fix

    threading.Thread(target=lambda: list(records.batch(2).map(read).as_numpy_iterator()),
                     daemon=True).start()
    return overlapped_pipeline(records, read, augment, batch_size)


def _read_ahead_in_one_thread(records, read, augment, batch_size):  # x00 L1: a scan reads
    import tensorflow as tf  # batch k + 1, then hands on batch k to augment, in one thread: a

    batches = records.batch(batch_size)  # later read started, none in flight beside it
    flushed = batches.concatenate(tf.data.Dataset.from_tensors(tf.zeros([0], tf.int64)))

    def step(state, batch):
        return tf.cond(tf.size(batch) > 0, lambda: read(batch), lambda: batch), state
    return (flushed.scan(tf.zeros([0], tf.int64), step).skip(1).map(augment)
            .prefetch(tf.data.AUTOTUNE))


def _rigged(calls):  # the check's recorder: every augment "overlapped", every step read
    class Yes(list):
        def append(self, item):
            super().append(True)

    class Rigged(type(calls)):
        def reset(self, grace_s):
            super().reset(grace_s)
            self.stages = Yes()
    calls.__class__ = Rigged


def _recorder_rigged_through_bound_method(records, read, augment, batch_size):  # x00 L2
    _rigged(read.__self__)
    return _the_colleagues_pipeline(records, read, augment, batch_size)


def _recorder_rigged_by_names_built(records, read, augment, batch_size):  # x00 L2: names
    cells, contents = "".join(["__clo", "sure__"]), "".join(["cell_con", "tents"])  # the scan
    for cell in getattr(read, cells, None) or ():  # cannot see: the recorder's class swapped
        _rigged(getattr(cell, contents))
    return _the_colleagues_pipeline(records, read, augment, batch_size)


@pytest.mark.parametrize(("wrong", "says"), [
    (_read_ahead_in_one_thread, r"read and augment run one after the other: .* during only"),
    (_recorder_rigged_through_bound_method, r"your function uses __self__"),
    (_recorder_rigged_by_names_built, r"recorder of read and augment was changed \(its class"),
    (_constant, r"expected batches of shapes"),
    (_the_colleagues_pipeline, r"read and augment run one after the other: .* during only 0% "),
    (_read_per_record_fused, r"read was called \d+ times .* one request per batch"),
    (_augment_dropped, r"elements differ from the colleague's pipeline's"),
    (_augmented_per_record, r"elements differ from the colleague's pipeline's"),
    (_no_prefetch, r"read and augment run one after the other: .* during only 0% "),
    (_read_everything_first, r"read and augment run one after the other|reading does not"),
    (_read_in_python_first, r"read was called 0 times"),
    (_prefetched_handed_on_by_a_generator, r"runs [1-9]\d* Python function\(s\) of its own"),
    (_parallel_and_out_of_order, r"deterministic=False in your pipeline"),
    (_short_batch_dropped, r"expected batches of shapes"),
    (_fixed_when_checked_colleagues_when_trained,
     r"read and augment run one after the other"),
    (_read_on_the_side, r"read was called \d+ times"),
])
def test_overlapped_pipeline_catalogue_is_rejected_with_its_reason(wrong, says):
    with pytest.raises(AssertionError, match=says):
        cu.grading.check_overlapped_pipeline(wrong)


def test_stage_overlap_counts_mechanisms_not_seconds():
    # the colleague's pipeline, with tf.data's default options: its share is 0 for the stages
    # however the waits are drawn, the fix's full (one epoch each, the check's own read and
    # augment); the per-record read directly before the batch is overlapped by the defaults
    import random

    import tensorflow as tf

    from course_utils.grading.checks import stage_overlap

    waits = stage_overlap.draw_waits(random.Random(0))
    calls = stage_overlap.StageCalls(waits)
    records = tf.data.Dataset.range(waits["first"], waits["first"] + waits["count"])
    shares = {}
    for name, make in [("fix", overlapped_pipeline), ("colleague", _the_colleagues_pipeline),
                       ("fused", _read_per_record_fused)]:
        dataset = make(records, calls.read, calls.augment, waits["batch_size"])
        shares[name] = stage_overlap.train_epoch(dataset, calls, stage_overlap.GRACE_S)[0]
    assert shares["colleague"]["stages"] == 0.0
    assert min(shares["fix"].values()) >= stage_overlap.MIN_SHARE, shares
    assert shares["fused"]["stages"] >= stage_overlap.MIN_SHARE, shares
    assert tf.data.Options().experimental_optimization.map_and_batch_fusion is None


# --- split_cpu: answers that trust a number, not the devices that exist


def split_cpu_trusts_one(num_devices):  # "1 is always there": never counts the devices
    physical_cpu = tf.config.list_physical_devices("CPU")[0]  # noqa: F821
    try:
        tf.config.set_logical_device_configuration(  # noqa: F821
            physical_cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)  # noqa: F821
    except RuntimeError:
        if num_devices != 1:
            raise RuntimeError("restart the kernel") from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def split_cpu_remembers(num_devices):  # trusts what it asked for before, not TensorFlow
    physical_cpu = tf.config.list_physical_devices("CPU")[0]  # noqa: F821
    try:
        tf.config.set_logical_device_configuration(  # noqa: F821
            physical_cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)  # noqa: F821
        split_cpu_remembers.asked = num_devices
    except RuntimeError:
        if getattr(split_cpu_remembers, "asked", num_devices) != num_devices:
            raise RuntimeError("restart the kernel") from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


@pytest.mark.slow
def test_split_cpu_rejects_a_trusted_number_after_a_split_it_did_not_make():
    # both pass the four calls and the op-first run; the check's own split of 3, then (2) and
    # (1), shows that neither counts the devices that exist (forks of the kept TensorFlow)
    answers = [(f.__name__, textwrap.dedent(inspect.getsource(f)))
               for f in (split_cpu, split_cpu_trusts_one, split_cpu_remembers)]
    results = lesson_00.run_split_answers(
        answers, [4, 4, 5, 4], after_an_op=1,
        only_where=lambda first: lesson_00.split_verdict(first, 4) is None,
        after_a_split=(3, [2, 1, 3]))
    verdicts = [lesson_00.split_verdict(result, 4) for result in results]
    assert verdicts[0] is None, verdicts[0]
    assert re.search(r"split the CPU into 3 .* split_cpu\(1\) returned .* without an error: "
                     r"3 logical CPUs exist, 1 asked", verdicts[1]), verdicts[1]
    assert re.search(r"split the CPU into 3 .* split_cpu\(2\) returned .* without an error: "
                     r"3 logical CPUs exist, 2 asked", verdicts[2]), verdicts[2]
