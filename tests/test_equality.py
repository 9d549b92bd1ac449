"""Equal to a one-device reference: the largest difference and the verdict."""

from __future__ import annotations

import numpy as np
import pytest

from course_utils.equality import FLOAT32_TOLERANCE, compare_with_reference, largest_difference


def test_largest_difference_over_lists_of_arrays():
    a = [np.zeros((2, 2)), np.array([1.0, 2.0])]
    b = [np.full((2, 2), 0.5), np.array([1.0, 2.25])]
    assert largest_difference(a, b) == 0.5
    assert largest_difference([], []) == 0.0
    assert largest_difference([np.zeros(0)], [np.zeros(0)]) == 0.0


def test_unlike_lists_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="2 arrays against 1"):
        largest_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="shapes"):
        largest_difference([np.zeros(3)], [np.zeros((3, 1))])


def test_comparison_says_equal_within_the_tolerance_and_why_not():
    reference = [np.ones(4, np.float32)]
    same = compare_with_reference([reference[0] + 1e-7], reference)
    assert same and same.tolerance == FLOAT32_TOLERANCE and "equal to" in str(same)
    off = compare_with_reference([reference[0] + 1e-3], reference)
    assert not off and "differs from" in str(off) and "1.0e-03" in str(off)
    assert compare_with_reference([reference[0] + 1e-3], reference, tolerance=1e-2)
    with pytest.raises(ValueError):
        compare_with_reference(reference, reference, tolerance=-1)


def test_a_non_finite_element_is_never_equal_whichever_way_it_is_compared():
    reference = [np.zeros(2), np.ones(3)]
    for bad in (np.nan, np.inf, -np.inf):
        last = [reference[0], np.array([1.0, 1.0, bad])]  # not first: max() used to drop a NaN
        assert largest_difference(last, reference) == np.inf
        assert largest_difference(reference, last) == np.inf
        assert not largest_difference(last, reference) <= 1e-5
        assert largest_difference(last, reference) > 1e-5
        verdict = compare_with_reference(last, reference)
        assert not verdict and "not finite" in str(verdict)
    both_inf = [np.array([np.inf])]
    assert not compare_with_reference(both_inf, both_inf)  # inf equals inf, yet no result
