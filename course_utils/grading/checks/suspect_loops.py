"""Lesson 07, exercise 3: diagnose an accumulation loop from what it does to the weights.

The check, registered by name (``lesson_07`` imports it), hands the learner's
``diagnose_accumulation(loop)`` fresh loops with one name, one code, no defaults and a random
token in their closure. A loop's kind (right, applies every micro-batch, sums without dividing)
is drawn, from the OS's entropy, only when the loop is first called: before it runs, nothing in
the process says what it does, so an answer must run it. An answer whose code names a loop's
closure or the check's plans is refused before any call. ``suspect_loop(kind)`` makes a loop of a
known kind (the lesson's tests and the catalogue use it).

What it cannot stop: that refusal reads the names in the answer's code, so an answer that runs
a loop once on anything (its kind is drawn then) and reads the plan from this process's memory
by names built at run time is not refused. In one process the plan is always reachable; a loop
run in a process of its own would close it, at the cost of a fresh TensorFlow per check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["DIAGNOSES", "accumulate", "check_diagnose_accumulation", "suspect_loop"]

#: The answers ``diagnose_accumulation`` may give.
DIAGNOSES = ("correct", "applies every micro-batch", "sums without dividing")


def accumulate(model: Any, optimizer: Any, loss_fn: Any, features: Any, labels: Any,
           batch_size: int, steps: int, divisor: float) -> None:
    """Sum the gradients of ``steps`` batches of ``batch_size`` (each loss / ``divisor``) and
    apply them once: the reference (``steps=1``), the right loop and the two wrong ones."""
    tf = _tf()
    data = tf.data.Dataset.from_tensor_slices((features, labels))
    sums = None
    for index, (x, y) in enumerate(data.batch(batch_size), start=1):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) / divisor
        grads = tape.gradient(loss, model.trainable_variables)
        sums = grads if sums is None else [s + g for s, g in zip(sums, grads, strict=True)]
        if index % steps == 0:
            optimizer.apply_gradients(zip(sums, model.trainable_variables, strict=True))
            sums = None


# --- Exercise 3 · diagnose an accumulation loop ------------------------------------------------


#: What each suspect loop does, by an opaque token: (applies every micro-batch, divides by k).
#: A loop made by the check has no entry until it is first called (drawn then, at random).
_SUSPECT_PLANS: dict[str, tuple[bool, bool]] = {}
_PLANS = {"correct": (False, True), "applies every micro-batch": (True, False),
          "sums without dividing": (False, False)}
#: The check's undrawn loops, by token, each pointing at its check's deck, shared by the check's
#: loops ({"drawn": kinds drawn so far, "left": loops not yet drawn}); no kind is chosen before
#: a call.
_UNDRAWN: dict[str, dict[str, Any]] = {}


def _draw(token: str) -> tuple[bool, bool]:
    """The plan of a check's loop at its first call: drawn from the OS's entropy, among the
    kinds its check must still show when there are as many loops left as kinds to show."""
    import secrets

    if token not in _SUSPECT_PLANS:
        deck = _UNDRAWN.pop(token)
        needed = [kind for kind in DIAGNOSES if kind not in deck["drawn"]]
        kind = secrets.choice(needed if len(needed) >= deck["left"] else list(DIAGNOSES))
        deck["drawn"].append(kind)
        deck["left"] -= 1
        _SUSPECT_PLANS[token] = _PLANS[kind]
    return _SUSPECT_PLANS[token]


def _run_suspect(token: str, model: Any, optimizer: Any, loss_fn: Any, features: Any,
                 labels: Any, micro_batch_size: int, accumulation_steps: int) -> None:
    every, divide = _draw(token)
    accumulate(model, optimizer, loss_fn, features, labels, micro_batch_size,
           1 if every else accumulation_steps, accumulation_steps if divide else 1)


def _suspect(token: str) -> Callable[..., None]:
    def loop(model, optimizer, loss_fn, features, labels, micro_batch_size,  # type: ignore
             accumulation_steps):
        _run_suspect(token, model, optimizer, loss_fn, features, labels, micro_batch_size,
                     accumulation_steps)

    return loop


def suspect_loop(kind: str) -> Callable[..., None]:
    """A loop with exercise 1's signature that is right or makes one of the two mistakes.

    Every loop is a fresh function with the same name, code and no defaults; its closure holds
    only a random token, so what it does shows only in what it does to the weights."""
    if kind not in DIAGNOSES:
        raise ValueError(f"kind must be one of {DIAGNOSES}, got {kind!r}")
    import secrets

    token = secrets.token_hex(8)
    _SUSPECT_PLANS[token] = _PLANS[kind]
    return _suspect(token)


def _undrawn_loops(count: int) -> list[tuple[str, Callable[..., None]]]:
    """``count`` loops like :func:`suspect_loop`'s whose kinds are drawn at their first call
    (every kind among them): before a loop runs, nothing in the process says what it does."""
    import secrets

    deck: dict[str, Any] = {"drawn": [], "left": count}
    loops = []
    for _ in range(count):
        token = secrets.token_hex(8)
        _UNDRAWN[token] = deck
        loops.append((token, _suspect(token)))
    return loops


def _kind_of(token: str) -> str | None:
    plan = _SUSPECT_PLANS.get(token)
    return None if plan is None else {p: k for k, p in _PLANS.items()}[plan]


#: Names by which an answer would read a suspect loop's plan instead of running the loop.
_PLAN_READERS = frozenset({"__closure__", "cell_contents", "__globals__", "_SUSPECT_PLANS",
                           "_PLANS", "_UNDRAWN", "_run_suspect", "_draw", "getclosurevars",
                           "__module__", "get_referrers", "get_objects"})


def _plan_readers(fn: Any) -> list[str]:
    """The plan-reading names (attributes, globals or strings) in the learner's code: ``fn``'s
    own code, the functions defined in it, and the functions its closure holds."""
    import types

    found: set[str] = set()
    functions, seen = [fn], set()
    while functions:
        current = functions.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        codes = [getattr(current, "__code__", None)]
        while codes:
            code = codes.pop()
            if not isinstance(code, types.CodeType):
                continue
            found |= _PLAN_READERS & (set(code.co_names) | {
                c for c in code.co_consts if isinstance(c, str)})
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        for cell in getattr(current, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(value, types.FunctionType):
                functions.append(value)
    return sorted(found)


@register
def check_diagnose_accumulation(fn: Any) -> bool:
    """Check ``diagnose_accumulation(loop)``: names what each loop written here does."""
    readers = _plan_readers(fn) if callable(fn) else []
    if readers:
        raise AssertionError(
            f"diagnose_accumulation: your function uses {', '.join(readers)}, which reads how "
            "the check built the loop instead of what the loop does: what does it do to "
            "weights you know? (lesson 07, section 3)")
    loops = _undrawn_loops(len(DIAGNOSES) + 1)

    def case(number: int, token: str, loop: Callable[..., None]) -> Case:
        def verify(answer: Any) -> str | None:
            kind = _kind_of(token)
            _UNDRAWN.pop(token, None)
            if kind is None:
                return (f"your function returned {answer!r} without running the loop: it "
                        "does nothing until it is called, so nothing else can tell what it "
                        "does (lesson 07, section 3)")
            if answer != kind:
                return (f"your diagnosis {answer!r} differs from what this loop does to the "
                        "weights")
            return None

        return Case(args=(loop,), verify=verify, label=f"(suspect loop {number})")

    cases = [case(i, token, loop) for i, (token, loop) in enumerate(loops, start=1)]
    return run_check(
        "diagnose_accumulation", fn, cases,
        hint="lesson 07, section 3 (the popular wrong versions, measured): what would each "
             "kind of loop do to weights you know, on data you chose, and which one does "
             f"this loop match? Return one of {', '.join(map(repr, DIAGNOSES))}.")
