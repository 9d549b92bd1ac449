"""Lesson 06 ex 3: an attention block sharded by heads (Megatron-LM's attention), never whole.

The check hands the learner ``x`` already on its mesh (every device needs all of it, as the
lesson's column-sharded layer did) and ``init_weight(name, shape)``, which records the shape
asked for and the layout of the ``dtensor.call_with_layout`` it ran inside (read from the call
stack by code identity; None when it ran outside one: the weight whole on one device). The
verdict reads the work, not only the values: each weight made by ``init_weight`` under a layout
that shards its **heads** axis over the mesh's dimension; nothing copied onto the mesh from the
host and no matrix whole on every device or gathered on the way (``dtensor_watch``); the
attention probabilities laid out with the heads sharded, each device's piece (``unpack``, read
by the check after the call) of shape ``(batch, heads / n, seq, seq)`` and equal to its own
heads' probabilities, in the mesh's device order; the output replicated (one all-reduce, over
the heads) and equal on every device to the unsharded block's, computed in NumPy from the
check's own draw of the same weights under the same layouts (DTensor draws a sharded weight
piece by piece, with per-device seeds: not the unsharded draw). Known limit, as in
``dtensor_watch``: a relayout DTensor makes inside an op (one of its inputs gathered whole on
every device to compute it) is no Python call and is not seen, unless a returned layout shows it.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from course_utils.grading.framework import Case
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["attention_case", "weight_initializer"]

#: the axes of each weight (q, k, v: ``(d_model, heads, head_dim)``; o the converse)
NAMES = ("q", "k", "v", "o")


def weight_initializer(seeds: dict[str, tuple[int, int]]) -> tuple[Any, list[Any]]:
    """``init_weight(name, shape)`` and the list of ``(name, shape, layout)`` of its calls."""
    from tensorflow.dtensor.python import api

    tf = _tf()
    calls: list[Any] = []

    def init_weight(name: Any, shape: Any) -> Any:
        if name not in seeds:
            raise ValueError(f"init_weight: name is 'q', 'k', 'v' or 'o', not {name!r}")
        frame, layout = sys._getframe(1), None
        while frame is not None:
            if frame.f_code is api.call_with_layout.__code__:
                layout = frame.f_locals.get("layout")
                break
            frame = frame.f_back
        calls.append((name, tuple(int(n) for n in shape), layout))
        return tf.random.stateless_normal(shape, seed=seeds[name], stddev=0.5)

    return init_weight, calls


def _softmax(scores: Any) -> Any:
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return scores / scores.sum(axis=-1, keepdims=True)


def _block(x: Any, w: dict[str, Any], head_dim: int) -> tuple[Any, Any]:
    """The unsharded attention block in float64: (probabilities, output)."""
    q, k, v = (np.einsum("bsd,dhe->bhse", x, w[n]) for n in "qkv")
    probs = _softmax(np.einsum("bhse,bhte->bhst", q, k) / np.sqrt(head_dim))
    return probs, np.einsum("bhse,hed->bsd", np.einsum("bhst,bhte->bhse", probs, v), w["o"])


def attention_case(rng: Any, devices: list[str], whole: list[str],
                   copied: list[Any]) -> Case:
    """A fresh case: a mesh with a fresh name and size, shapes, seeds; its verify."""
    from tensorflow.experimental import dtensor

    dim = rng.choice(["heads", "tp", "shards"])  # never "model": read mesh.dim_names
    count = rng.choice([n for n in (2, 4) if n <= len(devices)])
    mesh = dtensor.create_mesh([(dim, count)], devices=devices[:count])
    heads, head_dim = count * rng.randint(1, 2), count * rng.randint(1, 2)
    batch, seq, d_model = rng.randint(1, 3), rng.randint(2, 4), rng.randint(3, 6)
    data = np.random.default_rng(rng.randint(0, 2**31 - 1))
    x_np = data.normal(size=(batch, seq, d_model)).astype("float32")
    x = dtensor.pack([x_np] * count, dtensor.Layout.replicated(mesh, rank=3))
    seeds = {n: (rng.randint(0, 9999), rng.randint(0, 9999)) for n in NAMES}
    init_weight, calls = weight_initializer(seeds)
    U = dtensor.UNSHARDED
    specs = {n: [U, dim, U] for n in "qkv"} | {"o": [dim, U, U]}
    shapes = {n: (d_model, heads, head_dim) for n in "qkv"} | {"o": (heads, head_dim, d_model)}
    draw = weight_initializer(seeds)[0]
    weights = {}
    for n in NAMES:  # the check's own draw, under the layouts the task names, gathered
        made = dtensor.call_with_layout(_tf().function(lambda shape, n=n: draw(n, shape)),
                                        dtensor.Layout(specs[n], mesh), shape=shapes[n])
        pieces = [None] * count  # each device's piece, at its coordinate
        for where, piece in zip(mesh.local_device_locations(), dtensor.unpack(made),
                                strict=True):
            pieces[where[dim]] = piece.numpy()
        weights[n] = np.concatenate(pieces, axis=specs[n].index(dim))
    probs, out = _block(x_np.astype("float64"), weights, head_dim)

    def verify(got: Any) -> str | None:
        try:
            return judge(got)
        finally:
            whole.clear()
            copied.clear()

    def made_where() -> str | None:
        for n in NAMES:
            mine = [c for c in calls if c[0] == n]
            if not mine:
                return (f"init_weight({n!r}, ...) was never called: W{n} must be what it makes")
            for _, shape, layout in mine:
                if layout is None:
                    return (f"init_weight({n!r}, ...) ran outside dtensor.call_with_layout: "
                            f"the whole W{n} was made on one device (section 4: create it "
                            "sharded)")
                if shape != shapes[n]:
                    return (f"init_weight({n!r}, {shape}): W{n}'s shape is {shapes[n]}, "
                            "(d_model, num_heads, head_dim) for q, k, v and "
                            "(num_heads, head_dim, d_model) for o")
                if list(layout.sharding_specs) != specs[n]:
                    last = (" (the last axis, head_dim, is the one q·kᵀ sums over: every "
                            "score a partial sum, whole on every device once added)"
                            if list(layout.sharding_specs)[-1] == dim else "")
                    return (f"W{n} was made under layout {list(layout.sharding_specs)}, "
                            f"expected {specs[n]}: shard the heads axis over {dim!r}, so "
                            f"that each device holds whole heads{last}")
        return None

    def judge(got: Any) -> str | None:
        if whole:
            return (f"a matrix was whole on every device, or gathered ({whole[0]}): only x "
                    "may be whole on every device; the weights and the heads' "
                    "activations stay in pieces (section 4)")
        if copied:
            return (f"{copied[0][0]} copied {copied[0][1]} numbers onto the mesh: nothing "
                    "comes from the host (x is already on the mesh; the weights are drawn "
                    "there by init_weight)")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return "return (probs, out), both DTensors on the mesh"
        reason = made_where()
        if reason:
            return reason
        try:
            layouts = [dtensor.fetch_layout(value) for value in got]
        except Exception as error:  # noqa: BLE001 - a plain tensor or array has no layout
            return f"probs and out must be DTensors on the mesh ({type(error).__name__})"
        if any(layout.mesh != mesh for layout in layouts):
            return "a result is not on the given mesh"
        if list(layouts[0].sharding_specs) != [U, dim, U, U]:
            return (f"probs' layout is {list(layouts[0].sharding_specs)}, expected "
                    f"{[U, dim, U, U]}: each device computes the attention of its own heads "
                    "(a replicated layout: every head's probabilities on every device)")
        pieces, per = dtensor.unpack(got[0]), heads // count
        for device, (piece, where) in enumerate(zip(pieces, mesh.local_device_locations(),
                                                    strict=True)):
            first = where[dim] * per
            want = probs[:, first:first + per]
            if tuple(piece.shape) != want.shape:
                return (f"device {device}'s piece of probs has shape {tuple(piece.shape)}, "
                        f"expected {want.shape}: its {per} heads only")
            error = float(np.abs(piece.numpy() - want).max())
            if error > 1e-4:
                which = f"head {first}" if per == 1 else f"heads {first}-{first + per - 1}"
                return (f"device {device}'s piece of probs ({which}) differs from "
                        "the attention "
                        f"probabilities by {error:.2e}: softmax(q·kᵀ / √head_dim) over the "
                        "keys, per head")
        if not layouts[1].is_fully_replicated():
            return (f"out's layout is {list(layouts[1].sharding_specs)}: summed over the "
                    "heads (one all-reduce), out is replicated")
        for device, piece in enumerate(dtensor.unpack(got[1])):
            error = float(np.abs(piece.numpy() - out).max()) if piece.shape == out.shape else -1
            if not 0 <= error <= 1e-4:
                return (f"out on device {device} differs from the unsharded block's "
                        f"({'shape ' + str(tuple(piece.shape)) if error < 0 else error})")
        return None

    return Case(args=(x, init_weight, heads, head_dim, mesh), verify=verify,
                     label=f"(a {count}-device mesh named {dim!r}, {heads} heads of "
                           f"{head_dim}, x {batch}×{seq}×{d_model})")
