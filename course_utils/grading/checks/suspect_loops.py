"""Lesson 07, exercise 3: diagnose an accumulation loop from what it does to the weights.

The check, registered by name (``lesson_07`` imports it), hands the learner's
``diagnose_accumulation(loop)`` fresh loops with one name, one code, no defaults and a random
token in their closure: black boxes. Each computes its micro-batches' gradients here, with the
model, optimizer and loss it is given, and hands them to a copy of this process forked before
any kind exists (``forked_call.ForkedCall``; plain Python and NumPy there, no TensorFlow),
which draws the loop's kind (right, applies every micro-batch, sums without dividing) from the
OS's entropy at its first call, keeps it, and answers each micro-batch with the update to
apply, or none yet. The kind never exists in the learner's process: only the updates the loop
applies show it, so an answer must run the loop. The channel to the copy, which the loop's
closure holds, answers only the loop's own code (:func:`_run_black_box`) and the check's
:func:`_reveal`, by the caller's code object (identity, however the channel was reached): an
answer that reads the closure, by any spelling, and sends the copy gradients of its own (no
model, no training) is refused at its first request; one that asks for the kind through
``_reveal`` is named after it returned (the copy counts the reveals). Still open: an answer
that rewrites the channel's ``callers`` or writes to its pipe itself. An answer whose code
names a loop's closure or the check's plans is refused before any call.
``suspect_loop(kind)`` makes a loop of a known kind in this process (the lesson's tests and the
catalogue use it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from course_utils.grading.checks.forked_call import ForkedCall
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


#: What each loop ``suspect_loop`` made does, by an opaque token: (applies every micro-batch,
#: divides by k). The check's own loops have no entry here: their kinds live in a forked copy.
_SUSPECT_PLANS: dict[str, tuple[bool, bool]] = {}
_PLANS = {"correct": (False, True), "applies every micro-batch": (True, False),
          "sums without dividing": (False, False)}


def _draw(token: str) -> tuple[bool, bool]:
    """The plan of a loop :func:`suspect_loop` made."""
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


#: In the forked copy only (empty here): each black-box loop's state, by token.
_IN_THE_COPY: dict[str, dict[str, Any]] = {}


def _black_box(deck: dict[str, Any], request: str, token: str, *args: Any) -> Any:
    """The forked copy's side: ``"begin"`` a run of loop ``token`` (its kind drawn at the
    first, from ``deck`` as :func:`_draw` does); ``"step"`` one micro-batch's gradients (NumPy
    arrays) and the accumulation steps: the update to apply now, or None; ``"reveal"`` the
    loop's kind (None: it never ran) and how often it was revealed before."""
    import secrets

    import numpy as np

    state = _IN_THE_COPY.setdefault(token, {"kind": None, "sums": None, "count": 0,
                                            "revealed": 0})
    if request == "reveal":
        state["revealed"] += 1
        return state["kind"], state["revealed"] - 1
    if state["kind"] is None:
        needed = [kind for kind in DIAGNOSES if kind not in deck["drawn"]]
        kind = secrets.choice(needed if len(needed) >= deck["left"] else list(DIAGNOSES))
        deck["drawn"].append(kind)
        deck["left"] -= 1
        state["kind"] = kind
    if request == "begin":
        state["sums"], state["count"] = None, 0
        return None
    gradients, steps = args
    every, divide = _PLANS[state["kind"]]
    scaled = [np.asarray(g) / (steps if divide else 1) for g in gradients]
    sums = state["sums"]
    state["sums"] = scaled if sums is None else [a + b for a, b in zip(sums, scaled,
                                                                          strict=True)]
    state["count"] += 1
    if state["count"] % (1 if every else steps) == 0:
        update, state["sums"] = state["sums"], None
        return update
    return None


def _black_box_loop(ask: Any, token: str) -> Callable[..., None]:
    """A loop with exercise 1's signature whose kind lives in the forked copy ``ask`` calls."""

    def loop(model, optimizer, loss_fn, features, labels, micro_batch_size,  # type: ignore
             accumulation_steps):
        _run_black_box(ask, token, model, optimizer, loss_fn, features, labels,
                       micro_batch_size, accumulation_steps)

    return loop


def _run_black_box(ask: Any, token: str, model: Any, optimizer: Any, loss_fn: Any,
                   features: Any, labels: Any, micro_batch_size: int,
                   accumulation_steps: int) -> None:
    """Each micro-batch's gradients computed here, the updates decided by the copy."""
    tf = _tf()
    ask("begin", token)  # the channel answers this function's code only (and _reveal's)
    data = tf.data.Dataset.from_tensor_slices((features, labels))
    for x, y in data.batch(micro_batch_size):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        update = ask("step", token, [tf.convert_to_tensor(g).numpy() for g in gradients],
                     int(accumulation_steps))
        if update is not None:
            optimizer.apply_gradients(zip([tf.constant(u) for u in update],
                                          model.trainable_variables, strict=True))


def _reveal(ask: Any, token: str) -> tuple[str | None, int]:
    """The copy's record of loop ``token``: its kind (None: it never ran) and how often it was
    revealed before."""
    return ask("reveal", token)


_REFUSAL = ("your function asked the check's process directly (a request only the loop and "
            "the check make, reached through the loop's closure) instead of running the loop: "
            "run it on a model and data you chose, and compare what it does to the weights")


#: Names by which an answer would read a suspect loop's plan instead of running the loop.
_PLAN_READERS = frozenset({"__closure__", "cell_contents", "__globals__", "_SUSPECT_PLANS",
                           "_PLANS", "_IN_THE_COPY", "_run_suspect", "_draw", "getclosurevars",
                           "__module__", "get_referrers", "get_objects"})


def _reads_module(code: Any) -> bool:
    """Whether ``code`` reads a ``__module__`` (a class body only stores its own)."""
    import dis

    return any(i.argval == "__module__" and i.opname != "STORE_NAME"
               for i in dis.get_instructions(code))


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
            names = set(code.co_names) | {c for c in code.co_consts if isinstance(c, str)}
            if not code.co_flags & inspect.CO_NEWLOCALS and not _reads_module(code):
                names.discard("__module__")  # a class body stores its own __module__
            found |= _PLAN_READERS & names
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
    import functools
    import secrets

    count = len(DIAGNOSES) + 1
    deck: dict[str, Any] = {"drawn": [], "left": count}  # drawn from in the copy only
    with ForkedCall(functools.partial(_black_box, deck), timeout_s=60, refusal=_REFUSAL,
                    callers=[_run_black_box.__code__, _reveal.__code__]) as ask:
        loops = [(token, _black_box_loop(ask, token))
                 for token in (secrets.token_hex(8) for _ in range(count))]
        return _diagnose_black_boxes(fn, ask, loops)


def _diagnose_black_boxes(fn: Any, ask: Any, loops: list[tuple[str, Any]]) -> bool:
    """``check_diagnose_accumulation``'s cases: one per black-box loop, its kind asked of the
    copy once the answer returned."""

    def case(number: int, token: str, loop: Callable[..., None]) -> Case:
        def verify(answer: Any) -> str | None:
            kind, asked_before = _reveal(ask, token)
            if asked_before:
                return ("your function asked the check's process what this loop is (a "
                        "request only the check makes, reached through the loop's closure) "
                        "instead of finding it: run the loop and compare what it does")
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
