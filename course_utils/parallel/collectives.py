"""The collectives DTensor adds to a Megatron MLP's training step, read from TensorFlow's log.

DTensor adds its collectives after tracing (its SPMD expansion), so the traced graph has none.
What the devices really run is logged by ``tf.debugging.set_log_device_placement(True)``, which
works only when switched on before the process's first operation: hence a fresh process
(``python -m course_utils.parallel.collectives BATCH FEATURES HIDDEN``) that builds the MLP
of lesson 06 on a 2 x 2 (batch x model) mesh, with its weights created sharded
(``dtensor.call_with_layout``) and its inputs packed (``dtensor.pack``), runs one forward and
backward pass, and prints the placement log; :func:`collectives_in_fresh_process` reads the
``CollectiveReduceV2`` ops back, each named after the op whose result it sums. Where DTensor
combines several results into one all-reduce, it flattens each (ops named
``<result>/DTensorAllReduceOp/CombinedReduceFlatten``) into one buffer and names the collective
after the first: a row's "sums together" lists them all (the row's own result alone otherwise).
"""

from __future__ import annotations

import re
import sys

__all__ = ["collectives_in_fresh_process"]

_MARK = "=== step: "
_SHAPE = "=== shape: "
_LINE = re.compile(r"^(?P<name>\S+): \((?P<type>\w+)\): \S*device:(?P<device>\w+:\d+)$")


def collectives_in_fresh_process(batch: int, features: int, hidden: int,
                                 timeout_s: float = 300.0) -> dict[str, list[dict[str, object]]]:
    """The all-reduces of the step, x not watched and watched: the op each follows, its devices,
    and the results it sums together (more than one where DTensor combines all-reduces)."""
    from course_utils.child import run_cpu_only

    done = run_cpu_only(["-m", "course_utils.parallel.collectives", str(batch), str(features),
                         str(hidden)], timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"the fresh process failed: {done.stderr.strip()[-800:]}")
    runs: dict[str, dict[str, list[str]]] = {}
    found: dict[str, list[str]] = {}
    shapes: dict[str, str] = {}
    combined: dict[str, list[str]] = {}  # run -> the results flattened into one all-reduce
    run = ""
    for line in done.stdout.splitlines():  # the placer prints its lines to stdout
        if line.startswith(_SHAPE):
            name, shape = line[len(_SHAPE):].split(" ", 1)
            shapes[name] = shape
            continue
        if line.startswith(_MARK):
            run = line[len(_MARK):].strip()
            found, shapes = runs.setdefault(run, {}), {}
            continue
        match = _LINE.match(line.strip())
        if match and match["name"].endswith("/DTensorAllReduceOp/CombinedReduceFlatten"):
            piece = match["name"].split("/DTensorAllReduceOp")[0].split("/", 1)[-1]
            pieces = combined.setdefault(run, [])  # one combined all-reduce a run: this step's
            if f"{piece} {shapes.get(piece, '?')}" not in pieces:  # logged once per device
                pieces.append(f"{piece} {shapes.get(piece, '?')}")
        if match and match["type"] == "CollectiveReduceV2":
            after = match["name"].split("/DTensorAllReduceOp")[0].split("/", 1)[-1]
            devices = found.setdefault(f"{after} {shapes.get(after, '?')}", [])
            if match["device"] not in devices:
                devices.append(match["device"])
    return {run: [{"all-reduce after": key.split(" ", 1)[0],
                   "of a result shaped": key.split(" ", 1)[1], "devices": sorted(devices),
                   "sums together": (combined[run] if key in combined.get(run, [])
                                     else [key])}
                  for key, devices in found.items()] for run, found in runs.items()}


def _main(batch: int, features: int, hidden: int) -> None:
    import tensorflow as tf

    tf.debugging.set_log_device_placement(True)  # before the first op, or it logs nothing
    from tensorflow.experimental import dtensor

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    mesh = dtensor.create_mesh([("batch", 2), ("model", 2)], devices=devices)
    free = dtensor.UNSHARDED
    init = tf.function(tf.random.stateless_normal)
    w1 = dtensor.DVariable(dtensor.call_with_layout(
        init, dtensor.Layout([free, "model"], mesh), shape=(features, hidden), seed=(1, 0)))
    w2 = dtensor.DVariable(dtensor.call_with_layout(
        init, dtensor.Layout(["model", free], mesh), shape=(hidden, features), seed=(1, 1)))
    halves = tf.split(tf.random.stateless_normal((batch, features), seed=(2, 0)), 2)
    x = dtensor.pack([halves[where["batch"]] for where in mesh.local_device_locations()],
                     dtensor.Layout(["batch", free], mesh))

    def step(x: tf.Tensor, watch_input: bool) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            if watch_input:
                tape.watch(x)  # x needs a gradient, as the output of an earlier layer does
            hidden = tf.nn.relu(tf.matmul(x, w1, name="layer_1"))
            out = tf.matmul(hidden, w2, name="layer_2")
            loss = tf.reduce_mean(tf.square(out - x))
        return tape.gradient(loss, [x, w1, w2] if watch_input else [w1, w2])

    for watch_input in (False, True):
        print(f"{_MARK}x {'watched' if watch_input else 'not watched'}",
              flush=True)
        traced = tf.function(lambda x, w=watch_input: step(x, w))
        for op in traced.get_concrete_function(x).graph.get_operations():
            if op.type == "MatMul":  # what each matmul computes, by its (global) shape
                print(f"{_SHAPE}{op.name} {op.outputs[0].shape.as_list()}", flush=True)
        traced(x)


if __name__ == "__main__":
    _main(*(int(arg) for arg in sys.argv[1:4]))
