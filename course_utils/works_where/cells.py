"""The rows, columns and cells of the "what works where" table, and the upstream issues behind them.

No TensorFlow here: a :class:`Cell` is plain data (a status, what was checked or the error, an
issue link), so a table can be written, read back and compared without starting TensorFlow.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

__all__ = [
    "APIS",
    "STRATEGIES",
    "STATUSES",
    "KNOWN_ISSUES",
    "NOT_APPLICABLE",
    "FIRST_REPLICA_ONLY",
    "OVERFLOW_NOT_PROBED",
    "ITERATIONS_SHORT",
    "REMAT_MODES",
    "REMAT_ROWS",
    "Cell",
    "first_line",
    "failed",
    "not_applicable",
]

#: Row key -> label: every data-parallel training API of the course (lesson 06's model
#: parallelism – a model split with ``tf.device``, DTensor, ``ModelParallel`` – is no row).
APIS: dict[str, str] = {
    "keras3_fit": "Keras 3 `fit`",
    "steps_per_execution": "Keras 3 `fit`, `steps_per_execution=2`",
    "jit_compile": "Keras 3 `fit`, `jit_compile=True` (XLA)",
    "custom_loop": "Keras 3 custom loop (`strategy.run` + `GradientTape`)",
    "trainer": "`cu.Trainer`",
    "tf_keras_fit": "tf_keras `fit`",
    "gradient_accumulation": "Keras `gradient_accumulation_steps` (in `fit`)",
    "loss_scale_optimizer": "`LossScaleOptimizer` + `mixed_float16` (custom loop)",
    "recompute_grad": "`tf.recompute_grad` around the model (custom loop)",
    "remat_scope": "`keras.RematScope(mode=\"full\")` (in `fit`)",
    "remat_activations": "`keras.RematScope(mode=\"activations\")` (in `fit`)",
    "remat_larger_than": "`keras.RematScope(mode=\"larger_than\")` (in `fit`)",
    "remat_list_of_layers": "`keras.RematScope(mode=\"list_of_layers\")` (in `fit`)",
    "keras_distribution": "`keras.distribution.DataParallel`",
}

#: Row key -> the ``keras.RematScope`` mode (and its options) the row's model is built in.
REMAT_MODES: dict[str, dict] = {
    "remat_scope": {"mode": "full"},
    "remat_activations": {"mode": "activations"},
    "remat_larger_than": {"mode": "larger_than", "output_size_threshold": 1},
    "remat_list_of_layers": {"mode": "list_of_layers", "layer_names": ["hidden"]},
}
REMAT_ROWS = tuple(REMAT_MODES)

#: Column key -> label: every strategy of the course.
STRATEGIES: dict[str, str] = {
    "default": "default",
    "one_device": "OneDevice",
    "mirrored": "Mirrored",
    "multi_worker": "MultiWorker (2 processes)",
    "parameter_server": "ParameterServer (in-process)",
    "tpu": "TPU or fallback",
}

#: What a cell can say: it trained and the check passed; it ran but the check failed (silently
#: wrong); it raised; the combination makes no sense.
STATUSES = ("works", "wrong", "fails", "n/a")

_KERAS = "https://github.com/keras-team/keras/issues/"
_XLA_VARIABLES = "https://www.tensorflow.org/xla/known_issues#tfvariable_on_a_different_device"
_CUSTOM_GRADIENT = "https://www.tensorflow.org/api_docs/python/tf/custom_gradient"
#: Keras source at the tag of the version the appendix cites line numbers of (not master).
_KERAS_SOURCE = "https://github.com/keras-team/keras/blob/v3.15.1/keras/src/"

#: (row, column) -> the upstream issue a failing or wrong cell cites (the TPU fallback column
#: cites the mirrored one's); never beside a ✅, whose link is a caveat its details state.
KNOWN_ISSUES: dict[tuple[str, str], str] = {
    ("keras3_fit", "multi_worker"): _KERAS + "20585",
    ("gradient_accumulation", "multi_worker"): _KERAS + "20585",
    ("keras3_fit", "parameter_server"): _KERAS + "18624",
    ("gradient_accumulation", "parameter_server"): _KERAS + "18624",
    ("custom_loop", "parameter_server"): _KERAS + "18624",
    ("loss_scale_optimizer", "parameter_server"): _KERAS + "18624",
    ("trainer", "parameter_server"): _KERAS + "18624",
    ("gradient_accumulation", "mirrored"): _KERAS + "20582",
    ("steps_per_execution", "mirrored"): _KERAS + "19246",
    ("steps_per_execution", "multi_worker"): _KERAS + "20585",
    ("steps_per_execution", "parameter_server"): _KERAS + "18624",
    ("jit_compile", "mirrored"): _XLA_VARIABLES,
    ("jit_compile", "multi_worker"): _KERAS + "20585",
    ("jit_compile", "parameter_server"): _KERAS + "18624",
    ("keras_distribution", "default"): _KERAS_SOURCE + "backend/tensorflow/distribution_lib.py",
    # keras.distribution.initialize calls the backend's initialize, which only JAX defines
    ("keras_distribution", "multi_worker"): _KERAS_SOURCE
    + "distribution/distribution_lib.py#L151",
    ("recompute_grad", "parameter_server"): _KERAS + "18624",
    # mode="activations" trains where fit does: no issue to cite beside its ✅
    **{(row, column): _CUSTOM_GRADIENT for row in REMAT_ROWS if row != "remat_activations"
       for column in ("default", "one_device", "mirrored")},
    **{(row, "multi_worker"): _KERAS + "20585" for row in REMAT_ROWS},
    **{(row, "parameter_server"): _KERAS + "18624" for row in REMAT_ROWS},
}

#: What a LossScaleOptimizer cell cites when an overflow on a replica other than the first was
#: applied (the runner then makes the cell "wrong", ⚠️): the optimizer checks finiteness on the
#: first replica only.
FIRST_REPLICA_ONLY = _KERAS_SOURCE + "optimizers/loss_scale_optimizer.py"

#: The caveat of a "works" LossScaleOptimizer cell whose overflow probe was not run (under
#: multi-worker and parameter servers): only finite steps were checked there. Links to the
#: runner that skips it.
OVERFLOW_NOT_PROBED = ("https://github.com/scaling-tensorflow/scaling-tensorflow/blob/main/"
                       "course_utils/works_where/runner.py")

#: The caveat of a "works" parameter-server cell whose ``optimizer.iterations`` counted fewer
#: steps than were applied (its detail says by how many): Keras's ``assign_add`` is
#: ``self.assign(self + value)``, a read then a write, so two workers stepping at once lose a
#: count. Links to those lines of the Keras source at the cited version.
ITERATIONS_SHORT = _KERAS_SOURCE + "backend/common/variables.py#L300-L301"

#: (row, column) -> why the combination makes no sense.
NOT_APPLICABLE: dict[tuple[str, str], str] = {
    ("keras_distribution", "one_device"): "keras.distribution replaces tf.distribute: "
    "it is tried alone, in the default column",
    ("keras_distribution", "mirrored"): "keras.distribution replaces tf.distribute: "
    "it is tried alone, over the same devices, in the default column",
    ("keras_distribution", "parameter_server"): "keras.distribution has no parameter servers",
    ("keras_distribution", "tpu"): "keras.distribution replaces tf.distribute: "
    "it is tried alone, in the default column",
}


@dataclass(frozen=True)
class Cell:
    """One combination's result: ``status`` (one of :data:`STATUSES`), ``detail``, ``issue``."""

    status: str
    detail: str
    issue: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, str | None]:
        """The cell as a JSON-ready dict (what a worker process reports)."""
        return asdict(self)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Lines of an error message that say nothing about the cause (headers, traceback lines).
_NOISE = re.compile(r"^(Exception encountered when calling|Graph execution error|Detected at node|"
                    r"\d+ root error\(s\) found|\d+ successful operations|"
                    r"\d+ derived errors ignored|File \"|\[\[)")


def first_line(error: BaseException, limit: int = 150) -> str:
    """``Type: the first line of the message that names the cause``, cut at ``limit`` chars.

    Skips Keras's "Exception encountered when calling ..." wrapper, TensorFlow's "Graph
    execution error" headers and traceback lines, and collapses printed values (``{...}``).
    """
    text = _ANSI.sub("", str(error))
    raw = [s for s in text.splitlines() if s.strip() and not s.startswith(("    ", "\t"))]
    lines = [s.strip() for s in raw]
    useful = [s for s in lines if not _NOISE.match(s)]
    line = (useful or lines or [""])[0]
    if "{" in line and "}" not in line:  # a value printed over many lines: drop its body
        whole = " ".join(useful or lines)
        head, _, tail = whole.partition("{")
        line = f"{head}{{…}}{tail.rpartition('}')[2]}"
    line = re.sub(r"^\(\d+\) [A-Z_]+:\s*", "", line)  # "(0) INVALID_ARGUMENT:  ..."
    line = re.sub(r" \(defined @ [^)]*\)", "", line)  # absolute paths of this machine
    line = re.sub(r"\s+", " ", line).strip()
    if len(line) > limit:
        line = line[: limit - 1].rstrip() + "…"
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


def _issue(row: str, column: str) -> str | None:
    return KNOWN_ISSUES.get((row, "mirrored" if column == "tpu" else column))


def failed(row: str, column: str, error: BaseException) -> Cell:
    """The cell of a combination that raised ``error``, with its upstream issue if known."""
    return Cell("fails", first_line(error), _issue(row, column))


def not_applicable(row: str, column: str) -> Cell:
    """The ``n/a`` cell of a combination that makes no sense, with the reason."""
    return Cell("n/a", NOT_APPLICABLE[(row, column)])
