"""Lesson 09, exercise 2's hold-out and verdict: the colleague's ``keep`` (a random draw per
call, each recorded), what is wrong with the examples an epoch holds and with the reads, and
the check's verdict on a pipeline (``verifier``; ``lesson_09`` builds it).

``keep(features, label)`` draws afresh at every call whether to train on the record (about
``HOLD_OUT`` of them are held out for validation) and records ``(label, kept, on a TensorFlow
thread)``; the validation examples are those its one draw per record held out. A pipeline
that calls it again in a later epoch trains on examples held out before: the check asks for
one draw per record, from the learner's call through two epochs, every epoch holding exactly
the examples that draw kept, and no held-out example read (the disk is slow)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks import pipeline_probe
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["HOLD_OUT", "drawing_keep", "frozen_keep", "kept_labels", "labels_problem",
           "verifier"]

#: The share of the records ``keep`` holds out, on average (each call draws).
HOLD_OUT = 0.25


def drawing_keep(seed: int, draws: list[Any]) -> Callable[..., Any]:
    """The colleague's ``keep``: a scalar ``tf.bool`` drawn afresh per call (a NumPy generator
    in a ``tf.py_function``), each draw appended to ``draws`` as ``(label, kept, on a
    TensorFlow thread)``."""
    tf = _tf()
    generator = np.random.default_rng(seed)

    def draw(label: Any) -> np.bool_:
        kept = bool(generator.random() >= HOLD_OUT)
        draws.append((int(np.asarray(label).reshape(-1)[0]), kept,
                      pipeline_probe._on_a_tensorflow_thread()))  # noqa: SLF001 (a sibling)
        return np.bool_(kept)

    def keep(features: Any, label: Any) -> Any:
        return tf.reshape(tf.py_function(draw, [label], tf.bool), [])

    return keep


def kept_labels(draws: list[Any]) -> list[int]:
    """The labels ``keep``'s draws kept (one draw per record: ``labels_problem`` checked)."""
    return sorted(label for label, kept, _ in draws if kept)


def frozen_keep(kept: list[int], n: int) -> Callable[..., Any]:
    """``keep`` as its draws left it, a lookup (the check's slow baseline calls it each epoch)."""
    tf = _tf()
    table = tf.constant(np.isin(np.arange(n), kept))

    def keep(features: Any, label: Any) -> Any:
        return tf.gather(table, tf.cast(tf.reshape(label, [-1])[0], tf.int32))

    return keep


def labels_problem(draws: list[Any], n: int) -> Callable[[int, np.ndarray], str | None]:
    """What is wrong with an epoch's labels and ``keep``'s draws so far, or None: each of the
    ``n`` records drawn once, the epoch holding the kept examples, each once."""
    def problem(epoch: int, labels: np.ndarray) -> str | None:
        got = labels.astype(int).tolist()
        if not draws:
            return (f"keep never ran (epoch {epoch} holds {len(got)} examples of the {n} "
                    "records): train only on the examples keep's draw keeps, as the "
                    "colleague's pipeline does")
        counts = Counter(label for label, _, _ in draws)
        if max(counts.values()) > 1:
            kept = {label for label, drawn, _ in draws if drawn}
            both = kept & {label for label, drawn, _ in draws if not drawn}
            return (f"keep ran {len(draws)} times for {n} records by the end of epoch "
                    f"{epoch}: each call draws afresh, so {len(both)} example(s) were held "
                    "out by one draw and kept by another (validation examples trained on). "
                    "Ask keep once per record, and let every epoch reuse that draw")
        if len(counts) < n:
            return (f"keep drew for {len(counts)} of the {n} records by the end of epoch "
                    f"{epoch}: ask it of every record, once")
        kept = kept_labels(draws)
        if sorted(got) == kept:
            return None
        held = sorted(set(got) - set(kept))
        if held:
            return (f"epoch {epoch} holds {len(held)} example(s) keep held out (example "
                    f"{held[0]}): train only on those its one draw per record kept")
        return (f"epoch {epoch} does not hold each of the {len(kept)} examples keep kept "
                f"once ({len(got)} examples, {len(set(got))} different)")
    return problem


def reads_problem(calls: list[bool], read: list[int], kept: list[int]) -> str | None:
    """What is wrong with ``read``'s calls (``calls``) and the labels it read (``read``), from
    the learner's call through two epochs: each kept example read once, none held out."""
    held = sorted(set(read) - set(kept))
    if held:
        return (f"read ran on {len(held)} example(s) keep held out (example {held[0]}): the "
                "disk is slow, and they are not trained on; read only the examples kept")
    if len(calls) == len(kept):
        return None
    return (f"read ran {len(calls)} times for {len(kept)} examples kept (building the "
            "pipeline and two epochs): "
            + ("it never ran; read every example kept, once" if not calls else
               "read each example once, as the exercise asks: what keeps what it "
               "returned?" if len(calls) > len(kept) else "some examples were never read"))


def verifier(features: np.ndarray, batch_size: int, reads: tuple[list[bool], list[int]],
             augment: Any, augmented: list[Any], draws: list[Any],
             profiles: Callable[[Any, list[int]], tuple[Any, Any]],
             course_pipeline: Callable[[], str | None]) -> Callable[[Any], str | None]:
    """The verdict on the dataset the learner's function returned: its two epochs (the
    examples keep kept, each once, augmented afresh by ``augment``), the reads, whether it
    works ahead, then ``profiles(dataset, kept)`` (the least input share of the learner's
    step, the slow baseline's breakdown) against ``FAST_INPUT_SHARE``."""
    from course_utils.profiling import format_breakdown

    tf = _tf()

    def verify(dataset: Any) -> str | None:
        if course_pipeline() or not isinstance(dataset, tf.data.Dataset):
            return course_pipeline() or f"returned {type(dataset).__name__}; return a Dataset"
        if int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
            return "the dataset repeats forever; return one epoch (the check repeats it)"
        # reads counted from the learner's call on: a cache filled at build time reads too
        state = augment.generator.state.numpy().copy()
        problem = pipeline_probe.elements_problem(dataset, features, batch_size, augmented,
                                                  labels_problem(draws, len(features)))
        untouched = np.array_equal(state, augment.generator.state.numpy())
        if untouched and (problem is None or problem.startswith(
                ("both epochs", "part of the noise", "the noise on")) or " are not w" in
                problem):
            return ("augment did not run in the epochs, yet the features carry noise: apply "
                    "the augment you are given in the pipeline, every epoch, not once or yours")
        kept = kept_labels(draws)
        problem = problem or reads_problem(reads[0], reads[1], kept)
        if problem:
            return problem
        if not pipeline_probe.runs_ahead(dataset, augment, augmented, batch_size, features):
            return ("nothing in your pipeline works ahead of the step: after the step takes a "
                    "batch, nothing is prepared while the step runs (a shuffle buffer or a "
                    "bigger batch fills inside next()), so augmentation waits for it (the "
                    "check switches off tf.data's injected prefetch and the distributed "
                    "iterator's buffer: not yours to rely on). Which "
                    "tf.data step overlaps preparing with consuming? (lesson 01, section 4)")
        fast, slow = profiles(dataset, kept)
        shares = fast.shares()["input"], slow.shares()["input"]
        if shares[0] >= pipeline_probe.FAST_INPUT_SHARE:
            return (f"the step still waits for input {shares[0]:.0%} of its time (the slow "
                    f"pipeline {shares[1]:.0%}; under {pipeline_probe.FAST_INPUT_SHARE:.0%} "
                    f"passes); read ran {len(reads[0])} times in two epochs of {len(kept)} "
                    f"examples kept.\n{format_breakdown(fast)}")
        print(f"input share of the step: {shares[1]:.0%} slow → {shares[0]:.0%} yours; "
              f"step {slow.step_s * 1e3:.1f} → {fast.step_s * 1e3:.1f} ms")
        return None

    return verify
