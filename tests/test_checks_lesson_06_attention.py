"""Lesson 06 ex 3 (``check_shard_attention``): attention sharded by heads, never whole on a
device. The right answer passes; a catalogue of wrong answers as a learner would write them
fails, each with a message that says what differed. 4 logical CPUs (tests/conftest.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

import course_utils as cu
from tests.tools.catalogue_routes import FULL_ENV, catalogue_params

pytestmark = pytest.mark.usefixtures("normal_check_mode")
U = dtensor.UNSHARDED


def _made(init_weight, x, num_heads, head_dim, mesh, qkv_axis=1):
    """The four weights, each made sharded by ``init_weight``: q, k, v on ``qkv_axis``, o by
    heads."""
    dim, d = mesh.dim_names[0], x.shape[-1]
    qkv = [U, U, U]
    qkv[qkv_axis] = dim
    shapes = {"q": (d, num_heads, head_dim), "k": (d, num_heads, head_dim),
              "v": (d, num_heads, head_dim), "o": (num_heads, head_dim, d)}
    return {n: dtensor.call_with_layout(tf.function(init_weight), dtensor.Layout(
        [dim, U, U] if n == "o" else qkv, mesh), n, shape) for n, shape in shapes.items()}


def _block(x, w, head_dim, scale=True, softmax_axis=-1, sum_heads=True):
    q, k, v = (tf.einsum("bsd,dhe->bhse", x, w[n]) for n in "qkv")
    scores = tf.einsum("bhse,bhte->bhst", q, k)
    probs = tf.nn.softmax(scores / np.sqrt(head_dim) if scale else scores, axis=softmax_axis)
    context = tf.einsum("bhst,bhte->bhse", probs, v)
    return probs, tf.einsum("bhse,hed->bsd" if sum_heads else "bhse,hed->bhsd",
                            context, w["o"])


def _answer(qkv_axis=1, **block):
    def answer(x, init_weight, num_heads, head_dim, mesh):
        w = _made(init_weight, x, num_heads, head_dim, mesh, qkv_axis)
        return _block(x, w, head_dim, **block)
    return answer


def shard_attention(x, init_weight, num_heads, head_dim, mesh):  # the solution's
    dim = mesh.dim_names[0]
    by_heads = dtensor.Layout([U, dim, U], mesh)  # W[:, my heads, :]
    w = {n: dtensor.call_with_layout(tf.function(init_weight), by_heads, n,
                                     (x.shape[-1], num_heads, head_dim)) for n in "qkv"}
    w["o"] = dtensor.call_with_layout(tf.function(init_weight),
                                      dtensor.Layout([dim, U, U], mesh), "o",
                                      (num_heads, head_dim, x.shape[-1]))
    q, k, v = (tf.einsum("bsd,dhe->bhse", x, w[n]) for n in "qkv")
    probs = tf.nn.softmax(tf.einsum("bhse,bhte->bhst", q, k) / np.sqrt(head_dim))
    context = tf.einsum("bhst,bhte->bhse", probs, v)
    return probs, tf.einsum("bhse,hed->bsd", context, w["o"])  # one all-reduce, over heads


def by_matmuls(x, init_weight, num_heads, head_dim, mesh):
    """Right too: matmuls and a softmax written out, the heads moved by transposes."""
    w = _made(init_weight, x, num_heads, head_dim, mesh)
    q, k, v = (tf.einsum("bsd,dhe->bhse", x, w[n]) for n in "qkv")
    scores = tf.matmul(q, k, transpose_b=True) * (1 / head_dim ** 0.5)
    e = tf.exp(scores - tf.reduce_max(scores, axis=-1, keepdims=True))
    probs = e / tf.reduce_sum(e, axis=-1, keepdims=True)
    context = tf.transpose(tf.matmul(probs, v), (0, 2, 1, 3))  # (b, s, h, e)
    return probs, tf.tensordot(context, w["o"], axes=[[2, 3], [0, 1]])


def hard_coded_model(x, init_weight, num_heads, head_dim, mesh):
    """The lesson's mesh dimension name, typed."""
    by_heads = dtensor.Layout([U, "model", U], mesh)
    return dtensor.call_with_layout(tf.function(init_weight), by_heads, "q",
                                    (x.shape[-1], num_heads, head_dim)), x


def constant(x, init_weight, num_heads, head_dim, mesh):
    return x, x


def weights_replicated(x, init_weight, num_heads, head_dim, mesh):
    """Every weight made whole on every device, the block computed from them."""
    d, everywhere = x.shape[-1], dtensor.Layout.replicated(mesh, 3)
    w = {n: dtensor.call_with_layout(tf.function(init_weight), everywhere, n,
                                     (num_heads, head_dim, d) if n == "o"
                                     else (d, num_heads, head_dim)) for n in "qkvo"}
    return _block(x, w, head_dim)


def made_on_one_device_then_packed(x, init_weight, num_heads, head_dim, mesh):
    """init_weight called eagerly (whole on the default device), its pieces packed."""
    dim, d = mesh.dim_names[0], x.shape[-1]
    n = mesh.dim_size(dim)
    w = {}
    for name in "qkvo":
        shape, specs = (((num_heads, head_dim, d), [dim, U, U]) if name == "o"
                        else ((d, num_heads, head_dim), [U, dim, U]))
        axis = specs.index(dim)
        w[name] = dtensor.pack(np.split(init_weight(name, shape).numpy(), n, axis=axis),
                               dtensor.Layout(specs, mesh))
    return _block(x, w, head_dim)


def gathered_to_compute(x, init_weight, num_heads, head_dim, mesh):
    """The weights made sharded, gathered to compute; probs then laid out as asked."""
    w = _made(init_weight, x, num_heads, head_dim, mesh)
    whole = {n: dtensor.relayout(t, dtensor.Layout.replicated(mesh, 3)) for n, t in w.items()}
    probs, out = _block(x, whole, head_dim)
    return dtensor.relayout(probs, dtensor.Layout([U, mesh.dim_names[0], U, U], mesh)), out


def computed_on_the_host(x, init_weight, num_heads, head_dim, mesh):
    """The pieces read back to the host (unpack) and the block run there."""
    w = _made(init_weight, x, num_heads, head_dim, mesh)
    return _block(dtensor.unpack(x)[0], {n: dtensor.unpack(t)[0] for n, t in w.items()},
                  head_dim)


def probs_transposed(x, init_weight, num_heads, head_dim, mesh):
    """Right work, probs returned (batch, seq, heads, seq)."""
    probs, out = shard_attention(x, init_weight, num_heads, head_dim, mesh)
    return tf.transpose(probs, (0, 2, 1, 3)), out


def lesson_mlp_copied(x, init_weight, num_heads, head_dim, mesh):
    """The lesson's MLP kernels, 2-D: q, k, v by columns, o by rows, heads cut by reshapes."""
    dim, d = mesh.dim_names[0], x.shape[-1]
    cols, rows = dtensor.Layout([U, dim], mesh), dtensor.Layout([dim, U], mesh)
    w = {n: dtensor.call_with_layout(tf.function(init_weight), cols, n,
                                     (d, num_heads * head_dim)) for n in "qkv"}
    w["o"] = dtensor.call_with_layout(tf.function(init_weight), rows, "o",
                                      (num_heads * head_dim, d))
    heads = {n: tf.reshape(w[n], (d, num_heads, head_dim)) for n in "qkv"}
    heads["o"] = tf.reshape(w["o"], (num_heads, head_dim, d))
    return _block(x, heads, head_dim)


def with_course_helpers(x, init_weight, num_heads, head_dim, mesh):
    """The course's mesh helper, then anything: refused once the function returns."""
    cu.parallel.make_mesh(mesh.local_devices(), dim=mesh.dim_names[0])
    return x, x


#: one rejection, several routes: make test runs the first of each (tests/tools/catalogue_routes)
WHOLE = (r"a matrix was whole on every device, or gathered \(dtensor\.(call_with_layout with "
         r"a replicated rank-2|relayout of a matrix to a replicated|unpack: its pieces)")
PROBS = r"device \d's piece of probs \(heads? [\d-]+\) differs .* √head_dim\) over the keys"

CATALOGUE = {
    "constant": (constant, r"return \(probs, out\)|init_weight\('q', ...\) was never"),
    "lesson's column layout on the last axis": (
        _answer(qkv_axis=2), r"Wq was made under layout \['unsharded', 'unsharded', '\w+'\], "
        r"expected .*shard the heads axis .*head_dim, is the one q·kᵀ sums over"),
    "lesson's MLP copied, 2-D kernels": (lesson_mlp_copied,
                                         r"init_weight\('q', \(\d+, \d+\)\): Wq's shape"),
    "mesh dimension typed as 'model'": (hard_coded_model, "model"),
    "weights replicated": (weights_replicated, WHOLE),
    "made on one device, packed": (made_on_one_device_then_packed,
                                   r"dtensor.pack copied \d+ numbers onto the mesh"),
    "gathered to compute": (gathered_to_compute, WHOLE),
    "computed on the host": (computed_on_the_host, WHOLE),
    "helper under the answer's name": (cu.parallel.sharded_dense,
                                       "the course's sharded_dense, not yours"),
    "course helper inside": (with_course_helpers, "ran the course's make_mesh"),
    "probs transposed": (probs_transposed, r"probs' layout is \['unsharded', 'unsharded', "),
    "out not summed over heads": (_answer(sum_heads=False), r"out's layout is .* all-reduce"),
    "no 1/sqrt(head_dim)": (_answer(scale=False), PROBS),
    "softmax over the heads": (_answer(softmax_axis=1), PROBS),
}


def test_shard_attention_reference_passes():
    assert cu.grading.check_shard_attention(shard_attention) is True


@pytest.mark.skipif(os.environ.get(FULL_ENV) != "1", reason="another right answer: make "
                    "test-grading (COURSE_FULL_CATALOGUES=1) runs it")
def test_shard_attention_by_matmuls_passes():
    assert cu.grading.check_shard_attention(by_matmuls) is True


@pytest.mark.parametrize(("answer", "message"), catalogue_params(CATALOGUE))
def test_shard_attention_wrong_answers_fail(answer, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_shard_attention(answer)
