"""Tensor parallelism with DTensor: a mesh of devices, layouts, and a dense layer sharded on it.

A dense layer ``y = x @ W`` sharded by **columns** of ``W`` gives each device a slice of the
outputs (no communication until someone needs the whole ``y``); sharded by **rows**, each device
multiplies its slice of the inputs by its rows and the partial sums are added across devices
(an all-reduce), which DTensor inserts itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["dense_layouts", "make_mesh", "shard", "shard_shapes", "sharded_dense",
           "sharding_of", "unshard"]


def make_mesh(devices: Sequence[str] | None = None, dim: str = "model") -> Any:
    """A one-dimensional DTensor mesh named ``dim`` over ``devices`` (default: every CPU)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    if devices is None:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    return dtensor.create_mesh([(dim, len(devices))], devices=list(devices))


def dense_layouts(mesh: Any, by: str) -> dict[str, Any]:
    """Layouts of x, kernel and y of a dense layer sharded ``by`` "columns" or "rows"."""
    from tensorflow.experimental import dtensor

    dim, free = mesh.dim_names[0], dtensor.UNSHARDED
    if by == "columns":
        specs = {"x": [free, free], "kernel": [free, dim], "y": [free, dim]}
    elif by == "rows":
        specs = {"x": [free, dim], "kernel": [dim, free], "y": [free, free]}
    else:
        raise ValueError(f"by must be 'columns' or 'rows', got {by!r}")
    return {name: dtensor.Layout(spec, mesh) for name, spec in specs.items()}


def shard(value: Any, layout: Any) -> Any:
    """Put host ``value`` on ``layout``'s mesh: each device gets only its piece (``dtensor.pack``).

    Never a whole copy on every device first: ``copy_to_mesh`` with a replicated layout, then
    ``relayout``, needs the whole value on each device, which a model too big for one device
    does not allow.
    """
    import numpy as np
    from tensorflow.experimental import dtensor

    value = np.asarray(value)
    mesh = layout.mesh
    pieces = []
    for where in mesh.local_device_locations():
        piece = value
        for axis, spec in enumerate(layout.sharding_specs):
            if spec != dtensor.UNSHARDED:
                piece = np.split(piece, mesh.dim_size(spec), axis=axis)[where[spec]]
        pieces.append(piece)
    return dtensor.pack(pieces, layout)


def sharding_of(value: Any) -> list[str]:
    """The sharding spec of a DTensor, one entry per axis: a mesh dimension or "unsharded"."""
    from tensorflow.experimental import dtensor

    return list(dtensor.fetch_layout(value).sharding_specs)


def shard_shapes(value: Any) -> list[tuple[int, ...]]:
    """The shape of the piece each device of the mesh holds."""
    from tensorflow.experimental import dtensor

    return [tuple(int(d) for d in piece.shape) for piece in dtensor.unpack(value)]


def sharded_dense(x: Any, kernel: Any, bias: Any, mesh: Any, by: str) -> Any:
    """``x @ kernel + bias`` with ``kernel`` sharded ``by`` "columns" or "rows" on ``mesh``."""
    import tensorflow as tf

    layouts = dense_layouts(mesh, by)
    bias_layout = type(layouts["y"])([layouts["y"].sharding_specs[1]], mesh)
    y = tf.matmul(shard(x, layouts["x"]), shard(kernel, layouts["kernel"]))
    return y + shard(bias, bias_layout)


def unshard(value: Any) -> Any:
    """The whole value of a DTensor as a NumPy array (gathered to a replicated layout first)."""
    from tensorflow.experimental import dtensor

    layout = dtensor.fetch_layout(value)
    replicated = dtensor.Layout.replicated(layout.mesh, rank=len(value.shape))
    return dtensor.relayout(value, replicated).numpy()
