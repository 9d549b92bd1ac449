"""Appendix A's table: cells, checks, jobs, the Markdown file, the README copy, a fresh run."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import numpy as np
import pytest

from course_utils import equality as cu_equality
from course_utils import works_where as ww
from course_utils.works_where import cells, cli, jobs, ps_process, runner, table, verdicts, worker

REPO = pathlib.Path(__file__).resolve().parents[1]
ALL_CELLS = {(row, column) for row in ww.APIS for column in ww.STRATEGIES}


# ------------------------------------------------------------------ cells
def test_cell_refuses_an_unknown_status():
    assert ww.Cell("works", "ok").to_dict() == {"status": "works", "detail": "ok", "issue": None}
    with pytest.raises(ValueError, match="status must be one of"):
        ww.Cell("maybe", "?")


def test_first_line_names_the_cause_not_the_wrappers():
    keras_wrapped = RuntimeError("Exception encountered when calling Cond.call().\n\n"
                                 "\x1b[1m`merge_call` called while defining a new graph\x1b[0m")
    assert ww.first_line(keras_wrapped) == ("RuntimeError: `merge_call` called while "
                                            "defining a new graph")
    graph = ValueError("Graph execution error:\n\nDetected at node x defined at:\n"
                       '  File "/a/b.py", line 1, in f\n    code()\n2 root error(s) found.\n'
                       "  (0) INVALID_ARGUMENT:  You must feed a value for placeholder\n")
    assert ww.first_line(graph) == "ValueError: You must feed a value for placeholder"
    value = ValueError("Attempt to convert a value (PerReplica:{\n  0: <tf.Tensor 1>,\n"
                       "  1: <tf.Tensor 2>\n}) with an unsupported type")
    assert ww.first_line(value) == ("ValueError: Attempt to convert a value (PerReplica:{…}) "
                                    "with an unsupported type")
    assert ww.first_line(KeyError()) == "KeyError"
    assert len(ww.first_line(ValueError("x" * 500), limit=50)) <= len("ValueError: ") + 50


def test_failed_cells_cite_their_issue_and_the_tpu_fallback_the_mirrored_one():
    cell = cells.failed("gradient_accumulation", "tpu", RuntimeError("boom"))
    assert (cell.status, cell.detail) == ("fails", "RuntimeError: boom")
    assert cell.issue == cells.KNOWN_ISSUES[("gradient_accumulation", "mirrored")]
    assert cells.failed("trainer", "default", RuntimeError("x")).issue is None


def test_not_applicable_cells_say_why_and_every_key_is_a_real_cell():
    cell = cells.not_applicable("keras_distribution", "mirrored")
    assert cell.status == "n/a" and "default column" in cell.detail
    assert set(cells.NOT_APPLICABLE) <= ALL_CELLS and set(cells.KNOWN_ISSUES) <= ALL_CELLS


# ------------------------------------------------------------------ task and checks
def test_task_reference_learns_and_task_loss_agrees_with_keras():
    import keras

    task = ww.make_task(steps=3, global_batch=8)
    assert (task.steps, task.num_features, task.num_classes) == (3, 8, 3)
    reference = task.reference_weights()
    assert ww.task_loss(task, reference) < ww.task_loss(task, task.initial_weights)
    model = task.keras_model()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(task.y, model(task.x))
    assert ww.task_loss(task, task.initial_weights) == pytest.approx(float(loss), rel=1e-5)
    assert [b[0].shape[0] for b in task.dataset(4)] == [4] * 6


def test_checks_pass_only_the_right_weights_and_replica_count():
    task = ww.make_task()
    good = [w + 1e-7 for w in task.reference_weights()]
    assert ww.check_same_as_reference("trainer", "mirrored", task, good, 2, 2).status == "works"
    untrained = ww.check_same_as_reference("trainer", "mirrored", task, task.initial_weights, 2, 2)
    assert untrained.status == "wrong" and "differ" in untrained.detail
    one_replica = ww.check_same_as_reference("trainer", "mirrored", task, good, 1, 2)
    assert one_replica.status == "wrong" and "expected 2" in one_replica.detail
    assert cu_equality.largest_difference([np.ones(2)], [np.zeros(2)]) == 1.0
    with pytest.raises(ValueError):
        cu_equality.largest_difference([np.ones(2)], [])


def test_the_tolerances_are_public_and_the_default_check_uses_float32s():
    assert ww.TOLERANCES is verdicts.TOLERANCES and "TOLERANCES" in ww.__all__
    task = ww.make_task()
    just_outside = [w + 2 * ww.TOLERANCES["float32"] for w in task.reference_weights()]
    assert ww.check_same_as_reference("trainer", "mirrored", task, just_outside, 2,
                                      2).status == "wrong"


def test_async_and_distribution_checks():
    task = ww.make_task()
    trained = task.reference_weights()
    assert verdicts.check_async("trainer", "parameter_server", task, trained, 24, 24).status == (
        "works")
    lost = verdicts.check_async("trainer", "parameter_server", task, trained, 20, 24)
    assert lost.status == "wrong" and "20/24" in lost.detail
    short = verdicts.check_async("custom_loop", "parameter_server", task, trained, 24, 24, 21)
    assert short.status == "works" and "optimizer.iterations counted 21" in short.detail
    devices = ["cpu:0", "cpu:1"]
    one = verdicts.check_distributed("keras_distribution", "default", task, trained,
                                     [{"CPU:0"}] * 4, devices)
    assert one.status == "wrong" and "every variable is on CPU:0 of 2" in one.detail
    both = verdicts.check_distributed("keras_distribution", "default", task, trained,
                                      [{"CPU:0", "CPU:1"}] * 4, devices)
    assert both.status == "works" and "replicated on all 2" in both.detail


def test_distributed_check_asks_each_variable_on_every_device_not_spread():
    """rA4 R1: variables spread one per device are not replicated (⚠️); a MirroredVariable,
    whose own ``device`` is its first component's, and a replicated DTensor layout are."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    task = ww.make_task()
    trained, devices = task.reference_weights(), ["cpu:0", "cpu:1"]
    spread = [{"CPU:0"}, {"CPU:1"}, {"CPU:0"}, {"CPU:1"}]  # round-robin, none replicated
    cell = verdicts.check_distributed("keras_distribution", "default", task, trained, spread,
                                      devices)
    assert cell.status == "wrong" and "4 of 4 variables lack a copy" in cell.detail, cell
    with tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"]).scope():
        model = task.keras_model()
    # what the old measure read: one device per variable, its first component's
    assert {jobs.device_name(v.value.device) for v in model.weights} == {"CPU:0"}
    placed = [jobs.variable_devices(v) for v in model.weights]
    assert placed == [{"CPU:0", "CPU:1"}] * 4, placed
    assert verdicts.check_distributed("keras_distribution", "default", task, trained, placed,
                                      devices).status == "works"
    mesh = dtensor.create_mesh([("batch", 2)], devices=["CPU:0", "CPU:1"])
    replicated = dtensor.DVariable(dtensor.call_with_layout(
        tf.zeros, dtensor.Layout.replicated(mesh, 1), shape=(4,)))
    sharded = dtensor.DVariable(dtensor.call_with_layout(
        tf.zeros, dtensor.Layout.batch_sharded(mesh, "batch", 1), shape=(4,)))
    assert jobs.variable_devices(replicated) == {"CPU:0", "CPU:1"}
    assert jobs.variable_devices(sharded) != {"CPU:0", "CPU:1"}
    assert jobs.variable_devices(tf.Variable(1.0)) == {"CPU:0"}


def test_a_loss_scale_that_skips_a_real_overflow_is_judged_against_a_reference_that_skips_it():
    """rA4 R2: skipping exactly the overflowed steps is right, synchronous or asynchronous."""
    import tensorflow as tf

    task = ww.make_task()
    skipping = task.reference_weights(skip=[1])
    assert cu_equality.largest_difference(skipping, task.reference_weights()) > 1e-3
    right = verdicts.check_loss_scaled("loss_scale_optimizer", "default", task, skipping, 1, 1,
                                       overflowed=[1], skipped=[1])
    assert right.status == "works" and "step(s) [1] overflowed and were skipped" in right.detail
    assert verdicts.check_loss_scaled("loss_scale_optimizer", "default", task,
                                      task.reference_weights(), 1, 1, [], []).status == "works"
    applied = verdicts.check_loss_scaled("loss_scale_optimizer", "default", task,
                                         task.reference_weights(), 1, 1, overflowed=[1],
                                         skipped=[])
    assert applied.status == "wrong" and "overflowed at step(s) [1]" in applied.detail
    spurious = verdicts.check_loss_scaled("loss_scale_optimizer", "default", task, skipping,
                                          1, 1, overflowed=[], skipped=[1])
    assert spurious.status == "wrong" and "skipped step(s) [1]" in spurious.detail
    real = ww.make_task()
    real.x[real.global_batch:2 * real.global_batch] *= 3000.0  # step 1 overflows float16
    cell = ww.run_cell("loss_scale_optimizer", "default", tf.distribute.get_strategy(), real,
                       1)  # the real job: its loss scale skips step 1, the reference too
    assert cell.status == "works" and "step(s) [1] overflowed and were skipped" in cell.detail
    ps = verdicts.check_async("loss_scale_optimizer", "parameter_server", task,
                              task.reference_weights(), 23, 24, 23, skipped=1)
    assert ps.status == "works" and "23/24 steps applied, 1 skipped" in ps.detail, ps
    lost = verdicts.check_async("loss_scale_optimizer", "parameter_server", task,
                                task.reference_weights(), 22, 24, 22, skipped=1)
    assert lost.status == "wrong"


def test_a_caveat_link_beside_works_only_with_the_caveat_in_the_details():
    """rA4 R3 (and U1): a ✅ links what its details say, never the row's known issue."""
    task = ww.make_task()
    trained = task.reference_weights()
    full = verdicts.check_async("custom_loop", "parameter_server", task, trained, 24, 24, 24)
    assert full.status == "works" and full.issue is None, full
    short = verdicts.check_async("custom_loop", "parameter_server", task, trained, 24, 24, 19)
    assert short.issue == cells.ITERATIONS_SHORT and "counted 19" in short.detail
    assert table.short_link(short.issue) == "iterations short"
    assert ("custom_loop", "parameter_server") in cells.KNOWN_ISSUES
    for row, column in (("remat_scope", "mirrored"), ("keras3_fit", "multi_worker")):
        assert (row, column) in cells.KNOWN_ISSUES
        cell = ww.check_same_as_reference(row, column, task, trained, 2, 2)
        assert cell.status == "works" and cell.issue is None, cell
    wrong = ww.check_same_as_reference("remat_scope", "mirrored", task, task.initial_weights,
                                       2, 2)
    assert wrong.issue == cells.KNOWN_ISSUES[("remat_scope", "mirrored")]


def test_an_error_of_the_check_is_not_the_apis(monkeypatch):
    """rA4 R4: weights in another structure make the check raise: ⚠️ with that said, not ❌."""
    task = ww.make_task()
    monkeypatch.setitem(jobs.SYNC_JOBS, "trainer",
                        lambda strategy, task: task.reference_weights()[:3])
    strategy = SimpleNamespace(num_replicas_in_sync=1)
    cell = runner.run_cell("trainer", "default", strategy, task, 1)
    assert cell.status == "wrong" and "its check raised ValueError" in cell.detail, cell

    def raising(strategy, task):
        raise RuntimeError("the API broke")
    monkeypatch.setitem(jobs.SYNC_JOBS, "trainer", raising)
    assert runner.run_cell("trainer", "default", strategy, task, 1) == ww.Cell(
        "fails", "RuntimeError: the API broke")


def test_non_finite_weights_are_never_works_and_the_detail_says_so():
    task = ww.make_task()
    reference = task.reference_weights()
    all_nan = [np.full_like(w, np.nan) for w in reference]
    last_nan = [*reference[:-1], np.full_like(reference[-1], np.nan)]  # max() dropped it
    one_inf = [w.copy() for w in reference]
    one_inf[0].flat[0] = np.inf
    for weights in (all_nan, last_nan, one_inf):
        for cell in (ww.check_same_as_reference("custom_loop", "mirrored", task, weights, 2, 2),
                     verdicts.check_distributed("keras_distribution", "default", task, weights,
                                                [{"CPU:0", "CPU:1"}] * 4, ["cpu:0", "cpu:1"]),
                     verdicts.check_async("trainer", "parameter_server", task, weights, 24, 24)):
            assert cell.status == "wrong" and "not finite" in cell.detail, cell
    assert "(0 NaN, 1 inf)" in ww.check_same_as_reference("trainer", "default", task, one_inf,
                                                           1, 1).detail
    assert cu_equality.largest_difference(last_nan, reference) == np.inf
    assert cu_equality.largest_difference(reference, one_inf) == np.inf


# ------------------------------------------------------------------ jobs and runner
@pytest.mark.slow
def test_every_synchronous_job_matches_one_device_under_the_default_strategy():
    import tensorflow as tf

    task = ww.make_task(steps=2, global_batch=8)
    column = ww.run_column("default", tf.distribute.get_strategy(), task, expected_replicas=1)
    assert set(column) == set(ww.APIS)
    distribution = column.pop("keras_distribution")
    failing = ("remat_scope", "remat_larger_than", "remat_list_of_layers")
    for row in failing:  # fit traces, and custom_gradient takes keywords in eager mode only
        remat = column.pop(row)
        assert remat.status == "fails" and "custom_gradient" in remat.detail, row
    assert {row: cell.status for row, cell in column.items()} == {  # remat_activations too
        row: "works" for row in jobs.SYNC_JOBS if row not in failing}
    assert "overflow on the last replica was skipped" in column["loss_scale_optimizer"].detail
    if distribution.status == "fails":  # a Keras without the guard (keras#18983): no build
        assert "num_processes" in distribution.detail
    else:  # Keras 3.15: it builds and trains, and distributes nothing
        assert distribution.status == "wrong"


def _updates_waiting_for_every_gradient(recompute: bool) -> bool:
    """Whether, in the traced custom-loop step, the optimizer's ops (its name scope) carry
    control inputs on every gradient: the ops whose outputs Keras's all-reduce of the
    gradients takes (an identity under the default strategy, ``sgd/IdentityN``)."""
    import tensorflow as tf

    task = ww.make_task(steps=2, global_batch=8)
    _, optimizer, step = jobs.replica_training(tf.distribute.get_strategy(), task,
                                               recompute=recompute)
    x, y = next(iter(task.dataset()))
    graph = tf.function(step).get_concrete_function(x, y).graph
    scope = f"{optimizer.name}/"  # "sgd/", or "sgd_1/" for a second optimizer in the process
    gradients = {t.op for t in graph.get_operation_by_name(scope + "IdentityN").inputs}
    waits = {control for op in graph.get_operations() if op.name.startswith(scope)
             for control in op.control_inputs}
    assert len(gradients) >= 1, gradients
    return gradients <= waits


def test_the_recompute_rows_update_waits_for_every_gradient():
    # benchmarks/recompute_update_order.py: without the wait, an update sometimes ran before
    # the recomputation read its weight (the plain custom loop has no recomputation)
    assert _updates_waiting_for_every_gradient(recompute=True)
    assert not _updates_waiting_for_every_gradient(recompute=False)


def test_keras_fit_under_mirrored_matches_and_accumulation_fails():
    from course_utils.strategies import make_strategy

    task = ww.make_task(steps=2, global_batch=8)
    strategy = make_strategy("mirrored", num_replicas=2, verbose=False)
    assert ww.run_cell("keras3_fit", "mirrored", strategy, task, 2).status == "works"
    accumulation = ww.run_cell("gradient_accumulation", "mirrored", strategy, task, 2)
    assert accumulation.status == "fails" and "merge_call" in accumulation.detail
    assert ww.run_cell("recompute_grad", "mirrored", strategy, task, 2).status == "works"


def test_loss_scale_optimizer_applies_an_overflow_of_the_second_replica():
    from course_utils.strategies import make_strategy

    task = ww.make_task(steps=2, global_batch=8)
    strategy = make_strategy("mirrored", num_replicas=2, verbose=False)
    assert jobs.overflow_on_last_replica_applied(strategy, task)
    cell = ww.run_cell("loss_scale_optimizer", "mirrored", strategy, task, 2)
    assert cell.status == "wrong" and "first replica only" in cell.detail  # ⚠️
    assert cell.issue == cells.FIRST_REPLICA_ONLY
    # under multi-worker the probe is not run: the ✅ carries a caveat that says so
    unprobed = ww.run_cell("loss_scale_optimizer", "multi_worker", strategy, task, 2)
    assert unprobed.status == "works" and "overflow probe was not run" in unprobed.detail
    assert unprobed.issue == cells.OVERFLOW_NOT_PROBED


def test_loss_scale_optimizer_under_parameter_servers_says_its_overflow_was_not_probed(
        monkeypatch):
    """rA U1: the scheduled loop runs no overflow step, so its ✅ carries the caveat."""
    from course_utils.works_where import coordinator_jobs

    task = ww.make_task(steps=2, global_batch=8)
    steps = coordinator_jobs.PS_STEPS
    trained = (task.reference_weights(), steps, steps - 2, 0)  # iterations 2 short
    monkeypatch.setitem(coordinator_jobs.PS_JOBS, "loss_scale_optimizer",
                        lambda strategy, task: trained)
    cell = ww.run_cell("loss_scale_optimizer", "parameter_server", None, task, 0)
    assert cell.status == "works" and "overflow probe was not run" in cell.detail
    assert cell.issue == cells.OVERFLOW_NOT_PROBED
    assert f"counted {steps - 2}" in cell.detail and cells.ITERATIONS_SHORT in cell.detail
    monkeypatch.setitem(coordinator_jobs.PS_JOBS, "custom_loop",
                        lambda strategy, task: trained[:2] + (steps,))
    plain = ww.run_cell("custom_loop", "parameter_server", None, task, 0)
    assert plain.status == "works" and plain.issue is None  # no caveat, no link (rA4 R3)


def test_loss_scale_optimizer_under_parameter_servers_counts_applied_not_run_steps(
        monkeypatch):
    """rA2 U3: a step the LossScaleOptimizer skipped ran but was not applied; its halved scale
    shows it. rA4 R2: such a skip is what loss scaling must do, so the cell says it and stays
    ✅; a step neither applied nor skipped is ⚠️."""
    from types import SimpleNamespace

    from course_utils.works_where import coordinator_jobs

    task = ww.make_task(steps=2, global_batch=8)
    model = SimpleNamespace(get_weights=task.reference_weights)

    def optimizer(scale):
        return SimpleNamespace(initial_scale=2.0**15, dynamic_growth_steps=2000,
                               dynamic_scale=SimpleNamespace(numpy=lambda: np.float32(scale)),
                               iterations=SimpleNamespace(numpy=lambda: steps - 1))

    steps = coordinator_jobs.PS_STEPS
    for scale, applied in ((2.0**15, steps), (2.0**14, steps - 1), (2.0**12, steps - 3)):
        monkeypatch.setattr(coordinator_jobs, "_scheduled_loop",
                            lambda *args, scale=scale, **kwargs: (model, optimizer(scale),
                                                                  steps))
        assert coordinator_jobs.ps_loss_scaled_loop(None, task)[1:4:2] == (
            applied, steps - applied), scale
    cell = ww.run_cell("loss_scale_optimizer", "parameter_server", None, task, 0)
    assert cell.status == "works", cell
    assert f"{steps - 3}/{steps} steps applied, 3 skipped by the loss scale" in cell.detail
    monkeypatch.setattr(coordinator_jobs, "_scheduled_loop",  # one step never ran
                        lambda *args, **kwargs: (model, optimizer(2.0**14), steps - 1))
    cell = ww.run_cell("loss_scale_optimizer", "parameter_server", None, task, 0)
    assert cell.status == "wrong" and f"{steps - 2}/{steps} steps applied" in cell.detail


def test_the_mirrored_replica_count_is_expected_from_the_devices_not_the_strategy(
        monkeypatch):
    """rA U2: a Mirrored strategy over fewer devices than this process has fails the check."""
    import tensorflow as tf

    from course_utils import strategies

    devices = strategies.replica_devices()
    one = tf.distribute.MirroredStrategy(devices[:1])
    monkeypatch.setattr(strategies, "make_strategy", lambda *args, **kwargs: one)
    for column in ("mirrored", "tpu"):
        strategy, expected, _ = ww.local_strategy(column)
        assert strategy is one and expected == len(devices) > 1, column
        task = ww.make_task()
        cell = ww.check_same_as_reference("keras3_fit", column, task, task.reference_weights(),
                                          strategy.num_replicas_in_sync, expected)
        assert cell.status == "wrong" and f"expected {len(devices)}" in cell.detail


def test_run_cell_turns_an_error_into_a_cell_and_skips_what_makes_no_sense():
    class Broken:
        num_replicas_in_sync = 1

        def scope(self):
            raise RuntimeError("no scope here")

    cell = runner.run_cell("keras3_fit", "default", Broken(), ww.make_task(), 1)
    assert (cell.status, cell.detail) == ("fails", "RuntimeError: no scope here")
    assert runner.run_cell("keras_distribution", "tpu", Broken(), ww.make_task(), 1).status == (
        "n/a")


def test_keras_distribution_multi_worker_calls_initialize_and_shows_its_error(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["localhost:1", "localhost:2"]}, '
                       '"task": {"type": "worker", "index": 0}}')
    cell = runner.run_cell("keras_distribution", "multi_worker", None, ww.make_task(), 2)
    if cell.status == "fails":  # Keras 3.15 on TensorFlow: no backend initialize
        assert "initialize" in cell.detail and cell.issue.endswith("#L151"), cell
        assert table.short_link(cell.issue) == "initialize: JAX only"
    assert ("keras_distribution", "multi_worker") not in cells.NOT_APPLICABLE


def test_worker_script_needs_tf_config(monkeypatch, tmp_path):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    sizes = ww.task_arguments(ww.make_task(steps=3, global_batch=8))
    assert sizes == ["--steps", "3", "--global-batch", "8"]  # what run_matrix passes on
    with pytest.raises(ValueError, match="TF_CONFIG"):  # after the sizes were parsed
        worker.main(["--out", str(tmp_path), *sizes])


@pytest.mark.parametrize("other", [{"hidden": 8}, {"seed": 1}])
def test_a_task_the_children_cannot_rebuild_is_refused(other):
    with pytest.raises(ValueError, match="rebuild the task"):
        ww.task_arguments(ww.make_task(steps=3, global_batch=8, **other))


@pytest.mark.slow
def test_the_parameter_server_column_runs_in_a_process_that_leaves_nothing_behind(tmp_path):
    from course_utils.cluster import leftovers

    process = ww.start_parameter_server(tmp_path)
    column, note, ports = ww.collect_parameter_server(process, tmp_path)
    assert set(column) == set(ww.APIS) and len(ports) == 3  # 2 workers and 1 parameter server
    assert {row for row, cell in column.items() if cell.status == "works"} == {
        "custom_loop", "trainer", "tf_keras_fit", "loss_scale_optimizer", "recompute_grad"}
    assert "in-process cluster" in note and (tmp_path / ps_process.REPORT_NAME).is_file()
    assert leftovers(process.pids, ports) == {"processes": [], "ports": []}
    assert "parameter_server" not in ww.LOCAL_COLUMNS  # it would bind this process for good


# ------------------------------------------------------------------ the table
def _matrix(status: str = "works") -> ww.Matrix:
    grid = {row: {column: ww.Cell(status, "d|x", "https://github.com/k/keras/issues/1")
                  for column in ww.STRATEGIES} for row in ww.APIS}
    grid["keras_distribution"]["tpu"] = ww.Cell("n/a", "why")
    return ww.Matrix(grid, {"TensorFlow": "2.21.0"}, {"tpu": "a fallback"})


def test_markdown_round_trip_and_differences():
    matrix = _matrix("fails")
    text = ww.to_markdown(matrix)
    assert "TensorFlow 2.21.0" in text and "[keras#1](" in text and "d\\|x" in text
    assert ww.statuses_from_markdown(text) == matrix.statuses()
    assert matrix.count("n/a") == 1 and matrix.count("fails") == len(ALL_CELLS) - 1
    other = {**matrix.statuses(), ("trainer", "default"): "works"}
    assert ww.status_differences(matrix.statuses(), other) == [
        "`cu.Trainer` × default: fails → works"]
    with pytest.raises(ValueError, match="no what-works-where table"):
        ww.statuses_from_markdown("nothing")


def test_short_links_name_the_issue_or_the_page():
    assert table.short_link("https://github.com/keras-team/keras/issues/20585") == "keras#20585"
    assert table.short_link(cells.KNOWN_ISSUES[("jit_compile", "mirrored")]) == "XLA known issue"
    assert "prototype" in table.short_link(cells.KNOWN_ISSUES[("keras_distribution",
                                                                "default")])
    assert table.short_link(cells.FIRST_REPLICA_ONLY) == "first replica only"
    assert table.short_link(cells.OVERFLOW_NOT_PROBED) == "overflow not probed"
    assert table.short_link(cells.KNOWN_ISSUES[("remat_scope", "mirrored")]) == (
        "tf.custom_gradient")


def test_replace_between_markers(tmp_path):
    path = tmp_path / "README.md"
    start, end = table.README_MARKERS
    path.write_text(f"intro\n{start}\nold\n{end}\noutro\n")
    assert table.replace_between_markers(path, "new\n") is True
    assert path.read_text() == f"intro\n{start}\nnew\n{end}\noutro\n"
    assert table.replace_between_markers(path, "new") is False
    path.write_text("no markers")
    with pytest.raises(ValueError, match="lacks the markers"):
        table.replace_between_markers(path, "x")


def test_document_and_readme_section(tmp_path):
    document = ww.table_document(ww.to_markdown(_matrix()))
    assert document.startswith("# What works where\n")
    assert cli.readme_section(document) in document
    with pytest.raises(ValueError):
        cli.readme_section("no title")
    (tmp_path / "docs").mkdir()
    (tmp_path / cli.TABLE_PATH).write_text(document)
    (tmp_path / "sub").mkdir()
    assert ww.committed_table_path(tmp_path / "sub") == tmp_path / cli.TABLE_PATH
    assert ww.committed_table_path("/") is None


def test_the_readme_shows_the_committed_table_for_every_cell():
    document = (REPO / cli.TABLE_PATH).read_text(encoding="utf-8")
    start, end = table.README_MARKERS
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.split(start)[1].split(end)[0].strip() == cli.readme_section(document)
    assert set(ww.statuses_from_markdown(document)) == ALL_CELLS
    assert "TensorFlow 2." in document and "Keras 3." in document


def test_draw_works_where_colours_every_cell():
    import matplotlib

    matplotlib.use("Agg")
    from course_utils import plots

    statuses = {"a": {"x": "works", "y": "fails"}, "b": {"x": "wrong", "y": "n/a"}}
    ax = plots.draw_works_where(statuses)
    colours = [matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches]
    assert colours == [plots.STATUS_COLORS[s].lower() for s in ("works", "fails", "wrong", "n/a")]
    with pytest.raises(ValueError):
        plots.draw_works_where({"a": {"x": "maybe"}})
    with pytest.raises(ValueError):
        plots.draw_works_where({})


def test_command_line_refuses_unknown_options():
    with pytest.raises(SystemExit):
        cli.main(["--nope"])


def test_check_exits_1_naming_each_cell_whose_status_differs(monkeypatch, tmp_path, capsys):
    """``works-where --check`` against a committed table; the fresh run of the whole table is
    appendix A's own cell, which asserts agreement under nbval (``make nbval``)."""
    import course_utils.environment
    import course_utils.works_where.matrix

    fresh = _matrix("works")
    monkeypatch.setattr(course_utils.environment, "setup", lambda **kwargs: None)
    monkeypatch.setattr(course_utils.works_where.matrix, "run_matrix", lambda: fresh)
    (tmp_path / "docs").mkdir()
    (tmp_path / cli.TABLE_PATH).write_text(ww.table_document(ww.to_markdown(fresh)))
    assert cli.main(["--check", "--root", str(tmp_path)]) == 0
    assert "every cell's status agrees" in capsys.readouterr().out
    committed = _matrix("works")
    committed.cells["trainer"]["mirrored"] = ww.Cell("fails", "boom")
    (tmp_path / cli.TABLE_PATH).write_text(ww.table_document(ww.to_markdown(committed)))
    assert cli.main(["--check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.count("differs from") == 1 and "× Mirrored: fails → works" in out, out


def test_status_and_detail_rows_for_show_table():
    matrix = _matrix("works")
    matrix.cells["trainer"]["default"] = ww.Cell("fails", "boom")
    rows = ww.status_rows(matrix)
    assert [r["API"] for r in rows] == list(ww.APIS.values())
    assert rows[0][ww.STRATEGIES["default"]] == "✅ works (keras#1)"
    details = ww.detail_rows(matrix)  # every cell here has an issue, so all but none are kept
    assert {"API": ww.APIS["trainer"], "strategy": "default", "status": "fails",
            "detail": "boom", "issue": ""} in details
    plain = ww.Matrix({row: {c: ww.Cell("works", "ok") for c in ww.STRATEGIES}
                       for row in ww.APIS})
    assert ww.detail_rows(plain) == [] and len(ww.detail_rows(plain, everything=True)) == len(
        ALL_CELLS)
