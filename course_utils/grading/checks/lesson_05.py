"""Checks of lesson 05's exercises (registered by name with ``@register``).

* ``check_make_bucketed(make_bucketed)``: on fresh variable-length sequences and fresh bucket
  lengths, one epoch of the pipeline against the batches a bucketing pipeline hands out
  (``bucket_batches``: each sequence cut to the largest bucket, in the smallest bucket that holds
  it, a batch of ``batch_size`` padded to its bucket's length handed out as soon as its bucket
  fills, the rest dropped): a ``jit_compile=True`` step traces at most once per bucket (counted),
  every batch's shape is ``(batch_size, a bucket's length)``, no row sits in a larger bucket than
  it needs (the padding shares named), then order, labels and rows; the graph reads the dataset
  given, runs no Python of its own and keeps the order; nothing read when called, nor most of a
  long stream before its first batch; a bound of the pipeline's own meets a longer sequence.
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
verifier, exercises 1 and 3 against batches or a run made another way; the course's answers are
in the solutions notebook and the tests. Every function of this module, ``settings_rules``,
``token_training`` and ``bucket_batches`` (``expected_batches`` among them; not ``raw_dataset``,
the generator of the dataset given) is importable, so the checks refuse them all while the
learner's function runs: by the identity of their code and by content (a copy made with
``exec``), see ``refusals`` and ``call_guard``.
"""

from __future__ import annotations

import sys
from typing import Any

from course_utils.grading.checks import bucket_batches, settings_rules, token_training
from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = ["check_make_bucketed", "check_tpu_settings", "check_train_steps"]


def _refusing_the_check(fn: Any, why: str, also_refused: tuple[Any, ...] = (),
                        also: Any = None) -> Any:
    """``fn`` refusing this module's, the settings verifier's and ``also_refused``'s code."""
    return refusing(fn, [*own_functions(sys.modules[__name__]),
                         *own_functions(settings_rules), *own_functions(token_training),
                         *also_refused], why, also)


# --- Exercise 1 · buckets: a few static shapes -------------------------------------------------


@register
def check_make_bucketed(fn: Any) -> bool:
    """Check ``make_bucketed(dataset, batch_size, bucket_lengths)`` on fresh sequences."""
    return run_check(
        "make_bucketed",
        _refusing_the_check(fn, "build the pipeline yourself", tuple(own_functions(
            bucket_batches, but=["raw_dataset"]))),
        bucket_batches.cases(fresh_rng()),
        hint="lesson 05, section 3 (static shapes: one program per shape): which bucket does "
             "a sequence of exactly a bucket's length go to, which length does each batch pad "
             "to, and what becomes of a bucket's last, partial batch?")


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
            sys.modules[__name__])),
        hint="lesson 05, section 9 (one training function, any strategy): with R replicas "
             "the gradients of R replica losses are summed, and each replica sees only its "
             "share of the global batch. Which number in the one-device loss does no single "
             "replica know, and how can every replica learn it inside the step (lesson 02 "
             "counted examples across the replicas)?")
