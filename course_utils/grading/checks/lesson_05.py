"""Checks of lesson 05's exercises (registered by name with ``@register``).

* ``check_make_tpu_ready(make_tpu_ready)``: on fresh variable-length sequences (token ids up to
  2**31 - 1; in each of two cases one empty and one longer than twice ``sequence_length``, among
  ones of up to twice; case 1's long one made as below, case 2's drawn up to 100 times), the
  pipeline's ``element_spec`` has every dimension known and int32 or int64 dtypes, its graph
  holds the given dataset's reads and no Python of its own (the ``py_function`` tokens of the
  given dataset and no other: a generator that iterates it, a ``py_function`` or a
  ``numpy_function`` fails) and pulls nothing from an iterator, a queue, a variable or a file
  made outside it (work handed on), a compiled step traces once over an epoch, which ends
  (``repeat`` is named) and has ``n // batch_size`` batches read from the dataset given, holding
  the sequences cut or padded with zeros at the end to ``sequence_length``, in order (no
  ``deterministic=False``); the function may not read the dataset when called (the dataset
  counts what it hands out), nor read most of a long stream before its first batch. In case 1, a
  bound of its own meets a long sequence made before it is read: one token longer than the
  largest whole number below ``2**24`` its graph holds or works out from its constants outside
  called functions, loops, conditionals and tensors of unknown shape or of more than ``2**16``
  numbers (a ``padded_batch``'s ``padded_shapes``, a
  ``tf.pad``'s target, ``static_batches.graph_numbers``), and never shorter than ``2**20`` + 1
  tokens, for bounds the graph hides; case 2's long sequence keeps its drawn length, and kept
  rows are made one token past the whole numbers between ``sequence_length`` and ``2**24`` the
  graph holds, as many as its kept rows and ``2**24`` tokens allow (an answer right only for
  very long or very short sequences fails there: ``past_each_number``).
* ``check_tpu_settings(tpu_settings)``: the per-replica batch and ``steps_per_execution`` for
  fresh described TPUs (small per-replica batches, and two exactly on the overhead rule's
  boundary), each pair judged rule by rule as the exercise states them
  (``settings_rules.settings_problem``: within the global batch, in whole tiles, no larger one
  fitting; the round-trip shared within the accepted share while one step fewer is not, at
  most an epoch's steps, at least 1), the failure naming the rule broken and the case; a
  global batch that cannot give each replica one example must raise ValueError.
* ``check_train_steps(make_train_steps)``: a token tagger on sequences padded with zeros
  (``token_training``), under the notebook's ``MirroredStrategy``, then on one device (a replica
  count typed into the loss fails there): two calls of different step counts must match, within
  1e-05, the weights one device reaches another way (``_one_device_weights``: the exercise's
  one-device loss, each token's cross-entropy summed over the batch's real tokens and divided
  by their count, in a plain GradientTape step a batch, no strategy), on global batches sorted
  by length so that the replicas' shares hold different numbers of real tokens; trace once,
  change the weights, and run the model in a replica context on each replica's rows
  (``strategy.run``: a weightless layer of the check's model notes both when traced).
  ``cu.Trainer``'s and Keras's trainer files are refused while it is made, traced and run;
  the optimizer's settings must stay as given.

No function of the package returns an exercise's answer (the package is installed for
learners, also where only the exercise notebooks are handed out): exercise 2 is judged by a
verifier, exercise 3 against a run made another way; the course's answers are in the solutions
notebook and the tests. Every function of this module, ``settings_rules`` and ``token_training``
(``_expected_batches`` among them) is importable, so the checks refuse them all while the
learner's function runs: by the identity of their code and by content (a copy made with
``exec``), see ``refusals`` and ``call_guard``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from course_utils.grading.checks import settings_rules, static_batches, token_training
from course_utils.grading.checks.batch_shapes import py_function_tokens
from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["check_make_tpu_ready", "check_tpu_settings", "check_train_steps"]


def _refusing_the_check(fn: Any, why: str, also_refused: tuple[Any, ...] = (),
                        also: Any = None) -> Any:
    """``fn`` refusing this module's, the settings verifier's and ``also_refused``'s code."""
    return refusing(fn, [*own_functions(sys.modules[__name__], but=["_raw_dataset"]),
                         *own_functions(settings_rules), *own_functions(token_training),
                         *also_refused], why, also)


# --- Exercise 1 · a TPU-ready pipeline ---------------------------------------------------------


def _sequences(rng: Any, n: int, longest: int) -> tuple[list[np.ndarray], np.ndarray]:
    data = np.random.default_rng(rng.randint(0, 2**31 - 1))
    lengths = data.integers(0, longest + 1, size=n)
    tokens = [data.integers(1, 2**31, size=length).astype("int32") for length in lengths]
    return tokens, data.integers(0, 2, size=n).astype("int32")


def _raw_dataset(tokens: list[np.ndarray], labels: np.ndarray,
                 read: list[int]) -> Any:
    """The sequences as a dataset; ``read[0]`` counts the examples it has handed out."""
    tf = _tf()

    def examples() -> Any:
        for pair in zip(tokens, labels, strict=True):
            read[0] += 1
            yield pair

    return tf.data.Dataset.from_generator(
        examples,
        output_signature=(tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)))


def _expected_batches(tokens: list[np.ndarray], labels: np.ndarray, batch: int,
                      length: int) -> list[tuple[np.ndarray, np.ndarray]]:
    fixed = np.zeros((len(tokens), length), "int32")
    for row, sequence in enumerate(tokens):
        cut = sequence[:length]
        fixed[row, :len(cut)] = cut
    return [(fixed[i:i + batch], labels[i:i + batch])
            for i in range(0, len(tokens) - batch + 1, batch)]


#: A stream longer than any read-ahead: a pipeline hands out its first batch after a few
#: batches' worth (the reference's AUTOTUNE map and prefetch, batches of 16: 18 examples, 64
#: half a second later); a copy of the data, even one put off to the first batch, reads all.
_STREAM = 1_000


def _stream_case(rng: Any) -> Case:
    """A long dataset of which only the first batch is read: what had been read by then?"""
    tf = _tf()
    batch, length = rng.choice([4, 8]), rng.choice([6, 10])
    tokens, labels = _sequences(rng, _STREAM, 2 * length)
    read = [0]

    def verify(got: Any) -> str | None:
        if read[0]:
            return (f"your function read {read[0]} examples of the dataset when called: a copy "
                    "of the data made in memory, not a pipeline")
        if not isinstance(got, tf.data.Dataset):
            return f"expected a tf.data.Dataset, got {type(got).__name__}"
        try:
            x, y = next(iter(got))
        except Exception as error:  # noqa: BLE001 - the learner's to see
            return f"reading the first batch failed: {type(error).__name__}: {str(error)[:160]}"
        ahead = read[0]
        (ex, ey), = _expected_batches(tokens[:batch], labels[:batch], batch, length)
        if not (np.array_equal(np.asarray(x), ex) and np.array_equal(np.asarray(y), ey)):
            return (f"the first batch of a {_STREAM}-sequence stream differs from its first "
                    f"{batch} sequences cut or padded to {length}")
        if ahead >= _STREAM // 2:
            return (f"your pipeline read {ahead} of {_STREAM} examples before it handed out "
                    f"its first batch of {batch}: it copies the data, not transforms the "
                    "examples as they stream (section 3)")
        return None

    return Case(args=(_raw_dataset(tokens, labels, read), batch, length), verify=verify,
                label=f"(a stream of {_STREAM} sequences, batch_size={batch}, "
                      f"sequence_length={length}: its first batch)")


@register
def check_make_tpu_ready(fn: Any) -> bool:
    """Check ``make_tpu_ready(dataset, batch_size, sequence_length)`` on fresh sequences."""
    rng = fresh_rng()
    cases = []
    for index in range(2):
        batch, length = rng.choice([4, 8, 16]), rng.choice([6, 10, 16])
        n = batch * rng.randint(3, 6) + rng.randint(1, batch - 1)  # a partial last batch
        tokens, labels = _sequences(rng, n, 2 * length)
        # one sequence far longer, in a batch kept: padding to a bound of one's own (twice
        # sequence_length, then cut) is no cut; case 1 makes it longer than any bound of the
        # pipeline's (2**20 + 1 tokens at least) before it is read, case 2 keeps the drawn
        # length; and one empty sequence in a batch kept
        kept = batch * (n // batch)
        longest, at = rng.randint(2 * length + 1, 100 * length), rng.randrange(kept)
        tokens[at] = np.random.default_rng(
            rng.randint(0, 2**31 - 1)).integers(1, 2**31, size=longest).astype("int32")
        tokens[rng.choice([i for i in range(kept) if i != at])] = np.zeros(0, "int32")
        read = [0]
        given = _raw_dataset(tokens, labels, read)
        reads = py_function_tokens(given)  # the ops of its generator: what reads it

        def verify(got: Any, tokens: Any = tokens, labels: Any = labels, batch: int = batch,
                   length: int = length, read: list[int] = read,
                   reads: set[str] = reads, at: int = at, index: int = index) -> str | None:
            def lengthen(bound: int) -> Any:  # past a bound of the pipeline's own
                if len(tokens[at]) > bound:
                    return None
                tokens[at] = np.resize(tokens[at], bound + 1)  # read when iterated
                return _expected_batches(tokens, labels, batch, length)

            if read[0]:
                return (f"your function read {read[0]} examples of the dataset when called: "
                        "a copy of the data made in memory, not a pipeline that transforms "
                        "the examples as they stream")
            if index == 1:  # a bound of its own behind a guard that cuts only long ones
                static_batches.past_each_number(got, tokens, [
                    i for i in range(batch * (len(tokens) // batch)) if i != at], length)
            return static_batches.verify_pipeline(
                got, _expected_batches(tokens, labels, batch, length), batch, length, read, reads,
                lengthen if index == 0 else None)

        cases.append(Case(args=(given, batch, length),
                          verify=verify,
                          label=f"({n} sequences of 0 to {2 * length} tokens and one of "
                                + ("at least 1048577 (made past 2**20 and every number below "
                                   "2**24 your graph holds)" if index == 0 else
                                   f"{longest}, rows made a token past the numbers your graph "
                                   f"holds between {length} and 2**24")
                                + f", batch_size={batch}, sequence_length={length})"))
    cases.append(_stream_case(rng))
    return run_check(
        "make_tpu_ready", _refusing_the_check(fn, "build the pipeline yourself"), cases,
        hint="lesson 05, section 3 (static shapes: one program, compiled once): what shape "
             "does each of your batches have, the last included, and what becomes of a "
             "sequence longer or shorter than sequence_length?")


# --- Exercise 2 · settings for a described TPU --------------------------------------------------


def _settings_cases(rng: Any) -> list[Case]:
    cases = [Case(args=(8, 4096, 2.0, 0.5, 0.15, 1_000_000)),  # a v5e-8, small fast steps
             Case(args=(1, 100, 1.0, 3.0, 0.05, 10_000)),  # Colab's v5e-1, a small batch
             Case(args=(8, 40, 1.0, 2.0, 0.3, 10_000)),  # fewer than 8 examples a replica
             Case(args=(4, 4 * 256, 5.0, 0.1, 0.03, 4 * 256 * 3)),  # capped at the epoch
             # tiles per replica (10 -> 8), not of the global batch (80 is a multiple of 8)
             Case(args=(8, 80, 1.0, 1.0, 0.3, 10_000)),
             # the epoch of the global batch used (4 x 256), not of the largest allowed
             Case(args=(4, 4 * 300, 5.0, 0.1, 0.03, 5_220)),
             Case(args=(8, 1024, 1.0, 1.0, 0.3, 500)),  # not one step an epoch: still 1
             # exactly on the boundary, in binary fractions: 8 steps suffice, not 9
             Case(args=(8, 4096, 1.0, 0.5, 0.25, 1_000_000)),
             Case(args=(2, 200, 3.0, 0.75, 0.5, 100_000))]
    while len(cases) < 13:
        replicas = rng.choice([1, 4, 8, 16])
        args = (replicas, replicas * rng.choice([rng.randint(2, 7), rng.randint(9, 127),
                                                 rng.randint(129, 1200)]),
                rng.choice([0.5, 1.0, 2.0, 5.0]), rng.choice([0.2, 1.0, 3.0, 20.0]),
                rng.choice([0.02, 0.05, 0.1]), rng.randint(20_000, 2_000_000))
        if not settings_rules.on_a_boundary(*args[2:5]):
            cases.append(Case(args=args))
    for case in cases:  # judged rule by rule: nothing here computes the answer
        case.verify = lambda got, args=case.args: settings_rules.settings_problem(args, got)
    return cases


def _refuses_an_impossible_batch(fn: Any, hint: str) -> None:
    args = (16, 8, 1.0, 1.0, 0.1, 1_000)
    try:
        got = fn(*args)
    except ValueError:
        return
    except NotImplementedError:
        return  # the stub: run_check reports it as not attempted
    except Exception as error:
        raise AssertionError(f"tpu_settings{args} raised {type(error).__name__}: {error}; "
                             f"expected ValueError\nHint: {hint}") from error
    raise AssertionError(f"tpu_settings{args} returned {got!r}: 16 replicas cannot share a "
                         f"global batch of 8, expected ValueError\nHint: {hint}")


@register
def check_tpu_settings(fn: Any) -> bool:
    """Check ``tpu_settings(replicas, max_global_batch, host_overhead_ms, step_ms,
    max_overhead_fraction, num_examples)`` on fresh described TPUs."""
    hint = ("per replica: as many examples as the global batch allows, in whole tiles: a "
            "multiple of 128 when one fits, else of 8 when one fits, else what fits (ValueError "
            "when not one example a replica fits); steps_per_execution: the fewest steps a call "
            "that share the round-trip down to the accepted overhead, at most the steps of one "
            "epoch (drop_remainder), at least 1 (lesson 05, sections 5 and 7).")
    fn = _refusing_the_check(fn, "apply the rules yourself")
    _refuses_an_impossible_batch(fn, hint)
    return run_check("tpu_settings", fn, _settings_cases(fresh_rng()), hint=hint)


# --- Exercise 3 · a padded-token loss under any strategy --------------------------------------


@register
def check_train_steps(fn: Any) -> bool:
    """Check ``make_train_steps(...)`` under the notebook's MirroredStrategy, then on one
    device, against one device's training on the mean over the global batch's real tokens
    (``token_training``): a replica count typed into the loss fails on one device."""
    kerass: list[str] = []
    guarded = _refusing_the_check(fn, token_training.YOURSELF,
                                  token_training.course_training_files(),
                                  token_training.noting_kerass_trainer(kerass))
    return run_check(
        "make_train_steps", guarded,
        token_training.train_cases(fresh_rng(), kerass, own_functions(
            sys.modules[__name__], but=["_raw_dataset"])),
        hint="lesson 05, section 9 (one training function, any strategy): with R replicas "
             "the gradients of R replica losses are summed, and each replica sees only its "
             "share of the global batch. Which number in the one-device loss does no single "
             "replica know, and how can every replica learn it inside the step (lesson 02 "
             "counted examples across the replicas)?")
