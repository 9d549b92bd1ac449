"""An answer that replaces the course's code while its check runs fails, and the code is put
back (``course_utils.grading.code_watch``, applied to every registered check)."""

from __future__ import annotations

import types

import pytest

import course_utils.grading.checks.dataset_graphs as dataset_graphs
import course_utils.grading.framework as framework
from course_utils.grading.checks import registry
from course_utils.grading.code_watch import course_code_kept


def _rebind():
    framework.compare = lambda *args, **kwargs: None


def _recode():
    framework.fresh_rng.__code__ = (lambda: None).__code__


def _method():
    dataset_graphs.HiddenDataset.__init__ = lambda self, *args, **kwargs: None


def _delete():
    del dataset_graphs.unmade_dataset_message


@pytest.mark.parametrize(("tamper", "named"), [
    (_rebind, "course_utils.grading.framework.compare"),
    (_recode, "course_utils.grading.framework.fresh_rng (its code)"),
    (_method, "course_utils.grading.checks.dataset_graphs.HiddenDataset (its members)"),
    (_delete, "course_utils.grading.checks.dataset_graphs.unmade_dataset_message"),
])
def test_replaced_course_code_fails_the_check_and_is_put_back(tamper, named):
    before = (framework.compare, framework.fresh_rng.__code__,
              dataset_graphs.HiddenDataset.__init__, dataset_graphs.unmade_dataset_message)
    with pytest.raises(AssertionError, match="your code replaced the course's own") as error:
        with course_code_kept("some_exercise"):
            tamper()
    assert named in str(error.value)
    assert (framework.compare, framework.fresh_rng.__code__,
            dataset_graphs.HiddenDataset.__init__, dataset_graphs.unmade_dataset_message) == before


def test_names_added_and_state_changed_are_no_tampering():
    with course_code_kept("some_exercise"):
        framework.SOME_NEW_NAME = lambda: None  # a lazy import adds names
        framework._strict_override = framework._strict_override  # state, not code
    del framework.SOME_NEW_NAME


def test_every_registered_check_is_watched():
    calls = []

    def check_watched_example(fn):
        calls.append(fn())
        return True

    check = registry.register(check_watched_example)
    try:
        assert check(lambda: 1) is True
        with pytest.raises(AssertionError, match="framework.compare"):
            check(lambda: _rebind())
        assert framework.compare.__module__ == "course_utils.grading.framework"
    finally:
        registry._CHECKS.pop("check_watched_example", None)


def test_a_threshold_replaced_and_put_back_before_the_end_is_named():
    """nb32-0A1: a patch that undoes itself before the check ends (a judge switched off, then
    put back by the first call) left nothing to compare; every binding the learner's code
    replaces in a course module while the check runs is noted as it happens."""
    code = compile("import course_utils.grading.checks.dataset_graphs as judge\n"
                   "kept = judge.ASSERTED\n"
                   "judge.ASSERTED = 0\n"
                   "judge.ASSERTED = kept\n", "<cell>", "exec")
    with pytest.raises(AssertionError, match="replaced the course's own course_utils.grading."
                                             "checks.dataset_graphs.ASSERTED"):
        with course_code_kept("some_exercise"):
            exec(code, {})
    assert type(dataset_graphs) is types.ModuleType  # its class given back


def test_a_threshold_raised_is_put_back():
    before = dataset_graphs.ASSERTED
    with pytest.raises(AssertionError, match="dataset_graphs.ASSERTED"):
        with course_code_kept("some_exercise"):
            dataset_graphs.ASSERTED = 10**9
    assert dataset_graphs.ASSERTED == before
