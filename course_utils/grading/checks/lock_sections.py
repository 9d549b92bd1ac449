"""Lesson 04 ex 3: whether a traced step writes a variable only inside a lock, from a value it
read inside that same lock (:func:`locked_writes`).

``tf.CriticalSection.execute(fn)`` (the pinned ``tensorflow/python/ops/critical_section_ops.py``,
lines 262-324) puts a ``MutexLock`` op on its mutex before ``fn``'s ops (a control dependency on
each), and a ``ConsumeMutexLock`` after ``fn``'s outputs: the lock is held until that op has run,
so that an op runs under the lock exactly when it depends on the ``MutexLock`` and the
``ConsumeMutexLock`` depends on it. A write that is not such an op can run after the lock is
released; a write computed from a read that is not such an op can use a value another worker
has overwritten since (both read before either wrote: an update lost or stale). An op that reads,
computes and writes under the variable's exclusive lock (``assign_add``, an op whose
``use_locking`` is true) is a whole update of its own, stale where its input was computed from
an earlier read of the variable. The graph is read
in its ``FunctionDef`` form, each body its own: a ``tf.cond`` branch, a loop body or a nested
``tf.function`` that reads or writes the variable counts, where it is called, as such an op
(or as a locked write of its own where it takes and releases its lock inside); one nested
deeper than ``_DEPTH`` and given the variable is refused (``"unread function"``). A resource
handle that an op not read through (the output of a ``tf.cond`` or of a nested function)
made from the variable's counts as the variable's (:data:`MAYBE`). What the graph says holds
whatever the timing: races under overlapping workers are likely, not certain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Report", "locked_writes", "mutexes_of"]

#: Ops that read a resource variable and write nothing (any other op given its handle writes).
_READS = frozenset(("ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape",
                    "VarIsInitializedOp"))
#: Ops that read, compute and write a variable under its exclusive lock, as one (any op with a
#: true ``use_locking`` attribute too: ``ResourceApplyMomentum``, ``ResourceScatterNdAdd``).
_ATOMIC = frozenset(("AssignAddVariableOp", "AssignSubVariableOp"))
_ALIASES = frozenset(("Identity", "IdentityN"))  # pass the handle on, touch nothing
#: Function-calling ops whose first input is not an argument of the function (a branch index).
_OFFSET = {"If": 1, "StatelessIf": 1, "Case": 1, "StatelessCase": 1}
_DEPTH = 8  # nested functions read, at most: one deeper given the variable is refused
#: A handle the check cannot trace back to one captured tensor (an output of a ``tf.cond``, a
#: loop or a nested function, or of any other op given the variable's handle): possibly it.
MAYBE = object()


@dataclass
class Report:
    """What one function body does to the variable: its findings (see :func:`locked_writes`),
    whether it reads it, writes it from a read under no lock (``open_writes``), writes it
    whole (``closed_writes``: under a lock, or by one atomic op), writes it at all, and the
    mutexes (the captured handles; ``None`` for one made inside the step) of the locks its
    writes ran under."""

    problems: list[str] = field(default_factory=list)
    reads: bool = False
    open_writes: bool = False
    closed_writes: bool = False
    writes: bool = False
    mutexes: list[Any] = field(default_factory=list)


def _source(token: str) -> str:
    return token.lstrip("^").split(":")[0]


def _ancestors(name: str, inputs: dict[str, list[str]], memo: dict[str, set[str]]) -> set[str]:
    """Every node ``name`` depends on through ``inputs`` (iterative: a long chain of nodes
    would overflow a recursion)."""
    stack, seen = [(name, False)], set()
    while stack:
        node, expanded = stack.pop()
        if expanded:
            found: set[str] = set()
            for source in inputs.get(node, ()):
                found |= {source} | memo.get(source, set())
            memo[node] = found
        elif node not in memo and node not in seen:
            seen.add(node)
            stack.append((node, True))
            stack.extend((s, False) for s in inputs.get(node, ()) if s not in memo)
    return memo[name]


def _body(fdef: Any, handles: dict[str, Any], variable: Any, lookup: Any, depth: int) -> Report:
    """The report of one function body, its arguments' handles (``handles``: argument name ->
    the captured tensor) given."""
    report = Report()
    nodes = {node.name: node for node in fdef.node_def}
    data = {name: [t for t in node.input if not t.startswith("^")] for name, node in nodes.items()}
    everything = {name: [_source(t) for t in node.input if _source(t) in nodes]
                  for name, node in nodes.items()}
    only_data = {name: [_source(t) for t in tokens if _source(t) in nodes]
                 for name, tokens in data.items()}

    def handle(token: str, seen: int = 0) -> Any:
        source = _source(token)
        if source not in nodes:
            return handles.get(source)
        node = nodes[source]
        if node.op in _ALIASES and data[source] and seen < 32:
            index = int(token.split(":")[-1]) if token.count(":") == 2 else 0
            return handle(data[source][min(index, len(data[source]) - 1)], seen + 1)
        if seen < 32 and _is_resource(token, node, lookup) and any(
                handle(t, seen + 1) in ours for t in data[source]):
            return MAYBE  # a handle made from the variable's by an op not read through
        return None

    ours = _Ours(variable)

    reads, writes, closed, blind, locks = set(), set(), set(), set(), {}
    for name, node in nodes.items():
        calls = [value.func.name for value in node.attr.values() if value.HasField("func")]
        calls += [f.name for value in node.attr.values() for f in value.list.func]
        if node.op == "MutexLock":
            mutex = handle(data[name][0]) if data[name] else None
            locks[name] = None if mutex is MAYBE else mutex
        if calls:
            offset = _OFFSET.get(node.op, 0)
            for called in calls:
                inner_def = lookup(called)
                if inner_def is None or depth >= _DEPTH:
                    if any(handle(t) in ours for t in data[name]):
                        report.problems.append("unread function")
                    continue
                args = [arg.name for arg in inner_def.signature.input_arg]
                passed = {arg: handle(token) for arg, token in zip(args, data[name][offset:],
                                                                   strict=False)}
                inner = _body(inner_def, {a: h for a, h in passed.items() if h is not None},
                              variable, lookup, depth + 1)
                report.problems += inner.problems
                report.mutexes += inner.mutexes
                report.writes |= inner.writes
                if inner.reads:
                    reads.add(name)
                if inner.open_writes:
                    writes.add(name)
                elif inner.closed_writes:
                    closed.add(name)
        elif node.op not in _ALIASES and any(handle(t) in ours for t in data[name]):
            if node.op in _READS:
                reads.add(name)
            else:
                locking = node.attr.get("use_locking")
                atomic = node.op in _ATOMIC or bool(locking and locking.b)
                (closed if atomic else writes).add(name)
                blind.update([name] if node.op == "AssignVariableOp" else [])
    memo: dict[str, set[str]] = {}
    sections = {}
    for name, node in nodes.items():  # the ops under each lock: after it, before its release
        if node.op == "ConsumeMutexLock" and data[name] and _source(data[name][0]) in locks:
            lock = _source(data[name][0])
            sections[lock] = {n for n in nodes if lock in _ancestors(n, everything, memo)
                              and n in _ancestors(name, everything, memo)}
    data_memo: dict[str, set[str]] = {}
    report.writes = report.writes or bool(writes | closed)
    for write in sorted(writes | closed):
        fed_by = reads & _ancestors(write, only_data, data_memo)
        under = [lock for lock, members in sections.items() if write in members]
        if under:  # under a lock: every read it is computed from under that same lock
            report.mutexes.append(locks[under[0]])
            report.closed_writes = True
            if fed_by - sections[under[0]]:
                report.problems.append("read outside")
        elif fed_by and any(r in members for r in fed_by for members in sections.values()):
            report.problems.append("write after the lock")
        elif fed_by and write in closed:  # atomic, or locked inside: from an earlier read
            report.problems.append("stale")
        elif write in closed:
            report.closed_writes = True
        elif fed_by or write not in blind:  # a read, then a write; or a racy update op
            report.open_writes = True
    report.reads = bool(reads)
    return report


def locked_writes(concrete: Any, variable: Any) -> Report:
    """The report of the traced step ``concrete`` (a ``ConcreteFunction``) for ``variable``:
    its problems are ``"no lock"`` (a write computed from a read, or an update op that takes
    the variable's shared lock only, under no lock), ``"read outside"`` (a write under a lock
    computed from a read taken outside it), ``"stale"`` (an atomic op, or a nested function
    that locks and writes, given a value computed from an earlier read), ``"write after the
    lock"`` (read under a lock, written after its release), ``"unread function"`` (the
    variable given to a function nested too deep to read)."""
    graph = concrete.graph
    fdef = concrete.function_def
    target = variable.handle
    handles = {arg.name: tensor for arg, tensor in zip(
        fdef.signature.input_arg, _outer_of(graph), strict=False) if tensor is not None}
    variable_handle = next((h for h in handles.values() if h is target), target)

    def lookup(name: str) -> Any:
        try:
            function = graph._get_function(name)
            return getattr(function, "cached_definition", None) or function.definition
        except (AttributeError, KeyError, ValueError):
            return None

    report = _body(fdef, handles, variable_handle, lookup, 0)
    if report.open_writes:
        report.problems.append("no lock")
    return report


class _Ours:
    """``x in ours``: ``x`` is the variable's handle (by identity), or :data:`MAYBE`."""

    def __init__(self, variable: Any) -> None:
        self.variable = variable

    def __contains__(self, found: Any) -> bool:
        return found is self.variable or found is MAYBE


def _is_resource(token: str, node: Any, lookup: Any) -> bool:
    """Whether the output ``token`` (``node:arg:index``) of ``node`` is a resource handle, from
    the op's registered outputs (a function's signature where the op is a function)."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import op_def_registry

    parts = token.split(":")
    arg_name, index = (parts[1], int(parts[2])) if len(parts) == 3 else ("", 0)
    op_def = op_def_registry.get(node.op)
    if op_def is None:
        function = lookup(node.op)
        outputs = function.signature.output_arg if function is not None else []
        return any(arg.name == arg_name and arg.type == types_pb2.DT_RESOURCE
                   for arg in outputs)
    for arg in op_def.output_arg:
        if arg.name != arg_name:
            continue
        if arg.type_list_attr:
            types = list(node.attr[arg.type_list_attr].list.type)
        else:
            one = node.attr[arg.type_attr].type if arg.type_attr else arg.type
            types = [one] * (node.attr[arg.number_attr].i if arg.number_attr else 1)
        return index < len(types) and types[index] == types_pb2.DT_RESOURCE
    return False


def mutexes_of(report: Report) -> list[Any]:
    """The distinct mutexes (by identity) the report's locked writes ran under."""
    distinct: list[Any] = []
    for mutex in report.mutexes:
        if not any(mutex is seen for seen in distinct):
            distinct.append(mutex)
    return distinct


def _outer_of(graph: Any) -> list[Any]:
    """For each input of ``graph`` (its arguments, then its captures), the captured tensor
    outside it (``None`` for an argument)."""
    outer = {id(internal): external for external, internal in graph.captures}
    return [outer.get(id(placeholder)) for placeholder in graph.inputs]
