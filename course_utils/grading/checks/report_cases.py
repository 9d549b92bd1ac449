"""Lesson 09's exercise 3, the report: the reference report and the cases its check runs.

``report_reference(results, model, global_batch, replicas, budget_bytes)`` is the report the
exercise asks for: the benchmark's noise (``cu.grid.noise``); the strategy, the second value
only when its examples/s over the first's, like for like at the first precision, exceeds
``1 + 2 × noise``; the precision by the same rule at the chosen strategy; and the fewest
micro-batches ``k`` whose ``cu.memory.step_budget`` total fits the budget, with that total.
``synthetic_results`` makes fresh benchmarks (``SCENARIOS``), ``report_case`` one case with a
fresh model and a budget that the count without the accumulation buffer gets wrong;
``edge_cases`` eight more: a budget no ``k`` fits, one only the largest ``k`` fits (on a
per-replica batch drawn from 1104 to 19992), one whose ``k`` is half the per-replica batch,
two whose per-replica batch and ``k`` are drawn (``drawn_case``: ``k`` from 65 to 1024, its
micro-batch from 10 to 128 examples, more examples fitting than that divisor makes), and one
that ``k`` = 1 fits, 2 does not (the accumulation buffer outweighs what two micro-batches
save), the largest ``k`` does, one whose ``k`` is the square root of the per-replica batch
(``square_case``), and one whose ``k`` is its whole part on a batch ``k × (k + 1)``
(``near_square_case``). Left: a search of the divisors capped at 19992 micro-batches or
more passes every draw (no answer here is larger), as do the divisors to 1024 then the whole
batch, and the small k with the batch over every divisor to 128 (no other k, no micro-batch
here is larger): a bound above every draw is a right answer on these batches.
"""

from __future__ import annotations

import dataclasses
from math import isclose as _isclose  # bound here: a later rebinding does not reach the verdict
from typing import Any

import numpy as np

from course_utils.grading.framework import Case

__all__ = ["SCENARIOS", "edge_cases", "fresh_cases", "report_case", "report_problem",
           "report_reference", "synthetic_results", "verify_later"]


def report_reference(results: Any, model: Any, global_batch: int,
                     replicas: dict[str, int], budget_bytes: int) -> dict[str, Any]:
    """The report the exercise asks for (the check's reference): see ``check_write_report``."""
    from course_utils.grid import noise as grid_noise
    from course_utils.memory import step_budget

    speed = {(r.options["strategy"], r.options["precision"]): r.examples_per_s
             for r in results}
    strategies = list(dict.fromkeys(r.options["strategy"] for r in results))
    precisions = list(dict.fromkeys(r.options["precision"] for r in results))
    band = grid_noise(results)
    ratio_s = speed[strategies[1], precisions[0]] / speed[strategies[0], precisions[0]]
    strategy = strategies[1] if ratio_s > 1 + 2 * band else strategies[0]
    ratio_p = speed[strategy, precisions[1]] / speed[strategy, precisions[0]]
    precision = precisions[1] if ratio_p > 1 + 2 * band else precisions[0]
    per_replica = global_batch // replicas[strategy]
    for k in range(1, per_replica + 1):
        if per_replica % k:
            continue
        need = step_budget(model, global_batch=global_batch, replicas=replicas[strategy],
                           accumulation_steps=k).total
        if need <= budget_bytes:
            return {"noise": band,
                    "strategy": {"choice": strategy, "ratio": ratio_s},
                    "precision": {"choice": precision, "ratio": ratio_p},
                    "accumulation_steps": {"choice": k, "step_bytes": need}}
    raise ValueError(f"not even one example per replica fits {budget_bytes} bytes")


def synthetic_results(rng: Any, speeds: dict[tuple[str, str], float],
                       spread: float) -> list[Any]:
    """Grid results with the given examples/s, each repetition within ``spread`` of it."""
    from course_utils.bench import Timing
    from course_utils.grid import GridResult

    batch = rng.choice([32, 64])
    results = []
    for (strategy, precision), per_s in speeds.items():
        median = batch / per_s
        # the same spread around every median, in a fresh order: each run's median is exactly
        # its speed and the noise exactly spread / 2 (the check draws it per benchmark)
        jitter = [-spread, -spread / 2, spread / 2, spread, 0.0]
        rng.shuffle(jitter)
        times = tuple(median * (1 + j) for j in jitter)
        results.append(GridResult({"strategy": strategy, "precision": precision},
                                  rng.uniform(0.5, 2.0), Timing(times), batch))
    return results


#: Fresh benchmarks, each as (what it tests, the range its noise is drawn from, and a function
#: of that noise and two draws: ``inside`` in [1.8, 1.95] and ``beyond`` in [2.05, 2.2], giving
#: the examples/s of default·f32, default·16-bit, second strategy·f32, second strategy·16-bit).
#: Speeds are multiplied by a fresh scale; the check draws the second strategy's and the 16-bit
#: policy's names afresh. Ratios sit on both sides of the rule's ``1 + 2 × noise``, between
#: ``1 + noise`` and ``1 + 3 × noise``, and a ratio inside the band of a noisy benchmark (at
#: least 1.072) exceeds one beyond the band of a quiet one (at most 1.044): a band of another
#: multiple of the noise, or a fixed threshold ignoring it, picks wrong somewhere.
SCENARIOS = [
    ("the second strategy far faster; 16-bit just inside the band", (0.04, 0.06),
     lambda n, inside, beyond: (1.0, 1.0 + inside * n, 1.8, 1.8 * (1 + inside * n))),
    ("the second strategy just inside the band; 16-bit just beyond it on one device only",
     (0.01, 0.02), lambda n, inside, beyond: (1.0, 1 + beyond * n, 1 + inside * n,
                                              1 + inside * n)),
    ("the second strategy just beyond the band; 16-bit just inside it there", (0.01, 0.06),
     lambda n, inside, beyond: (1.0, 1.5, 1 + beyond * n,
                                (1 + beyond * n) * (1 + inside * n))),
    ("the second strategy slower; 16-bit faster", (0.01, 0.06),
     lambda n, inside, beyond: (1.0, 1.7, 0.6, 1.0)),
    ("the second strategy faster only in 16 bits", (0.01, 0.06),
     lambda n, inside, beyond: (1.0, 1.2, 1.0, 2.0)),
]


# the types a report's values may have: exact types, so that no object of the answer's own
# class (an __eq__ that says yes to anything, a __class__ that pretends) decides a comparison
_NUMBERS = frozenset({int, float} | {t for t in set(np.sctypeDict.values())
                                     if issubclass(t, np.number)})


def report_problem(got: Any, want: dict[str, Any]) -> str | None:
    if type(got) is not dict:
        return f"returned {type(got).__name__}; return a plain dict like the one described"
    for key in want:
        if key not in got:
            return f"the report has no {key!r} entry (it has {sorted(map(str, got))})"
    if type(got["noise"]) not in _NUMBERS or not _isclose(
            float(got["noise"]), want["noise"], rel_tol=1e-6, abs_tol=1e-8):
        return f"noise: {got['noise']!r}, but this run's is {want['noise']:.6f}"
    for axis in ("strategy", "precision", "accumulation_steps"):
        entry = got[axis]
        if type(entry) is not dict:
            return f"{axis}: expected a plain dict with its choice and figure, got {entry!r}"
        for field, value in want[axis].items():
            mine = entry.get(field)
            if isinstance(value, str) and field != "ratio":
                same = type(mine) is str and str.__eq__(mine, value) is True
            elif type(mine) not in _NUMBERS:
                same = False  # a str, None or an object of the answer's own class
            elif isinstance(value, int) and field != "ratio":
                same = float(mine) == value  # 3.0 for 3 passes, as before
            else:
                same = _isclose(float(mine), value, rel_tol=1e-6, abs_tol=1e-8)
            if not same:
                source = ("cu.memory.step_budget and the budget" if axis == "accumulation_steps"
                          else "the measurements")
                return (f"{axis} {field}: {mine!r}, but {source} say {value!r} "
                        f"(the whole expected entry: {want[axis]})")
    return None


def report_case(rng: Any, results: Any, label: str, want_k: int | None = None,
                second_replicas: int | None = None) -> Case:
    """A case on ``results`` with a fresh model, fresh replica counts (the second strategy's
    ``second_replicas`` or 2 or 4) and a budget whose answer is a k > 1 that the count without
    the accumulation buffer would get wrong, or k = 1. The per-replica batches are multiples
    of 3, and k = 3 and k = 6 are among the answers: k tried in powers of two skips them, k
    tried from 1 up to 4 finds none for 6, and k tried without the divisibility asks
    ``step_budget`` for 5, which divides no per-replica batch here (it raises)."""
    import keras

    from course_utils.memory import step_budget

    width, classes = rng.choice([16, 24, 32]), rng.choice([5, 10])
    model = keras.Sequential([keras.Input((rng.choice([32, 48]),)),
                              keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(classes)])
    first, second = dict.fromkeys(r.options["strategy"] for r in results)
    replicas = {first: 1, second: second_replicas or rng.choice([2, 4])}  # not assumed
    # 96 or 192 examples per replica of the second strategy: the activations outweigh the
    # accumulation buffer, so that each k asked for below is the right answer for some budget;
    # every k from 1 to 4, and 6, divides the per-replica batch; 5 does not
    global_batch = rng.choice([96, 192]) * replicas[second]
    want_k = want_k or rng.choice([1, 2, 3, 4, 6])  # k > 2 needs the buffer counted
    strategy = report_reference(results, model, global_batch, replicas, 2**40)
    count = {k: step_budget(model, global_batch=global_batch,
                            replicas=replicas[strategy["strategy"]["choice"]],
                            accumulation_steps=k) for k in (1, 2, 3, 4, 6)}
    if want_k == 1:
        budget = count[1].total + rng.randint(0, 1000)
    else:  # fits k, not the k before it; the count without the buffer would pick that one
        before = count[max(k for k in count if k < want_k)]  # the divisor before it
        budget = max(count[want_k].total,
                     before.total - before.accumulation + rng.randint(0, 200))
        budget = min(budget, before.total - 1)
    args = (results, model, global_batch, replicas, budget)
    assert report_reference(*args)["accumulation_steps"]["choice"] == want_k, budget  # own
    return Case(args=args, verify=verify_later(args),
                label=f"({label}; global batch {global_batch}, a budget of {budget} bytes)")


def verify_later(args: tuple[Any, ...]) -> Any:
    """The case's verdict: the reference report counted from the case's inputs after the
    learner's call returned, never kept where the call could read it (finding L2)."""
    return lambda got: report_problem(got, report_reference(*args))


def nothing_fits_case(case: Case) -> Case:
    """``case``'s benchmark and model with a budget one byte below the step of one example per
    replica, which no ``k`` fits: the case asks for ``ValueError``, as the exercise does."""
    from course_utils.memory import step_budget

    results, model, global_batch, replicas, _ = case.args
    chosen = report_reference(results, model, global_batch, replicas, 2**40)["strategy"]
    per_replica = global_batch // replicas[chosen["choice"]]
    least = step_budget(model, global_batch=global_batch, replicas=replicas[chosen["choice"]],
                        accumulation_steps=per_replica).total
    where = case.label.rsplit(", a budget", 1)[0][1:]  # the case's benchmark and batch

    def verify(got: Any) -> str | None:
        # the exception raised, not an object returned: its own type (not its __class__, which
        # an answer can fake), and a traceback, which only raising gives it
        if (issubclass(type(got), ValueError)
                and BaseException.__traceback__.__get__(got) is not None):
            return None
        return (f"returned {got!r:.160}, but no k fits (one example per replica needs "
                f"{least} bytes): raise ValueError, as the exercise asks")

    return dataclasses.replace(case, args=(*case.args[:4], least - 1), verify=verify,
                               raises=ValueError,
                               label=f"({where}, a budget of {least - 1} bytes)")


def examples_case(case: Case, examples: int = 1, per_replica: int | None = None) -> Case:
    """``case`` again (its global batch scaled to ``per_replica`` examples per replica, if
    given) with a budget that fits a micro-batch of ``examples`` examples per replica and not
    one of one more (half an example's activations either side; an example's are at least 276
    bytes here): the answer is the fewest k whose micro-batch holds ``examples`` or fewer. With 1,
    only the largest k fits (the per-replica batch: 96 to 768 on a case's own, 1104 to 19992
    where ``edge_cases`` draws it): k tried up to a bound below it finds none. With 2 on a
    per-replica batch of 192 or more, k is half of it (96 or more): k tried among small
    divisors, then the whole per-replica batch, answers the whole batch.
    ``drawn_case`` gives the others."""
    from course_utils.memory import step_budget

    results, model, global_batch, replicas, _ = case.args
    n = replicas[report_reference(results, model, global_batch, replicas, 2**40)["strategy"][
        "choice"]]
    if per_replica is not None:
        global_batch = per_replica * n
    per_replica = global_batch // n
    one = step_budget(model, global_batch=global_batch, replicas=n,
                      accumulation_steps=per_replica)  # one example per micro-batch (k > 1)
    budget = one.total + (examples - 1) * one.activations + one.activations // 2
    args = (results, model, global_batch, replicas, budget)
    k = next(k for k in range(1, per_replica + 1) if per_replica % k == 0
            and per_replica // k <= examples)
    assert report_reference(*args)["accumulation_steps"]["choice"] == k, budget  # own
    where = case.label.rsplit(", a budget", 1)[0][1:].rsplit("; global batch", 1)[0]
    return Case(args=args, verify=verify_later(args),  # the label names no answer
                label=f"({where}; global batch {global_batch}, a budget of {budget} bytes)")


def drawn_case(rng: Any, case: Case) -> Case:
    """``case`` again with an answer drawn here: ``k`` from 65 to 1024 and its micro-batch
    ``d`` from 10 to 128 examples, a per-replica batch of ``k × d``, and a budget that fits a
    micro-batch of ``m`` examples, ``m`` above ``d`` and below the next micro-batch a divisor
    makes. A list of candidates (the divisors up to ``K``, the batch over each ``j`` up to
    ``J``) holds the answer only where ``k <= K`` or ``d <= J``: one reaching 64 and the
    batch over 9 fails every draw, and any list below 1024 and 128 some. ``m`` is at least
    the batch over ``k - 1``: the k computed from the budget (the batch over ``m``, rounded
    up) is then below ``k`` and divides nothing (a divisor there would make a micro-batch
    between ``d`` and ``m``), so ``step_budget`` refuses it."""
    while True:
        k, d = rng.randint(65, 1024), rng.randint(10, 128)
        per_replica = k * d
        above = next(j for j in range(d + 1, per_replica + 1) if per_replica % j == 0)
        least = max(d + 1, -(-per_replica // (k - 1)))
        if least < above:
            break
    return examples_case(case, examples=rng.randint(least, above - 1), per_replica=per_replica)


def square_case(rng: Any, case: Case) -> Case:
    """``case`` again with a per-replica batch of ``k × k``, ``k`` drawn from 65 to 128, and a
    budget that fits a micro-batch of ``k`` examples, not of ``k + 1``: the answer is ``k``,
    the batch's square root. A search of the divisors in pairs (``i`` and the batch over
    ``i``) whose ``i`` stops short of the root misses it, and only here: the drawn cases make
    it the answer about once in a thousand checks."""
    k = rng.randint(65, 128)
    return examples_case(case, examples=k, per_replica=k * k)


def near_square_case(rng: Any, case: Case) -> Case:
    """``case`` again with a per-replica batch of ``k × (k + 1)``, ``k`` drawn from 65 to 128,
    and a budget that fits a micro-batch of ``k + 1`` examples, not of ``k + 2``: the answer is
    ``k``, the whole part of the batch's square root. A search of the divisors in pairs whose
    ``i`` stops one short of that whole part misses it, though it tries the root of a square
    batch apart (``square_case``)."""
    k = rng.randint(65, 128)
    return examples_case(case, examples=k + 1, per_replica=k * (k + 1))


def buffer_case(case: Case) -> Case:
    """``case`` again, its global batch scaled to a per-replica batch ``P`` (a multiple of 12)
    too small for splitting to pay: two micro-batches save ``P / 2`` examples' activations,
    less than the accumulation buffer they add, and one example per micro-batch saves more. A
    budget between the steps of k = 1 and k = 2 is fitted by k = 1 and by the largest k, not
    by 2: k tried from the largest down until one does not fit, or a bisection that takes the
    step to shrink as k grows, misses k = 1."""
    from course_utils.memory import step_budget

    results, model, global_batch, replicas, _ = case.args
    n = replicas[report_reference(results, model, global_batch, replicas, 2**40)["strategy"][
        "choice"]]
    one = step_budget(model, global_batch=n, replicas=n, accumulation_steps=1)
    per_example, buffer = one.activations, step_budget(
        model, global_batch=2 * n, replicas=n, accumulation_steps=2).accumulation
    # P / 2 < buffer / activations < P - 1 (12.8 to 24.2 here: P is 24 or 36)
    per_replica = next(p for p in range(12, 1200, 12)
                       if (p - 1) * per_example > buffer and p * per_example < 2 * buffer)
    steps = {k: step_budget(model, global_batch=per_replica * n, replicas=n,
                            accumulation_steps=k).total for k in (1, 2, per_replica)}
    assert steps[per_replica] < steps[1] < steps[2], steps  # the check's own
    args = (results, model, per_replica * n, replicas, (steps[1] + steps[2]) // 2)
    assert report_reference(*args)["accumulation_steps"]["choice"] == 1, args  # own
    where = case.label.rsplit(", a budget", 1)[0][1:].rsplit("; global batch", 1)[0]
    return Case(args=args, verify=verify_later(args),
                label=f"({where}; global batch {args[2]}, a budget of {args[-1]} bytes)")


def _per_replica(case: Case) -> int:
    results, model, global_batch, replicas, _ = case.args
    chosen = report_reference(results, model, global_batch, replicas, 2**40)["strategy"]
    return global_batch // replicas[chosen["choice"]]


def edge_cases(cases: list[Case], rng: Any) -> list[Case]:
    """Eight cases more: on the last two fresh benchmarks, a budget no k fits, and one only the
    largest k (one example per micro-batch) fits, on a per-replica batch drawn from 1104 to
    19992 (multiples of 12): a search of the divisors capped below that finds none, where the
    drawn cases (k up to 1024) catch a cap only when they draw a k above it; on the case with
    the largest per-replica batch (192 or more: some fresh benchmark keeps the first strategy,
    on one replica), one whose answer is half that batch (two examples per micro-batch); on the
    third and fifth from last, a per-replica batch and an answer drawn (``drawn_case``); on the
    fourth from last, a per-replica batch too small for two micro-batches to pay for their
    buffer, one whose answer is 1 though 2 does not fit and the largest k does
    (``buffer_case``); on the last, again, a per-replica batch ``k × k`` whose answer is ``k``
    (``square_case``); on the second from last, one ``k × (k + 1)`` whose answer is ``k``
    (``near_square_case``)."""
    per_replica = 12 * rng.randint(92, 1666)  # 1104 to 19992
    return [nothing_fits_case(cases[-1]), examples_case(cases[-2], per_replica=per_replica),
            examples_case(max(cases, key=_per_replica), examples=2),
            drawn_case(rng, cases[-3]), buffer_case(cases[-4]), drawn_case(rng, cases[-5]),
            square_case(rng, cases[-1]), near_square_case(rng, cases[-2])]


def fresh_cases(rng: Any) -> list[Case]:
    """A case on each of ``SCENARIOS`` (in a fresh order), with its own noise, scale and names
    of the second strategy and precision; what each tests is forgotten when this returns."""
    cases = []
    for number, (_, noise_range, make_speeds) in enumerate(
            rng.sample(SCENARIOS, len(SCENARIOS))):
        scale = rng.uniform(500, 5000)
        noise = round(rng.uniform(*noise_range), 4)  # drawn per benchmark: the band moves
        speeds = make_speeds(noise, rng.uniform(1.8, 1.95), rng.uniform(2.05, 2.2))
        # the second value of each axis differs between cases, the first is drawn: names are
        # read, not assumed (nb31-09 L3-b: "default" and "float32" assumed passed)
        second = (("mirrored", "multi_worker")[number % 2],
                  ("mixed_bfloat16", "mixed_float16")[number // 2 % 2])
        first = (rng.choice(["default", "one_device"]), rng.choice(["float32", "fp32"]))
        keys = [first, (first[0], second[1]), (second[0], first[1]), second]
        results = synthetic_results(rng, {key: scale * speed for key, speed
                                          in zip(keys, speeds, strict=True)},
                                    spread=2 * noise)
        # the first values' result first (it defines them), the others in a fresh order:
        # results are read by their options, not by their place in run_grid's order
        results = [results[0], *rng.sample(results[1:], len(results) - 1)]
        cases.append(report_case(rng, results, "a fresh benchmark",
                                 # k = 4, 3, 6: every divisor, not powers of 2 nor k <= 4
                                 want_k={0: 4, 1: 3, 2: 6}.get(number),
                                 # where the second strategy wins: 4 replicas, not 2
                                 second_replicas=4 if speeds[2] > 1.5 else None))
    return cases
