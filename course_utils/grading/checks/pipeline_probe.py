"""Lesson 09, exercise 2's pieces: the check's "disk" (a counting ``read``), its ``augment``
(counting the examples it augmented), a probe of whether a pipeline works ahead by itself,
and what is wrong with two epochs of a pipeline (``lesson_09`` uses them), and the profiles'
shares. Exact copies of another example's noise (moved or sign-flipped), 12 or more values
shared with another example's, a copy scaled or shifted in place (one factor, one amount),
and noise made wholly of two others' in place with one weight each (other examples' of either
epoch, or its own of the other epoch) are refused; other noise made from augment's noise is
not tested (a product, a scaled or shifted copy moved among the features, fewer values copied,
a mix of two with their values moved among the features, a copy or a mix of two whose scale,
sign or shift changes from value to value, a mix of three, a part of another example's noise
or of the last epoch's under fresh noise: a correlation under 0.9, a fit on two others' and a
constant under 90 %, or 0.25 between the epochs). Each of these runs augment on every example,
every epoch: more work than the fix."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["BASELINE_ATTEMPTS", "FAST_INPUT_SHARE", "NOISE_SPREAD", "SLOW_INPUT_SHARE",
           "STORED_OFFSET", "augment", "counting_read", "elements_problem", "least_input",
           "one_epoch", "runs_ahead", "slow_baseline", "watched_build"]

#: Input share of the step time the fixed pipeline must stay under.
FAST_INPUT_SHARE = 0.4
#: Input share the slow pipeline shows (the check's own sanity test of its baseline).
SLOW_INPUT_SHARE = 0.6
#: Profiles of the slow pipeline the check takes before it gives up on its own baseline: on a
#: busy machine one profile can catch the step slowed by other programs, not by its input.
BASELINE_ATTEMPTS = 3
#: The deviation of ``augment``'s noise.
NOISE_SPREAD = 0.1
#: What the check's "disk" stores: the features minus this offset, which ``read`` adds back,
#: so that a pipeline that never reads gets features far from the real ones.
STORED_OFFSET = 10.0


def counting_read(seconds: list[float], calls: list[int],
                  labels: list[int] | None = None) -> Callable[..., Any]:
    """A "disk" read: waits ``seconds[0]`` per example (read when it runs: the check can make
    its own baseline's disk slower), counts its calls in ``calls`` (each ``True`` when it ran
    on a thread TensorFlow made: ``watched_build``), the labels it read in ``labels`` (when
    given), and decodes the stored record (adds ``STORED_OFFSET`` back)."""
    import time

    tf = _tf()

    def read(features: Any, label: Any) -> tuple[Any, Any]:
        def wait(read_labels: Any) -> np.int32:
            calls.append(_on_a_tensorflow_thread())
            if labels is not None:
                labels.extend(np.asarray(read_labels).reshape(-1).astype(int).tolist())
            time.sleep(seconds[0])
            return np.int32(0)

        done = tf.py_function(wait, [label], tf.int32)
        with tf.control_dependencies([done]):
            return tf.identity(features) + STORED_OFFSET, tf.identity(label)

    return read


def augment(seed: int, calls: list[Any] | None = None) -> Callable[..., Any]:
    """Random noise on the features, new every epoch (a ``tf.random.Generator``); appends, per
    call, ``(start, end, labels, first features, noise, on a TensorFlow thread)`` to ``calls``
    (when given): one
    example's, or a batch's (a vectorised map after ``batch``), so that the check can tell the
    noise each example got from augment (x09 L10, L12: its output, not noise of the answer's
    own), and when each call ran (``runs_ahead``). ``augment.delay[0]``: seconds each call
    waits (the probe's, so that work in the background is in flight while the step runs)."""
    import time

    tf = _tf()
    generator = tf.random.Generator.from_seed(seed)
    delay = [0.0]

    def count(label: Any, first: Any, noise: Any) -> np.int32:
        start = time.monotonic()
        time.sleep(delay[0])
        if calls is not None:
            noise = np.asarray(noise)
            calls.append((start, time.monotonic(), np.asarray(label).reshape(-1),
                          np.asarray(first).reshape(-1), noise.reshape(-1, noise.shape[-1]),
                          _on_a_tensorflow_thread()))
        return np.int32(0)

    def augment(features: Any, label: Any) -> tuple[Any, Any]:
        noise = generator.normal(tf.shape(features), stddev=NOISE_SPREAD)
        done = tf.py_function(count, [label, features[..., 0], noise], tf.int32)
        with tf.control_dependencies([done]):
            noisy = features + noise
        return noisy, label

    augment.generator = generator  # type: ignore[attr-defined]  # the check reads its state
    augment.delay = delay  # type: ignore[attr-defined]
    return augment


def _augmented(calls: list[Any], features: np.ndarray) -> dict[int, list[tuple[Any, ...]]]:
    """The check's own examples in ``augment``'s records, by label (the example's index):
    ``(start, end, noise)`` per example augment was given as ``read`` returns it."""
    found: dict[int, list[tuple[Any, ...]]] = {}
    for start, end, labels, firsts, noise, _ in calls:
        for label, first, row in zip(labels.tolist(), firsts.tolist(), noise, strict=False):
            if (0 <= label < len(features) and float(label) == int(label)
                    and abs(first - features[int(label), 0]) < 1e-4):
                found.setdefault(int(label), []).append((start, end, row))
    return found


def _on_a_tensorflow_thread() -> bool:
    """Whether this Python runs on a thread Python did not start (TensorFlow's, running a
    ``tf.py_function``): CPython gives it a fresh thread state each call, which the guard counts
    (``call_guard``: ``RAW_THREAD``) and ``watched_build`` lets through for the check's own."""
    import threading

    return type(threading.current_thread()).__name__ == "_DummyThread"


def _whose(found: dict[int, list[Any]], label: int, noise: np.ndarray) -> Any:
    """The record of the call of ``augment`` whose noise ``noise`` is, or None."""
    return next((each for each in found.get(label, []) if each[2].shape == noise.shape
                 and np.abs(each[2] - noise).max() < 1e-4), None)


def one_epoch(dataset: Any) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Batch sizes, labels and features of one pass over ``dataset``."""
    sizes, labels, features = [], [], []
    for x, y in dataset:
        sizes.append(int(np.shape(y)[0]))
        labels.append(np.asarray(y).reshape(-1))
        features.append(np.asarray(x))
    return sizes, np.concatenate(labels), np.concatenate(features)


def runs_ahead(dataset: Any, augment: Any, calls: list[Any], batch_size: int,
               features: np.ndarray, wait_s: float = 2.0, step_s: float = 0.2) -> bool:
    """Whether ``dataset`` augments while the step runs, by itself: a prefetch (or a parallel
    map) works in the background. The probe takes a batch, then "steps" (waits) before the
    next one; the pipeline works ahead when an example it yields was augmented, by a call in
    ``calls`` (``augment``'s records), while the probe waited: the call ended after a wait
    began and began before it ended (as lesson 00's exercise 4 counts an overlap). A pipeline
    that augments only inside ``next()`` (a shuffle buffer or a bigger batch filled there,
    x09 L8, L9) has none. Each call of ``augment`` waits 10 ms here, so that background work
    is in flight when a wait begins; only calls whose output the pipeline yields count (a
    thrown-away call in the background does not). tf.data's own additions are switched off
    (``inject_prefetch`` would add a prefetch to any pipeline; the distributed iterator
    buffers too): what runs ahead here is what the learner wrote. The first wait lasts until
    such a call is seen or ``wait_s`` (a busy machine's thread may start late), the others
    ``step_s``."""
    import time

    tf = _tf()
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.apply_default_optimizations = False
    options.autotune.enabled = False
    first, waits, yielded = len(calls), [], []
    augment.delay[0] = 0.01
    try:
        iterator = iter(dataset.with_options(options))
        for batch in iterator:
            yielded.append(batch)
            begun = time.monotonic()
            while time.monotonic() < begun + (step_s if waits else wait_s):
                if any(end > begun for _, end, *_ in calls[first:]):
                    break  # a call ran during this wait: done waiting (judged below)
                time.sleep(0.01)
            waits.append((begun, time.monotonic()))
    finally:
        augment.delay[0] = 0.0
    found = _augmented(calls[first:], features)
    for x, y in yielded:
        for label, row in zip(np.asarray(y).reshape(-1).astype(int).tolist(),
                              np.asarray(x).reshape(len(np.asarray(y).reshape(-1)), -1),
                              strict=True):
            call = _whose(found, label, row - features[label])
            if call and any(call[0] < end and call[1] > begun for begun, end in waits):
                return True
    return False


def elements_problem(dataset: Any, features: np.ndarray, batch_size: int,
                     calls: list[Any] | None = None,
                     labels_problem: Callable[[int, np.ndarray], str | None] | None = None
                     ) -> str | None:
    """What is wrong with two epochs of ``dataset``, or None. Each epoch's noise (what it
    yields minus the examples) is put in the examples' order (by label: a shuffle is the
    learner's to add). Every feature of every example, each epoch, gets noise: no two
    features' noise alike over the examples (a correlation over 0.9 on 48 to 128 values comes
    by chance once in 10**14; a noise value drawn per example and given to all its features
    makes it 1), under 1e-4 on about 0.08 % of them (1.2 to 3.3 of the 1536 to 4096 values;
    over 20, fewer than one example's 32 features left unchanged in one epoch, comes by chance
    once in 10**10), and no two examples' noise alike (``_independence_problem``). Then the
    epochs are compared: fresh noise each epoch is independent of the last, a correlation of
    0 ± 0.04 here (768 to 2048 values, 0.25 either way is over six standard deviations),
    where an augmentation kept from the first epoch under a fresh one makes it 0.5, and the
    first epoch's noise negated makes it -1. Then one
    ``augment`` leaves a spread of 0.1 ± 0.002 (``NOISE_SPREAD``: its deviation), two make it
    0.14. Last, each example's noise must be what a call of ``augment`` (its records in
    ``calls``, when given) returned for it in that epoch (x09 L10, L12). ``labels_problem(epoch,
    labels)``, when given, judges each epoch's labels instead of "every example once" (the
    examples a hold-out keeps: ``held_out``)."""
    n = len(features)
    noise, found = [], []
    for epoch in (1, 2):
        first = len(calls) if calls is not None else 0
        sizes, labels, got = one_epoch(dataset)
        found.append(_augmented(calls[first:], features) if calls is not None else None)
        problem = labels_problem(epoch, labels) if labels_problem else None
        if problem:
            return problem
        if not labels_problem and sorted(labels.astype(int).tolist()) != list(range(n)):
            return (f"epoch {epoch} does not hold each of the {n} examples once "
                    f"({len(labels)} examples, {len(set(labels.tolist()))} different)")
        if sizes[:-1] != [batch_size] * (len(sizes) - 1) or sizes[-1] > batch_size:
            return f"epoch {epoch}'s batches have {sizes} examples; batch_size is {batch_size}"
        order = np.argsort(labels)  # the labels are the examples' indices
        held = np.sort(labels.astype(int))  # the examples it holds (all, or those kept)
        noise.append((got - features[labels.astype(int)])[order])
    if max(np.abs(n_).max() for n_ in noise) > 1:  # augment's noise has a deviation of 0.1
        return ("the features are not the ones read returns: every example must go through "
                "read (the records hold what is stored on the disk, not the examples)")
    if max(np.abs(n_).max() for n_ in noise) < 1e-4:  # read's decoding rounds, no more
        return "the features come out unchanged: apply augment to every example"
    if np.allclose(noise[0], noise[1]):
        return ("both epochs got the same augmentation: the augmented examples were kept. "
                "Which of your steps must give a new result every epoch?")
    problem = _independence_problem(np.stack(noise))
    if problem:
        return problem
    shared = float(np.corrcoef(noise[0].ravel(), noise[1].ravel())[0, 1])
    if abs(shared) > 0.25:
        return ("part of the noise is the same in both epochs, or made from the other's (the "
                f"two epochs' noise on each example correlates {shared:.2f}; fresh noise would "
                "not): an augmentation made before the step that keeps the examples is kept "
                "with them. Which of your steps must give a new result every epoch, and run "
                "only there?")
    spread = float(np.std(noise))
    if not 0.85 * NOISE_SPREAD < spread < 1.15 * NOISE_SPREAD:
        return (f"the noise on the features has a spread of {spread:.3f}, where one augment "
                f"gives {NOISE_SPREAD:g}: apply augment once to every example, each epoch")
    for epoch, (mine, theirs) in enumerate(zip(noise, found, strict=True), 1):
        wrong = [label for at, label in enumerate(held.tolist()) if theirs is not None
                 and _whose(theirs, label, mine[at]) is None]
        if wrong:
            return (f"{len(wrong)} of the {len(held)} examples in epoch {epoch} are not what "
                    f"augment returned for them (example {wrong[0]}: its features minus the "
                    "example read are not the noise any call of augment drew for it that epoch): "
                    "yield augment's output as it is, not noise of your own, changed or added")
    return None


def _independence_problem(noise: np.ndarray) -> str | None:
    """What ``elements_problem`` finds wrong with the two epochs' ``noise`` (epoch, example,
    feature), before the epochs are compared (a value drawn per example and shared by its
    features makes too few independent values for that): features sharing their noise (a
    constant feature is left to the next test), features left unchanged, or examples sharing
    their noise (over an example's 64 values of the two epochs, a correlation over 0.9 comes by
    chance once in 10**20 over the 2016 pairs of 64 examples; an example given another's noise
    makes it 1), moving it (an example's 32 values in one epoch, their sizes sorted, within
    1e-4 of another's or its own of the other epoch: at most 32! × (2e-4 × 8)**32 a pair, 8
    bounding the density of a value's size, by chance once in 10**49 over the 8128 pairs; noise
    moved along the features, sign-flipped, or handed to another example the next epoch makes
    them equal), copying part of it (12 or more of an example's 32 values in one epoch whose
    sizes lie within 1e-5 of one of another's: with read's float32 rounding, under 2.5e-6 a
    value, a value falls so near one of 32 others' with a chance under 32 × 3e-5 × 8, and 12
    of 32 do under C(32, 12) × 0.0077**12 = 1e-17 a pair, once in 10**12 over the 16256
    ordered pairs of 128 rows; half an example's noise given to another makes it 16) or making
    it of others' (an example's 64 values fitted on any two others' and a constant: a fit
    explaining over 90 % of them comes by chance 0.1**30.5 a pair, once in 10**25 over 64 ×
    1953; and each epoch's 32 values apart, so that a mix of the other epoch's noise is seen:
    0.1**14.5 a pair, 3e-9 over 128 × 8001; noise mixed from two examples', one weight each,
    or copied scaled or shifted, is fitted in full)."""
    columns = noise.reshape(-1, noise.shape[-1])
    alike = _most_alike(columns.T)
    if alike > 0.9:
        return (f"some features got the same noise as others on every example (a "
                f"correlation of {alike:.2f}; augment's noise is drawn for each feature "
                "apart): apply augment to each example's features, not to part of them")
    still = np.abs(noise) < 1e-4  # read's decoding rounds, no more
    if still.sum() > 20:
        rows = int(still.all(axis=-1).sum())
        whole = f" (all of an example's features: {rows} times)" if rows else ""
        return (f"{int(still.sum())} of the {still.size} feature values of the two epochs "
                f"come out unchanged{whole}: apply augment to every example, all its "
                "features, each epoch")
    alike = _most_alike(noise.transpose(1, 0, 2).reshape(noise.shape[1], -1))
    if alike > 0.9:
        return (f"some examples got the same noise as others (a correlation of {alike:.2f} "
                "over their features in both epochs; augment's noise is drawn for each "
                "example apart): apply augment to every example, not to part of them")
    if _nearest_sorted(noise.reshape(-1, noise.shape[-1])) < 1e-4:
        return ("some examples got noise another example had, or they had in the other epoch "
                "(the same values, moved among the features or sign-flipped; augment's noise "
                "is drawn for each example apart, each epoch): apply augment to every example, "
                "each epoch, and keep its noise where it put it")
    if _most_shared(noise.reshape(-1, noise.shape[-1])) >= 12:
        return ("some examples got part of the noise another example had, or they had in the "
                "other epoch (12 or more of its values, in place, moved among the features or "
                "sign-flipped; augment's noise is drawn for each example apart, each epoch): "
                "apply augment to every example, each epoch, and keep its noise where it put it")
    fitted = max(_best_two_fit(noise.transpose(1, 0, 2).reshape(noise.shape[1], -1)),
                 _best_two_fit(noise.reshape(-1, noise.shape[-1])))
    if fitted > 0.9:
        return (f"some examples' noise is made of other examples' or of the other epoch's "
                f"(two others' explain {fitted:.0%} of it; augment's noise is drawn for each "
                "example apart, each epoch): apply augment to every example, each epoch, and "
                "keep its noise")
    return None


def _nearest_sorted(rows: np.ndarray) -> float:
    """The least largest difference between two of ``rows``' sorted absolute values."""
    ranked = np.sort(np.abs(rows), axis=1)
    gaps = np.abs(ranked[:, None, :] - ranked[None, :, :]).max(axis=-1)
    np.fill_diagonal(gaps, np.inf)
    return float(gaps.min())


def _most_shared(rows: np.ndarray, within: float = 1e-5) -> int:
    """The most of a row's values whose sizes lie within ``within`` of a value's size in one
    other row (the sizes sorted together: each compared with the next ones while near)."""
    sizes = np.abs(rows).ravel()
    order = np.argsort(sizes, kind="stable")
    ranked, owner = sizes[order], (order // rows.shape[1])
    value, other = [], []
    for step in range(1, len(ranked)):
        near = np.flatnonzero(ranked[step:] - ranked[:-step] < within)
        if not len(near):
            break
        value += [order[near], order[near + step]]
        other += [owner[near + step], owner[near]]
    if not value:
        return 0
    value, other = np.concatenate(value), np.concatenate(other)
    keep = value // rows.shape[1] != other
    hits = np.unique(np.stack([value[keep], other[keep]]), axis=1)
    pairs = np.bincount(hits[0] // rows.shape[1] * len(rows) + hits[1])
    return int(pairs.max(initial=0))


def _best_two_fit(rows: np.ndarray) -> float:
    """The largest share of a row's spread (R²) that a least-squares fit on any two other rows
    and a constant explains (a copy shifted is fitted too), from the rows' correlations c:
    (c_ia² + c_ib² - 2 c_ia c_ib c_ab) / (1 - c_ab²) for row i on rows a and b (every pair: the
    two it correlates with most can miss a mix whose parts another row outranks)."""
    rows = rows - rows.mean(axis=1, keepdims=True)
    unit = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-30)
    c = unit @ unit.T
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = ((c[:, :, None] ** 2 + c[:, None, :] ** 2
                   - 2 * c[:, :, None] * c[:, None, :] * c[None, :, :])
                  / np.maximum(1 - c[None, :, :] ** 2, 1e-12))
    at = np.arange(len(rows))
    shares[at, at, :] = shares[at, :, at] = shares[:, at, at] = 0  # a row itself, a row twice
    return float(np.clip(np.nan_to_num(shares), 0, 1).max())


def _most_alike(rows: np.ndarray) -> float:
    """The largest correlation (absolute) between two of ``rows``; a constant row: none."""
    with np.errstate(invalid="ignore", divide="ignore"):
        alike = np.nan_to_num(np.abs(np.corrcoef(rows)), nan=0.0)
    return float((alike - np.eye(len(alike))).max())


def slow_baseline(profile: Callable[[], Any], attempts: int = BASELINE_ATTEMPTS) -> Any:
    """The first of up to ``attempts`` profiles (``profile()``, a step breakdown) whose input
    share reaches ``SLOW_INPUT_SHARE``; RuntimeError with every share when none does."""
    shares = []
    for _ in range(attempts):
        breakdown = profile()
        shares.append(breakdown.shares()["input"])
        if shares[-1] >= SLOW_INPUT_SHARE:
            return breakdown
    raise RuntimeError(f"the check's slow pipeline waited only "
                       f"{', '.join(f'{share:.0%}' for share in shares)} for input in "
                       f"{attempts} profiles (it should wait over {SLOW_INPUT_SHARE:.0%}): "
                       "this machine is too busy to grade this now; run the cell again")


def least_input(profile: Callable[[], Any], attempts: int = BASELINE_ATTEMPTS) -> Any:
    """Of up to ``attempts`` profiles (``profile()``, a step breakdown), the first whose input
    share is under ``FAST_INPUT_SHARE``, else the one with the least: a busy machine can slow
    one profile's step, never the check's disk (a sleep): a pipeline that waits on it waits in
    every profile."""
    best = profile()
    for _ in range(attempts - 1):
        if best.shares()["input"] < FAST_INPUT_SHARE:
            break
        best = min(best, profile(), key=lambda each: each.shares()["input"])
    return best


def watched_build(fn: Callable[..., Any], reads: list[bool], augmented: list[Any],
                  drawn: list[Any] | None = None
                  ) -> tuple[Callable[..., Any], Callable[[], str | None]]:
    """``fn`` wrapped to watch its calls into ``cu.data.make_pipeline`` (lesson 01's helper,
    which puts read, cache, augment, batch and prefetch in order: the answer under another
    name), and a function that says what the last build did wrong, or None. Only the build is
    watched: the profiles that follow run unwatched. The guard leaves TensorFlow's threads
    uncounted (a build may read the dataset it is given: the check's own ``read`` and
    ``augment`` run there), so the build counts them itself: every thread state made while it
    runs must be one of the check's own calls on a thread TensorFlow made (``reads``',
    ``augmented``'s and ``drawn``'s records say which: ``held_out``'s ``keep``); any other
    Python run there, on a thread the guard cannot watch (a ``tf.py_function`` of the answer's
    own calling ``make_pipeline``, x09 L11), is refused, as exercises 1 and 3 refuse it."""
    from course_utils.data import make_pipeline
    from course_utils.grading.checks import guard_threads
    from course_utils.grading.checks.call_guard import RAW_THREAD, CallsInto, watching_problem

    guard = CallsInto(make_pipeline, tensorflow_threads=True)
    taken: list[list[str]] = []
    unexplained: list[int] = []

    def own() -> int:  # the check's own calls so far on TensorFlow's threads
        return sum(map(bool, reads)) + sum(bool(each[-1])
                                           for each in augmented + (drawn or []))

    @functools.wraps(fn)
    def built(*args: Any) -> Any:
        with guard:
            before, explained = guard_threads.probe(), own()
            try:
                return fn(*args)
            finally:
                made = guard_threads.probe() - before - 1 if before >= 0 else 0
                unexplained.append(made - (own() - explained))
                taken.append(guard.take())

    def problem() -> str | None:
        called = taken[-1] if taken else []
        if called:
            return watching_problem(called) or (
                "remove_input_bottleneck called cu.data.make_pipeline (lesson 01's helper, "
                "which puts the steps in order): build the pipeline from tf.data's own steps "
                "yourself")
        if unexplained and unexplained[-1] > 0:
            return (f"{RAW_THREAD}: {unexplained[-1]} time(s) while it built the pipeline, "
                    "besides the read, keep and augment you are given; build it from tf.data's "
                    "own steps, in your function")
        return None

    return built, problem
