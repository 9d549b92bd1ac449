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

__all__ = []  # the modules are the interface: course_utils.instructor.<module>
