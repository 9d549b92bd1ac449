"""Training loops with a known mistake in their loss reduction, for lesson 02's diagnosis.

:class:`LoopBox` builds ``make_train_step(model, optimizer)`` – a distributed training step of
the kind lesson 02 writes – whose replica loss or reported loss is wrong in one of the ways the
lesson measures (or right). The learner's ``diagnose_loop`` receives it as a black box and must
find out which it is by running it. Which mistake each loop makes, and the numbers that make
it, live in a small child process (plain Python, no TensorFlow): every loop runs the same code,
and its closure holds a loop number and a pipe, never the mistake nor its numbers. The child
draws the mistakes itself, and answers the check's question "was this the mistake?" once per
loop: an answer that asks first leaves the check nothing to ask, and fails.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["DIAGNOSES", "LoopBox", "loop_with", "projecting_data", "sealed"]

#: The answers ``diagnose_loop`` may give, one per reduction of lesson 02's section 5.
DIAGNOSES = (
    "right",
    "reduce_mean per replica",
    "global_batch_size passed positionally",
    "loss reported with ReduceOp.MEAN",
    "constant global_batch_size on a short batch",
    "Keras loss object on an uneven split",
)

#: The child: every kind is one replica loss, sum(per-example losses) · a / (b · n + c · N + e)
#: over the replica's n examples (N: the step's), reported with strategy.reduce(SUM) · f.
#: Per kind (G: the global batch size written in the loop, R: replicas): (a, b, c, e, f).
#: "Keras loss object": the replica's mean, scaled by 1/R (scale_loss_for_distribution in
#: keras/src/losses/loss.py); "positionally": G taken as sample_weight, divided by n · R.
#: An empty replica (n = 0) divides 0 by 0: 0, as compute_average_loss does, but NaN for
#: "reduce_mean per replica", as tf.reduce_mean does (lesson 02, section 5). The Keras loss
#: object's stays 0 (Keras returns an empty batch's losses unreduced, reduce_values in
#: keras/src/losses/loss.py: a real loop's strategy.reduce then fails to trace).
#: The report is the kind's (its replica losses, reduced, times f) or, drawn apart from the
#: kind, the batch's true mean loss, computed beside the gradient as loops log it: a wrong
#: update then reports "right", and only the update tells the kinds apart (a fresh read's
#: answer that read the reported loss of one short step alone named 6 of 6 loops). The deck
#: gives at least one loop whose update is wrong such a report; "loss reported with
#: ReduceOp.MEAN", whose mistake is its report, always reports its own.
_CHILD = r"""
import random, sys
KINDS = %r
def numbers(kind, g, r):
    return {KINDS[0]: (1, 0, 1, 0, 1), KINDS[1]: (1, 1, 0, 0, 1), KINDS[2]: (g, r, 0, 0, 1),
            KINDS[3]: (1, 0, 1, 0, 1 / r), KINDS[4]: (1, 0, 0, g, 1),
            KINDS[5]: (1, r, 0, 0, 1)}[kind]
UPDATE_WRONG = {KINDS[1], KINDS[2], KINDS[4], KINDS[5]}
loops, asked, deck = {}, set(), []
TOKEN = sys.stdin.readline().strip()
for line in sys.stdin:
    token, word, *rest = line.split("\t") + [""]
    rest = [part.strip() for part in rest]
    if token != TOKEN:
        out = "?"
    elif word == "new" and rest[0] in loops:
        out = "?"
    elif word == "new":  # loop, kind ("" = the next of the deck), G, R, deck, extras, report
        if not rest[1] and not deck:  # each allowed kind once, and extras drawn among some
            draw = random.SystemRandom()
            kinds = rest[4].split("|")
            extra_kinds, count = rest[5].split("|"), int(rest[6])
            kinds += [draw.choice(extra_kinds) for _ in range(count if rest[5] else 0)]
            deck = [(kind, kind in UPDATE_WRONG and draw.random() < 0.5) for kind in kinds]
            wrong = [i for i, (kind, _) in enumerate(deck) if kind in UPDATE_WRONG]
            if wrong and not any(deck[i][1] for i in wrong):  # one reports the true mean
                i = draw.choice(wrong)
                deck[i] = (deck[i][0], True)
            draw.shuffle(deck)
        kind, apart = (rest[1], rest[7] == "apart") if rest[1] else deck.pop()
        loops[rest[0]] = (kind, numbers(kind, float(rest[2]), float(rest[3])),
                          apart and kind != KINDS[3])
        out = "ok"
    elif word == "scale":  # loop, n, N -> a / (b n + c N + e) (0 / 0: 0, or NaN for means)
        kind, (a, b, c, e, f), _ = loops[rest[0]]
        den = b * float(rest[1]) + c * float(rest[2]) + e
        out = repr(a / den if den else float("nan") if kind == KINDS[1] else 0.0)
    elif word == "report":  # factors of the kind's reduced loss and of the true mean
        _, numbers_, apart = loops[rest[0]]
        out = "0.0\t1.0" if apart else repr(numbers_[4]) + "\t0.0"
    elif word == "verdict":  # loop, answer -> "yes" / the kind; once per loop
        if rest[0] in asked:
            out = "asked"
        else:
            asked.add(rest[0])
            kind = loops[rest[0]][0]
            out = "yes" if rest[1] == kind else "no\t" + kind
    else:
        out = "?"
    sys.stdout.write(out + "\n")
    sys.stdout.flush()
"""


#: The code objects of the loop's own functions (filled below, once ``_make_train_step_for``
#: is defined): the asker, ``_child_loss_scale`` or ``_child_report_factor``, and the steps,
#: ``replica_step`` and ``train_step``, matched by identity. A code object compiled by an answer
#: under loops.py's file name and a step's name is not one of them (a fresh read's forged
#: ``replica_step`` asked the loop's numbers from the main thread, 1 of 1, while the guard
#: compared file and function names).
_LOOP_CODES: dict[str, tuple[Any, ...]] = {}

#: Set while a check's answer runs (:func:`sealed`): no box and no loop is made then. A fresh
#: read's answer that found the box in the loop's closure (names built at run time), made a
#: loop of each kind with it and named the one whose update and report matched the check's
#: loop on the same batches passed 2 of 2 with no one-device gradient.
_SEALED = threading.Event()


@contextlib.contextmanager
def sealed(seal: threading.Event = _SEALED) -> Iterator[None]:
    """While it runs, ``LoopBox(...)`` and ``box.loop(...)`` raise: the check's loops are
    made, the answer makes none of its own to compare with."""
    seal.set()
    try:
        yield
    finally:
        seal.clear()


def _refuse_if_sealed(seal: threading.Event = _SEALED) -> None:
    if seal.is_set():
        raise RuntimeError("no loop is made while diagnose_loop runs: compare the loop's "
                           "update with one device's gradient (lesson 02, section 5), not "
                           "with loops of known kinds made from the check's LoopBox")


def _asked_by_a_step(codes: dict[str, tuple[Any, ...]] = _LOOP_CODES) -> bool:
    """Whether the loop's own step seems to ask: ``_child_loss_scale`` or
    ``_child_report_factor`` called from TensorFlow's code only (its executor) or by the
    replica step run eagerly, not from other Python code that reached them. A call from a
    thread started in C has no frame above it and passes: a bar, not a wall."""
    import os

    tensorflow = os.path.dirname(_tf().__file__) + os.sep
    frame = sys._getframe(2)  # the caller of _ask's caller
    if frame is None or not any(frame.f_code is code for code in codes["askers"]):
        return False  # the box asked by someone else
    frame = frame.f_back  # the caller of _child_loss_scale / _child_report_factor
    while frame is not None:
        if any(frame.f_code is code for code in codes["steps"]):
            return True  # run eagerly
        if not frame.f_code.co_filename.startswith(tensorflow):
            return False
        frame = frame.f_back
    return True  # TensorFlow's executor ran the step


class LoopBox:
    """A child process that holds the mistakes of a check's loops, and the loops it drives."""

    def __init__(self, strategy: Any, _refuse: Callable[[], None] = _refuse_if_sealed) -> None:
        _refuse()
        self.strategy = strategy
        self._lock = threading.Lock()  # the replicas ask at once, from TensorFlow's threads
        self._count = 0
        self._child = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CHILD % (DIAGNOSES,)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        token = secrets.token_hex(16)  # first line: the child answers no line without it
        self._child.stdin.write(token + "\n")
        self._child.stdin.flush()
        self._token = token
        #: verdict(number, answer): bound now, over the pipe's own methods (see _verdict_of)
        self.verdict = _verdict_of(self._lock, self._child.stdin, self._child.stdout, token)

    def _ask(self, *words: Any, _guard: Callable[[], bool] = _asked_by_a_step,
             _refuse: Callable[[], None] = _refuse_if_sealed) -> str:
        # the guard is bound (rebinding _asked_by_a_step fails), not the names it reads (_tf)
        if words[0] == "new":
            _refuse()
        if words[0] in ("scale", "report") and not _guard():
            raise RuntimeError("a loop's numbers are given to its own steps only: run the step")
        with self._lock:
            assert self._child.stdin is not None and self._child.stdout is not None
            line = "\t".join(str(word) for word in (self._token, *words))
            self._child.stdin.write(line + "\n")
            self._child.stdin.flush()
            return self._child.stdout.readline().rstrip("\n")

    def close(self) -> None:
        """End the child (it holds nothing worth keeping)."""
        if self._child.poll() is None:
            assert self._child.stdin is not None
            self._child.stdin.close()
            try:
                self._child.wait(timeout=10)
            except subprocess.TimeoutExpired:  # its stdin held open by someone else
                self._child.kill()
                self._child.wait()

    def loop(self, global_batch_size: int, kinds: tuple[str, ...] = DIAGNOSES,
             kind: str = "", extra_from: tuple[str, ...] = (), extra: int = 0,
             report: str = "kind") -> tuple[int, Callable[[Any, Any], Any]]:
        """A new loop written for ``global_batch_size``: its number, and its
        ``make_train_step``. Its mistake is ``kind``, or the next of the child's deck: every kind
        of ``kinds`` once and ``extra`` more drawn from ``extra_from`` (only the child knows which
        repeat: elimination cannot name the last ones), shuffled; ask ``len(kinds) + extra``.
        A loop of the deck reports its kind's loss or the true mean loss, as the child draws;
        one made with ``kind`` reports as ``report`` says: "kind" or "apart" (the true mean)."""
        if (kind and kind not in DIAGNOSES or not set(kinds) <= set(DIAGNOSES)
                or not set(extra_from) <= set(kinds) or report not in ("kind", "apart")):
            raise ValueError(f"kinds must be among {DIAGNOSES}, extra_from among kinds, "
                             "report 'kind' or 'apart'")
        self._count += 1
        number = self._count
        self._ask("new", number, kind, global_batch_size,
                  self.strategy.num_replicas_in_sync, "|".join(kinds), "|".join(extra_from),
                  extra, report)
        return number, _make_train_step_for(self, number)


def _verdict_of(lock: Any, stdin: Any, stdout: Any,
                token: str) -> Callable[[int, str], str | None]:
    """``verdict(number, answer)``: None when ``answer`` is loop ``number``'s mistake, else a
    sentence; asked once. Bound when the box is made, over the pipe's bound methods: a class
    attribute or module name rebound later does not reach it."""
    write, flush, readline = stdin.write, stdin.flush, stdout.readline

    def verdict(number: int, answer: str) -> str | None:
        with lock:
            write(f"{token}\tverdict\t{number}\t{answer}\n")
            flush()
            reply = readline().rstrip("\n").split("\t")
        if reply[0] == "yes":
            return None
        if reply[0] == "asked":
            return ("this loop's verdict had been asked before the check asked for it: "
                    "diagnose the loop by running it")
        return f"this loop is {reply[1]!r}, not {answer!r}"

    return verdict


def _make_train_step_for(box: LoopBox, number: int) -> Callable[[Any, Any], Any]:
    import keras
    import numpy as np

    tf = _tf()
    # bound when the loop is made, before the answer runs: tf.numpy_function rebound by the
    # answer (a spy that records what the loop's numpy_functions return) no longer reaches it
    numpy_function = tf.numpy_function
    strategy = box.strategy
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def _child_loss_scale(n: Any, total: Any) -> Any:
        return np.float32(float(box._ask("scale", number, int(n), int(total))))

    def _child_report_factor() -> Any:  # (times the kind's reduced loss, times the mean)
        return np.array(box._ask("report", number).split("\t"), dtype=np.float32)

    def make_train_step(model: Any, optimizer: Any) -> Callable[[Any], Any]:
        def replica_step(features: Any, labels: Any, total: Any) -> Any:
            n = tf.shape(labels)[0]
            scale = numpy_function(_child_loss_scale, [n, total], tf.float32, stateful=True)
            scale.set_shape([])
            with tf.GradientTape() as tape:
                losses = per_example(labels, model(features, training=True))
                loss = tf.reduce_sum(losses) * scale
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss, tf.reduce_sum(losses)  # the loss it differentiates, and the plain sum

        @tf.function
        def train_step(batch: Any) -> Any:
            # the step's examples, counted from the replicas' shapes (no collective needed)
            total = tf.add_n([tf.shape(local)[0] for local in
                              strategy.experimental_local_results(batch[1])])
            loss, plain = strategy.run(replica_step, args=(*batch, total))
            reported = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
            mean = tf.math.divide_no_nan(  # the true mean loss, logged beside the gradient
                strategy.reduce(tf.distribute.ReduceOp.SUM, plain, axis=None),
                tf.cast(total, tf.float32))
            factors = numpy_function(_child_report_factor, [], tf.float32, stateful=True)
            factors.set_shape([2])
            # the kind's report (NaN kept, as reduce_mean's) or the true mean's
            return tf.where(factors[0] != 0, reported * factors[0], 0.0) + mean * factors[1]

        return train_step

    return make_train_step


def _own_codes(code: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    """The code objects named ``names`` that ``code`` and the functions it defines hold."""
    found, todo = [], [code]
    while todo:
        current = todo.pop()
        for const in current.co_consts:
            if isinstance(const, type(code)):
                todo.append(const)
                if const.co_name in names:
                    found.append(const)
    return tuple(found)


_LOOP_CODES.update(
    askers=_own_codes(_make_train_step_for.__code__, ("_child_loss_scale",
                                                      "_child_report_factor")),
    steps=_own_codes(_make_train_step_for.__code__, ("replica_step", "train_step")))


def loop_with(strategy: Any, kind: str, global_batch_size: int) -> Callable[[Any, Any], Any]:
    """``make_train_step(model, optimizer) -> train_step(distributed_batch) -> reported loss``,
    written for ``global_batch_size`` and wrong in the way ``kind`` (one of DIAGNOSES) names."""
    if kind not in DIAGNOSES:
        raise ValueError(f"kind must be one of {DIAGNOSES}, got {kind!r}")
    return LoopBox(strategy).loop(global_batch_size, kind=kind)[1]


def projecting_data(rng: Any, classes: int, size: int = 64) -> tuple[Any, Any, Any]:
    """``features, labels, build_model`` on which the update of a Keras loss object on an
    uneven split projects on the one-device gradient to exactly 1 (float rounding aside),
    on any short batch of distinct examples that leaves no replica empty, yet differs from it
    weight for weight: only the weight-for-weight comparison tells it from "right".

    Why: a linear model without bias, its kernel zero (every prediction uniform), over
    orthonormal features x_i of equal norm: example i's gradient x_i (p - y_i)^T is orthogonal
    to every other example's and of the same norm whatever its label ((1 - 1/classes) · size).
    Such a loop weights example i by w_i = 1 / (replicas · n_i), n_i its replica's examples,
    and the w_i sum to 1: its projection is sum(w_i) = 1. (300 draws of the former data, an
    MLP on a teacher's examples, projected within 1e-3 of 1 once: a fresh read's answer that
    named "right" by the projection alone passed 4 of 4.)"""
    import keras
    import numpy as np

    draw = np.random.default_rng(rng.randint(0, 2**31))
    rows, _ = np.linalg.qr(draw.normal(size=(size, size)))  # orthonormal rows
    features = (rows * np.sqrt(size)).astype(np.float32)  # entries about 1 in size
    labels = draw.integers(0, classes, size).astype(np.int32)

    def build_model() -> Any:
        return keras.Sequential([keras.Input(shape=(size,)), keras.layers.Dense(
            classes, use_bias=False, kernel_initializer="zeros", name="logits")],
            name="check_diagnose")

    return features, labels, build_model
