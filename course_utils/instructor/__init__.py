"""The instructor's tools: exercises generated from solutions, the batch grader, gradebooks,
feedback, Gradescope autograders and the lesson scaffold. Learners never import this package;
their check cells call :mod:`course_utils.grading`.

* ``generate``: exercises/ from solutions/ (``python -m course_utils exercises``).
* ``submissions`` (reading), ``assemble`` (the instructor's cells put back), ``sandbox`` (one
  notebook under limits, in a ``check_runner`` process that runs ``execute``), ``scoring``
  (a row per check) and ``batch`` (the loop): ``python -m course_utils grade``.
* ``gradebook``, ``feedback``, ``gradescope``, ``canvas``: what the grader writes.
* ``scaffold``: a new lesson's files (``python -m course_utils new``).
"""

from __future__ import annotations

import sys

# The instructor's tools read and run notebooks (nbformat, nbclient), which import jsonschema,
# which imports its optional checker of the "iri" string format, rfc3987_syntax, which builds
# Earley parsers at import: about 2 CPU-seconds in every grading process (one per graded
# notebook), for a format no notebook schema uses (python-jsonschema/jsonschema#1428). An
# import found as None in sys.modules raises ImportError, which jsonschema expects of an
# optional checker: it then validates everything else as before. Learners never import this.
if "jsonschema" not in sys.modules:
    sys.modules.setdefault("rfc3987_syntax", None)

__all__ = []  # the modules are the interface: course_utils.instructor.<module>
