"""Checks of lesson 02's exercises (registered by name with ``@register``): the latest of a
run's checkpoints restored under another strategy, an in-batch softmax loss whose negatives are
the whole global batch and the distributed step that clips it, a
training loop diagnosed from what it does, a ``dataset_fn`` over files for any number of input
pipelines (whole files each where there are enough, else every file and a share of its records).

Strategies come from ``cu.make_strategy("mirrored")``, the learner's own object: a second
MirroredStrategy over other devices would clash with its collective all-reduces.
"""

from __future__ import annotations

from typing import Any

from course_utils.grading.checks import batch_negatives, clipped_step, file_shards
from course_utils.grading.checks.loops import DIAGNOSES, LoopBox, projecting_data, sealed
from course_utils.grading.checks.registry import register
from course_utils.grading.checks.replicas import (
    mirrored_strategy,
    raises_own_stub,
    small_model,
)
from course_utils.grading.checks.resume import check_resume_training
from course_utils.grading.framework import (
    Case,
    fresh_rng,
    grader_introspection,
    not_attempted,
    run_check,
)
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["DIAGNOSES", "check_compute_loss", "check_diagnose_loop", "check_distributed_train_step",
           "check_make_files_dataset_fn", "check_resume_training"]


# --- Exercise 2 · a loss whose negatives are the whole global batch, and the clipped step ----


@register
def check_compute_loss(fn: Any) -> bool:
    """Check ``compute_loss(queries, keys)``, called inside a replica on its embeddings.

    It must be this replica's share of the in-batch softmax loss of the whole global batch
    (each query scored against every key of the batch, its own the target; the mean over the
    queries): outside any strategy, that loss; under the strategy, the replicas' losses and
    gradients summed must be one device's, on a full global batch and on short ones split
    unevenly (a replica with fewer pairs, or none: as TensorFlow splits them, and replica 0
    with none, the others more, as input pipelines of their own may split them). The
    embeddings come from a small model called in the replicas, so that the gradient must
    reach the replica that embedded each key (``batch_negatives``).
    """
    import numpy as np

    tf = _tf()
    if raises_own_stub(fn, tf.zeros((2, 3)), tf.zeros((2, 3))):
        not_attempted("compute_loss")
        return False
    strategy = mirrored_strategy()
    replicas = strategy.num_replicas_in_sync
    rng = fresh_rng()
    np_rng = np.random.default_rng(rng.randint(0, 2**31))
    model, x, _, _, classes = small_model(strategy, rng, "check_compute_loss")
    queries, keys = batch_negatives.pair_data(np_rng, x)
    global_batch = rng.choice([4, 8]) * replicas
    local, dim = rng.randint(4, 12), rng.randint(2, 6)
    plain_q, plain_k = (np_rng.normal(size=(local, dim)).astype(np.float32) for _ in "qk")
    sizes = (global_batch, replicas + 1, global_batch + 1 - replicas)
    # as input pipelines of their own may split a batch: replica 0 with none, the others more
    # (TensorFlow's own splits fill the replicas in order: an empty replica 0, or a start at
    # the replica's id x the largest share, went unseen at 2 replicas: r02 L3, L4)
    split = (0, *(rng.randint(2, 4) for _ in range(replicas - 1)))

    def run(kind: str, *args: Any) -> Any:
        if kind == "plain":
            return fn(*args)
        size, by = args[0], args[1] if len(args) > 1 else None
        return batch_negatives.measure_pairs(strategy, model, fn, queries[:size], keys[:size],
                                             by)

    cases = [Case(args=("plain", tf.constant(plain_q), tf.constant(plain_k)),
                  expected=batch_negatives.reference_loss(plain_q, plain_k),
                  label=f"(outside any strategy: {local} queries and keys of {dim} numbers)")]
    cases += [Case(args=("strategy", size), verify=batch_negatives.PairMeasurement.verdict,
                   label=f"(inside {replicas} replicas, a global batch of {size} pairs, "
                         f"embeddings of {classes} numbers)")
              for size in sizes]
    cases += [Case(args=("strategy", sum(split), split), verify=batch_negatives.PairMeasurement
                   .verdict, label=f"(inside {replicas} replicas, {sum(split)} pairs split as "
                                   f"input pipelines of their own may split them: {split})")
              ] if replicas > 1 else []
    return run_check("compute_loss", run, cases, rtol=1e-5, atol=1e-6,
                     hint="which keys does a query on replica 0 need, and which replica holds "
                          "them? The replica context gathers as well as it reduces, and "
                          "TensorFlow differentiates through both. Where, in what it "
                          "gathers, does this replica's first key sit – on a short batch too?")


@register
def check_distributed_train_step(fn: Any, num_full_batches: int = 2) -> bool:
    """Check ``distributed_train_step(strategy, model, optimizer, batch, clip_norm)``.

    An epoch of global batches of pairs ``(query_features, key_features)``, the last one short
    and split unevenly, under ``cu.make_strategy("mirrored")`` must give the weights (within
    1e-5) and losses of SGD (momentum) on one device on each batch's in-batch softmax loss, its
    gradient clipped to a global norm of ``clip_norm`` (half the first gradient's norm: the
    clip binds). Every call of the model runs inside a replica, on that replica's pairs only,
    and the gradients handed to the optimizer are, times one factor, those that flowed back
    through its calls there (a forward pass from the layers' weights is refused:
    ``clipped_step``). The reference is made after the step ran.
    """
    import numpy as np

    tf = _tf()
    strategy = mirrored_strategy()
    if raises_own_stub(fn, strategy, None, None, None, 1.0):
        not_attempted("distributed_train_step")
        return False
    replicas = strategy.num_replicas_in_sync
    rng = fresh_rng()
    np_rng = np.random.default_rng(rng.randint(0, 2**31))
    model, x, _, features, classes = small_model(strategy, rng, "check_step_initial")
    initial = model.get_weights()
    global_batch = rng.choice([4, 8]) * replicas
    size = global_batch * num_full_batches + replicas + 1  # a short, uneven last batch
    queries, keys = batch_negatives.pair_data(np_rng, x[:size])
    dataset = tf.data.Dataset.from_tensor_slices((queries, keys)).batch(global_batch)
    clip_norm = clipped_step.clip_norm_for(dataset, model)
    batch_sizes = [min(global_batch, size - start) for start in range(0, size, global_batch)]

    def run_learner(strategy_arg: Any, clip: float) -> Any:
        return clipped_step.learner_run(fn, strategy_arg, dataset, initial, features, classes,
                                        clip)

    # the clip binds at step 1; then a clip that binds on no step (the gradient stays as it
    # is: an answer that always rescales to clip_norm fails there)
    notes = {clip_norm: "binds at step 1", 64 * clip_norm: "32× step 1's norm"}
    cases = [Case(args=(strategy, clip), label=f"({len(batch_sizes)} steps on {replicas} "
                  f"replicas, batches of {batch_sizes} pairs, clip_norm={clip:.3g}"
                  f": {note})", verify=clipped_step.verifier(dataset, initial, features,
                                                              classes, clip, replicas,
                                                              batch_sizes))
             for clip, note in notes.items()]
    return run_check("distributed_train_step", run_learner, cases,
                     hint="lesson 02, section 4 (which gradient each replica holds, and where "
                          "apply_gradients sums them) and section 6 (the replicas' gradients "
                          "all-reduced by hand). Which gradient's norm does one device clip?")


# --- Exercise 3 · diagnose a training loop from its symptoms -----------------------------------


#: The answers a full global batch cannot tell apart: each needs a step on a short batch.
SHORT_BATCH_DIAGNOSES = ("right", "constant global_batch_size on a short batch",
                         "Keras loss object on an uneven split")
#: Loops beyond one of each kind, their mistakes drawn (by the loops' child) among the short-batch
#: ones: a guess among the short-batch kinds not yet answered passed 1 check in 6 without them
#: (a fresh read's runs), 1 in 405 with 3 of them (the best fixed guess; 97 of 40,000 real decks).
EXTRA_SHORT_BATCH_LOOPS = 3
#: Names by which an answer would reach a loop's own numbers without running it: its closure's
#: functions, the box that asks the loops' child, TensorFlow's registry of ``numpy_function``s;
#: and the check's own loop makers (a loop of each kind to compare with, no table needed).
LOOP_READERS = frozenset({"_child_loss_scale", "_child_report_factor", "_ask", "_child",
                          "_py_funcs", "_funcs", "LoopBox", "loop_with"})


def _counting(strategy: Any, make_train_step: Any, steps_run: list[int]) -> Any:
    """``make_train_step`` whose train steps add their batch's examples to ``steps_run``."""

    def counted_make_train_step(model: Any, optimizer: Any) -> Any:
        train_step = make_train_step(model, optimizer)

        def counted_train_step(batch: Any) -> Any:
            if not _tf().executing_eagerly():
                raise RuntimeError("call the training step eagerly, as lesson 02 does, not "
                                   "inside a tf.function of yours: the check counts the "
                                   "examples of each step it runs")
            from tensorflow.python.framework import op_callbacks
            if op_callbacks.should_invoke_op_callbacks():  # tf.debugging's dump, check_numerics
                raise RuntimeError("run the training step with no op callback on (such as "
                                   "tf.debugging.experimental.enable_dump_debug_info): it "
                                   "reads the loop's own numbers instead of what it does")
            result = train_step(batch)
            labels = batch[-1] if isinstance(batch, tuple | list) else batch
            steps_run.append(sum(int(_tf().shape(local)[0])
                                 for local in strategy.experimental_local_results(labels)))
            return result

        return counted_train_step

    return counted_make_train_step


def _diagnosis_cases(strategy: Any, box: LoopBox, kinds: tuple[str, ...],
                     rng: Any) -> list[Case]:
    """One case per loop of ``box``: every kind of ``kinds`` once and
    ``EXTRA_SHORT_BATCH_LOOPS`` more, each with fresh data, and its verify."""
    replicas = strategy.num_replicas_in_sync
    cases = []
    short_kinds = tuple(kind for kind in kinds if kind in SHORT_BATCH_DIAGNOSES)
    for _ in range(len(kinds) + EXTRA_SHORT_BATCH_LOOPS):
        classes = rng.randint(2, 4)  # data on which a Keras loss object projects to 1
        x, y, build_model = projecting_data(rng, classes)
        num_features = x.shape[1]
        global_batch = rng.choice([4, 8]) * replicas

        steps_run: list[int] = []  # the steps the answer ran: a diagnosis runs the loop
        number, loop = box.loop(global_batch, kinds, extra_from=short_kinds,
                                extra=EXTRA_SHORT_BATCH_LOOPS)
        make_train_step = _counting(strategy, loop, steps_run)

        def verify(answer: Any, number: int = number, steps_run: list[int] = steps_run,
                   global_batch: int = global_batch, verdict: Any = box.verdict,
                   gate: tuple[str, ...] = SHORT_BATCH_DIAGNOSES,
                   known: tuple[str, ...] = DIAGNOSES) -> str | None:
            if not isinstance(answer, str) or answer not in known:
                return f"answer one of DIAGNOSES, got {answer!r}"
            answer = known[known.index(answer)]  # the text itself, not a look-alike
            if not steps_run:
                return (f"you answered {answer!r} without running a single step of the loop: "
                        "diagnose it by running it (build the model, call "
                        "make_train_step(model, optimizer)(batch)), not by reading it")
            if answer in gate and min(steps_run) >= global_batch:
                return (f"you answered {answer!r} after steps on full batches only "
                        f"({steps_run} examples): on a full batch {SHORT_BATCH_DIAGNOSES} look "
                        "the same; run a step on a short batch, split unevenly")
            return verdict(number, answer)

        cases.append(Case(args=(strategy, make_train_step, build_model,
                                x, y, global_batch), verify=verify,
                          label=f"(a loop written for a global batch of {global_batch}, "
                                f"{replicas} replicas, {num_features} features, {classes} "
                                "classes)"))
    return cases


DIAGNOSIS_HINT = (
    "build the model and a plain SGD(learning_rate=1.0) in the scope, run one step on a full "
    "global batch and one on a short batch of replicas + 1 examples; the weights move by minus "
    "the gradient the loop applied. Project it on the one-device gradient of the mean loss "
    "(same initial weights), and divide the reported loss by the true mean loss: lesson 02, "
    "section 5's table says which factor means what. On the short batch compare weight for "
    "weight, np.allclose(applied, true, rtol=1e-3, atol=1e-5) (float32 weights: the defaults "
    "are finer than old - new resolves): on the check's data a Keras loss object's update "
    "projects to exactly 1.")


@register
def check_diagnose_loop(fn: Any) -> bool:
    """Check ``diagnose_loop(strategy, make_train_step, build_model, features, labels,
    global_batch_size)``: given a training step as a black box, it runs it and names its loss
    reduction (one of ``DIAGNOSES``). Every mistake of lesson 02's section 5 is asked about,
    each a real loop, on fresh data, and ``EXTRA_SHORT_BATCH_LOOPS`` more whose mistakes only a
    short batch shows.

    Refused since: telling "right" from the Keras loss object on the short batch by the
    update's projection on the one-device gradient alone (15 of 15 and 4 of 4 in fresh reads,
    on teacher data the projection came within 1e-3 of 1 once in 300 draws): every case's data
    (loops.projecting_data) make that update project to exactly 1 on a short batch of
    distinct examples that leaves no replica empty (replicas + 1 at 2 replicas; at more,
    replicas + 1 leaves one empty and the projection, non-empty replicas / replicas, then names
    it rightly). The reported loss alone passed 15 of 15, and one short
    step read by it 6 of 6: now some loop whose update is wrong reports the true mean loss,
    computed apart from its gradient (loops.py), so only the update names it. Still passes,
    by reading
    the check's code (loops.py's internals), with less work than the reference: an answer that
    walks the check's objects (the loop's closure, TensorFlow's registry of
    ``numpy_function``s, the box that asks the loops' child, its pipe and the token found
    there) and asks the loop's numbers for batch sizes of its choosing, through the box from a
    thread started in C, its own ``tf.function`` or any thread that passes the box a guard of
    its own, or through the pipe from any thread (6 of 6 to 8 of 8 in fresh reads); or that
    listens to a real step's asks with a profile or trace hook, got by a name built at run
    time, the step run eagerly (the child's replies read off loops.py's frames after one short
    step: 9 of 9 at 1, 2 and 4 replicas in a fresh read; a debugger's hook is not refused); or
    that rebinds, for one frozen short step, the op that TensorFlow's numpy_functions end in
    (``gen_script_ops.py_func`` as script_ops reaches it) and records what the loop's ops
    return with an op of its own: the child's replies, no gradient (3 of 3 in a fresh read;
    ``tf.numpy_function`` itself is bound when the loop is made: rebinding it in the answer
    passed 10 of 10 before; rebound in a cell before the check, it still reaches the loop;
    TensorFlow's debugger dump, ``tf.debugging.experimental.enable_dump_debug_info`` around a
    frozen short step, read the numpy_functions' outputs back, 4 of 4, before a step run with
    an op callback on was refused).
    Beyond any check that runs in the learner's process, and passing with no diagnosis at all:
    code that rewrites the check's own objects (a case's ``verify`` or verdict found through
    the garbage collector, 7 of 7 in a fresh read, is refused since: ``registry``; a
    name of this module or of loops.py rebound in a cell before the check or by the answer
    itself, its first call included: ``run_check`` rebound there passed 5 of 5 with no step
    run, and what each ask looks up – ``LoopBox._ask`` swapped for a spy with a guard of its
    own, or loops.py's ``_tf``, which the guard reads – 6 of 6 and 2 of 2 with one frozen
    step), or that speaks to the loops' child through /proc (its token read out of the child's
    memory, then its numbers asked from the main thread, 7 of 7; a "yes" written into the pipe
    the verdict reads while the child is stopped, 4 of 4). The plain ways in are refused: their
    names, strings included, before the answer runs (``LoopBox`` and ``loop_with`` too: a loop
    of each kind made with them and compared with the check's on the same batches passed 2 of 2
    before); a call to the box from Python code other than the loop's step; a line to the child
    without the token it got first (one found in /proc passed 10 of 10 before); a second key
    for a loop; the box, its loops and their verdict are made before the answer's first call
    (``LoopBox`` or ``_verdict_of`` rebound in that call passed 6 of 6 and 4 of 4 before); only
    an answer equal to one of ``DIAGNOSES`` reaches the child, as that text; no box nor loop
    is made while the answer runs (``loops.sealed``: the check's box found in the loop's
    closure by names built at run time, a loop of each kind made with it and matched against
    the check's on the same batches, passed 2 of 2 with no one-device gradient)."""
    peeks = grader_introspection(fn, constants=True, also=LOOP_READERS) if callable(fn) else []
    if peeks:
        raise AssertionError(
            f"diagnose_loop: your function uses {', '.join(peeks)}, which reads how the check "
            "built the loop instead of what the loop does: run its step on a batch you chose "
            "and compare the update with one device's (lesson 02, section 5)")
    strategy = mirrored_strategy()
    replicas = strategy.num_replicas_in_sync
    rng = fresh_rng()
    kinds = DIAGNOSES if replicas > 1 else (  # one replica: these look right
        "right", "global_batch_size passed positionally",
        "constant global_batch_size on a short batch")
    # which loop makes which mistake: only its child process knows. The box, every loop and
    # its verdict are made before the answer is first called (the stub test below included):
    # LoopBox or _verdict_of rebound by the answer no longer reaches them (what a step or the
    # box looks up when it asks still can be rebound: the docstring's rewritten objects)
    box = LoopBox(strategy)
    try:
        cases = _diagnosis_cases(strategy, box, kinds, rng)
        with sealed():  # no box nor loop made while the answer runs, its first call too
            if raises_own_stub(fn, strategy, None, None, None, None, 8):
                not_attempted("diagnose_loop")
                return False
            return run_check("diagnose_loop", fn, cases, hint=DIAGNOSIS_HINT)
    finally:
        box.close()


# --- Exercise 4 · a dataset_fn over files, for any number of pipelines ----------------------


@register
def check_make_files_dataset_fn(fn: Any) -> bool:
    """Check ``make_files_dataset_fn(files, global_batch_size, shuffle_buffer)``'s
    ``dataset_fn``.

    Fresh TFRecord files, pipelines and seeds each run (``file_shards``): an epoch under
    ``cu.make_strategy("mirrored")``; at least as many files as pipelines, where each pipeline
    must read whole files of its own, dealt evenly, and open no other; fewer files than
    pipelines, where each must read every file and keep its share. Every pipeline is made as a
    worker process seeded its own way makes it: together every record once, per-replica
    batches, shuffled with ``shuffle_buffer`` anew each epoch, the global seed left alone.
    """
    tf = _tf()
    if raises_own_stub(fn, ["part-0.tfrecord"], 4, 4):
        not_attempted("make_files_dataset_fn")
        return False
    strategy = mirrored_strategy()
    replicas = strategy.num_replicas_in_sync
    rng = fresh_rng()
    previous = _global_seed()
    per_replica = rng.randint(3, 6)
    # 4 or 5 pipelines, 2 files over a multiple: files dealt in blocks of ceil(files /
    # pipelines), or floor with the rest to the last, leave one with none or 2 more than
    # another ([2, 2, 2, 0], [1, 1, 1, 3]; such deals passed 2 of 3 and 1 of 3 when any
    # count was drawn)
    many = rng.randint(4, 5)
    few = rng.randint(3, 4)
    layouts = {"strategy": (rng.randint(1, 3), 1), "many": (many * rng.randint(1, 2) + 2, many),
               "few": (rng.randint(2, few - 1), few)}  # 2 or more: their interleaving seen
    workers = dict(zip(("many", "few"), rng.sample([1, 2, 3], 2), strict=True))  # replicas
    sets = {kind: file_shards.FileSet.write(file_shards.draw_file_sizes(
        rng, files, pipelines, kind != "few")) for kind, (files, pipelines) in layouts.items()}
    small = rng.randint(2, 3)

    def run(kind: str) -> Any:
        files, pipelines = sets[kind], layouts[kind][1]
        if kind == "strategy":
            dataset_fn = file_shards.dataset_fn_of(fn, files, per_replica * replicas,
                                                   len(files.file_of))
            return file_shards.steps_on(
                strategy, strategy.distribute_datasets_from_function(dataset_fn))
        seeds = [(rng.randint(2**20 * k, 2**20 * (k + 1) - 1),
                  rng.randint(2**20 * (k + 8), 2**20 * (k + 9) - 1)) for k in range(pipelines)]
        return file_shards.read_pipelines(
            fn, files, per_replica * pipelines * workers[kind], (len(files.file_of), small),
            pipelines, workers[kind], seeds, kind == "many")

    cases = [Case(args=("strategy",), verify=file_shards.strategy_verifier(
        len(sets["strategy"].file_of), per_replica, replicas), label=(
        f"({layouts['strategy'][0]} files, {len(sets['strategy'].file_of)} records, one "
        f"pipeline, {replicas} replicas, global batch {per_replica * replicas})"))]
    for kind in ("many", "few"):
        files, pipelines = layouts[kind]
        cases.append(Case(args=(kind,), verify=file_shards.workers_verifier(
            sets[kind], per_replica, (len(sets[kind].file_of), small), kind == "many"),
            label=f"({files} files of {len(sets[kind].file_of)} records, {pipelines} workers "
                  f"× {workers[kind]} replicas, each worker seeded its own way, global batch "
                  f"{per_replica * pipelines * workers[kind]}, shuffle_buffer "
                  f"{len(sets[kind].file_of)}, then 1 and {small})"))
    rng.shuffle(cases)
    try:
        return run_check("make_files_dataset_fn", run, cases,
                         hint="split the list of file names by input_context's pipelines "
                              "when there are enough, else read every file in the given order "
                              "and split the records; shuffle after the split (each worker "
                              "seeds its own way), then batch per replica (lesson 02, "
                              "section 9; lesson 01, shuffling).")
    finally:
        tf.random.set_seed(previous)
        for files in sets.values():
            files.remove()


def _global_seed() -> int | None:
    """TensorFlow's global seed as set (None where none is), to put back after the check."""
    from tensorflow.python.eager import context

    return context.global_seed()
