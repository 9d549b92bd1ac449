"""Model parallelism: a model split across devices, a GPipe pipeline, DTensor meshes and layouts.

One job per module: ``placement`` (split a model, read where TensorFlow ran it, memory per
device), ``pipeline`` (the GPipe schedule, running it with per-stage timestamps, the bubble),
``mesh`` (DTensor meshes, layouts and a sharded dense layer).
"""

from __future__ import annotations

from course_utils.parallel import mesh, pipeline, placement
from course_utils.parallel.mesh import (
    dense_layouts,
    make_mesh,
    shard,
    shard_shapes,
    sharded_dense,
    sharding_of,
    unshard,
)
from course_utils.parallel.pipeline import (
    Event,
    PipelineRun,
    Task,
    bubble_fraction,
    gpipe_schedule,
    measured_bubble,
    run_gpipe,
    schedule_bubble,
)
from course_utils.parallel.placement import (
    memory_per_stage,
    model_parallel_devices,
    short_device,
    split_sequential,
    split_step,
    variable_devices,
)

__all__ = [
    "Event", "PipelineRun", "Task", "bubble_fraction", "dense_layouts", "gpipe_schedule",
    "make_mesh", "measured_bubble", "memory_per_stage", "mesh", "model_parallel_devices",
    "pipeline", "placement",
    "run_gpipe", "schedule_bubble", "shard", "shard_shapes", "sharded_dense", "sharding_of",
    "short_device",
    "split_sequential", "split_step", "unshard", "variable_devices",
]
