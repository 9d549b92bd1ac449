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
A crash of worker 0 (the chief, which runs the coordination service) is another story:
measured on 3 localhost workers with ``timeout_seconds=3``, worker 0 raising
``PermissionDeniedError`` in its ``manager.save`` (a checkpoint folder it may not write), its
peers raised ``UnavailableError`` (``Socket closed``, from task 0), as for a killed worker 0
(worker 2 got it relayed through worker 1; these logs give every survivor worker 1's form):
only the culprit's own traceback tells the crash apart. A killed worker's survivor that makes
no call to the dead port before the collective time-out raises ``DeadlineExceededError``
instead (lesson 03, section 3's row *killed, timeout_seconds=3*): ``timed_out`` survivors do
so, at least one survivor still shows the kill.
"""

from __future__ import annotations

import random

__all__ = ["CAUSES", "CRASHES", "KILLED_REASONS", "failure_logs", "possible_reasons"]

#: What went wrong, as :func:`failure_logs` and the learner's ``diagnose`` name it.
CAUSES = ("killed", "crashed", "never_started", "stalled", "not_in_cluster")

#: A worker's own crash before it joined the cluster (reading its data), as Python 3.11 printed
#: it in this course's environment (NumPy 2): the worker script's line, then the library frames
#: down to the error, with the caret lines Python draws under each call ({site}: site-packages;
#: {stdlib}: the standard library; {n}, {m}, {rows}: fresh numbers). Most name an error the
#: lesson never names: a reader must find the log's own traceback, not match a list of names.
_LOAD = ["    with np.load(args.data) as data:", "         ^^^^^^^^^^^^^^^^^^"]
_CRASHES_BEFORE_JOINING = {
    "missing file": [
        *_LOAD,
        '  File "{site}/numpy/lib/_npyio_impl.py", line 454, in load',
        '    fid = stack.enter_context(open(os.fspath(file), "rb"))',
        "                              ^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/train-{n}.npz'"],
    # the same call, the file there but not readable by the worker's user (Python's own
    # message for errno 13, raised by the same open)
    "unreadable file": [
        *_LOAD,
        '  File "{site}/numpy/lib/_npyio_impl.py", line 454, in load',
        '    fid = stack.enter_context(open(os.fspath(file), "rb"))',
        "                              ^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        "PermissionError: [Errno 13] Permission denied: '/data/train-{n}.npz'"],
    "truncated file": [     # a copy cut short: measured on half of an .npz
        *_LOAD,
        '  File "{site}/numpy/lib/_npyio_impl.py", line 471, in load',
        "    ret = NpzFile(fid, own_fid=own_fid, allow_pickle=allow_pickle,",
        "          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "{site}/numpy/lib/_npyio_impl.py", line 197, in __init__',
        "    _zip = zipfile_factory(fid)",
        "           ^^^^^^^^^^^^^^^^^^^^",
        '  File "{site}/numpy/lib/_npyio_impl.py", line 112, in zipfile_factory',
        "    return zipfile.ZipFile(file, *args, **kwargs)",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "{stdlib}/zipfile.py", line 1302, in __init__',
        "    self._RealGetContents()",
        '  File "{stdlib}/zipfile.py", line 1369, in _RealGetContents',
        '    raise BadZipFile("File is not a zip file")',
        "zipfile.BadZipFile: File is not a zip file"],
    "empty file": [
        *_LOAD,
        '  File "{site}/numpy/lib/_npyio_impl.py", line 463, in load',
        '    raise EOFError("No data left in file")',
        "EOFError: No data left in file"],
    "missing key": [
        '    x, y = data["features"], data["labels"]',
        "           ~~~~^^^^^^^^^^^^",
        '  File "{site}/numpy/lib/_npyio_impl.py", line 243, in __getitem__',
        '    raise KeyError(f"{{key}} is not a file in the archive") from None',
        "KeyError: 'features is not a file in the archive'"],
    "object array": [
        "    x = np.load(args.features)",
        "        ^^^^^^^^^^^^^^^^^^^^^^",
        '  File "{site}/numpy/lib/_npyio_impl.py", line 483, in load',
        "    return format.read_array(fid, allow_pickle=allow_pickle,",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "{site}/numpy/lib/_format_impl.py", line 833, in read_array',
        '    raise ValueError("Object arrays cannot be loaded when "',
        "ValueError: Object arrays cannot be loaded when allow_pickle=False"],
    "wrong shape": [
        "    x = x.reshape(-1, 64)",
        "        ^^^^^^^^^^^^^^^^^",
        "ValueError: cannot reshape array of size {rows} into shape (64)"],
    "out of memory": [
        "    x = np.repeat(x, 4096, axis=1)",
        "        ^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "{site}/numpy/_core/fromnumeric.py", line 481, in repeat',
        "    return _wrapfunc(a, 'repeat', repeats, axis=axis)",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "{site}/numpy/_core/fromnumeric.py", line 54, in _wrapfunc',
        "    return bound(*args, **kwds)",
        "           ^^^^^^^^^^^^^^^^^^^^",
        "numpy._core._exceptions._ArrayMemoryError: Unable to allocate {n}.0 GiB for an array "
        "with shape ({rows}, 4096) and data type float32"],
}

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
_CRASHES_WHILE_TRAINING = {
    "label": ["Traceback (most recent call last):",
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
    # the chief's save into a checkpoint folder it may not write, as measured (the module's
    # docstring): after its step's line, between steps; its peers' calls to it then fail
    "chief's save": [
        "Traceback (most recent call last):",
        '  File "/job/worker.py", line {save_line}, in <module>',
        "    manager.save(checkpoint_number=step)",
        '  File "{site}/tensorflow/python/checkpoint/checkpoint_management.py", line 859, in '
        "save",
        "    save_path = self._checkpoint._write(prefix, options=options)  # pylint: "
        "disable=protected-access",
        "                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "{site}/tensorflow/python/checkpoint/checkpoint.py", line 2369, in _write',
        "    output = self._saver.save(file_prefix=file_prefix, options=options)",
        "             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "{site}/tensorflow/python/checkpoint/checkpoint.py", line 1354, in save',
        "    file_io.recursive_create_dir(os.path.dirname(file_prefix))",
        '  File "{site}/tensorflow/python/lib/io/file_io.py", line 498, in '
        "recursive_create_dir",
        "    recursive_create_dir_v2(dirname)",
        '  File "{site}/tensorflow/python/lib/io/file_io.py", line 513, in '
        "recursive_create_dir_v2",
        "    _pywrap_file_io.RecursivelyCreateDir(compat.path_to_bytes(path))",
        "tensorflow.python.framework.errors_impl.PermissionDeniedError: /data/checkpoints-{n}; "
        "Operation not permitted"],
}

#: The crashes, by name: :func:`failure_logs`' ``crash``.
CRASHES = (*_CRASHES_BEFORE_JOINING, *_CRASHES_WHILE_TRAINING)

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


def _collective_error(kind: str, reason: list[str], step_line: int, site: str,
                      op: int) -> list[str]:
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
            f"\t [[{{{{node sgd/CollectiveReduceV2}}}}]] [Op:__inference_train_step_{op}]"]


def _crash(rng: random.Random, crash: str, site: str, step_line: int, op: int) -> list[str]:
    n, line = rng.randint(10, 99), rng.randint(60, 80)
    classes = rng.randint(3, 9)
    labels = [rng.choice([*range(classes), n]) for _ in range(16)]
    labels[rng.randrange(16)] = n                   # the label the message names
    labels = " ".join(map(str, labels))
    fill = {"site": site, "stdlib": _STDLIBS[site], "n": n, "m": rng.randint(10, 99),
            "rows": n * 65536, "line": line, "step_line": rng.randint(40, 50),
            "replica_line": rng.randint(30, 39), "labels": labels, "op": op,
            "save_line": step_line + 4}
    if crash in _CRASHES_BEFORE_JOINING:
        if crash == "wrong shape":              # a size 64 does not divide
            fill["rows"] = 64 * rng.randint(100, 9999) + rng.randint(1, 63)
        return ["Traceback (most recent call last):",
                f'  File "/job/worker.py", line {line - 50}, in <module>',
                *(text.format(**fill) for text in _CRASHES_BEFORE_JOINING[crash])]
    # a label outside [0, classes), in the step call every worker of the job runs
    fill.update(m=classes, line=step_line)
    return [text.format(**fill) for text in _CRASHES_WHILE_TRAINING[crash]]


def failure_logs(cause: str, num_workers: int, culprit: int | None,
                 rng: random.Random, killed_reason: str | None = None,
                 crashed_early: bool | None = None, crash: str | None = None,
                 timed_out: int = 0, op: int | None = None) -> list[str]:
    """The logs of ``num_workers`` workers after ``cause``, started by worker ``culprit``.

    ``culprit`` is the worker at fault (None for ``"not_in_cluster"``, where every worker is).
    ``killed_reason`` (one of :data:`KILLED_REASONS`) gives every survivor of a killed peer
    that reason; by default each survivor draws its own. ``timed_out`` (for ``"killed"``):
    how many survivors time out first (``DeadlineExceededError``), fewer than all of them.
    ``crash`` (for ``"crashed"``, one of :data:`CRASHES`, by default drawn): what the culprit
    raised; ``crashed_early``: it crashed before it joined the cluster (its peers wait, their
    logs end at ``joining the cluster``, as in ``"never_started"``) or while training (its
    peers time out, or, when worker 0 crashed, find it gone); by default drawn. ``op``: the
    id TensorFlow gave the job's traced ``train_step`` (``__inference_train_step_{op}``, the
    same in every worker of the job, whoever's step failed); by default drawn.
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
    if timed_out and not (cause == "killed" and 0 <= timed_out <= num_workers - 2):
        raise ValueError(f"timed_out={timed_out}: only a kill's survivors time out, and at "
                         "least one of them shows the kill")
    if crash is not None and (crash not in CRASHES or cause != "crashed" or (
            crash == "chief's save" and culprit != 0) or (crashed_early is not None and (
                crash in _CRASHES_BEFORE_JOINING) != crashed_early)):
        raise ValueError(f"crash {crash!r} does not fit {cause!r}, worker {culprit}, "
                         f"crashed_early={crashed_early}")
    ports = rng.sample(range(20000, 60000), num_workers)
    last = rng.randint(3, 12)
    if crashed_early is None:
        crashed_early = crash in _CRASHES_BEFORE_JOINING if crash else rng.random() < 0.5
    if cause == "crashed" and crash is None:
        crash = rng.choice(list(_CRASHES_BEFORE_JOINING) if crashed_early else
                           ["label", "chief's save"] if culprit == 0 else ["label"])
    early = cause == "crashed" and crashed_early   # crashed before joining: the rest wait
    site = rng.choice(_SITES)                      # where the job's workers have TensorFlow
    # the line of the step call in the job's script: the same in every worker's traceback
    step_line = rng.randint(60, 80)
    op = rng.randint(200, 999) if op is None else op   # the job's traced step: one id
    survivors = [w for w in range(num_workers) if w != culprit]
    late = set(rng.sample(survivors, timed_out)) if cause == "killed" else set()
    logs = []
    for worker in range(num_workers):
        lines = [*_noise(rng), "joining the cluster"]
        if cause == "not_in_cluster":
            # only the lesson's script's lines: the replica count is the one tell
            lines += [f"worker {worker}: 1 replicas in sync", *_steps(rng, 1, last), "done"]
        elif cause == "never_started":
            lines = [] if worker == culprit else lines
        elif cause == "crashed" and worker == culprit:
            lines = [*_noise(rng), *_crash(rng, crash, site, step_line, op)] if early else [
                *lines, f"worker {worker}: {num_workers} replicas in sync",
                *_steps(rng, 1, last), *_crash(rng, crash, site, step_line, op)]
        elif not early:
            lines += [f"worker {worker}: {num_workers} replicas in sync",
                      *_steps(rng, 1, last)]
            if worker != culprit:
                if cause == "stalled" or worker in late or (cause == "crashed" and culprit):
                    kind, reason = "DeadlineExceededError", [   # a crashed peer other than
                        "Collective has timed out during execution."]   # 0: as a stall
                else:          # killed, or worker 0 crashed: its port is gone (measured)
                    kind = "UnavailableError"
                    reason = _killed_reason(
                        "closed" if cause == "crashed" else
                        killed_reason or rng.choice(possible_reasons(culprit)),
                        ports[culprit], culprit)
                lines += _collective_error(kind, reason, step_line, site, op)
        logs.append(lines)
    return ["\n".join(lines) + ("\n" if lines else "") for lines in logs]
