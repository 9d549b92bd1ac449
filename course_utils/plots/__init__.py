"""The course's pictures: measurement charts and explanatory diagrams, drawn by code.

Every function draws on a Matplotlib ``Axes`` (a new figure when none is given) and returns it,
so a lesson can add to it or lay several side by side. One module per kind of picture:

* ``style.py`` – the palette (Okabe-Ito) and ``axes_for``;
* ``charts.py`` – measurements: throughput bars, time breakdowns, scaling curves, lines;
* ``diagrams_basics.py`` – lessons 00-02: a training step, a pipeline's timeline, data parallelism;
* ``diagrams_clusters.py`` – lessons 03-05: workers, parameter servers, the TPU host loop;
* ``diagrams_parameter_server.py`` – lesson 04: each step on its worker's time line, measured;
  what a lost worker and a lost parameter server cost;
* ``diagrams_parallelism.py`` – 06-07: placement, pipeline schedules, sharding, accumulation;
* ``diagrams_tpu.py`` – lesson 05: a TPU host and chip, padding to 8×128 tiles;
* ``diagrams_memory.py`` – lesson 07: accumulation on replicas, a step's memory budget,
  recomputation;
* ``diagrams_precision.py`` – lesson 08: number formats, loss scaling, a mixed-precision step;
* ``diagrams_capstone.py`` – lesson 09: the capstone job and its measure-then-fix loop.
* ``status_grid.py`` – appendix A: what works where, one coloured cell per API and strategy.
"""

from __future__ import annotations

from course_utils.plots.charts import (
    bar_chart,
    epoch_orders,
    grouped_bars,
    line_chart,
    line_charts,
    scaling_curve,
    time_breakdown,
)
from course_utils.plots.diagrams_basics import (
    PIPELINE_MODES,
    STEP_PARTS,
    draw_data_parallelism,
    draw_pipeline_timeline,
    draw_training_step,
    pipeline_schedule,
)
from course_utils.plots.diagrams_capstone import (
    CAPSTONE_STAGES,
    draw_capstone_job,
    draw_micro_batch_order,
    trace_timeline,
)
from course_utils.plots.diagrams_clusters import (
    allreduce_cost_chart,
    draw_failure_paths,
    draw_multi_worker,
    draw_parameter_server,
    draw_replication,
    draw_tpu_host_loop,
)
from course_utils.plots.diagrams_memory import (
    draw_accumulation_on_replicas,
    draw_memory_budget,
    draw_recomputation,
)
from course_utils.plots.diagrams_parallelism import (
    draw_gradient_accumulation,
    draw_model_split,
    draw_pipeline_events,
    draw_pipeline_schedule,
    draw_sharded_dense,
    draw_zero_stages,
)
from course_utils.plots.diagrams_parameter_server import (
    draw_failure_recovery,
    draw_step_timeline,
)
from course_utils.plots.diagrams_precision import (
    draw_loss_scaling,
    draw_mixed_precision_step,
    draw_number_formats,
)
from course_utils.plots.diagrams_tpu import draw_tile_padding, draw_tpu_system
from course_utils.plots.status_grid import STATUS_COLORS, draw_works_where
from course_utils.plots.style import PALETTE, axes_for

__all__ = [
    "axes_for",
    "allreduce_cost_chart",
    "bar_chart",
    "draw_accumulation_on_replicas",
    "draw_memory_budget",
    "draw_recomputation",
    "CAPSTONE_STAGES",
    "draw_capstone_job",
    "draw_micro_batch_order",
    "draw_data_parallelism",
    "draw_gradient_accumulation",
    "draw_loss_scaling",
    "draw_mixed_precision_step",
    "draw_model_split",
    "draw_failure_paths",
    "draw_multi_worker",
    "draw_number_formats",
    "draw_parameter_server",
    "draw_pipeline_events",
    "draw_pipeline_schedule",
    "draw_pipeline_timeline",
    "draw_replication",
    "draw_sharded_dense",
    "draw_failure_recovery",
    "draw_step_timeline",
    "draw_tile_padding",
    "draw_tpu_host_loop",
    "draw_tpu_system",
    "draw_training_step",
    "draw_works_where",
    "draw_zero_stages",
    "epoch_orders",
    "grouped_bars",
    "line_chart",
    "line_charts",
    "PALETTE",
    "PIPELINE_MODES",
    "pipeline_schedule",
    "scaling_curve",
    "STATUS_COLORS",
    "STEP_PARTS",
    "time_breakdown",
    "trace_timeline",
]
