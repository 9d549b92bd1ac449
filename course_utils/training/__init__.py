"""One correct distributed training loop for Keras 3 models under any ``tf.distribute`` strategy.

Keras 3 ``model.fit`` fails under MultiWorkerMirroredStrategy and ParameterServerStrategy, and its
``gradient_accumulation_steps`` fails under MirroredStrategy. :class:`Trainer` is the custom loop
the lessons teach, written once and tested:

* per-example losses are averaged over the **global** batch (``tf.nn.compute_average_loss`` with
  keyword arguments), regularization losses are scaled per replica
  (``tf.nn.scale_regularization_loss``), and the reported loss is the true mean;
* batches that do not split evenly over the replicas (a short last batch) give the same update
  and loss as on one device, because the global batch size is counted, not assumed;
* ``accumulation_steps=k`` applies one update per ``k`` batches, equal to one update on a batch
  ``k`` times larger, on one device and under (multi-worker) mirrored strategies;
* mixed precision (``"mixed_float16"``, ``"mixed_bfloat16"``) without changing Keras's global
  policy, a ``LossScaleOptimizer`` for float16, and non-finite steps skipped on every replica;
* parameter-server training through ``ClusterCoordinator``, with step counts, losses and metrics
  computed on the coordinator (Keras 3's own counters lose updates there);
* ``checkpoint_dir`` for fault tolerance: a restarted job resumes where it stopped.

Example::

    trainer = Trainer(model_fn, optimizer_fn, loss_fn, strategy=strategy)
    history = trainer.fit(dataset, epochs=3)
    history["loss"]

One job per module (the loop of lesson 02 is in ``replica_step.py``):

* ``replica_step.py`` – the replica step: forward pass, loss over the global batch, gradients;
* ``accumulation.py`` – several micro-batches per update;
* ``precision.py`` – the precision policy, loss scaling, non-finite steps;
* ``checkpoints.py`` – checkpoints and resume;
* ``parameter_server.py`` – the ``ClusterCoordinator`` path;
* ``evaluation.py`` – the evaluation step;
* ``metrics.py`` and ``progress.py`` – what an epoch reports, and how it is shown;
* ``batches.py`` – batches, their sizes and the length of an epoch;
* ``trainer.py`` – the :class:`Trainer`, which puts them together.
"""

from __future__ import annotations

from course_utils.training.parameter_server import UnsupportedByKeras3Error
from course_utils.training.precision import (
    PRECISION_POLICIES,
    policy_scope,
    skip_everywhere_if_not_finite,
)
from course_utils.training.progress import in_notebook
from course_utils.training.trainer import Trainer

__all__ = [
    "PRECISION_POLICIES",
    "Trainer",
    "UnsupportedByKeras3Error",
    "in_notebook",
    "policy_scope",
    "skip_everywhere_if_not_finite",
]
