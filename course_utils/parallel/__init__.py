"""Model parallelism: a model split across devices, pipelines, DTensor meshes, sharded optimizers.

One job per module: ``placement`` (split a model, read where TensorFlow ran it, memory per
device), ``schedules`` (GPipe, 1F1B and interleaved 1F1B as data: slots, bubble, activations
in flight), ``pipeline`` (running a schedule with per-stage timestamps), ``mesh`` (DTensor
meshes, layouts and a sharded dense layer), ``collectives`` (the all-reduces DTensor ran,
from a fresh process's placement log), ``zero`` (optimizer state sharded over
data-parallel replicas).
"""

from __future__ import annotations

from course_utils.parallel import collectives, mesh, pipeline, placement, schedules, zero
from course_utils.parallel.collectives import collectives_in_fresh_process
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
    measured_bubble,
    run_gpipe,
    run_pipeline,
)
from course_utils.parallel.placement import (
    fresh_layer,
    memory_per_stage,
    model_parallel_devices,
    short_device,
    split_sequential,
    split_step,
    variable_devices,
)
from course_utils.parallel.schedules import (
    Task,
    bubble_fraction,
    check_orders,
    gpipe_orders,
    gpipe_schedule,
    interleaved_bubble_fraction,
    interleaved_orders,
    interleaved_schedule,
    one_f_one_b_orders,
    one_f_one_b_schedule,
    peak_in_flight,
    schedule_bubble,
    schedule_from_orders,
)
from course_utils.parallel.zero import zero_bytes_per_device, zero_shard_bounds

__all__ = [
    "Event", "PipelineRun", "Task", "bubble_fraction", "check_orders", "collectives",
    "collectives_in_fresh_process", "dense_layouts", "fresh_layer",
    "gpipe_orders", "gpipe_schedule", "interleaved_bubble_fraction", "interleaved_orders",
    "interleaved_schedule", "make_mesh",
    "measured_bubble", "memory_per_stage", "mesh", "model_parallel_devices",
    "one_f_one_b_orders", "one_f_one_b_schedule", "peak_in_flight", "pipeline", "placement",
    "run_gpipe", "run_pipeline", "schedule_bubble", "schedule_from_orders", "schedules", "shard",
    "shard_shapes", "sharded_dense", "sharding_of", "short_device", "split_sequential",
    "split_step", "unshard", "variable_devices", "zero", "zero_bytes_per_device",
    "zero_shard_bounds",
]
