"""Lesson 09's exercise 3, the report: the reference report and the cases its check runs.

The benchmark times one optimizer update of the whole global batch for every strategy and
every micro-batch count ``k`` (options ``strategy`` and ``accumulation_steps``), in
interleaved turns (``cu.grid.run_grid``). ``report_reference(results, model, global_batch,
replicas, budget_bytes)`` is the report the exercise asks for: of the measured pairs whose
``cu.memory.step_budget`` total fits the budget on their strategy's replica count, the one
with the most examples per second; its total and its examples/s; the next fastest pair that
fits (the runner-up); and in how many turns the choice took less time per example than the
runner-up (the i-th time of every result was taken in the same turn). None fits:
``ValueError``.

The lesson chose the strategy first (like for like, at one micro-batch: lesson 09 cell 32's
rule), then the fewest ``k`` that fits. The memory budget is per replica, so one replica
needs more micro-batches than two, and a micro-batch count has a measured cost: each fresh
case (``SCENARIOS``) is built so that a shortcut picks another pair:

* ``"memory flips the strategy"``: the first strategy is faster at every equal ``k``, but
  only fits at a larger ``k`` than the second, where it is slower (the lesson's order, and
  the fastest pair without the budget, pick wrong);
* ``"a larger k pays"``: one strategy throughout, whose second fitting ``k`` is faster than
  its first (the first ``k`` that fits picks wrong);
* ``"the buffer decides"``: the fastest pair fits only if the accumulation buffer is left
  out of the count;
* ``"one fits"``: a budget only the smallest step fits (no runner-up);
* ``"nothing fits"``: one byte below the smallest step (``ValueError``).

Each case draws its model, option names, ``k`` values, global batch and turn times (the
second strategy's replica count is 4 in three of them, 2 in two); its label names none of
the answers. In every case with a runner-up the choice wins between two and four of the
five turns: a count taken from the medians (all or none) is wrong.
"""

from __future__ import annotations

from math import isclose as _isclose  # bound here: a later rebinding does not reach the verdict
from typing import Any

import numpy as np

from course_utils.grading.framework import Case

__all__ = ["SCENARIOS", "fresh_cases", "own_case", "own_run_problem", "report_problem",
           "report_reference", "scenario_case", "step_totals", "synthetic_results",
           "verify_later"]

#: The options the benchmark varies: the exercise reads them by these names.
AXES = ("strategy", "accumulation_steps")


def step_totals(results: Any, model: Any, global_batch: int,
                replicas: dict[str, int]) -> dict[tuple[str, int], int]:
    """``cu.memory.step_budget``'s total for each measured (strategy, k): one replica's step."""
    from course_utils.memory import step_budget

    return {(r.options["strategy"], r.options["accumulation_steps"]): step_budget(
        model, global_batch=global_batch, replicas=replicas[r.options["strategy"]],
        accumulation_steps=r.options["accumulation_steps"]).total for r in results}


def report_reference(results: Any, model: Any, global_batch: int,
                     replicas: dict[str, int], budget_bytes: int) -> dict[str, Any]:
    """The report the exercise asks for (the check's reference): see the module."""
    totals = step_totals(results, model, global_batch, replicas)
    fitting = sorted((r for r in results if totals[tuple(r.options[a] for a in AXES)]
                      <= budget_bytes), key=lambda r: r.examples_per_s, reverse=True)
    if not fitting:
        raise ValueError(f"no measured step fits {budget_bytes} bytes per replica")
    best = fitting[0]
    report = {"strategy": best.options["strategy"],
              "accumulation_steps": best.options["accumulation_steps"],
              "step_bytes": totals[best.options["strategy"],
                                   best.options["accumulation_steps"]],
              "examples_per_s": best.examples_per_s, "runner_up": None, "rounds_won": None}
    if len(fitting) > 1:
        other = fitting[1]
        report["runner_up"] = {axis: other.options[axis] for axis in AXES}
        report["rounds_won"] = sum(
            mine / best.examples_per_call < theirs / other.examples_per_call
            for mine, theirs in zip(best.timing.times, other.timing.times, strict=True))
    return report


# the types a report's numbers may have: exact types, so that no object of the answer's own
# class (an __eq__ that says yes to anything, a __class__ that pretends) decides a comparison
_NUMBERS = frozenset({int, float} | {t for t in set(np.sctypeDict.values())
                                     if issubclass(t, np.number)})


def _same(mine: Any, value: Any) -> bool:
    if value is None:
        return mine is None
    if isinstance(value, str):
        return type(mine) is str and str.__eq__(mine, value) is True
    if isinstance(value, dict):
        return type(mine) is dict and set(mine) == set(value) and all(
            _same(mine[key], item) for key, item in value.items())
    if type(mine) not in _NUMBERS:
        return False  # a str, None, a bool or an object of the answer's own class
    if isinstance(value, int):
        return float(mine) == value  # 3.0 for 3 passes
    return _isclose(float(mine), value, rel_tol=1e-6, abs_tol=1e-8)


def report_problem(got: Any, want: dict[str, Any], results: Any, totals: dict[Any, int],
                   budget_bytes: int) -> str | None:
    """What differs between ``got`` and the reference ``want``, the choice explained from the
    measurements (over the budget, or slower than the pair chosen) when it is the choice."""
    if type(got) is not dict:
        return f"returned {type(got).__name__}; return a plain dict like the one described"
    missing = [key for key in want if key not in got]
    if missing:
        return f"the report has no {missing[0]!r} entry (it has {sorted(map(str, got))})"
    pair = (got["strategy"], got["accumulation_steps"])
    chosen = (want["strategy"], want["accumulation_steps"])
    if not (_same(pair[0], chosen[0]) and _same(pair[1], chosen[1])):
        speed = {tuple(r.options[a] for a in AXES): r.examples_per_s for r in results}
        mine = next((key for key in totals if _same(pair[0], key[0])
                     and _same(pair[1], key[1])), None)
        if mine is None:
            why = "which the benchmark did not measure"
        elif totals[mine] > budget_bytes:
            why = (f"whose step needs {totals[mine]} bytes per replica, over the budget of "
                   f"{budget_bytes}")
        else:
            why = f"which fits but runs {speed[mine]:.1f} examples/s"
        return (f"chose {pair!r:.80}, {why}; {chosen} fits ({totals[chosen]} bytes) and "
                f"runs {speed[chosen]:.1f} examples/s")
    for key, value in want.items():
        if not _same(got[key], value):
            return (f"{key}: {got[key]!r:.120}, but the measurements and the budget say "
                    f"{value!r}")
    return None


def verify_later(args: tuple[Any, ...]) -> Any:
    """The case's verdict: the reference report counted from the case's inputs after the
    learner's call returned, never kept where the call could read it (finding L2)."""
    def verify(got: Any) -> str | None:
        results, model, global_batch, replicas, budget = args
        return report_problem(got, report_reference(*args), results,
                              step_totals(results, model, global_batch, replicas), budget)
    return verify


def _raised(args: tuple[Any, ...]) -> Any:
    """The verdict of a case no step fits: ``ValueError`` raised (a traceback: not made)."""
    smallest = min(step_totals(*args[:4]).values())

    def verify(got: Any) -> str | None:
        if (issubclass(type(got), ValueError)
                and BaseException.__traceback__.__get__(got) is not None):
            return None
        return (f"returned {got!r:.160}, but no measured step fits (the smallest needs "
                f"{smallest} bytes): raise ValueError, as the exercise asks")
    return verify


def _model(rng: Any) -> Any:
    import keras

    width = rng.choice([16, 24, 32])
    return keras.Sequential([keras.Input((rng.choice([32, 48]),)),
                             keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(rng.choice([5, 10]))])


def synthetic_results(rng: Any, speeds: dict[tuple[str, int], float], global_batch: int,
                      spread: float) -> list[Any]:
    """Grid results with the given examples/s (each median exactly that), one update of
    ``global_batch`` per call, five turns each: the median's, two faster and two slower,
    each drawn up to 1.5 ``spread`` from it, so that a pair's mean and best turn say
    other than its median (xf09: ranked by the mean or the best turn passed every case)."""
    from course_utils.bench import Timing
    from course_utils.grid import GridResult

    results = []
    for (strategy, k), per_s in speeds.items():
        jitter = [0.0] + [sign * rng.uniform(0.1, 1.5) * spread for sign in (-1, -1, 1, 1)]
        rng.shuffle(jitter)
        median = global_batch / per_s
        results.append(GridResult({"strategy": strategy, "accumulation_steps": k},
                                  rng.uniform(0.5, 2.0),
                                  Timing(tuple(median * (1 + j) for j in jitter)),
                                  global_batch, global_batch))
    return results


def _flips(rng: Any, names: tuple[str, str], ks: list[int], totals: dict, scale: float):
    """The first strategy faster at every equal k; the budget: the second's step at k = 1.
    The runner-up: the first strategy at the first k that fits it (xf09: a runner-up taken
    from the choice's strategy passed every case but on the draw)."""
    speeds = {(names[0], k): 1.2 * 0.8**i for i, k in enumerate(ks)}
    speeds |= {(names[1], k): 0.8**i for i, k in enumerate(ks)}
    budget = totals[names[1], ks[0]]
    first = next((k for k in ks if totals[names[0], k] <= budget), None)
    if first is not None:  # below the choice, above the second strategy at the same k
        speeds[names[0], first] = max(speeds[names[0], first], 0.9)
    return speeds, budget


def _larger_k(rng: Any, names: tuple[str, str], ks: list[int], totals: dict, scale: float):
    """One strategy faster at every equal k; its second fitting k faster than its first."""
    budget = totals[names[0], ks[1]]
    fit = [k for k in ks if totals[names[0], k] <= budget]
    speeds = {(names[0], k): 0.8 for k in ks} | {(names[0], ks[0]): 1.3}
    speeds |= {(names[0], fit[0]): 1.0, (names[0], fit[1]): 1.15}
    return speeds | {(names[1], k): 0.7 * speeds[names[0], k] for k in ks}, budget


def _buffer(rng: Any, names: tuple[str, str], ks: list[int], totals: dict, scale: float):
    """The fastest step over the budget by less than its accumulation buffer."""
    speeds = {pair: rng.uniform(0.6, 1.0) for pair in totals}
    speeds[names[1], ks[1]] = 1.3
    return speeds, totals[names[1], ks[1]] - 1


def _one(rng: Any, names: tuple[str, str], ks: list[int], totals: dict, scale: float):
    return {pair: rng.uniform(0.6, 1.3) for pair in totals}, min(totals.values())


def _none(rng: Any, names: tuple[str, str], ks: list[int], totals: dict, scale: float):
    return {pair: rng.uniform(0.6, 1.3) for pair in totals}, min(totals.values()) - 1


#: (what it tests, how it makes the relative speeds and the budget)
SCENARIOS = [("memory flips the strategy", _flips), ("a larger k pays", _larger_k),
             ("the buffer decides", _buffer), ("one fits", _one), ("nothing fits", _none)]


def _shortcuts_told(results: Any, best: Any, other: Any, fitting: set) -> int | None:
    """How many readings of the turns other than the exercise's these results tell apart
    (None: the choice wins fewer than two or more than four of the five turns): the pair
    ranked by its best or its mean turn, the turns counted against a median, sorted, or
    against every pair that fits (xf09: each passed every case, or on the draw)."""
    by = {tuple(r.options[a] for a in AXES): r.timing.times for r in results}
    mine, theirs = by[best], by[other]
    won = sum(a < b for a, b in zip(mine, theirs, strict=True))
    if not 2 <= won <= 4:
        return None
    rest = [by[pair] for pair in fitting if pair != best]
    return sum((
        max(fitting, key=lambda pair: 1 / min(by[pair])) != best,
        max(fitting, key=lambda pair: 1 / float(np.mean(by[pair]))) != best,
        sum(a < float(np.median(theirs)) for a in mine) != won,
        sum(float(np.median(mine)) < b for b in theirs) != won,
        sum(a < b for a, b in zip(sorted(mine), sorted(theirs), strict=True)) != won,
        len(rest) < 2 or sum(all(mine[i] < t[i] for t in rest)
                             for i in range(len(mine))) != won))


def _close_runner_up(rng: Any, speeds: dict, args: tuple[Any, ...], spread: float,
                     global_batch: int) -> list[Any]:
    """Results whose runner-up is within a few per cent of the choice, an unfitting pair
    between them and the next fitting pair close behind (xf09: a runner-up with the budget
    left out, or every fitting pair's turns counted, passed), and whose choice wins two,
    three or four of the five turns against it (turns redrawn until the readings of
    ``_shortcuts_told`` differ from the exercise's, or the most of them do)."""
    results = synthetic_results(rng, speeds, global_batch, spread)
    try:
        want = report_reference(results, *args)
    except ValueError:
        return results
    if want["runner_up"] is None:
        return results
    best = (want["strategy"], want["accumulation_steps"])
    other = tuple(want["runner_up"][a] for a in AXES)
    totals = step_totals(results, *args[:3])
    fitting = {pair for pair, total in totals.items() if total <= args[3]}
    speeds = dict(speeds)
    if speeds[best] / speeds[other] > 1.05:  # raised towards the choice: still below it
        speeds[other] = speeds[best] / rng.uniform(1.02, 1.05)
    unfit = [pair for pair in speeds if pair not in fitting and speeds[pair] < speeds[best]]
    if unfit:  # the next fastest measured pair does not fit: the runner-up is the next
        speeds[max(unfit, key=speeds.get)] = (speeds[best] * speeds[other]) ** 0.5
    third = [pair for pair in fitting if pair not in (best, other)]
    if third:
        pair = max(third, key=speeds.get)
        speeds[pair] = max(speeds[pair], speeds[other] / rng.uniform(1.01, 1.03))
    kept = (-1, results)
    for _ in range(400):
        results = synthetic_results(rng, speeds, global_batch, spread)
        told = _shortcuts_told(results, best, other, fitting)
        if told is not None and told > kept[0]:
            kept = (told, results)
            if told == 6:
                break
    return kept[1]


def scenario_case(rng: Any, scenario: Any, number: int = 0) -> Case:
    """A case of ``scenario`` (a function of ``SCENARIOS``) with its own model, names, ``k``
    values, replica count (4 for an even ``number``, else 2), global batch and speeds."""
    from course_utils.memory import step_budget

    names = (rng.choice(["default", "one_device"]),
             ("mirrored", "multi_worker", "mirrored_2")[number % 3])
    ks = rng.choice([[1, 2, 4, 8], [1, 2, 3, 6], [1, 3, 6, 12], [1, 2, 4, 6]])
    replicas = {names[0]: 1, names[1]: (4, 2)[number % 2]}  # both counts in every check
    global_batch = replicas[names[1]] * 24 * rng.choice([8, 16])
    model = _model(rng)
    args = (model, global_batch, replicas)
    totals = {(s, k): step_budget(model, global_batch=global_batch, replicas=n,
                                  accumulation_steps=k).total
              for s, n in replicas.items() for k in ks}
    scale = rng.uniform(500, 5000)
    relative, budget = scenario(rng, names, ks, totals, scale)
    speeds = {pair: scale * value for pair, value in relative.items()}
    results = _close_runner_up(rng, speeds, (*args, budget), rng.uniform(0.08, 0.12),
                               global_batch)
    results = rng.sample(results, len(results))  # read by options, not by place
    case_args = (results, *args, budget)
    nothing = scenario is _none
    return Case(args=case_args, raises=ValueError if nothing else (),
                verify=_raised(case_args) if nothing else verify_later(case_args),
                label=f"(a fresh benchmark; {replicas}, global batch {global_batch}, a "
                      f"budget of {budget} bytes)")


def fresh_cases(rng: Any) -> list[Case]:
    """A case of each of ``SCENARIOS``, in a fresh order; what each tests is forgotten when
    this returns."""
    return [scenario_case(rng, scenario, number) for number, (_, scenario)
            in enumerate(rng.sample(SCENARIOS, len(SCENARIOS)))]


def own_run_problem(results: Any) -> str | None:
    """Why ``results`` is not the exercise's benchmark (``cu.grid.run_grid``'s list over
    ``strategy`` and ``accumulation_steps``, each call one update of the whole global
    batch), or None."""
    from course_utils.grid import GridResult

    if not (isinstance(results, list) and results
            and all(type(r) is GridResult for r in results)):
        return f"must be the list cu.grid.run_grid returned above, got {type(results).__name__}"
    if any(set(r.options) != set(AXES) for r in results):
        return (f"must vary exactly the options {AXES}, got {dict(results[0].options)}: run the "
                "benchmark cell as it is")
    batches = {r.examples_per_call for r in results}
    if len(batches) != 1:
        return f"every call must be one update of the same global batch, got {sorted(batches)}"
    wrong = [r.label() for r in results if not _same(r.output, r.examples_per_call)]
    if wrong:  # the step's own count of what one call trained on
        return (f"the steps of {wrong[:3]} did not train on the whole global batch of "
                f"{results[0].examples_per_call} in one call (their outputs: "
                f"{[r.output for r in results][:3]}): like for like needs every pair to")
    if len({len(r.timing.times) for r in results}) != 1:
        return "every pair must be timed in the same turns"
    return None


def own_case(rng: Any, results: Any) -> Case:
    """The learner's own benchmark with a fresh model, replica count and a budget that about
    half the measured steps fit."""
    global_batch = results[0].examples_per_call
    names = list(dict.fromkeys(r.options["strategy"] for r in results))
    ks = {r.options["accumulation_steps"] for r in results}
    choices = [n for n in (2, 4) if all(global_batch % (n * k) == 0 for k in ks)] or [1]
    replicas = {name: 1 if i == 0 else rng.choice(choices) for i, name in enumerate(names)}
    model = _model(rng)
    totals = sorted(set(step_totals(results, model, global_batch, replicas).values()))
    budget = totals[len(totals) // 2]
    args = (results, model, global_batch, replicas, budget)
    return Case(args=args, verify=verify_later(args),
                label=f"(your own benchmark; {replicas}, global batch {global_batch}, a "
                      f"budget of {budget} bytes)")

