"""The worker scripts lesson 03's checks run, built around the learner's own functions.

A learner writes a function in a notebook; the check copies its source into a worker script
(after a set-up that parses the flags and defines ``build_model``), runs the script on a real
localhost cluster, and compares what the workers wrote with :func:`reference_weights`, the same
training on one device in this process.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import threading
from typing import Any

__all__ = [
    "BROKEN_TRAIN_WORKER",
    "LEARNING_RATE",
    "SETUP",
    "function_source",
    "is_stub",
    "parse_python",
    "resume_script",
    "train_worker_script",
]

#: The learning rate of every exercise job (plain SGD), as ``SETUP`` writes it.
LEARNING_RATE = 0.1

#: What every exercise worker runs before the learner's code: its flags, ``build_model`` (seeded
#: differently on every worker, so that only the strategy's broadcast makes the initial weights
#: equal; it records the strategy it was built under and its replica count; a weightless layer
#: records, in each forward pass, the examples it carried, after how many backward passes, and
#: each row's hidden units projected on sqrt(1 … 8) (:func:`.worker_evaluation.row_prints`),
#: and in each backward pass the examples and the replica context it ran in),
#: an audit of ``CheckpointManager.save`` (where each worker saved, the prefix each save wrote
#: and its variables' shapes and sums, after how many backward passes, which folders of its
#: earlier saves were still there then and in each backward pass), of ``tf.train.Checkpoint``'s
#: ``write`` and ``save``, and of every tf.data dataset the worker makes (the batch or window
#: sizes of its batching ops, whatever tf.data method made them, and any element holding more
#: rows than a replica's share: :func:`~course_utils.grading.checks.dataset_audit.dataset_auditor`,
#: given this worker's copy of the data, bound by ``_set_up``).
#: The audit is held in the closures of ``_set_up``, out of reach of the learner's code by
#: name (no global holds it), with every function it calls bound before that code runs; it
#: is written at the end with a secret the check left for this worker and ``_set_up`` read
#: and deleted first, so that a file the learner's code writes is not taken for it. Given
#: ``--data`` with ``{task}``, ``_set_up`` reads this worker's own copy of the data (its shard,
#: the other rows decoys), deletes it, waits until no worker's copy is left, and hands the
#: learner's function that copy as a file with no name in any folder; first it makes the
#: worker not dumpable, so that a peer of the same user cannot read that file through
#: ``/proc/PEER/fd`` (nor ``/proc/PEER/mem``): only a grader running as root still can.
SETUP = """\"\"\"An exercise worker of lesson 03: the check's set-up, then your code.\"\"\"
import argparse, ctypes, io, json, os, tempfile, time
import keras
import numpy as np
import tensorflow as tf

_parser = argparse.ArgumentParser()
for _flag in ("--data", "--checkpoint-dir", "--out"):
    _parser.add_argument(_flag, required=True)
for _flag in ("--steps", "--global-batch", "--save-every", "--seed", "--classes"):
    _parser.add_argument(_flag, type=int, required=True)
_parser.add_argument("--step-delay", type=float, default=0.0)
_args = _parser.parse_args()
_task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
_workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
os.makedirs(_args.out, exist_ok=True)
LEARNING_RATE = 0.1


def _set_up(out, task, workers, share, data, seed, classes):
    \"\"\"build_model, the audit of this worker (see the check) in closures, and its data.\"\"\"
    if hasattr(os, "memfd_create"):   # Linux: no other process of this user (a peer worker)
        try:                          # may read this one's /proc files (fd, mem) from now on
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE, 0
        except (OSError, AttributeError):
            pass
    built, saves, saved_after, rows, contexts, left, lingering, written, writes, held, forward = (
        [] for _ in range(11))
    exists, abspath, join, write, close, exit_now = (
        os.path.exists, os.path.abspath, os.path.join, os.write, os.close, os._exit)
    replica_context, dependencies = tf.distribute.get_replica_context, tf.control_dependencies
    shape_of, py_function, identity = tf.shape, tf.py_function, tf.identity
    savez, dumps, sort, open_file, load = np.savez, json.dumps, sorted, os.open, np.load
    get_strategy, to_float, kind = tf.distribute.get_strategy, float, type
    as_array, square_root, numbers = np.asarray, np.sqrt, np.arange
    from course_utils.grading.checks.dataset_audit import dataset_auditor   # the check's audit
    multi_worker = tf.distribute.MultiWorkerMirroredStrategy
    set_seed, sequential, layer_input, dense = (keras.utils.set_random_seed, keras.Sequential,
                                                keras.Input, keras.layers.Dense)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    secret_path, secret, content = join(out, f"secret-{task}"), "", None
    if exists(secret_path):                       # left by the check: gone before your code
        with open(secret_path) as file:
            secret = file.read()
        os.remove(secret_path)
    if "{task}" in data:   # this worker's own copy, read into memory; then no worker's is left
        mine = data.replace("{task}", str(task))
        with open(mine, "rb") as file:
            content = file.read()
        os.remove(mine)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(
                exists(data.replace("{task}", str(other))) for other in range(workers)):
            time.sleep(0.05)
        if hasattr(os, "memfd_create"):               # a file with no name in any folder
            handle = os.memfd_create("data.npz")
            data = f"/proc/self/fd/{handle}"
        else:
            handle, data = tempfile.mkstemp(suffix=".npz")
        with os.fdopen(os.dup(handle), "wb") as file:
            file.write(content)

    def count_rows(carried):
        rows.append(int(carried))
        # the folders of this worker's earlier saves still there while it trains
        lingering.append(sort({d for d in saves if exists(d)}))
        return carried

    def count_forward(carried):           # its examples, after how many backward passes,
        values = as_array(carried, "float64")         # each row's hidden units projected
        weights = square_root(numbers(1.0, values.shape[1] + 1))
        forward.append((len(values), len(rows), [to_float(v) for v in values @ weights]))
        return len(values)

    @tf.custom_gradient
    def audited(inputs):
        \"\"\"Identity; its forward pass records the examples it carried (and after how many
        backward passes), its backward pass those and its context.\"\"\"
        def backward(upstream):
            context = replica_context()                       # at trace time
            contexts.append(context.num_replicas_in_sync if context is not None else 0)
            carried = py_function(count_rows, [shape_of(upstream)[0]], Tout=tf.int32)
            with dependencies([carried]):
                return identity(upstream)

        seen = py_function(count_forward, [inputs], Tout=tf.int32)
        with dependencies([seen]):
            return identity(inputs), backward

    class Audit(keras.layers.Layer):
        \"\"\"No weights: an audit of the backward passes through the model.\"\"\"

        def call(self, inputs):
            return audited(inputs)

        def compute_output_shape(self, input_shape):
            return input_shape

    def build_model():
        \"\"\"The exercise's model (call it inside strategy.scope()).\"\"\"
        with load(data) as arrays:
            features = arrays["x"].shape[1]
        set_seed(seed + task)                     # every worker draws its own weights
        model = sequential([layer_input((features,)), dense(8, activation="relu"), Audit(),
                            dense(classes)])
        strategy = get_strategy()
        built.append({"multi_worker": isinstance(strategy, multi_worker),
                      "strategy": type(strategy).__name__,
                      "replicas": strategy.num_replicas_in_sync})
        savez(join(out, f"initial-{task}.npz"), *model.get_weights())
        with open(join(out, f"built-{task}.json"), "w") as file:
            file.write(dumps(built))              # read even when the job fails later
        return model

    manager_save = tf.train.CheckpointManager.save

    def contents(path, load=tf.train.load_checkpoint, names=tf.train.list_variables,
                 asarray=np.asarray):       # what a save held: each variable's shape and sum
        reader, found = load(path), {}
        for name, shape in names(path):
            value = asarray(reader.get_tensor(name))
            found[name] = (shape, repr(float(value.sum(dtype="float64")))
                           if value.dtype.kind in "biuf" else None)
        return found

    def audited_save(self, *args, **kwargs):
        left.append(sort({d for d in saves if exists(d)}))   # earlier saves' folders still here
        saves.append(abspath(str(self.directory)))
        saved_after.append(len(rows))                     # backward passes so far
        path = manager_save(self, *args, **kwargs)
        if path:                                          # the prefix it wrote
            written.append(abspath(str(path)))
        held.append(contents(path) if path else {})       # read before your code goes on
        return path

    def audited_write(method, name):                      # tf.train.Checkpoint's own
        def audited(self, *args, **kwargs):
            path = method(self, *args, **kwargs)
            writes.append((name, abspath(str(path))))
            return path
        return audited

    tf.train.CheckpointManager.save = audited_save
    tf.train.Checkpoint.write = audited_write(tf.train.Checkpoint.write, "write")
    tf.train.Checkpoint.save = audited_write(tf.train.Checkpoint.save, "save")
    with load(io.BytesIO(content) if content is not None else data) as arrays:
        given = (arrays["x"], arrays["y"])        # the data your function is handed
    tf.data.Dataset.__init__, batches = dataset_auditor(
        tf, np, share, given, tf.data.Dataset.__init__)   # every dataset made from here on

    def report(loss, returned):
        \"\"\"Write the audit, then end this worker at once (nothing runs after it).\"\"\"
        try:
            held_out = repr(to_float(loss))     # a text: nan and inf are no literals
        except (TypeError, ValueError):
            held_out = None
        record = {"held_out": held_out, "returned": kind(returned).__name__, "forward": forward,
                  "secret": secret, "saves": saves, "built": built, "saved_after": saved_after,
                  "rows": rows, "contexts": contexts, "left": left, "batches": batches,
                  "lingering": lingering, "written": written, "writes": writes, "held": held}
        handle = open_file(join(out, f"audit-{task}.txt"), flags)
        write(handle, repr(record).encode())
        close(handle)
        print("done", flush=True)
        exit_now(0)

    return build_model, report, data


build_model, _report, _data = _set_up(_args.out, _task, _workers, _args.global_batch // _workers,
                                      _args.data, _args.seed, _args.classes)
"""

_TRAIN_WORKER_CALL = """

def _run(train_worker, build_model=build_model, report=_report, data=_data,
         arguments=(_args.checkpoint_dir, _args.steps, _args.global_batch // _workers,
                    _args.save_every),
         weights_file=os.path.join(_args.out, f"weights-{_task}.npz"), savez=np.savez):
    \"\"\"Your function, then the audit: every name bound before your code ran.\"\"\"
    returned = train_worker(build_model, LEARNING_RATE, data, *arguments)
    pair = isinstance(returned, tuple) and len(returned) == 2
    weights, loss = returned if pair else (returned, None)
    savez(weights_file, *weights)
    report(loss, returned)


_run(train_worker)
"""

_RESUME_JOB = '''

strategy = tf.distribute.MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=float(os.environ.get("COURSE_COLLECTIVE_TIMEOUT", "60"))))
is_chief = strategy.cluster_resolver.task_id == 0
with np.load(_data) as data:
    x, y = data["x"], data["y"]
with strategy.scope():
    model = build_model()
    optimizer = keras.optimizers.SGD(LEARNING_RATE)
    optimizer.build(model.trainable_variables)
examples_done = tf.Variable(0, dtype=tf.int64)           # examples the whole job has trained
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, examples_done=examples_done)
start = int(restore_latest(checkpoint, _args.checkpoint_dir, examples_done))     # yours
print(f"resumed at example {start}", flush=True)
dataset_fn = make_dataset_fn(x, y, _args.global_batch, start)                   # yours
iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
per_example_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def replica_step(features, labels):
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(per_example_loss(labels, model(features)),
                                          global_batch_size=_args.global_batch)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


@tf.function
def train_step(iterator):
    losses = strategy.run(replica_step, args=next(iterator))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


write_dir = _args.checkpoint_dir if is_chief else tempfile.mkdtemp(prefix="worker_ckpt_")
manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=2)
for step in range(1, _args.steps + 1):                       # the steps of this run
    loss = float(train_step(iterator))
    examples_done.assign_add(_args.global_batch)
    print(f"step {step} loss {loss:.4f} examples {int(examples_done.numpy())}", flush=True)
    if step % _args.save_every == 0:
        manager.save()            # numbered by its save counter, not by examples_done
        if not is_chief:
            tf.io.gfile.rmtree(write_dir)
    time.sleep(_args.step_delay)
np.savez(os.path.join(_args.out, f"weights-{_task}.npz"), *model.get_weights())
print("done", flush=True)
'''


#: Exercise 1's starting point: a colleague's worker whose training is the lesson's script
#: (for a per-replica batch), followed by an evaluation on the held-out set written like its
#: training step: it runs to the end and returns a loss that is not the held-out mean.
BROKEN_TRAIN_WORKER = '''\
def train_worker(build_model, learning_rate, data_path, checkpoint_dir, steps,
                 replica_batch, save_every):
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    is_chief = strategy.cluster_resolver.task_id == 0
    global_batch = replica_batch * strategy.num_replicas_in_sync
    with np.load(data_path) as data:
        x, y = data["x"], data["y"]
        x_eval, y_eval = data["x_eval"], data["y_eval"]

    def dataset_fn(context, x=x, y=y):
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset.batch(context.get_per_replica_batch_size(global_batch),
                             drop_remainder=True)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.SGD(learning_rate)
        optimizer.build(model.trainable_variables)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             reduction=None)

    def replica_loss(features, labels):
        return tf.nn.compute_average_loss(per_example(labels, model(features)),
                                          global_batch_size=global_batch)

    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            loss = replica_loss(features, labels)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def train_step(iterator):
        return strategy.reduce("SUM", strategy.run(replica_step, args=next(iterator)),
                               axis=None)

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    write_dir = checkpoint_dir if is_chief else tempfile.mkdtemp()
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=2)
    for step in range(1, steps + 1):
        train_step(iterator)
        if step % save_every == 0 or step == steps:
            manager.save(checkpoint_number=step)
            if not is_chief:
                tf.io.gfile.rmtree(write_dir)

    # the held-out loss of the trained model, the same way
    @tf.function
    def eval_step(iterator):
        return strategy.reduce("SUM", strategy.run(replica_loss, args=next(iterator)),
                               axis=None)

    evaluation = iter(strategy.distribute_datasets_from_function(
        lambda context: dataset_fn(context, x_eval, y_eval)))
    eval_steps = len(x_eval) // global_batch
    eval_loss = sum(float(eval_step(evaluation)) for _ in range(eval_steps)) / eval_steps
    return model.get_weights(), eval_loss
'''


def function_source(fn: Any, name: str | None = None) -> str:
    """The source of the learner's function, dedented, to copy into a worker script; with
    ``name``, followed by ``name = <its own name>`` so the script can call it by that name."""
    own = getattr(fn, "__name__", "")
    if not own.isidentifier():
        raise AssertionError(f"pass a function defined with def, got {fn!r}")
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as error:
        raise AssertionError(
            f"cannot read the source of {own!r} ({error}): define it with def in a notebook "
            "cell; it runs in a fresh worker process") from error
    return source if name in (None, own) else f"{source}\n{name} = {own}\n"


#: CPython 3.11 keeps the AST builder's recursion depth per interpreter, not per thread: two
#: threads parsing at once can raise "SystemError: AST constructor recursion depth mismatch"
#: (checks run side by side in threads, as the tests do); one parse at a time.
_PARSING = threading.Lock()


def parse_python(source: str, mode: str = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)``, one parse at a time in this process (every parse
    of the checks goes through here: ``ast.literal_eval`` of text parses too), tried again
    when a parse outside the checks (AutoGraph's, in another thread) ran at the same time."""
    for _ in range(2):
        try:
            with _PARSING:
                return ast.parse(source, mode=mode)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error):
                raise
    with _PARSING:
        return ast.parse(source, mode=mode)


def is_stub(fn: Any) -> bool:
    """True when ``fn``'s body only raises ``NotImplementedError`` (the exercise's stub)."""
    try:
        source = function_source(fn)
        tree = parse_python(source)
    except (AssertionError, SyntaxError):
        return False
    function = next((node for node in tree.body
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if function is None:
        return False
    body = [statement for statement in function.body
            if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))]
    def raises_not_implemented(statement: ast.stmt) -> bool:
        if not isinstance(statement, ast.Raise) or statement.exc is None:
            return False
        exc = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"

    return bool(body) and all(raises_not_implemented(statement) for statement in body)


def train_worker_script(train_worker_source: str) -> str:
    """Exercise 1's worker: the set-up, the learner's ``train_worker``, its call and report."""
    return SETUP + "\n\n" + train_worker_source + _TRAIN_WORKER_CALL


def resume_script(restore_latest_source: str, make_dataset_fn_source: str) -> str:
    """Exercise 3's worker: the set-up, the learner's two functions, then the whole job."""
    return (SETUP + "\n\n" + restore_latest_source + "\n\n" + make_dataset_fn_source
            + _RESUME_JOB)
