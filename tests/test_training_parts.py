"""Unit tests of the modules inside course_utils.training, one section per module.

The Trainer as a whole is proved in tests/test_training.py; here each part is checked alone.
Only the default strategy and the cached MirroredStrategy over the 4 logical CPUs are used
(see tests/test_training.py). ``CoordinatorLoop`` needs a parameter-server cluster: it runs in
tests/test_training.py's subprocess test.
"""

from __future__ import annotations

import ast
import json
import re
import types
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from course_utils.strategies import make_strategy
from course_utils.training import accumulation, batches, precision, progress
from course_utils.training.checkpoints import Checkpoints, is_chief
from course_utils.training.evaluation import make_eval_function
from course_utils.training.metrics import LossTotals, copy_metric, epoch_logs, reset_metrics
from course_utils.training.parameter_server import (
    UnsupportedByKeras3Error,
    is_parameter_server,
    make_worker_function,
    refuse_variable_partitioner,
)
from course_utils.training.replica_step import (
    count_examples,
    make_replica_step,
    make_train_function,
    per_example_loss,
    regularization_loss,
)

PACKAGE = Path(__file__).resolve().parents[1] / "course_utils" / "training"


def mirrored4() -> tf.distribute.Strategy:
    return make_strategy("mirrored", num_replicas=4, verbose=False)


def default() -> tf.distribute.Strategy:
    return tf.distribute.get_strategy()


def loss_fn(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def tiny_data(n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)).astype("float32"), rng.integers(0, 2, size=n).astype("int32")


def tiny_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


# ---------------------------------------------------------------------- the package's shape
def _imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    prefix = "course_utils.training."
    return {name[len(prefix) :] for name in names if name.startswith(prefix)}


def test_training_modules_import_downward_without_a_circle():
    graph = {p.stem: _imports_of(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert not any("trainer" in imports for imports in graph.values())  # trainer is the top
    visiting, done = set(), set()

    def visit(module: str) -> None:
        assert module not in visiting, f"import circle through {module}"
        if module in done:
            return
        visiting.add(module)
        for imported in graph[module]:
            visit(imported)
        visiting.discard(module)
        done.add(module)

    for module in graph:
        visit(module)


# ---------------------------------------------------------------------- batches
def test_unpack_batch_gives_x_y_and_an_optional_sample_weight():
    assert batches.unpack_batch((1, 2)) == (1, 2, None)
    assert batches.unpack_batch([1, 2, 3]) == (1, 2, 3)
    with pytest.raises(ValueError, match="tuple"):
        batches.unpack_batch({"x": 1})
    with pytest.raises(ValueError, match="4 parts"):
        batches.unpack_batch((1, 2, 3, 4))


def test_batch_sizes_read_the_first_tensor_of_a_structure():
    structure = {"a": tf.zeros([5, 2]), "b": tf.zeros([5])}
    assert int(batches.batch_size(structure)) == 5
    assert batches.static_batch_size(structure) == 5
    spec = tf.TensorSpec([None, 2])
    traced = tf.function(lambda t: tf.constant(batches.static_batch_size(t) is None))
    assert bool(traced.get_concrete_function(spec)(tf.zeros([3, 2])))


def test_concat_batches_joins_along_the_batch_axis():
    joined = batches.concat_batches([{"y": tf.zeros([2, 1])}, {"y": tf.ones([3, 1])}])
    assert joined["y"].shape == (5, 1) and float(tf.reduce_sum(joined["y"])) == 3.0


def test_element_spec_of_a_dataset_and_of_a_dataset_function():
    data = tf.data.Dataset.from_tensor_slices(tiny_data()).batch(4)
    assert batches.element_spec(data) == data.element_spec
    assert batches.element_spec(lambda context: data) == data.element_spec
    with pytest.raises(ValueError, match="tf.data.Dataset"):
        batches.element_spec([1, 2])


def test_distribute_splits_global_batches_over_the_replicas():
    data = tf.data.Dataset.from_tensor_slices(tiny_data()).batch(8)
    features, _ = next(iter(batches.distribute(mirrored4(), data)))
    assert [int(t.shape[0]) for t in features.values] == [2, 2, 2, 2]
    per_replica = batches.distribute(mirrored4(), lambda context: data.rebatch(2))
    assert len(next(iter(per_replica))[0].values) == 4


def test_count_steps_takes_the_length_or_asks_for_steps_per_epoch():
    data = tf.data.Dataset.from_tensor_slices(tiny_data()).batch(3)
    assert batches.count_steps(data, None) == 3
    assert batches.count_steps(data.repeat(), 7) == 7
    for bad, message in [
        ((data.repeat(), None), "repeats forever"),
        ((data.filter(lambda x, y: True), None), "unknown"),
        ((data.take(0), None), "empty"),
        ((lambda context: data, None), "dataset function"),
        ((data, 0), "positive integer"),
    ]:
        with pytest.raises(ValueError, match=message):
            batches.count_steps(*bad)
    with pytest.raises(ValueError, match="parameter-server"):
        batches.count_steps(data, None, on_parameter_servers=True)


# ---------------------------------------------------------------------- accumulation
def test_skip_read_batches_resumes_where_an_uninterrupted_iterator_is():
    strategy, global_batch, start_step = mirrored4(), 8, 3
    whole = tf.data.Dataset.range(64).batch(global_batch)  # a dataset of global batches

    def dataset_fn(context):  # numbered examples, per-replica batches
        return tf.data.Dataset.range(64).batch(context.get_per_replica_batch_size(global_batch))

    def local(batch):
        return [part.numpy().tolist() for part in strategy.experimental_local_results(batch)]

    fresh = iter(())
    assert batches.skip_read_batches(fresh, 0) is fresh  # a run from step 0 reads nothing
    for data in (whole, dataset_fn):
        uninterrupted = iter(batches.distribute(strategy, data))
        for _ in range(start_step):
            next(uninterrupted)
        resumed = batches.skip_read_batches(iter(batches.distribute(strategy, data)), start_step)
        first = local(next(resumed))
        assert first == local(next(uninterrupted)) and first[0][0] == start_step * global_batch
        assert local(next(resumed)) == local(next(uninterrupted))


def test_split_into_calls_groups_updates_and_keeps_a_short_last_group():
    assert accumulation.split_into_calls(16, 2, 3) == [(2, 3), (2, 3), (2, 2)]
    assert accumulation.split_into_calls(10, 4, 1) == [(4, 1), (4, 1), (2, 1)]
    assert accumulation.split_into_calls(3, 1, 8) == [(1, 3)]


def test_add_gradients_sums_and_keeps_variables_without_gradient():
    total = accumulation.add_gradients([None, None, None], [tf.constant(1.0), None, None])
    total = accumulation.add_gradients(total, [tf.constant(2.0), tf.constant(5.0), None])
    assert float(total[0]) == 3.0 and float(total[1]) == 5.0 and total[2] is None


# ---------------------------------------------------------------------- precision
def test_check_policy_accepts_the_known_policies_only():
    assert precision.check_policy("float32") is None
    assert precision.check_policy(None) is None
    assert precision.check_policy("mixed_bfloat16") == "mixed_bfloat16"
    with pytest.raises(ValueError, match="precision policy"):
        precision.check_policy("float8")


def test_policy_scope_restores_the_global_policy_even_after_an_error():
    before = keras.config.dtype_policy().name
    with pytest.raises(RuntimeError):
        with precision.policy_scope("mixed_float16"):
            assert keras.config.dtype_policy().name == "mixed_float16"
            raise RuntimeError("inside")
    assert keras.config.dtype_policy().name == before
    with precision.policy_scope(None):
        assert keras.config.dtype_policy().name == before


def test_loss_scaling_only_for_float16_and_never_twice():
    sgd = keras.optimizers.SGD(0.1)
    assert precision.with_loss_scaling(sgd, "mixed_bfloat16") is sgd
    scaled = precision.with_loss_scaling(sgd, "mixed_float16")
    scaled.build([tf.Variable(1.0)])
    assert precision.uses_loss_scaling(scaled) and not precision.uses_loss_scaling(sgd)
    assert precision.with_loss_scaling(scaled, "mixed_float16") is scaled
    loss = tf.constant(2.0)
    assert float(precision.scale_loss(sgd, loss)) == 2.0
    assert float(precision.scale_loss(scaled, loss)) == 2.0 * float(scaled.dynamic_scale)


def test_to_float32_casts_every_tensor_of_a_structure():
    cast = precision.to_float32({"a": tf.ones([2], tf.float16), "b": [tf.ones([1], tf.bfloat16)]})
    assert cast["a"].dtype == tf.float32 and cast["b"][0].dtype == tf.float32


def test_one_replica_with_an_inf_poisons_the_gradients_of_every_replica():
    strategy = mirrored4()

    def replica(bad_replica: int) -> list[tf.Tensor]:
        context = tf.distribute.get_replica_context()
        value = tf.where(context.replica_id_in_sync_group == bad_replica, np.inf, 1.0)
        grads = [None, tf.fill([2], value), tf.ones([3])]
        return precision.skip_everywhere_if_not_finite(context, grads)[1:]

    for bad_replica, poisoned in [(3, True), (-1, False)]:
        results = strategy.run(tf.function(replica), args=(bad_replica,))
        firsts = strategy.experimental_local_results(results[0])
        seconds = strategy.experimental_local_results(results[1])
        assert all(bool(np.all(np.isnan(g.numpy()))) == poisoned for g in firsts)
        assert all(np.all(g.numpy() == 1.0) for g in seconds)  # only the first is poisoned


# ---------------------------------------------------------------------- metrics
def test_copy_metric_gives_fresh_metrics_of_the_same_kind():
    used = keras.metrics.SparseCategoricalAccuracy("acc")
    used.update_state([1], [[0.0, 1.0]])
    fresh = copy_metric(used)
    assert fresh is not used and fresh.name == "acc" and float(fresh.result()) == 0.0
    accuracy = copy_metric("accuracy")
    accuracy.update_state(tf.constant([1, 0]), tf.constant([[0.1, 0.9], [0.2, 0.8]]))
    assert float(accuracy.result()) == 0.5  # sparse labels recognised from the shapes
    assert isinstance(copy_metric("mae"), keras.metrics.MeanAbsoluteError)

    def hits(labels: tf.Tensor, predictions: tf.Tensor) -> tf.Tensor:
        return tf.cast(labels == predictions, tf.float32)

    wrapped = copy_metric(hits)
    wrapped.update_state(tf.constant([1.0, 2.0]), tf.constant([1.0, 0.0]))
    assert wrapped.name == "hits" and float(wrapped.result()) == 0.5
    with pytest.raises(ValueError, match="metrics must be"):
        copy_metric(3)


def test_epoch_logs_and_reset_metrics():
    metric = keras.metrics.Mean("m")
    metric.update_state([2.0, 4.0])
    assert epoch_logs(0.5, [metric]) == {"loss": 0.5, "m": 3.0}
    reset_metrics([metric])
    assert float(metric.result()) == 0.0


def test_loss_totals_sum_over_replicas_into_the_mean_per_example():
    strategy = mirrored4()
    with strategy.scope():
        totals = LossTotals()
    assert totals.mean() == 0.0

    @tf.function
    def add() -> None:
        # Every replica adds a summed loss of 2 over 1 example: 8 over 4 examples in all.
        strategy.run(lambda: totals.add(tf.constant(2.0), tf.constant(1.0)))

    add()
    assert totals.mean() == pytest.approx(2.0)
    totals.reset()
    assert totals.mean() == 0.0


# ---------------------------------------------------------------------- progress
def test_progress_bar_and_epoch_report_follow_verbose(capsys):
    assert progress.in_notebook() is False  # pytest is not a Jupyter kernel
    assert progress.check_verbose(2) == 2
    with pytest.raises(ValueError, match="verbose"):
        progress.check_verbose(3)
    assert progress.progress_bar(0, 10, 0, 2) is None
    assert progress.progress_bar("auto", 10, 0, 2) is None  # not in a notebook
    bar = progress.progress_bar(1, 10, 0, 2)
    bar.update(10)
    progress.report_epoch(bar, {"loss": 0.25}, 0, 2, 1)
    assert bar.disable or bar.n == 10
    progress.report_epoch(None, {"loss": 0.25, "acc": 0.5}, 1, 2, 2)
    assert "epoch 2/2 - loss: 0.2500 - acc: 0.5000" in capsys.readouterr().out


# ---------------------------------------------------------------------- checkpoints
def test_is_chief_for_single_processes_chiefs_and_worker_zero():
    assert is_chief(default())

    def strategy_of(cluster: dict, task_type: str, task_id: int) -> types.SimpleNamespace:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id
        )
        return types.SimpleNamespace(cluster_resolver=resolver)

    workers = {"worker": ["localhost:1", "localhost:2"]}
    assert is_chief(strategy_of(workers, "worker", 0))
    assert not is_chief(strategy_of(workers, "worker", 1))
    with_chief = {"chief": ["localhost:3"], **workers}
    assert is_chief(strategy_of(with_chief, "chief", 0))
    assert not is_chief(strategy_of(with_chief, "worker", 0))


def test_checkpoints_save_restore_and_resume_only_an_unfinished_run(tmp_path):
    model, optimizer = tiny_model(), keras.optimizers.SGD(0.1)
    checkpoints = Checkpoints(str(tmp_path), model, optimizer, max_to_keep=2)
    saved_weights = model.get_weights()
    assert checkpoints.latest() is None and checkpoints.resume_step() is None
    path = checkpoints.save(run_step=3)
    assert checkpoints.latest() == path
    model.set_weights([w + 1.0 for w in saved_weights])
    assert checkpoints.resume_step() == 3  # unfinished: restored
    np.testing.assert_array_equal(model.get_weights()[0], saved_weights[0])
    checkpoints.save(run_step=5, completed=True)
    assert checkpoints.resume_step() is None  # finished: a new run starts
    assert checkpoints.restore() == 5
    assert len(list(tmp_path.glob("ckpt-*.index"))) == 2  # max_to_keep


def test_a_non_chief_takes_part_in_a_save_but_keeps_no_file(tmp_path):
    checkpoints = Checkpoints(
        str(tmp_path), tiny_model(), keras.optimizers.SGD(0.1), chief=False
    )
    assert checkpoints.save(run_step=1) is None
    assert list(tmp_path.iterdir()) == []
    assert Checkpoints(None, tiny_model(), keras.optimizers.SGD(0.1)).save(1) is None


# ---------------------------------------------------------------------- parameter servers
def test_parameter_server_checks_on_other_strategies():
    assert not is_parameter_server(default()) and not is_parameter_server(mirrored4())
    refuse_variable_partitioner(default())  # nothing to refuse
    assert issubclass(UnsupportedByKeras3Error, NotImplementedError)


def test_worker_function_returns_the_loss_and_the_examples_of_its_steps():
    x, y = tiny_data(8)
    model, optimizer = tiny_model(), keras.optimizers.SGD(0.0)
    optimizer.build(model.trainable_variables)
    step = make_replica_step(model, optimizer, loss_fn, [], None, 1, on_parameter_servers=True)
    worker = make_worker_function(default(), step, num_micro_batches=2, num_updates=2)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
    loss_sum, count, labels, predictions = worker(iter(data))
    assert float(count) == 8 and labels.shape == (8,) and predictions.shape == (8, 2)
    np.testing.assert_array_equal(labels.numpy(), y)
    expected = float(np.sum(loss_fn(y, model(x)).numpy()))
    assert float(loss_sum) == pytest.approx(expected, rel=1e-5)


# ---------------------------------------------------------------------- the replica step
def test_per_example_loss_averages_extra_axes_and_applies_weights():
    labels = tf.constant([[1.0, 1.0], [0.0, 0.0]])
    predictions = tf.constant([[0.0, 2.0], [0.0, 0.0]], tf.float16)
    squared = lambda y, p: tf.square(y - p)  # shape [batch, 2]
    np.testing.assert_allclose(per_example_loss(squared, labels, predictions, None), [1.0, 0.0])
    weighted = per_example_loss(squared, labels, predictions, tf.constant([3.0, 1.0]))
    np.testing.assert_allclose(weighted, [3.0, 0.0])
    with pytest.raises(ValueError, match="per-example"):
        per_example_loss(lambda y, p: tf.reduce_mean(y), labels, predictions, None)


def test_regularization_loss_is_shared_by_replicas_and_micro_batches():
    losses = [tf.constant(4.0), tf.constant(2.0)]
    assert float(regularization_loss(losses, 3)) == pytest.approx(2.0)
    per_replica = mirrored4().run(tf.function(lambda: regularization_loss(losses, 2)))
    values = mirrored4().experimental_local_results(per_replica)
    assert [float(v) for v in values] == pytest.approx([0.75] * 4)


def test_count_examples_counts_the_real_global_batch():
    strategy = mirrored4()
    x, y = tiny_data(10)

    def count(data: tf.data.Dataset) -> tuple[list[int], list[int]]:
        @tf.function
        def run(iterator: tf.distribute.DistributedIterator) -> tuple[tf.Tensor, tf.Tensor]:
            _, labels = next(iterator)  # inside the function, as in the Trainer
            return strategy.run(lambda y: count_examples([y, y], 4), args=(labels,))

        here, total = run(iter(strategy.experimental_distribute_dataset(data)))
        results = strategy.experimental_local_results
        return [int(v) for v in results(here)], [int(v) for v in results(total)]

    # 10 examples on 4 replicas: the shapes are unknown, the count is all-reduced.
    here, total = count(tf.data.Dataset.from_tensor_slices((x, y)).batch(10))
    assert sum(here) == 20 and total == [20] * 4  # two micro-batches of 10
    # drop_remainder: static shapes, 2 per replica, no all-reduce needed.
    here, total = count(tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True))
    assert here == [4] * 4 and total == [16] * 4
    assert [int(v) for v in count_examples([tf.zeros([3])], 4, True)] == [3, 3]


def test_one_replica_step_is_the_hand_written_sgd_step():
    x, y = tiny_data(8)
    reference = tiny_model()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_fn(y, reference(x)))
    gradients = tape.gradient(loss, reference.trainable_variables)
    expected = [w - 0.1 * g for w, g in zip(reference.get_weights(), gradients, strict=True)]

    strategy = mirrored4()
    with strategy.scope():
        model, optimizer, totals = tiny_model(), keras.optimizers.SGD(0.1), LossTotals()
        optimizer.build(model.trainable_variables)
    step = make_replica_step(model, optimizer, loss_fn, [], totals, num_replicas=4)
    train = make_train_function(strategy, step, num_micro_batches=2)  # 2 x 4: one update
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    train(iter(strategy.experimental_distribute_dataset(data)), tf.constant(1))
    for got, want in zip(model.get_weights(), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert totals.mean() == pytest.approx(float(loss), rel=1e-5)


def test_eval_function_reports_the_mean_loss_and_metrics_without_updates():
    x, y = tiny_data(8)
    strategy = mirrored4()
    with strategy.scope():
        model, totals = tiny_model(), LossTotals()
        accuracy = keras.metrics.SparseCategoricalAccuracy()
    before = model.get_weights()
    evaluate = make_eval_function(strategy, model, loss_fn, [accuracy], totals)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    evaluate(iter(strategy.experimental_distribute_dataset(data)), tf.constant(2))
    logits = model(x).numpy()
    assert totals.mean() == pytest.approx(float(np.mean(loss_fn(y, logits))), rel=1e-5)
    assert float(accuracy.result()) == pytest.approx(np.mean(logits.argmax(1) == y))
    np.testing.assert_array_equal(model.get_weights()[0], before[0])


def test_the_replica_step_docstring_points_at_the_loop_in_lesson_02():
    # The docstring tells a learner where lesson 02 writes the loop by hand: keep it true.
    from course_utils.training import replica_step

    number = re.search(r"section (\d+), ``make_distributed_train_step``",
                       replica_step.__doc__).group(1)
    lesson = json.loads((PACKAGE.parents[1] / "notebooks/02_mirrored_strategy.ipynb").read_text())
    cells = ["".join(cell["source"]) for cell in lesson["cells"]]
    start = next(i for i, s in enumerate(cells) if s.startswith(f"## {number}. "))
    end = next(i for i, s in enumerate(cells[start + 1:], start + 1) if s.startswith("## "))
    section = "\n".join(cells[start:end])
    assert "def make_distributed_train_step" in section
    assert "per_example_loss(labels, logits)" in section
