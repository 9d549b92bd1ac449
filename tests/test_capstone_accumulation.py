"""Lesson 09's defaults take the capstone's accumulation path, a partial last group included.

The lesson's own nbval run (make test) executes that path and asserts what it does:
cu.Trainer's update count in every training stage (cell ``train``: ``updates_of`` counts the
extra update of a partial group), and the profiled step being one accumulated update of the
whole global batch (cell ``profile-raw``). This file checks, without running the notebook, that
the defaults lead there: the default budget needs ``k > 1`` and the default ``k`` is the fewest
that fits, and the pre-training epochs end in a partial group of micro-batches. (It replaces a
second run of the whole notebook with a smaller budget, which cost two minutes.) Only one stage
has a partial group on purpose: a partial group is one more traced function per cu.Trainer.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import numpy as np
import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "09_capstone.ipynb"
REPLICAS = 2  # the lesson's cu.setup(logical_devices=2): MirroredStrategy's replicas


@pytest.fixture(scope="module")
def lesson() -> dict[str, str]:
    """The lesson's cells by id."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    return {cell.get("id"): cell.source for cell in notebook.cells}


@pytest.fixture(scope="module")
def defaults(lesson) -> dict:
    """The values the lesson runs with: its parameters and the choices' default cells."""
    assert "mirrored" in lesson["choices"] and "import" not in lesson["parameters"]
    names: dict = {}
    for cell in ("parameters", "choices", "choose-k"):
        exec(lesson[cell], names)  # plain assignments of numbers, strings and dicts
    return names


def _split_labels(data_dir: Path) -> dict[str, np.ndarray]:
    """The labels of course_digits' splits, by the builder's own split (nothing prepared)."""
    from course_utils.data import digits_builder

    splits = digits_builder(data_dir)._split_generators(None)  # downloads nothing
    return {name: np.array([example["label"] for _, example in examples])
            for name, examples in splits.items()}


def test_the_default_budget_needs_accumulation_and_the_default_k_is_the_fewest_that_fits(
        lesson, defaults):
    import keras

    import course_utils as cu

    assert defaults["STRATEGY"] == "mirrored" and defaults["MEMORY_BUDGET_MIB"] is not None
    names = {"keras": keras, "image_shape": (8, 8, 1), "FILTERS": defaults["FILTERS"]}
    exec(lesson["model"], names)  # make_backbone and make_classifier, as the lesson has them
    with cu.training.policy_scope(defaults["PRECISION"]):
        probe = names["make_classifier"](10 - defaults["PRETRAIN_CLASSES"])
    budget = defaults["MEMORY_BUDGET_MIB"] * 2**20
    whole = cu.memory.step_budget(probe, global_batch=defaults["GLOBAL_BATCH"],
                                  replicas=REPLICAS)
    fits = cu.memory.smallest_accumulation(probe, global_batch=defaults["GLOBAL_BATCH"],
                                           budget_bytes=budget, replicas=REPLICAS)
    assert whole.total > budget, (whole.total, budget)  # the whole batch does not fit
    assert fits == defaults["ACCUMULATION_STEPS"] > 1, (fits, defaults["ACCUMULATION_STEPS"])


def test_the_pretraining_epochs_of_the_defaults_end_in_a_partial_group(defaults, tmp_path):
    labels = _split_labels(tmp_path)["train"]
    k = defaults["ACCUMULATION_STEPS"]
    micro_batch = defaults["GLOBAL_BATCH"] // k  # the lesson's micro_batch
    stages = {"pre-train": int(np.sum(labels < defaults["PRETRAIN_CLASSES"])),
              "transfer": int(np.sum(labels >= defaults["PRETRAIN_CLASSES"]))}
    assert sum(stages.values()) == len(labels)
    last_groups = {stage: (count // micro_batch) % k for stage, count in stages.items()}
    assert last_groups["pre-train"], (stages, micro_batch, k, last_groups)


def test_the_lesson_asserts_the_update_count_and_profiles_the_accumulated_step(lesson):
    """What the lesson's run asserts, so that a later edit cannot drop it unnoticed."""
    assert "math.ceil(batches / accumulation_steps)" in lesson["trainer"]  # a partial group
    assert "trainer.updates == applied + skipped == updates_of(dataset, epochs)" in (
        lesson["train"])
    assert "GLOBAL_BATCH,\n                           accumulation_steps)" in lesson["job-step"]
    assert "== PROFILE_STEPS  # one a step" in lesson["profile-raw"]
    assert "assert int(seen[0]) == GLOBAL_BATCH" in lesson["profile-raw"]
