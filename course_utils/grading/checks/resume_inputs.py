"""Lesson 03's exercise 3 in this process: the learner's ``restore_latest`` on fresh folders of
checkpoints, and the ``dataset_fn`` of its ``make_dataset_fn`` for fresh input contexts.

What the checkpoints hold is written by a function that returns nothing and read back only
after the learner's call, so no frame of the check holds it while the learner's code runs.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from course_utils.grading.checks.dataset_audit import COUNTED, dataset_auditor
from course_utils.quiet import import_tensorflow as _tf

__all__ = ["dataset_fn_problem", "max_difference", "restore_problem"]


def max_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """The largest absolute difference of two lists of arrays (inf when their shapes differ or
    a value is NaN: a NaN difference would compare False with every tolerance)."""
    if len(a) != len(b) or any(u.shape != v.shape for u, v in zip(a, b, strict=True)):
        return float("inf")
    return max(float(np.nan_to_num(np.abs(np.subtract(u, v, dtype="float64")), nan=np.inf).max())
               for u, v in zip(a, b, strict=True))


def _write_checkpoints(saved: tuple[Any, Any, Any], root: str, rng: Any) -> None:
    """Two checkpoints of fresh weights and counts in ``root``; the newest must win, and its
    name sorts before the other's (ckpt-23 before ckpt-7): sorting names does not find it."""
    tf = _tf()
    model, optimizer, done, checkpoint = saved
    manager = tf.train.CheckpointManager(checkpoint, root, max_to_keep=3)
    first = rng.randint(5, 9)   # then a number past 9 whose name sorts before it (ckpt-1x..)
    for number in (first, rng.randint(10, 10 * first - 1)):
        for variable in [*model.weights, *_optimizer_state(optimizer)]:
            variable.assign(np.random.default_rng(rng.randint(0, 2**31)).normal(
                size=variable.shape).astype("float32"))
        optimizer.iterations.assign(int(optimizer.iterations.numpy()) + rng.randint(5, 500))
        done.assign(int(done.numpy()) + rng.randint(50, 5000))
        manager.save(checkpoint_number=number)   # the name does not say examples_done


def _optimizer_state(optimizer: Any) -> list[Any]:
    """The optimizer's slots (its momentum per weight), not its step count or learning rate."""
    return [v for v in optimizer.variables
            if v.path.split("/")[-1] not in ("iteration", "iterations", "learning_rate")]


def _state(optimizer: Any) -> list[np.ndarray]:
    return [np.asarray(optimizer.iterations.numpy()),
            *(np.asarray(v.numpy()) for v in _optimizer_state(optimizer))]


def _as_count(got: Any) -> Any:
    """A scalar integer tensor or variable (``examples_done`` itself, restored) as an int."""
    dtype = getattr(got, "dtype", None)
    if hasattr(got, "numpy") and getattr(got, "shape", None) == () and getattr(
            dtype, "is_integer", False):
        return int(got.numpy())
    return got


def restore_problem(restore_latest: Any, rng: Any) -> str | None:
    """Run ``restore_latest`` here on a fresh folder of checkpoints (and on an empty one)."""
    tf = _tf()
    import keras

    features, units = rng.randint(3, 6), rng.randint(2, 5)

    def fresh() -> tuple[Any, Any, Any, Any]:
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(units)])
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)   # a state that moves the weights
        optimizer.build(model.trainable_variables)
        done = tf.Variable(0, dtype=tf.int64)
        return model, optimizer, done, tf.train.Checkpoint(model=model, optimizer=optimizer,
                                                           examples_done=done)

    with tempfile.TemporaryDirectory(prefix="lesson03_restore_") as root:
        empty = Path(root) / "empty"
        empty.mkdir()
        model, optimizer, done, checkpoint = fresh()
        before = model.get_weights()
        got = _as_count(restore_latest(checkpoint, str(empty), done))
        if got != 0 or max_difference(model.get_weights(), before) > 0:
            return ("with no checkpoint in checkpoint_dir, return 0 and restore nothing (got "
                    f"{got!r})")
        _write_checkpoints(fresh(), root, rng)
        model, optimizer, done, checkpoint = fresh()
        got = _as_count(restore_latest(checkpoint, root, done))
        newest = fresh()                       # read back only now: never in reach before
        newest[3].restore(tf.train.latest_checkpoint(root)).expect_partial()
        expected = int(newest[2].numpy())
        if not isinstance(got, (int, np.integer)) or int(got) != expected:
            return (f"the newest checkpoint holds examples_done = {expected}; restore_latest "
                    f"returned {got!r}: restore it, then return examples_done")
        if max_difference(model.get_weights(), newest[0].get_weights()) > 1e-7:
            return "restore_latest returned the count but did not restore the newest model"
        if max_difference(_state(optimizer), _state(newest[1])) > 1e-7:
            got_steps, saved_steps = (int(o.iterations.numpy()) for o in (optimizer, newest[1]))
            what = (f"its step count is {got_steps}, not {saved_steps}"
                    if got_steps != saved_steps else "its momentum differs")
            return ("restore_latest restored the model but not the optimizer of the newest "
                    f"checkpoint ({what}): restore the whole checkpoint it was given, so that "
                    "training resumes where it stopped")
    return None


def _audit(tf: Any, share: int, arrays: tuple[Any, ...]) -> Any:
    """Put the audit of every tf.data dataset made from now on in place
    (:func:`~course_utils.grading.checks.dataset_audit.dataset_auditor`, given ``arrays``, the
    data handed to the learner); return ``finish``, which puts the original back and returns
    ``recorded``, a function giving a copy of what the audit recorded so far (its probes go on
    recording while the datasets run), or None when the audit was taken out meanwhile (a
    second call, or ``Dataset.__init__`` replaced). The original, the audit and its records
    live only in closures: no frame of the check holds them while the learner's code runs (a
    caller's locals are in reach of ``inspect.getargvalues``)."""
    original = tf.data.Dataset.__init__
    init, sizes = dataset_auditor(tf, np, share, arrays, original)
    tf.data.Dataset.__init__, calls = init, []

    def finish() -> Any:
        calls.append(tf.data.Dataset.__init__ is init)
        tf.data.Dataset.__init__ = original
        return (lambda: list(sizes)) if calls == [True] else None

    return finish


def _with_batch_sizes(build: Any, share: int, arrays: tuple[Any, ...]) -> tuple[Any, Any]:
    """``build()``'s dataset and a function giving what every tf.data dataset made meanwhile
    batched, so far (None: the learner's code took the audit out, see :func:`_audit`)."""
    finish = _audit(_tf(), share, arrays)
    try:
        dataset = build()
    finally:
        recorded = finish()
    return dataset, recorded


_BATCHING = ("Batch", "Window")   # the kinds of tf.data ops that put elements together
_SIZES = ("batch_size", "batch_sizes", "size", "window_size")   # their inputs saying how many


def _graph_batches(tf: Any, dataset: Any, width: int) -> list[int]:
    """The examples each batching op in ``dataset``'s serialized graph puts together (made by
    any API, ``tf.raw_ops`` included, in its functions too): the dimensions of its output
    shapes before a row of ``width`` values (the first alone for other parts), or its constant
    size input (``batch_size``, a window's ``size``...) where larger, read through ``Identity``
    and ``Cast`` and from a function's captured arguments to what its caller passes; -1 where
    either is not known (a size computed, whatever output shapes the op declares: as the audit
    counts a size not known when the op was made)."""
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(tf.raw_ops.DatasetToGraphV2(
        input_dataset=tf.data.experimental.to_variant(dataset),
        external_state_policy=1).numpy())
    groups = {"": graph.node, **{f.signature.name: f.node_def for f in graph.library.function}}
    names = {name: {node.name: node for node in group} for name, group in groups.items()}
    args = {f.signature.name: [arg.name for arg in f.signature.input_arg]
            for f in graph.library.function}
    passed: dict[tuple[str, str], list[tuple[str, str]]] = {}   # (function, arg): its callers'
    for where, group in groups.items():
        for node in group:
            for attr, value in node.attr.items():
                function = value.func.name if value.HasField("func") else ""
                if function not in args:
                    continue          # its captured arguments come last (a call's: all)
                inputs = _inputs(node)
                given = inputs.get(f"{attr}_other_arguments", inputs.get(
                    "other_arguments", inputs.get("args", [])))[:len(args[function])]
                for arg, name in zip(args[function][len(args[function]) - len(given):], given,
                                     strict=True):
                    passed.setdefault((function, arg), []).append((where, name))

    def known(where: str, name: str, depth: int = 0) -> Any:
        """The constant value of input ``name`` in function ``where`` ("": the graph), or None."""
        node = names[where].get(name.split(":")[0])
        if depth > 16:
            return None
        if node is None:      # a function's argument: what every caller passes, if one value
            values = {known(*caller, depth + 1) for caller in passed.get((where, name), [])}
            return values.pop() if len(values) == 1 else None
        if node.op == "Const":
            return int(np.max(tf.make_ndarray(node.attr["value"].tensor)))
        return known(where, node.input[0], depth + 1) if node.op in ("Identity", "Cast") else None

    found = []
    for where, group in groups.items():
        for node in group:
            if "Dataset" not in node.op or not any(k in node.op for k in _BATCHING) or (
                    "Unbatch" in node.op or "GroupByWindow" in node.op):
                continue      # a group's window: its reduce function's batches are read
            counts = []
            for shape in node.attr["output_shapes"].list.shape:
                dims = [d.size for d in shape.dim]
                lead = dims[:-1] if len(dims) >= 2 and dims[-1] == width else dims[:1]
                counts.append(-1 if any(d < 0 for d in lead) else int(np.prod(lead or [0])))
            sizes = [known(where, name) for arg, given in _inputs(node).items()
                     if arg in _SIZES for name in given]
            found.append(-1 if None in sizes else max(counts + sizes, default=-1))
    return found


def _inputs(node: Any) -> dict[str, list[str]]:
    """The inputs of graph ``node`` by the names its op gives them (a list each)."""
    from tensorflow.python.framework import op_def_registry

    op_def, index, named = op_def_registry.get(node.op), 0, {}
    for arg in op_def.input_arg if op_def is not None else []:
        count = (node.attr[arg.number_attr].i if arg.number_attr else len(
            node.attr[arg.type_list_attr].list.type) if arg.type_list_attr else 1)
        named[arg.name] = list(node.input[index:index + count])
        index += count
    return named


def _one_shard_per_pipeline(batches: list, pipelines: int, pipeline: int) -> str | None:
    """Within one pass of the data (until a label falls back), a pipeline that reads its own
    shard reads one residue class of the examples mod the number of pipelines (which class
    does not matter: skip then shard and shard then skip both fit)."""
    labels = [int(label) for _, batch_labels in batches for label in batch_labels]
    first_pass = labels[:1]
    for label in labels[1:]:
        if label < first_pass[-1]:
            break
        first_pass.append(label)
    classes = sorted({label % pipelines for label in first_pass})
    if len(classes) < 2:
        return None
    return (f"pipeline {pipeline} read examples {first_pass[:6]} in one pass of the data, "
            f"{len(classes)} residue classes mod {pipelines}: each pipeline should read only "
            f"its own shard, every {pipelines}-th example (skip then shard, or shard then skip "
            "its own trained rows), not read and "
            "batch every row and keep every few batches")


def dataset_fn_problem(make_dataset_fn: Any, rng: Any) -> str | None:
    """Call the learner's ``dataset_fn`` for fresh input contexts; check the steps of as many
    passes as there are pipelines, and one more."""
    tf = _tf()
    layouts = [1, 2, rng.choice([1, 2])]   # replicas per pipeline: both, every time
    rng.shuffle(layouts)
    for case, per in enumerate(tuple(layouts)):   # a list emptied meanwhile ends no loop
        pipelines = rng.choice([2, 3, 4])
        replicas = pipelines * per
        replica_batch = rng.randint(2, 4)
        global_batch = replicas * replica_batch
        size = global_batch * rng.randint(4, 7) + rng.randint(1, global_batch - 1)
        # in the second pass, before its last global batch (a skip short by a whole pass
        # would train the same examples); once, the end of the data falls within the first two
        # steps checked: the data repeats from its first example, not from where the job resumed
        second = [e for e in range(size, 2 * size - global_batch) if e % pipelines]
        wraps = [e for e in second if size - 2 * global_batch < e % size]
        done = rng.choice(wraps if case == 0 and wraps else second)
        ids = np.arange(size)
        x = np.random.default_rng(rng.randint(0, 2**31)).normal(size=(size, 3)).astype("float32")
        dataset_fn, made = _with_batch_sizes(
            lambda: make_dataset_fn(x, ids, global_batch, done),  # noqa: B023
            replica_batch, (x, ids))   # datasets made before dataset_fn runs: audited too
        ahead = pipelines * size // global_batch + 2  # as many passes as pipelines, and a step
        trained: list[list[int]] = [[] for _ in range(ahead)]
        for pipeline in range(pipelines):
            context = tf.distribute.InputContext(num_input_pipelines=pipelines,
                                                 input_pipeline_id=pipeline,
                                                 num_replicas_in_sync=replicas)
            dataset, recorded = _with_batch_sizes(lambda: dataset_fn(context),  # noqa: B023
                                                  replica_batch, (x, ids))
            batches = list(dataset.take(ahead * per).as_numpy_iterator())
            sizes = (recorded() + made() if recorded is not None and made is not None
                     else None)
            where = (f"{pipelines} input pipelines feeding {per} replica(s) each, global batch "
                     f"{global_batch}, resumed at example {done}")
            if len(batches) != ahead * per or any(len(b[1]) != replica_batch for b in batches):
                return (f"{where}: pipeline {pipeline} must give {ahead * per} per-replica "
                        f"batches of {replica_batch} for {ahead} steps, got {len(batches)} of "
                        f"sizes {[len(b[1]) for b in batches]}")
            if sizes is None:
                return (f"{where}: pipeline {pipeline}'s dataset_fn took out the check's "
                        "audit of its datasets (tf.data.Dataset.__init__): build the "
                        "pipeline, leave tf.data's classes as they are")
            if sizes is not None:   # what the pipeline's graph batches, however it was made
                sizes += [n for n in _graph_batches(tf, dataset, x.shape[1])
                          if not 0 <= n <= replica_batch]
            if any(size < 0 or size > replica_batch for size in sizes):
                return (f"{where}: pipeline {pipeline} batched {sizes[:4]} examples at a time "
                        f"({COUNTED}): each pipeline should read only its own shard of the "
                        f"data, batched by the per-replica batch of {replica_batch} (skip then "
                        "shard, or shard then skip), not whole global batches to slice its rows")
            for index, (features, labels) in enumerate(batches):
                if not np.array_equal(features, x[labels]):
                    return f"{where}: the features no longer match their labels"
                trained[index // per] += [int(label) for label in labels]
            shard_problem = _one_shard_per_pipeline(batches, pipelines, pipeline)
            if shard_problem:
                return f"{where}: {shard_problem}"
        for step, got in enumerate(trained):
            due = sorted(((done + step * global_batch + np.arange(global_batch)) % size).tolist())
            if sorted(got) != due:
                extra = sorted(set(got) - set(due))[:4]
                missing = sorted(set(due) - set(got))[:4]
                return (f"{where}: step {step + 1} after the restart trained examples it should "
                        f"not ({extra}) or missed some ({missing}); {len(due)} were due from "
                        f"example {(done + step * global_batch) % size}")
    return None
