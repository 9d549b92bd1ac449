"""Fresh logs of failed multi-worker jobs, for lesson 03's diagnosis exercise.

:func:`failure_logs` writes the logs every worker of a job would leave after one of
:data:`CAUSES`, with fresh ports, step counts, losses, process ids and start-up noise. The
error lines are TensorFlow 2.21's own, as lesson 03's workers printed them under TensorFlow's
defaults (no ``GRPC_FAIL_FAST``). A killed peer: ``UnavailableError``, with whichever reason
came first in that survivor: the survivor's own call to the dead port (``Connection
refused``), a call in flight that the dead worker's end dropped (``Socket closed`` or
``Connection reset by peer``), or, for a killed worker other than worker 0, the coordination
service's heartbeat check (``The following tasks are unhealthy (stopped sending heartbeats)``,
naming the task). Worker 0 runs the coordination service
(``multi_worker_util.coordination_leader``): no one is left to report its missing heartbeats,
and its peers see one of the other reasons, as any killed worker's peers may. A stalled
peer, in a job whose collectives have a ``timeout_seconds`` shorter than the heartbeat
time-out: ``DeadlineExceededError ... Collective has timed out during execution``. So do the
peers of a worker that crashed while training (it never joins the step's all-reduce):
measured on 2 localhost workers with ``timeout_seconds=3``, worker 1 raising a Python error
between steps or an op error in a step, worker 0 raised that error, never ``Unavailable``.
"""

from __future__ import annotations

import random

__all__ = ["CAUSES", "KILLED_REASONS", "failure_logs", "possible_reasons"]

#: What went wrong, as :func:`failure_logs` and the learner's ``diagnose`` name it.
CAUSES = ("killed", "crashed", "never_started", "stalled", "not_in_cluster")

#: A worker's own crash before it joined the cluster (reading its data), as Python 3.11 printed
#: it in this course's environment (NumPy 2): the worker script's line, then the library frames
#: down to the error, with the caret lines Python draws under each call ({site}: site-packages;
#: {n}, {m}, {rows}: fresh numbers).
_CRASHES_BEFORE_JOINING = [
    ["    with np.load(args.data) as data:",
     "         ^^^^^^^^^^^^^^^^^^",
     '  File "{site}/numpy/lib/_npyio_impl.py", line 454, in load',
     '    fid = stack.enter_context(open(os.fspath(file), "rb"))',
     "                              ^^^^^^^^^^^^^^^^^^^^^^^^^^^",
     "FileNotFoundError: [Errno 2] No such file or directory: '/data/train-{n}.npz'"],
    ['    x, y = data["features"], data["labels"]',
     "           ~~~~^^^^^^^^^^^^",
     '  File "{site}/numpy/lib/_npyio_impl.py", line 243, in __getitem__',
     '    raise KeyError(f"{{key}} is not a file in the archive") from None',
     "KeyError: 'features is not a file in the archive'"],
    ["    x = np.repeat(x, 4096, axis=1)",
     "        ^^^^^^^^^^^^^^^^^^^^^^^^^^",
     '  File "{site}/numpy/_core/fromnumeric.py", line 481, in repeat',
     "    return _wrapfunc(a, 'repeat', repeats, axis=axis)",
     "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
     '  File "{site}/numpy/_core/fromnumeric.py", line 54, in _wrapfunc',
     "    return bound(*args, **kwds)",
     "           ^^^^^^^^^^^^^^^^^^^^",
     "numpy._core._exceptions._ArrayMemoryError: Unable to allocate {n}.0 GiB for an array "
     "with shape ({rows}, 4096) and data type float32"],
]

#: The frames between the worker script's call of its train step and an op's error, as
#: TensorFlow 2.21 prints them under Python 3.11 (a crash while training shows them too).
_STEP_FRAMES = [
    "    losses.append(float(train_step(iterator)))",
    "                        ^^^^^^^^^^^^^^^^^^^^",
    '  File "{site}/tensorflow/python/util/traceback_utils.py", line 167, in error_handler',
    "    raise e.with_traceback(filtered_tb) from None",
    '  File "{site}/tensorflow/python/eager/execute.py", line 53, in quick_execute',
    "    tensors = pywrap_tfe.TFE_Py_Execute(ctx._handle, device_name, op_name,",
    "  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"]


#: A worker's own crash while training, as TensorFlow 2.21 and Keras 3 printed it here for a
#: label outside the classes (a message over several lines: its last line is not the error's),
#: with the frames of the lesson's worker script: the node was defined in the thread MWMS runs
#: ``replica_step`` in (Python 3.11.7's ``threading.py``), not under ``<module>`` and
#: ``train_step``. (The W/E lines TensorFlow logs before a traceback, a survivor's too, are
#: left out of every log.)
_CRASHES_WHILE_TRAINING = [
    ["Traceback (most recent call last):",
     '  File "/job/worker.py", line {line}, in <module>',
     *_STEP_FRAMES,
     "tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error:", "",
     "Detected at node sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits/"
     "SparseSoftmaxCrossEntropyWithLogits defined at (most recent call last):",
     '  File "{stdlib}/threading.py", line 1002, in _bootstrap', "",
     '  File "{stdlib}/threading.py", line 1045, in _bootstrap_inner', "",
     '  File "/job/worker.py", line {replica_line}, in replica_step', "",
     '  File "{site}/keras/src/losses/loss.py", line 67, in __call__', "",
     '  File "{site}/keras/src/losses/losses.py", line 34, in call', "",
     '  File "{site}/keras/src/losses/losses.py", line 2359, in sparse_categorical_crossentropy',
     "",
     '  File "{site}/keras/src/ops/nn.py", line 2216, in sparse_categorical_crossentropy', "",
     '  File "{site}/keras/src/backend/tensorflow/nn.py", line 1438, in '
     "sparse_categorical_crossentropy", "",
     "Received a label value of {n} which is outside the valid range of [0, {m}).  Label "
     "values: {labels}",
     "\t [[{{{{node sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits/"
     "SparseSoftmaxCrossEntropyWithLogits}}}}]] [Op:__inference_train_step_{op}]"],
]

#: Where a worker's Python packages may be installed, and its Python's standard library (a
#: Python 3.11.7, whose threading.py the crash's frames name: not a distribution's
#: /usr/lib/python3.11, Debian 12's 3.11.2 calls them at lines 995 and 1038).
_STDLIBS = {"/usr/local/lib/python3.11/site-packages": "/usr/local/lib/python3.11",
            "/opt/conda/lib/python3.11/site-packages": "/opt/conda/lib/python3.11",
            "/home/trainer/.venv/lib/python3.11/site-packages":
                "/home/trainer/.pyenv/versions/3.11.7/lib/python3.11"}
_SITES = list(_STDLIBS)


def _noise(rng: random.Random) -> list[str]:
    stamp = f"{rng.randint(1_700_000_000, 1_900_000_000)}.{rng.randint(0, 999_999):06d}"
    pid = rng.randint(1000, 60000)
    lines = ["WARNING: All log messages before absl::InitializeLog() is called are written to "
             "STDERR",
             f"I0000 00:00:{stamp} {pid} cudart_stub.cc:31] Could not find cuda drivers on your "
             "machine, GPU will not be used."]
    return lines[: rng.randint(0, 2)]


def _steps(rng: random.Random, first: int, last: int) -> list[str]:
    loss = rng.uniform(0.9, 1.4)
    lines = []
    for step in range(first, last + 1):
        loss *= rng.uniform(0.9, 1.02)
        lines.append(f"step {step} loss {loss:.4f}")
    return lines


#: Why a survivor's all-reduce failed after a peer was killed, as TensorFlow 2.21 words it
#: (measured on localhost jobs like lesson 03's, killing a worker between steps or while its
#: peers wait in an all-reduce): the dead port refused a call (seen for workers 0 and 1), a
#: call in flight was dropped (``Socket closed`` seen for worker 0, ``Connection reset by
#: peer`` for worker 1: either end of a dropped connection, whoever died), or the coordination
#: service's heartbeat check (seen for workers 1 and 2), for any worker but worker 0, which
#: runs the service (``multi_worker_util.coordination_leader``).
KILLED_REASONS = ("refused", "closed", "reset", "heartbeats")


def possible_reasons(culprit: int) -> tuple[str, ...]:
    """The reasons a survivor can give when worker ``culprit`` is killed."""
    return KILLED_REASONS if culprit != 0 else ("refused", "closed", "reset")


def _killed_reason(reason: str, port: int, culprit: int) -> list[str]:
    target = (f"Additional GRPC error information from remote target /job:worker/replica:0/"
              f"task:{culprit} while calling /tensorflow.WorkerService/RecvBuf:")
    if reason == "refused":
        why = (f"failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:{port}: "
               "Failed to connect to remote host: Connection refused")
        return [f"Collective ops is aborted by: {why}", target,
                f':UNKNOWN:Error received from peer  {{grpc_message:"{why}", grpc_status:14}}']
    if reason == "closed":
        why = "Socket closed"
        return [f"Collective ops is aborted by: {why}", target,
                f':UNKNOWN:Error received from peer  {{grpc_message:"{why}", grpc_status:14}}']
    if reason == "reset":
        why = "recvmsg:Connection reset by peer"
        return [f"Collective ops is aborted by: {why}",
                target.replace("RecvBuf", "CompleteInstance"),
                f':UNKNOWN:Error received from peer  {{grpc_message:"{why}", grpc_status:14}}']
    return [f"Collective ops is aborted by: Error reported from /job:worker/task:{culprit}: The "
            "following tasks are unhealthy (stopped sending heartbeats):",
            f"/job:worker/replica:0/task:{culprit}",
            "The tasks have crashed. Check the task logs for an earlier error, or scheduler "
            "events (e.g. preemption, eviction) to debug further."]


def _collective_error(kind: str, reason: list[str], step_line: int, site: str) -> list[str]:
    head = ["Traceback (most recent call last):",
            f'  File "/job/worker.py", line {step_line}, in <module>',
            *(line.format(site=site) for line in _STEP_FRAMES),
            f"tensorflow.python.framework.errors_impl.{kind}: Graph execution error:", "",
            "Detected at node sgd/CollectiveReduceV2 defined at (most recent call last):",
            # where the all-reduce was defined: the step call and train_step, as TensorFlow
            # 2.21 printed them here for a survivor of a killed peer (no thread frames)
            f'  File "/job/worker.py", line {step_line}, in <module>', "",
            f'  File "/job/worker.py", line {40 + step_line % 11}, in train_step', ""]
    return [*head, *reason, "The error could be from a previous operation. Restart your "
            "program to reset.",
            "\t [[{{node sgd/CollectiveReduceV2}}]] [Op:__inference_train_step_296]"]


def _crash(rng: random.Random, before_joining: bool, site: str, step_line: int) -> list[str]:
    n, line = rng.randint(10, 99), rng.randint(60, 80)
    classes = rng.randint(3, 9)
    labels = [rng.choice([*range(classes), n]) for _ in range(16)]
    labels[rng.randrange(16)] = n                   # the label the message names
    labels = " ".join(map(str, labels))
    fill = {"site": site, "n": n, "m": rng.randint(10, 99), "rows": n * 65536,
            "line": line, "step_line": rng.randint(40, 50), "replica_line": rng.randint(30, 39),
            "labels": labels, "op": rng.randint(200, 999)}
    crash = rng.choice(_CRASHES_BEFORE_JOINING if before_joining else _CRASHES_WHILE_TRAINING)
    if before_joining:
        return ["Traceback (most recent call last):",
                f'  File "/job/worker.py", line {line - 50}, in <module>',
                *(text.format(**fill) for text in crash)]
    # a label outside [0, classes), in the step call every worker of the job runs
    fill.update(m=classes, stdlib=_STDLIBS[site], line=step_line)
    return [text.format(**fill) for text in crash]


def failure_logs(cause: str, num_workers: int, culprit: int | None,
                 rng: random.Random, killed_reason: str | None = None,
                 crashed_early: bool | None = None) -> list[str]:
    """The logs of ``num_workers`` workers after ``cause``, started by worker ``culprit``.

    ``culprit`` is the worker at fault (None for ``"not_in_cluster"``, where every worker is).
    ``killed_reason`` (one of :data:`KILLED_REASONS`) gives every survivor of a killed peer
    that reason; by default each survivor draws its own. ``crashed_early`` (for
    ``"crashed"``): the culprit crashed before it joined the cluster (its peers wait, their
    logs end at ``joining the cluster``, as in ``"never_started"``) or while training; by
    default drawn.
    """
    if killed_reason is not None and killed_reason not in KILLED_REASONS:
        raise ValueError(f"killed_reason must be one of {KILLED_REASONS}, got {killed_reason!r}")
    if cause not in CAUSES:
        raise ValueError(f"cause must be one of {CAUSES}, got {cause!r}")
    if killed_reason is not None and culprit is not None and (
            killed_reason not in possible_reasons(culprit)):
        raise ValueError(f"a killed worker {culprit} gives its peers "
                         f"{possible_reasons(culprit)}, not {killed_reason!r}: worker 0 runs "
                         f"the coordination service, no one reports its missing heartbeats")
    if num_workers < 2:
        raise ValueError("a multi-worker job has at least 2 workers")
    if (culprit is None) != (cause == "not_in_cluster") or (
            culprit is not None and not 0 <= culprit < num_workers):
        raise ValueError(f"culprit {culprit!r} does not fit {cause!r} with {num_workers} workers")
    ports = rng.sample(range(20000, 60000), num_workers)
    last = rng.randint(3, 12)
    if crashed_early is None:
        crashed_early = rng.random() < 0.5
    early = cause == "crashed" and crashed_early   # crashed before joining: the rest wait
    site = rng.choice(_SITES)                      # where the job's workers have TensorFlow
    # the line of the step call in the job's script: the same in every worker's traceback
    step_line = rng.randint(60, 80)
    logs = []
    for worker in range(num_workers):
        lines = [*_noise(rng), "joining the cluster"]
        if cause == "not_in_cluster":
            # only the lesson's script's lines: the replica count is the one tell
            lines += [f"worker {worker}: 1 replicas in sync", *_steps(rng, 1, last), "done"]
        elif cause == "never_started":
            lines = [] if worker == culprit else lines
        elif cause == "crashed" and worker == culprit:
            lines = [*_noise(rng), *_crash(rng, True, site, step_line)] if early else [
                *lines, f"worker {worker}: {num_workers} replicas in sync",
                *_steps(rng, 1, last), *_crash(rng, False, site, step_line)]
        elif not early:
            lines += [f"worker {worker}: {num_workers} replicas in sync",
                      *_steps(rng, 1, last)]
            if worker != culprit:
                if cause in ("stalled", "crashed"):     # a crashed peer: never in the
                    kind, reason = "DeadlineExceededError", [   # all-reduce, as a stall
                        "Collective has timed out during execution."]
                else:
                    kind = "UnavailableError"
                    reason = _killed_reason(
                        killed_reason or rng.choice(possible_reasons(culprit)),
                                            ports[culprit], culprit)
                lines += _collective_error(kind, reason, step_line, site)
        logs.append(lines)
    return ["\n".join(lines) + ("\n" if lines else "") for lines in logs]
