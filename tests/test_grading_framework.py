"""The check framework (run, compare, stubs, strict mode), run in this process (no kernels)."""

from __future__ import annotations

import re

import nbformat
import pytest

import course_utils as cu
from course_utils.grading import framework
from course_utils.grading.framework import Case, NotAttemptedError, compare, run_check
from course_utils.instructor.cells import check_cells


def stub(*args):
    raise NotImplementedError()


pytestmark = pytest.mark.usefixtures("normal_check_mode")


def test_importing_grading_does_not_import_tensorflow():
    import subprocess
    import sys

    code = ("import sys, course_utils as cu; cu.grading.check_diagnose_step; "
            "import course_utils.instructor.batch, course_utils.instructor.cli; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_stub_is_not_attempted_and_does_not_raise_in_normal_mode(capsys):
    assert cu.grading.check_diagnose_step(stub) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_stub_raises_not_attempted_in_strict_mode_by_switch_and_by_environment(monkeypatch):
    with framework.strict_checks(), pytest.raises(NotAttemptedError, match="not attempted"):
        cu.grading.check_diagnose_step(stub)
    monkeypatch.setenv(framework.STRICT_ENV, "1")
    assert framework.strict_mode()
    with pytest.raises(NotAttemptedError):
        cu.grading.check_diagnose_step(stub)
    framework.set_strict(False)  # the switch wins over the environment
    assert cu.grading.check_diagnose_step(stub) is False


def test_not_implemented_from_inside_a_library_is_an_error_not_a_stub():
    def calls_library(batch, replicas):
        return stub(batch, replicas)

    with pytest.raises(AssertionError, match="from inside a library call"):
        cu.grading.check_diagnose_step(calls_library)


def test_exception_in_learner_code_becomes_assertion_with_its_type():
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        cu.grading.check_diagnose_step(lambda batch, replicas: 1 / 0)


def test_passing_something_not_callable_is_explained():
    with pytest.raises(AssertionError, match="expected your function"):
        cu.grading.check_diagnose_step(12)


def test_object_claiming_equality_does_not_pass():
    class Liar(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    with pytest.raises(AssertionError):
        cu.grading.check_diagnose_step(lambda batch, replicas: Liar(-1))


@pytest.mark.parametrize(("expected", "got", "ok"), [
    (3, 3, True), (3, True, False), (3, 3.0, False), (0.3, 0.1 + 0.2, True), (0.3, 0.31, False),
    ("a", "a", True), ([1, 2], (1, 2), True), ([1, 2], [1], False), ({"a": 1.0}, {"a": 1}, True),
    ({"a": 1}, {"b": 1}, False), (True, True, True), (None, None, True), ([1], "1", False),
])
def test_compare(expected, got, ok):
    assert (compare(expected, got) is None) is ok


def test_compare_numpy_arrays_by_shape_and_value():
    np = pytest.importorskip("numpy")
    assert compare(np.ones((2, 3)), np.ones((2, 3)) + 1e-9) is None
    assert "shape" in compare(np.ones((2, 3)), np.ones((3, 2)))
    assert "index (1, 2)" in compare(np.zeros((2, 3)), np.eye(2, 3) * 0 + np.pad([[5]], ((1, 0),
                                                                                   (2, 0))))


def test_run_check_with_custom_verify():
    cases = [Case(args=(2,), verify=lambda got: None if got % 2 == 0 else "should be even")]
    assert run_check("double", lambda x: 2 * x, cases)
    with pytest.raises(AssertionError, match="should be even"):
        run_check("double", lambda x: 2 * x + 1, cases)


def test_fresh_inputs_differ_between_runs(learner_diagnosis, tmp_path):
    seen = tmp_path / "seen.txt"  # the answer runs in a forked copy: it writes what it saw

    def spy(parts, whole_step):
        with seen.open("a") as out:
            out.write(repr((sorted(parts.items()), whole_step)) + "\n")
        return learner_diagnosis(parts, whole_step)

    cu.grading.check_diagnose_step(spy)
    first = seen.read_text()
    seen.unlink()
    cu.grading.check_diagnose_step(spy)
    assert first and seen.read_text() and seen.read_text() != first


def test_every_check_cell_of_every_solution_calls_an_existing_check(repo):
    calls = 0
    for path in sorted((repo / "solutions").glob("*_solutions.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        assert check_cells(nb), f"{path.name} has no check cells"
        for cell in check_cells(nb):
            for name in re.findall(r"cu\.grading\.(check_\w+)\(", cell.source):
                assert callable(getattr(cu.grading, name, None)), f"{path.name}: {name}"
                calls += 1
    assert calls


def test_a_course_function_or_a_frame_walk_passed_as_the_answer_is_refused():
    import functools
    import inspect

    from course_utils.grading.checks import lesson_00
    from course_utils.parallel import schedules

    cases = [framework.Case((1,), expected=2)]
    for course_code in (schedules.one_f_one_b_orders, lesson_00.split_verdict,
                        functools.partial(schedules.one_f_one_b_orders)):
        with pytest.raises(AssertionError, match="the course's own code"):
            framework.run_check("t", course_code, cases)

    def read_the_expected(x):
        return inspect.currentframe().f_back.f_locals["case"].expected

    with pytest.raises(AssertionError, match="reads the checker's own frames"):
        framework.run_check("t", read_the_expected, cases)

    def make_answer():  # a function handed to the answer keeps the expected result in a cell
        expected = 2

        def given():
            return expected
        return given

    given = make_answer()

    def read_the_closure(x):
        return given.__closure__[0].cell_contents

    with pytest.raises(AssertionError, match="reads the checker's own frames"):
        framework.run_check("t", read_the_closure, cases)

    def wrapped(x):  # a check's own wrapper around a learner's function is fine
        return schedules.one_f_one_b_orders and 2 * x

    assert framework.run_check("t", wrapped, cases)


def test_a_frame_walk_in_a_helper_the_answer_calls_is_refused():
    """The walk hidden in a learner's helper, called by a global name or from a module of
    the learner's own: the helper is scanned as the answer is."""
    import types

    cases = [framework.Case((1,), expected=2)]
    peek = "import sys\ndef peek():\n    return sys._getframe(3).f_locals['case'].expected\n"
    cell: dict = {}
    exec(peek + "def answer(x):\n    return peek()\n", cell)  # noqa: S102 - a notebook cell
    helpers = types.ModuleType("my_helpers")
    exec(peek, helpers.__dict__)  # noqa: S102 - the learner's own module
    other_cell: dict = {"my_helpers": helpers}
    exec("def answer(x):\n    return my_helpers.peek()\n", other_cell)  # noqa: S102
    for answer in (cell["answer"], other_cell["answer"]):
        with pytest.raises(AssertionError, match="reads the checker's own frames"):
            framework.run_check("t", answer, cases)
    plain: dict = {}
    exec("def double(x):\n    return 2 * x\ndef answer(x):\n    return double(x)\n", plain)  # noqa: S102
    assert framework.run_check("t", plain["answer"], cases)



def _square_cases() -> list[Case]:
    return [Case(args=(2,), expected=[4]), Case(args=(3,), expected=[9])]


def test_an_answer_that_rewrites_its_cases_verdict_fails():
    """An answer that reaches the check's cases (here handed to it; a learner's through its
    callers' frames) and swaps what judges them, or edits the expected result in place, is
    named: run_check judges with what it took before the answer ran."""
    def swaps_the_verdict(cases):
        def answer(x):
            for case in cases:
                case.verify = lambda got: None
            return None
        return answer

    def edits_the_expected(cases):
        def answer(x):
            for case in cases:
                case.expected.clear()
            return []
        return answer

    for wrong in (swaps_the_verdict, edits_the_expected):
        cases = _square_cases()
        with pytest.raises(AssertionError, match="changed the check's own case"):
            run_check("square", wrong(cases), cases)
    assert run_check("square", lambda x: [x * x], _square_cases())


def _frames_by_built_names(x):
    """The check's expected result read from its callers' frames, every name built at run
    time: no scan of the answer's names or constants sees it (fresh reads nb31-01/04/05)."""
    import sys

    read = getattr
    frame = read(sys, "_get" + "frame")()
    while frame is not None:
        for value in read(frame, "f_" + "locals").values():
            if isinstance(value, tuple) and value and isinstance(value[0], Case):
                return value[0].expected
        frame = read(frame, "f_" + "back")
    return None


def _frames_through_a_traceback(x):
    try:
        raise ValueError(x)
    except ValueError as error:
        frame = getattr(error.__traceback__, "tb_" + "frame")
    return _walk_up(frame)


def _walk_up(frame):
    while frame is not None:
        plan = getattr(frame, "f_" + "locals").get("plan")
        if plan:
            return plan[0][2]  # (case, verify, expected, ...)
        frame = getattr(frame, "f_" + "back")
    return None


def _frames_from_a_thread(x):
    import sys
    import threading

    found = []
    me = threading.get_ident()

    def peek():
        found.append(_walk_up(getattr(sys, "_current_" + "frames")()[me]))
    thread = threading.Thread(target=peek)
    thread.start()
    thread.join()
    return found[0]


def _frames_through_inspect(x):
    import importlib

    stack = getattr(importlib.import_module("inspect"), "st" + "ack")()
    return _walk_up(stack[0].frame)


def _frames_through_logging(x):
    import logging

    return _walk_up(getattr(logging, "current" + "frame")())


def _frames_through_tf_inspect(x):
    import importlib

    tf_inspect = importlib.import_module("tensorflow.python.util.tf_" + "inspect")
    return _walk_up(getattr(tf_inspect, "current" + "frame")())


def _frames_by_code_named_as_a_library(x):
    import logging

    cell = {}
    exec(compile("import sys\ndef grab():\n    return getattr(sys, '_get' + 'frame')(1)\n",
                 logging.__file__, "exec"), cell)  # claims to be logging's own code
    return _walk_up(cell["grab"]())


def _frames_by_code_named_as_a_made_up_library_file(x):
    import os
    import sys

    cell = {}
    exec(compile("import sys\ndef grab():\n    return getattr(sys, '_get' + 'frame')(1)\n",
                 os.path.join(sys.prefix, "lib", "made_up.py"), "exec"), cell)
    return _walk_up(cell["grab"]())


@pytest.mark.parametrize("peek", [_frames_by_built_names, _frames_through_a_traceback,
                                  _frames_from_a_thread, _frames_through_inspect,
                                  _frames_through_logging, _frames_through_tf_inspect,
                                  _frames_by_code_named_as_a_library,
                                  _frames_by_code_named_as_a_made_up_library_file])
def test_reading_the_checks_frames_at_run_time_fails_however_it_is_named(peek):
    """Python's audit events (``sys._getframe``, ``sys._current_frames``, ``tb_frame``), raised
    from the learner's code or through ``inspect``, are named (``frame_reach``)."""
    with pytest.raises(AssertionError, match=r"case 1: your code read the interpreter's "
                                             r"frames while the check ran \((sys\._getframe|"
                                             r"sys\._current_frames|tb_frame) \((test_grading_"
                                             r"framework|__init__|tf_inspect|made_up)\.py, "
                                             r"line \d+\)"):
        run_check("square", peek, _square_cases())


def test_a_signal_handler_of_the_learners_fails_the_check(monkeypatch):
    """nb32-02: a signal handler is handed the interrupted frame with no audit event; one of
    the learner's code installed before or during the check is named."""
    import signal

    cell = {}  # the handler as a notebook cell defines it
    exec(compile("def handler(number, frame):\n    pass\n", "<cell>", "exec"), cell)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, cell["handler"])
        with pytest.raises(AssertionError, match="a signal handler for SIGUSR1 of yours is set"):
            run_check("square", lambda x: [x * x], _square_cases())
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert run_check("square", lambda x: [x * x], _square_cases())


def test_a_profile_function_of_the_learners_fails_the_check():
    """nb32-04 3.1/3.2: a profile function is handed every frame; one set by the answer (its
    sys.setprofile audit event) or before the check (threading's or this thread's) is named."""
    import sys
    import threading

    cell = {}
    exec(compile("def hook(frame, event, arg):\n    pass\n", "<cell>", "exec"), cell)

    def sets_a_profile(x):  # left set when the case ends
        getattr(sys, "set" + "profile")(cell["hook"])
        return [x * x]

    try:
        with pytest.raises(AssertionError, match="sys.setprofile of yours is set"):
            run_check("square", sets_a_profile, _square_cases())
    finally:
        sys.setprofile(None)
    threading.setprofile(cell["hook"])
    try:
        with pytest.raises(AssertionError, match="threading.setprofile of yours is set"):
            run_check("square", lambda x: [x * x], _square_cases())
    finally:
        threading.setprofile(None)


def test_a_library_function_replaced_fails_the_check(monkeypatch):
    """nb32-09, nb33-02: builtins.max, numpy.isclose or tf.clip_by_global_norm rebound (while
    the answer runs, or by an earlier cell to the learner's code) rigged the check's own
    computation; each is named."""
    import builtins

    import numpy as np

    real_max = builtins.max

    def rigs_max(x):
        builtins.max = lambda *args, **kwargs: [x * x]
        return [x * x]

    try:
        with pytest.raises(AssertionError, match="builtins.max is not the library's own"):
            run_check("square", rigs_max, _square_cases())
    finally:
        builtins.max = real_max
    cell = {}
    exec(compile("def isclose(*args, **kwargs):\n    return True\n", "<cell>", "exec"), cell)
    monkeypatch.setattr(np, "isclose", cell["isclose"])  # as an earlier cell would
    with pytest.raises(AssertionError, match="numpy.isclose is not the library's own"):
        run_check("square", lambda x: [x * x], _square_cases())
    monkeypatch.undo()
    assert run_check("square", lambda x: [x * x], _square_cases())


def test_randomness_replaced_before_a_check_fails_it(monkeypatch):
    """nb33-0304: os.urandom replaced by a constant made every check's cases predictable."""
    import os
    import random

    from course_utils.grading.framework import fresh_rng

    assert fresh_rng().random() != fresh_rng().random()
    monkeypatch.setattr(os, "urandom", lambda n: bytes(n))
    with pytest.raises(AssertionError, match="os.urandom or random.Random was replaced"):
        fresh_rng()
    monkeypatch.undo()
    monkeypatch.setattr(random.Random, "randint", lambda self, a, b: a)
    with pytest.raises(AssertionError, match="os.urandom or random.Random was replaced"):
        fresh_rng()


def test_libraries_that_read_frames_for_themselves_do_not_fail_an_answer():
    """``logging`` and ``collections.namedtuple`` read their callers' frames, TensorFlow's
    tracing too: not the learner's code."""
    import collections
    import logging

    def answer(x):
        logging.getLogger("course-test").info("computing")
        pair = collections.namedtuple("Pair", "a b")(x, x)
        return [pair.a * pair.b]

    assert run_check("square", answer, _square_cases())
    tf = cu.quiet.import_tensorflow()
    assert run_check("square", tf.function(lambda x: [x * x]), _square_cases())


def test_a_check_during_which_the_garbage_collector_was_searched_fails(monkeypatch):
    """``gc.get_objects`` reaches every case and verdict in the process: a registered check
    during which it ran fails, whatever the answer returned (names built at run time escape
    the scan of the answer's names, not the audit hook)."""
    from course_utils.grading.checks import registry

    monkeypatch.setattr(registry, "_CHECKS", dict(registry._CHECKS))  # registered for now

    @registry.register
    def check_square_search(fn):
        return run_check("square_search", fn, [Case(args=(3,), expected=9)])

    def searches_then_answers(x):
        getattr(__import__("g" + "c"), "".join(["get_o", "bjects"]))()
        return x * x

    with pytest.raises(AssertionError, match="searched the garbage collector"):
        check_square_search(searches_then_answers)
    assert check_square_search(lambda x: x * x) is True


def test_the_course_replaced_before_a_check_fails_it(monkeypatch):
    """A helper or threshold of the course replaced in an earlier cell is in place before the
    check's snapshot, and the grader imports only ``course_utils.grading`` afresh: a registered
    check compares the rest with its source and names what differs."""
    import contextlib

    from course_utils import equality
    from course_utils.grading.checks import registry
    from course_utils.training import precision

    monkeypatch.setattr(registry, "_CHECKS", dict(registry._CHECKS))

    @registry.register
    def check_square_replaced(fn):
        return run_check("square_replaced", fn, [Case(args=(3,), expected=9)])

    assert check_square_replaced(lambda x: x * x) is True
    with monkeypatch.context() as patch:
        patch.setattr(precision, "policy_scope", contextlib.nullcontext)  # not the course's
        with pytest.raises(AssertionError, match=r"course_utils\.training\.precision\."
                                                 r"policy_scope differs from its source"):
            check_square_replaced(lambda x: x * x)
    with monkeypatch.context() as patch:
        patch.setattr(equality, "FLOAT32_TOLERANCE", equality.FLOAT32_TOLERANCE * 10)
        with pytest.raises(AssertionError, match="equality.FLOAT32_TOLERANCE differs"):
            check_square_replaced(lambda x: x * x)
    namespace = {}  # a replacement compiled under the module's own file name: still foreign
    exec(compile("def policy_scope(policy):\n    return policy\n",  # noqa: S102
                 precision.__file__, "exec"), namespace)
    with monkeypatch.context() as patch:
        patch.setattr(precision, "policy_scope", namespace["policy_scope"])
        with pytest.raises(AssertionError, match="policy_scope differs from its source"):
            check_square_replaced(lambda x: x * x)
    assert check_square_replaced(lambda x: x * x) is True
