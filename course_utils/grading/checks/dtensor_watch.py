"""What lesson 06's DTensor exercise watches: matrices made whole on the way to the mesh, or
gathered from it (the layout each call of its initializer ran under: ``head_shards``)."""

from __future__ import annotations

import types
from typing import Any

import numpy as np

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["whole_copy_watch"]

_LIBRARIES = {"tensorflow", "keras", "tf_keras", "numpy"}
_RESOURCE_READS = {"ReadVariableOp", "ResourceGather", "ResourceGatherNd"}


def whole_copy_watch(whole: list[str],
                     copied: list[tuple[str, int, bool, Any]] | None = None) -> Any:
    """A profile callback that notes each matrix put on the mesh whole, or gathered from it.

    Watched by identity of code, whatever name it was reached by: ``dtensor.pack`` or
    ``dtensor.call_with_layout`` with a replicated layout of rank 2 or more (a whole copy on
    every device); ``dtensor.call_with_layout`` of a function given or holding a matrix's data,
    whole or flattened, for a layout of rank 2 or more (``lambda: tf.constant(x)``: the
    constant goes whole into every device's program, which keeps its slice), and any constant
    of 4 or more numbers traced into such a function, however the function reached its data
    (a dict, an attribute: the graph's ``Const`` ops are watched as they are made), and so is
    any read of a host ``tf.Variable`` of 4 or more numbers (its resource read, as it is made);
    ``dtensor.copy_to_mesh`` or ``dtensor.relayout`` of a host tensor of rank 2 or more (the
    whole tensor sent to the mesh, then sliced there); ``dtensor.relayout`` of a DTensor laid
    out replicated (it was whole on every device before), or of any tensor of 4 or more
    numbers to a replicated layout (a flattened kernel); ``dtensor.relayout_like`` of a host
    value of rank 2 or more or 4 or more numbers, or of 4 or more numbers to another
    tensor's replicated layout (a gather); ``dtensor.call_with_layout`` to a replicated
    layout given a sharded DTensor (a gather); ``dtensor.unpack`` of any tensor of
    4 or more numbers, whatever its rank, and ``.numpy()`` of an on-mesh tensor of 4 or more
    (its pieces brought back to the host, e.g. to compute ``y`` there). Not seen: a relayout
    DTensor makes inside an op (a reshape across the sharded axis), which no Python call shows.

    ``copied`` (when given) receives ``(what, numbers, whole, content)`` for every copy of data onto
    the mesh whatever its rank or dtype (bytes and strings counted a float32 per 4 bytes):
    ``whole`` True where every device gets all of it (``copy_to_mesh``, ``relayout`` and
    ``relayout_like`` of a host value, a replicated ``pack``, the data a ``call_with_layout``
    function holds or is given, DTensors laid out whole on every device among it), False for
    one device's component of a sharded ``pack`` (what that device holds), one entry each with
    its content. The check compares the sums with what the task lets a device hold (the bias
    whole, its own piece of ``x``) and each sharded piece's content with those: a whole
    DTensor read on the host through the buffer protocol (``np.asarray``, ``memoryview``: C,
    no Python call to watch) can only come back to the mesh by one of these copies.
    """
    from tensorflow.dtensor.python import api

    tf = _tf()

    def rank(tensor: Any) -> int:
        shape = getattr(tensor, "shape", None)
        return len(shape) if shape is not None else np.ndim(tensor)

    def replicated_matrix(layout: Any) -> bool:
        return layout is not None and layout.rank >= 2 and layout.is_fully_replicated()

    def rank_of(layout: Any) -> int:
        return getattr(layout, "rank", 0) if layout is not None else 0

    def holds_data(fn: Any, args: Any, kwargs: Any) -> int:
        """How many numbers that are data (4 or more in one value, whatever its rank or
        dtype, bytes and strings included, a DTensor laid out whole on every device too)
        are arguments of ``fn`` or held by it: a value in its closure, its
        defaults, a ``functools.partial``'s arguments or a global it names, through the
        functions it holds (``tf.function``'s Python function too). ``init_kernel`` holds
        only a seed and the kernel's shape, two numbers each."""
        values, functions, seen = [*args, *kwargs.values()], [fn], set()
        while functions:
            current = functions.pop()
            if id(current) in seen or len(seen) > 50:
                continue
            seen.add(id(current))
            if (isinstance(current, types.FunctionType) and current is not fn
                    and (current.__module__ or "").split(".")[0] in _LIBRARIES):
                continue  # the library's own code: its module strings are not the data
            inner = [getattr(current, name, None) for name in
                     ("python_function", "__wrapped__", "func")]
            functions += [f for f in inner if callable(f)]
            values += [*getattr(current, "args", ()), *(getattr(current, "keywords", None)
                                                        or {}).values()]
            values += list(getattr(current, "__defaults__", None) or ())
            for cell in getattr(current, "__closure__", None) or ():
                try:
                    values.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
            code_of = getattr(current, "__code__", None)
            names = getattr(current, "__globals__", {})
            if code_of is not None and isinstance(names, dict):
                values += [names[n] for n in code_of.co_names if n in names]
            functions += [v for v in values if callable(v) and not isinstance(v, type)]
        return sum(numbers(value) for value in values if data(value))

    def numbers(value: Any) -> int:
        """How many numbers ``value`` can carry onto the mesh: elements of an array or
        tensor of numbers, a quarter of the bytes of bytes, strings or string tensors (a
        float32's worth each: ``x.tobytes()`` is ``x``), the elements of a DTensor laid out
        whole on every device (already whole there) and of a ``tf.Variable`` (on the host, or
        a DVariable laid out whole); 0 for anything else."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return len(bytes(value)) // 4
        if isinstance(value, str):
            return len(value.encode()) // 4
        if isinstance(value, tf.Variable):  # a host variable's value, whole (x06 L11-L13)
            layout = getattr(value, "layout", None)  # a DVariable's
            if layout is not None and not layout.is_fully_replicated():
                return 0
            return int(value.shape.num_elements() or 0)
        if isinstance(value, tf.Tensor):
            if api.is_dtensor(value):
                layout = api.fetch_layout(value)
                if not layout.is_fully_replicated():
                    return 0
            if value.dtype == tf.string:
                try:
                    return sum(len(b) for b in np.ravel(value.numpy())) // 4
                except Exception:  # noqa: BLE001 - symbolic: count it as data
                    return 1 << 20
            return int(value.shape.num_elements() or 0)
        if isinstance(value, (np.ndarray, list, tuple)):
            try:
                array = np.asarray(value)
            except Exception:  # noqa: BLE001 - ragged or odd: not one array of numbers
                return 0
            if array.dtype.kind in "biufc":
                return int(array.size)
            if array.dtype.kind in "SUV":
                return int(array.nbytes) // 4
        return 0

    def data(value: Any) -> bool:
        return numbers(value) >= 4

    def on_mesh(tensor: Any) -> bool:
        return isinstance(tensor, tf.Tensor) and api.is_dtensor(tensor)

    def key(value: Any) -> Any:
        """The content of a host value (the same bias packed twice is one copy), else None."""
        try:
            array = value.numpy() if isinstance(value, tf.Tensor) else np.asarray(value)
            return (array.dtype.str, array.shape, array.tobytes())
        except Exception:  # noqa: BLE001 - a DTensor or odd value: counted each time
            return None

    relayouts = {api.relayout.__code__: "relayout", api.relayout_like.__code__: "relayout_like"}

    def note(code: Any, local: Any) -> None:
        layout = local.get("layout")
        if code is api.pack.__code__:
            spread = layout is not None and layout.is_fully_replicated()
            pieces = list(local.get("tensors") or ())
            if pieces and spread:
                biggest = max(pieces, key=numbers)
                copied.append(("dtensor.pack", numbers(biggest), spread, key(biggest)))
            for piece in pieces if not spread else ():  # each, its content compared
                copied.append(("dtensor.pack", numbers(piece), spread, key(piece)))
        elif code is api.call_with_layout.__code__:
            held = holds_data(local.get("fn"), local.get("args", ()), local.get("kwargs", {}))
            if held:
                copied.append(("data held by a dtensor.call_with_layout function", held, True,
                               None))
        elif code is api.copy_to_mesh.__code__ or (code in relayouts
                                                   and not on_mesh(local.get("tensor"))):
            name = relayouts.get(code, "copy_to_mesh")
            tensor = local.get("tensor")
            copied.append((f"dtensor.{name} of a host value", numbers(tensor), True,
                           key(tensor)))
        elif code is api.relayout.__code__:  # a DTensor whole on every device before
            copied.append(("dtensor.relayout of a DTensor laid out whole on every device",
                           numbers(local.get("tensor")), True, None))

    from tensorflow.python.framework import ops as _ops
    numpy_code = _ops._EagerTensorBase.numpy.__code__
    new_op_code = _ops.Graph._create_op_internal.__code__  # every graph op, FuncGraph's too

    def host_variable_read(local: Any) -> int:
        """The numbers of the host (not DTensor) variable a resource read being traced reads
        (the handle captured from outside the function: found through its captures)."""
        from tensorflow.python.ops import handle_data_util

        graph, inputs = local.get("self"), list(local.get("inputs") or ())
        for external, internal in getattr(graph, "captures", ()) if inputs else ():
            if internal is not inputs[0]:
                continue
            with tf.init_scope():  # is_dtensor runs eagerly only
                on_the_mesh = api.is_dtensor(external)
            if not on_the_mesh:
                data = handle_data_util.get_resource_handle_data(internal)
                shapes = [tf.TensorShape(entry.shape) for entry in data.shape_and_type]
                return sum(int(shape.num_elements() or 1 << 20) for shape in shapes)
        return 0

    def traced_constant(frame: Any, local: Any) -> None:
        """A constant of 4 or more numbers traced into a function that a
        ``dtensor.call_with_layout`` runs: whole in every device's program, however the
        function reached its data (a dict, an attribute; a file cannot: DTensor has no layout
        propagation for ReadFile)."""
        attrs = local.get("attrs") or {}
        if local.get("op_type") in _RESOURCE_READS:
            held = host_variable_read(local)
            layout = _enclosing_layout(frame) if held >= 4 else None
            if layout is not None and rank_of(layout) >= 2:
                whole.append("dtensor.call_with_layout of a function that reads a host "
                             f"tf.Variable of {held} numbers: its value goes whole to every "
                             "device, each keeps its slice")
            if layout is not None and copied is not None:
                copied.append(("a host tf.Variable read in a dtensor.call_with_layout "
                               "function", held, True, None))
            return
        if local.get("op_type") != "Const" or "value" not in attrs:
            return
        proto = attrs["value"].tensor
        if proto.dtype == tf.string.as_datatype_enum:
            held = sum(len(b) for b in proto.string_val) // 4
            content = None
        else:
            array = tf.make_ndarray(proto)
            held, content = numbers(array), key(array)
        if held < 4:
            return
        layout = _enclosing_layout(frame)
        if layout is None:
            return
        if rank_of(layout) >= 2:
            whole.append("dtensor.call_with_layout of a function that holds a whole "
                         f"matrix's numbers (a constant of {held} traced into it: they go "
                         "to every device, each keeps its slice)")
        if copied is not None:
            copied.append(("a constant traced into a dtensor.call_with_layout function",
                           held, True, content))

    def watch(frame: Any, c_function: Any) -> None:
        if c_function is not None:  # a C function: none of DTensor's calls watched here
            return
        code, local = frame.f_code, frame.f_locals
        if code is numpy_code:
            value = local.get("self")
            if on_mesh(value) and int(value.shape.num_elements() or 0) >= 4:
                whole.append(".numpy() of a DTensor: brought whole to the host")
            return
        if code is new_op_code:
            traced_constant(frame, local)
            return
        if copied is not None:
            note(code, local)
        if code is api.pack.__code__ and replicated_matrix(local.get("layout")):
            whole.append("dtensor.pack with a replicated rank-2 layout")
        elif (code is api.call_with_layout.__code__ and local.get("layout") is not None
              and local.get("layout").is_fully_replicated()
              and any(on_mesh(a) and not api.fetch_layout(a).is_fully_replicated()
                      and int(a.shape.num_elements() or 0) >= 4
                      for a in [*local.get("args", ()), *local.get("kwargs", {}).values()])):
            whole.append("dtensor.call_with_layout gathering a sharded value to a replicated "
                         "layout: whole on every device")
        elif code is api.call_with_layout.__code__ and replicated_matrix(local.get("layout")):
            whole.append("dtensor.call_with_layout with a replicated rank-2 layout")
        elif (code is api.call_with_layout.__code__ and rank_of(local.get("layout")) >= 2
              and holds_data(local.get("fn"), local.get("args", ()), local.get("kwargs", {}))):
            whole.append("dtensor.call_with_layout of a function that holds a whole "
                         "matrix's numbers (they go to every device, each keeps its slice)")
        elif code is api.copy_to_mesh.__code__ and rank(local.get("tensor")) >= 2:
            whole.append("dtensor.copy_to_mesh of a whole matrix, sliced on the mesh")
        elif code is api.relayout.__code__:
            tensor = local.get("tensor")
            target = local.get("layout")
            size = int(getattr(getattr(tensor, "shape", None), "num_elements", lambda: 0)() or 0)
            if (target is not None and target.is_fully_replicated() and size >= 4
                    and rank(tensor) < 2):
                whole.append("dtensor.relayout to a replicated layout: whole on every device")
            elif rank(tensor) >= 2 and replicated_matrix(local.get("layout")):
                whole.append("dtensor.relayout of a matrix to a replicated layout")
            elif not on_mesh(tensor) and rank(tensor) >= 2:
                whole.append("dtensor.relayout of a whole host matrix")
            elif on_mesh(tensor) and replicated_matrix(api.fetch_layout(tensor)):
                whole.append("dtensor.relayout of a matrix laid out whole on every device")
        elif code is api.relayout_like.__code__:  # the layout of another tensor (nb31-06 L3-1)
            tensor, like = local.get("tensor"), local.get("layout_tensor")
            target = api.fetch_layout(like) if on_mesh(like) else None
            if not on_mesh(tensor) and (rank(tensor) >= 2 or data(tensor)):
                whole.append("dtensor.relayout_like of a whole host value: sent whole to "
                             "every device, sliced there")
            elif (int(getattr(getattr(tensor, "shape", None), "num_elements", lambda: 0)()
                      or 0) >= 4 and (target is None or target.is_fully_replicated())):
                whole.append("dtensor.relayout_like to a replicated layout (that of the "
                             "tensor given): whole on every device")
        elif code is api.unpack.__code__ and int(getattr(getattr(local.get("tensor"), "shape",
                                                              None), "num_elements",
                                                      lambda: 0)() or 0) >= 4:
            whole.append("dtensor.unpack: its pieces brought back to the host")

    return watch


def _enclosing_layout(frame: Any) -> Any:
    """The layout of the ``dtensor.call_with_layout`` on the call stack above ``frame``
    (found by code identity), or None."""
    from tensorflow.dtensor.python import api

    while frame is not None and frame.f_code is not api.call_with_layout.__code__:
        frame = frame.f_back
    return frame.f_locals.get("layout") if frame is not None else None

