"""Lesson 06, exercise 1: 1F1B orders under a memory budget per stage, judged.

``budgeted_orders(num_stages, num_micro_batches, max_in_flight)`` returns each stage's passes
in order; ``max_in_flight[s]`` is stage ``s``'s budget (devices with different memory). The
orders are turned into time slots by the course's simulator (``schedule_from_orders``: a
deadlock fails), stage ``s`` must never keep more than ``max_in_flight[s]`` micro-batches'
activations (a prefix count of its own order: forwards minus backwards), and the schedule must
take no more slots than the fewest the budgets allow, counted by :func:`fewest_slots` (a count,
no orders). :func:`fewest_slots` runs each slot as a backward first (it frees memory and feeds
the stage before), else a forward its stage can afford; tests/test_checks_lesson_06.py checks it
against a breadth-first search over every stage's progress (every order that runs a stage's
micro-batches in turn, idling included): every budget up to ``K`` for ``K ≤ 3``, ``M ≤ 5``,
and four budgets of ``K = 4``. The lesson's 1F1B warm-up (``K − 1 − s``) with each
stage's own budget in it deadlocks when a budget rises downstream (stage ``s + 1`` cannot hold
more than stage ``s`` lets through); bounded by the smallest budget upstream, its strict
alternation takes more slots than the fewest with one budget from 2 to ``K − 1`` on every stage
(checked for ``K ≤ 5``, ``6 ≤ M ≤ 10``: the check's second case).

Guards: the course's schedule helpers and this module's functions are refused by code identity
and content (``refusals``); a near copy of ``one_f_one_b_orders`` run in the answer (bytecode
80 % the same, its two arguments) is refused (:func:`edited_copies`); so is the large case
when the helpers were asked for as many micro-batches in the kernel (``schedules.
_LARGEST_ASKED``). Known limit: :func:`fewest_slots`, copied and made to record its passes,
is a right answer (it is readable, as the whole package is).
"""

from __future__ import annotations

from typing import Any

from course_utils.grading.framework import Case

__all__ = ["budget_cases", "edited_copies", "fewest_slots", "verify_orders"]


def fewest_slots(budgets: list[int], m: int) -> int:
    """The fewest time slots in which ``len(budgets)`` stages run ``m`` micro-batches, stage
    ``s`` keeping at most ``budgets[s]`` in flight: a count, slot by slot."""
    k = len(budgets)
    done = [[0, 0] for _ in range(k)]  # per stage: forwards, backwards finished
    slots = 0
    while done[0][1] < m:
        before = [list(pair) for pair in done]  # what finished in earlier slots
        for s, (f, b) in enumerate(before):
            if b < f and (s == k - 1 or before[s + 1][1] > b):
                done[s][1] += 1
            elif f < m and f - b < budgets[s] and (s == 0 or before[s - 1][0] > f):
                done[s][0] += 1
        slots += 1
    return slots


def verify_orders(got: Any, k: int, m: int, budgets: list[int]) -> str | None:
    """Why ``got`` is not a right answer for ``(k, m, budgets)``, or None."""
    from course_utils.parallel.schedules import check_orders, peak_in_flight, schedule_from_orders

    if not isinstance(got, (list, tuple)) or len(got) != k:
        return f"return one order (a list) per stage: {k} lists, got {type(got).__name__}"
    try:
        orders = [[(str(phase), int(b)) for phase, b in order] for order in got]
        check_orders(orders, m)
        tasks = schedule_from_orders(orders)
    except (TypeError, ValueError) as error:
        return str(error)[:600]  # an order of the large case is some 6000 passes long
    peaks = peak_in_flight(tasks, k)
    for stage, peak in enumerate(peaks):
        if peak > budgets[stage]:
            return (f"stage {stage} keeps up to {peak} micro-batches' activations at once "
                    f"(forwarded, not yet backwarded); its budget max_in_flight[{stage}] is "
                    f"{budgets[stage]}. Kept per stage: {peaks}, budgets: {budgets}")
    slots = max(task.slot for task in tasks) + 1
    best = fewest_slots(budgets, m)
    if slots > best:
        return (f"the orders take {slots} time slots (bubble {1 - 2 * m / slots:.3f}); "
                f"within the same budgets {budgets} the fewest is {best} (bubble "
                f"{1 - 2 * m / best:.3f}): a stage waits that could work")
    return None


def edited_copies(codes: Any, own: Any) -> list[str]:
    """The functions among ``codes`` (not the answer's own, ``own``) whose bytecode is the
    course's ``one_f_one_b_orders``'s but for a few instructions (a ``+ 0``, a renamed local)
    and that take its two arguments (x06 L2)."""
    import difflib
    import dis

    from course_utils.parallel import schedules

    helper = schedules.one_f_one_b_orders.__code__
    wanted = [i.opname for i in dis.get_instructions(helper)]
    found = []
    for code in codes:
        if code is own or code is helper or code.co_argcount != helper.co_argcount:
            continue
        ops = [i.opname for i in dis.get_instructions(code)]
        if difflib.SequenceMatcher(None, wanted, ops, autojunk=False).ratio() >= 0.8:
            found.append(code.co_name)
    return found


def budget_cases(rng: Any, fn: Any) -> tuple[Any, list[Case]]:
    """Fresh ``(K, M, budgets)``: budgets that rise downstream (1, then more), one number
    below ``K − s`` for all, at or above it but the last stage's 1 (the lesson's 1F1B keeps to
    them), ``M`` below ``K``, one stage, random, one ``M`` drawn from 1000-3000, and budgets
    falling along five or six stages (``K − 1 − s``, each below every budget before it and
    below the ``K − s`` a stage would keep: an answer that leaves any stage's budget out, the
    last's aside, keeps too much there); each verified by :func:`verify_orders` after the
    guards. Also returns the profiler hook that
    records what the answer ran (``refusing``'s ``also``)."""
    from course_utils.parallel import schedules

    def draw(k: int) -> list[int]:
        budgets = [rng.randint(1, k) for _ in range(k)]
        budgets[rng.randrange(k - 1)] = rng.randint(1, 2)  # one below K - s, not the last
        return budgets

    k1, k2, k3, k4 = (rng.randint(3, 5) for _ in range(4))
    rising = [1] + [rng.randint(3, k1 + 1) for _ in range(k1 - 1)]  # 1, then more
    low = rng.randint(2, k2 - 1)
    triples = [(k1, rng.randint(6, 10), rising),
               (k2, rng.randint(6, 10), [low] * k2),
               (k3, rng.randint(3, 8), [k3 - s + rng.randint(0, 2) for s in range(k3 - 1)] + [1]),
               (4, rng.randint(1, 3), draw(4)), (1, rng.randint(1, 4), [1]),
               (k4, rng.randint(7, 12), draw(k4))]
    k_large = rng.randint(3, 5)
    triples.append((k_large, rng.randint(1000, 3000), draw(k_large)))
    k5 = rng.randint(5, 6)  # falling: every stage but the last below all before it (xf06 L1)
    triples.append((k5, rng.randint(6, 10), [k5 - 1 - s for s in range(k5 - 1)]
                    + [rng.randint(1, k5)]))
    entered: set[Any] = set()  # the code of every Python function the answer ran

    def verify(got: Any, k: int, m: int, budgets: list[int]) -> str | None:
        copies = edited_copies(entered, getattr(fn, "__code__", None))
        entered.clear()
        if copies:
            return (f"it ran {copies[0]}, an edited copy of the course's one_f_one_b_orders "
                    "(the same bytecode, nearly: no budget in it): build the orders yourself")
        asked = max(schedules._LARGEST_ASKED.values(), default=0)
        if m >= 1000 and asked >= m:
            return (f"the course's 1F1B helpers were asked for {asked} micro-batches in this "
                    "kernel: orders cut from theirs are the helpers' (build the orders "
                    "yourself; explored them? restart the kernel)")
        return verify_orders(got, k, m, budgets)

    def note(frame: Any, c_function: Any) -> None:
        if c_function is None:
            entered.add(frame.f_code)

    return note, [Case(args=(k, m, list(budgets)),
                       verify=lambda got, k=k, m=m, b=tuple(budgets): verify(got, k, m, list(b)),
                       label=f"(num_stages={k}, num_micro_batches={m}, "
                             f"max_in_flight={budgets})")
                  for k, m, budgets in triples]
