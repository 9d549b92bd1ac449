"""Lesson 06's checks: reference solutions pass, lazy and wrong answers fail with a useful
message, stubs are "not attempted". The unit-test process has 4 logical CPUs (tests/conftest.py)."""

from __future__ import annotations

import itertools

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_06
from course_utils.grading.framework import NotAttemptedError, strict_checks

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def budgeted_orders(num_stages, num_micro_batches, max_in_flight):  # the solution's
    forwarded, backwarded = [0] * num_stages, [0] * num_stages
    orders = [[] for _ in range(num_stages)]
    while backwarded[0] < num_micro_batches:
        done_f, done_b = list(forwarded), list(backwarded)  # finished in earlier slots
        for s in range(num_stages):
            f, b = done_f[s], done_b[s]
            if b < f and (s == num_stages - 1 or done_b[s + 1] > b):
                orders[s].append(("B", b))
                backwarded[s] += 1
            elif (f < num_micro_batches and f - b < max_in_flight[s]
                  and (s == 0 or done_f[s - 1] > f)):
                orders[s].append(("F", f))
                forwarded[s] += 1
    return orders


def by_ready_slots(num_stages, num_micro_batches, max_in_flight):  # right: slots of readiness
    k, m = num_stages, num_micro_batches
    f_at, b_at = [[] for _ in range(k)], [[] for _ in range(k)]  # slots each pass ran
    orders, slot = [[] for _ in range(k)], 0
    while len(b_at[0]) < m:
        for s in range(k):
            f, b = len(f_at[s]), len(b_at[s])
            came_back = f_at[s] if s == k - 1 else b_at[s + 1]  # what B(s, b) waits for
            if b < f and len(came_back) > b and came_back[b] < slot:
                b_at[s].append(slot)
                orders[s].append(("B", b))
            elif f < m and f - b < max_in_flight[s] and (
                    s == 0 or (len(f_at[s - 1]) > f and f_at[s - 1][f] < slot)):
                f_at[s].append(slot)
                orders[s].append(("F", f))
        slot += 1
    return orders


def _alternation(num_stages, num_micro_batches, warm_ups):
    orders = []
    for warm_up in warm_ups:
        warm_up = min(warm_up, num_micro_batches)
        order = [("F", b) for b in range(warm_up)]
        for b in range(warm_up, num_micro_batches):
            order += [("F", b), ("B", b - warm_up)]
        orders.append(order + [("B", b) for b in range(num_micro_batches - warm_up,
                                                       num_micro_batches)])
    return orders


def the_lessons_1f1b(num_stages, num_micro_batches, max_in_flight):  # section 3, budgets ignored
    return _alternation(num_stages, num_micro_batches,
                        [num_stages - 1 - s for s in range(num_stages)])


def each_stages_budget_in_the_warm_up(num_stages, num_micro_batches, max_in_flight):
    return _alternation(num_stages, num_micro_batches,  # the old exercise, one budget a stage
                        [min(num_stages - 1 - s, max_in_flight[s] - 1)
                         for s in range(num_stages)])


def smallest_budget_upstream_in_the_warm_up(num_stages, num_micro_batches, max_in_flight):
    return _alternation(num_stages, num_micro_batches,  # no deadlock, strict alternation
                        [min(num_stages - 1 - s, min(max_in_flight[:s + 1]) - 1)
                         for s in range(num_stages)])


def _greedy(num_stages, num_micro_batches, budgets, backward_first=True):
    forwarded, backwarded = [0] * num_stages, [0] * num_stages
    orders = [[] for _ in range(num_stages)]
    while backwarded[0] < num_micro_batches:
        done_f, done_b = list(forwarded), list(backwarded)
        for s in range(num_stages):
            f, b = done_f[s], done_b[s]
            can_b = b < f and (s == num_stages - 1 or done_b[s + 1] > b)
            can_f = (f < num_micro_batches and f - b < budgets[s]
                     and (s == 0 or done_f[s - 1] > f))
            if can_b and (backward_first or not can_f):
                orders[s].append(("B", b))
                backwarded[s] += 1
            elif can_f:
                orders[s].append(("F", f))
                forwarded[s] += 1
    return orders


def forward_first(num_stages, num_micro_batches, max_in_flight):
    return _greedy(num_stages, num_micro_batches, max_in_flight, backward_first=False)


def smallest_budget_everywhere(num_stages, num_micro_batches, max_in_flight):
    return _greedy(num_stages, num_micro_batches, [min(max_in_flight)] * num_stages)


def one_over_budget(num_stages, num_micro_batches, max_in_flight):
    return _greedy(num_stages, num_micro_batches, [c + 1 for c in max_in_flight])


def later_budgets_left_out(num_stages, num_micro_batches, max_in_flight):  # xf06 L1
    """Only the first three stages' budgets kept: "the stages after follow them"."""
    return _greedy(num_stages, num_micro_batches,
                   [c if s < 3 else num_micro_batches for s, c in enumerate(max_in_flight)])


def budgets_ignored(num_stages, num_micro_batches, max_in_flight):
    return _greedy(num_stages, num_micro_batches, [num_micro_batches] * num_stages)


def budgets_raised_in_place(num_stages, num_micro_batches, max_in_flight):  # read from input
    max_in_flight[:] = [num_stages - s for s in range(num_stages)]
    return budgeted_orders(num_stages, num_micro_batches, max_in_flight)


def gpipe_orders(num_stages, num_micro_batches, max_in_flight):
    return [[("F", b) for b in range(num_micro_batches)]
            + [("B", b) for b in range(num_micro_batches)] for _ in range(num_stages)]


def one_forward_then_its_backward(num_stages, num_micro_batches, max_in_flight):  # serial
    return [[(p, b) for b in range(num_micro_batches) for p in "FB"] for _ in range(num_stages)]


def backward_first(num_stages, num_micro_batches, max_in_flight):  # B before its F: a deadlock
    return [[("B", 0), ("F", 0)] + [(p, b) for b in range(1, num_micro_batches) for p in "FB"]
            for _ in range(num_stages)]


def the_lessons_helper(num_stages, num_micro_batches, max_in_flight):
    return cu.parallel.one_f_one_b_orders(num_stages, num_micro_batches)


def _copy_of_the_schedules_module():
    """The course's schedules module run again from its source: new code objects, same code."""
    import inspect

    from course_utils.parallel import schedules

    namespace = {"__name__": "__main__"}  # as in a notebook
    exec(compile(inspect.getsource(schedules), "<pasted>", "exec"), namespace)  # noqa: S102
    return namespace


def exec_copy_of_the_helper(num_stages, num_micro_batches, max_in_flight):
    return _copy_of_the_schedules_module()["one_f_one_b_orders"](num_stages, num_micro_batches)


def the_checks_count_recorded(num_stages, num_micro_batches, max_in_flight):
    from course_utils.grading.checks import budget_orders

    budget_orders.fewest_slots(max_in_flight, num_micro_batches)  # called, to time the answer
    return budgeted_orders(num_stages, num_micro_batches, max_in_flight)

def _split_once(parts, x, y, loss_fn, devices):  # one micro-batch, each part's backward at home
    import tensorflow as tf

    tapes, inputs, outputs, value = [], [], [], tf.convert_to_tensor(x)
    for i, (part, device) in enumerate(zip(parts, devices, strict=True)):
        with tf.device(device), tf.GradientTape() as tape:
            tape.watch(value)
            inputs.append(value)
            value = part(value)
            if i == len(parts) - 1:
                value = loss = loss_fn(y, value)
        tapes.append(tape)
        outputs.append(value)
    grads, upstream = [], None
    for i in reversed(range(len(parts))):
        wanted = [inputs[i]] * (i > 0) + parts[i].trainable_variables
        with tf.device(devices[i]):
            found = tapes[i].gradient(outputs[i], wanted, output_gradients=upstream)
        upstream = found[0] if i > 0 else None
        grads = found[i > 0:] + grads
    return loss, grads


def accumulated(single, at_home=True, weigh="examples"):
    """A micro-batch answer from a one-batch one: each micro-batch's loss and gradients weighted
    (by its share of the examples, by 1/M, or not at all), the gradients summed per part, where
    asked."""
    import contextlib

    def answer(parts, micro_batches, loss_fn, devices):
        import tensorflow as tf

        owner = [d for part, d in zip(parts, devices, strict=True)
                 for _ in part.trainable_variables]
        total = sum(int(y.shape[0]) for _, y in micro_batches)
        losses, sums = [], None
        for x, y in micro_batches:
            loss, grads = single(parts, x, y, loss_fn, devices)
            w = {"examples": int(y.shape[0]) / total, "micro-batches": 1 / len(micro_batches),
                 "none": 1.0}[weigh]
            losses.append(loss * w)
            scaled = []
            for index, (grad, device) in enumerate(zip(grads, owner, strict=True)):
                with tf.device(device) if at_home else contextlib.nullcontext():
                    scaled.append(grad * w if sums is None else sums[index] + grad * w)
            sums = scaled
        return tf.add_n(losses), sums

    return answer


fixed_part_step = accumulated(_split_once)
the_lessons_fix_in_a_loop = accumulated(_split_once, weigh="micro-batches")  # the old answer


def _one_tape(parts, x, y, loss_fn, devices, backward_device=None, copy=False):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        value = x
        for part, device in zip(parts, devices, strict=True):
            with tf.device(device):
                value = part(value)
        loss = loss_fn(y, value)
    variables = [v for part in parts for v in part.trainable_variables]
    if backward_device is None:
        grads = tape.gradient(loss, variables)
    else:
        with tf.device(backward_device):
            grads = tape.gradient(loss, variables)
    if copy:  # each gradient copied onto "its" device afterwards
        owner = [d for part, d in zip(parts, devices, strict=True)
                 for _ in part.trainable_variables]
        copied = []
        for grad, device in zip(grads, owner, strict=True):
            with tf.device(device):
                copied.append(tf.identity(grad))
        grads = copied
    return loss, grads


def _through_the_parts(parts, devices, x):
    """The forward pass: each part on its device, one after the other."""
    import tensorflow as tf

    value = x
    for part, device in zip(parts, devices, strict=True):
        with tf.device(device):
            value = part(value)
    return value


def one_tape(parts, micro_batches, loss_fn, devices):  # the broken code of the exercise
    import tensorflow as tf

    variables = [v for part in parts for v in part.trainable_variables]
    with tf.GradientTape() as tape:
        losses = [loss_fn(y, _through_the_parts(parts, devices, x)) * _share(y, micro_batches)
                  for x, y in micro_batches]
        loss = tf.add_n(losses)
    return loss, tape.gradient(loss, variables)


def _share(y, micro_batches):
    """Micro-batch ``y``'s share of the batch's examples."""
    return int(y.shape[0]) / sum(int(b.shape[0]) for _, b in micro_batches)


one_tape_copied_with_identity = accumulated(
    lambda *a: _one_tape(*a, backward_device=a[-1][0], copy=True))
one_tape_on_the_last_device = accumulated(lambda *a: _one_tape(*a, backward_device=a[-1][-1]))
summed_on_the_default_device = accumulated(_split_once, at_home=False)
summed_not_averaged = accumulated(_split_once, weigh="none")


def first_micro_batch_only(parts, micro_batches, loss_fn, devices):
    return _split_once(parts, *micro_batches[0], loss_fn, devices)


def _the_lessons_two_part_fix(parts, x, y, loss_fn, devices):  # ignores parts beyond two
    import tensorflow as tf

    part_a, part_b = parts[0], parts[-1]
    with tf.device(devices[0]), tf.GradientTape() as tape_a:
        hidden = part_a(x)
    with tf.device(devices[-1]), tf.GradientTape() as tape_b:
        tape_b.watch(hidden)
        loss = loss_fn(y, part_b(hidden))
    with tf.device(devices[-1]):
        d_hidden, *grads_b = tape_b.gradient(loss, [hidden, *part_b.trainable_variables])
    with tf.device(devices[0]):
        grads_a = tape_a.gradient(hidden, part_a.trainable_variables, output_gradients=d_hidden)
    return loss, grads_a + grads_b


the_lessons_two_part_fix = accumulated(_the_lessons_two_part_fix)


def _each_part_recomputes_from_the_loss(parts, x, y, loss_fn, devices):
    """Right devices for the last op of each gradient, but later parts' backward redone there."""
    import tensorflow as tf

    with tf.GradientTape(persistent=True) as tape:
        value = x
        for part, device in zip(parts, devices, strict=True):
            with tf.device(device):
                value = part(value)
        loss = loss_fn(y, value)
    grads = []
    for part, device in zip(parts, devices, strict=True):
        with tf.device(device):
            grads += tape.gradient(loss, part.trainable_variables)
    return loss, grads


each_part_recomputes_from_the_loss = accumulated(_each_part_recomputes_from_the_loss)


def _forgets_output_gradients(parts, x, y, loss_fn, devices):  # each part: d(sum of output)
    import tensorflow as tf

    tapes, outputs, value = [], [], tf.convert_to_tensor(x)
    for i, (part, device) in enumerate(zip(parts, devices, strict=True)):
        with tf.device(device), tf.GradientTape() as tape:
            value = part(value)
            if i == len(parts) - 1:
                value = loss = loss_fn(y, value)
        tapes.append(tape)
        outputs.append(value)
    grads = []
    for i, part in enumerate(parts):
        with tf.device(devices[i]):
            grads += tapes[i].gradient(outputs[i], part.trainable_variables)
    return loss, grads


forgets_output_gradients = accumulated(_forgets_output_gradients)


def _with_the_course_helper(parts, x, y, loss_fn, devices):
    step = cu.parallel.split_step(parts, devices, x, y, loss_fn)
    return step["loss"], step["grads"]


with_the_course_helper = accumulated(_with_the_course_helper)


def helper_only_when_traced(parts, micro_batches, loss_fn, devices):
    """Right values eagerly (placed wrong), the course's helper in a graph: both are read."""
    import tensorflow as tf

    answer = one_tape if tf.executing_eagerly() else with_the_course_helper
    return answer(parts, micro_batches, loss_fn, devices)


_EAGER_NUMBERS = {}


def numbers_kept_from_the_eager_call(parts, micro_batches, loss_fn, devices):
    """Eagerly the colleague's one tape, each gradient copied onto its part's device and kept;
    traced, the kept numbers as constants, plus an op per micro-batch for show."""
    import tensorflow as tf

    home = [i for i, part in enumerate(parts) for _ in part.trainable_variables]
    if tf.executing_eagerly():
        loss, grads = one_tape(parts, micro_batches, loss_fn, devices)
        copied = []
        for grad, i in zip(grads, home, strict=True):
            with tf.device(devices[i]):
                copied.append(tf.identity(grad))
        _EAGER_NUMBERS[id(parts[0])] = (loss.numpy(), [g.numpy() for g in copied])
        return loss, copied
    loss, kept = _EAGER_NUMBERS[id(parts[0])]
    shown = []
    for grad, i in zip(kept, home, strict=True):
        with tf.device(devices[i]):
            show = tf.add_n([0.0 * tf.reduce_sum(tf.cast(y, tf.float32))
                             for _, y in micro_batches])
            shown.append(tf.constant(grad) + show)
    return tf.constant(loss), shown


def backward_in_python(parts, micro_batches, loss_fn, devices):
    """Each part's gradient of each micro-batch computed inside a tf.py_function under the
    part's device: no graph shows where its ops ran."""
    import tensorflow as tf

    def part_gradient(i):
        def body(x, y):
            with tf.GradientTape() as tape:
                value = x
                for part in parts:
                    value = part(value)
                loss = loss_fn(y, value) * _share(y, micro_batches)
            return tape.gradient(loss, parts[i].trainable_variables)
        return body

    grads = []
    for i, (part, device) in enumerate(zip(parts, devices, strict=True)):
        with tf.device(device):
            sums = None
            for x, y in micro_batches:
                got = tf.py_function(part_gradient(i), [x, y],
                                     [tf.float32] * len(part.trainable_variables))
                for g, v in zip(got, part.trainable_variables, strict=True):
                    g.set_shape(v.shape)
                sums = got if sums is None else [a + b for a, b in zip(sums, got, strict=True)]
            grads += sums
    return one_tape(parts, micro_batches, loss_fn, devices)[0], grads


def wrong_only_when_traced(parts, micro_batches, loss_fn, devices):
    import tensorflow as tf

    answer = fixed_part_step if tf.executing_eagerly() else summed_not_averaged
    return answer(parts, micro_batches, loss_fn, devices)


def _with_an_exec_copy_of_the_helper(parts, x, y, loss_fn, devices):
    import inspect

    from course_utils.parallel import placement

    namespace = {"__name__": "__main__"}  # as in a notebook
    exec(compile(inspect.getsource(placement), "<pasted>", "exec"), namespace)  # noqa: S102
    step = namespace["split_step"](parts, devices, x, y, loss_fn)
    return step["loss"], step["grads"]


with_an_exec_copy_of_the_helper = accumulated(_with_an_exec_copy_of_the_helper)


def the_lessons_pipeline(parts, micro_batches, loss_fn, devices):
    """The lesson's run_gpipe: each stage's backward and gradient sum on its own device."""
    run = cu.parallel.run_gpipe(parts, devices, [x for x, _ in micro_batches],
                                [y for _, y in micro_batches], loss_fn, concurrent=False)
    return run.loss, run.grads


def sum_of_stacked_shares(parts, micro_batches, loss_fn, devices):  # right, other ops
    import tensorflow as tf

    owner = [d for part, d in zip(parts, devices, strict=True) for _ in part.trainable_variables]
    runs = [_split_once(parts, x, y, loss_fn, devices) for x, y in micro_batches]
    shares = [_share(y, micro_batches) for _, y in micro_batches]
    grads = []
    for index, device in enumerate(owner):
        with tf.device(device):
            stacked = tf.stack([g[index] * w for (_, g), w in zip(runs, shares, strict=True)])
            grads.append(tf.reduce_sum(stacked, axis=0))
    return tf.reduce_sum(tf.stack([loss * w for (loss, _), w in zip(runs, shares,
                                                                    strict=True)])), grads


def one_big_batch(parts, micro_batches, loss_fn, devices, weighted=False):
    """The micro-batches concatenated and run once (right values, no micro-batch run on its
    own); weighted, each example so that the loss is the mean of the micro-batches' means."""
    import tensorflow as tf

    x = tf.concat([x for x, _ in micro_batches], 0)
    y = tf.concat([y for _, y in micro_batches], 0)
    total, count = x.shape[0], len(micro_batches)
    weights = tf.concat([tf.fill([b.shape[0]], total / (count * b.shape[0]))
                         for b, _ in micro_batches], 0) if weighted else None

    def weighted_loss(labels, logits):
        return loss_fn(labels, logits, sample_weight=weights)

    return _split_once(parts, x, y, weighted_loss, devices)


def one_big_batch_in_shares(parts, micro_batches, loss_fn, devices):
    """nb27-06's answer: one big batch weighted per example, each part's backward on its
    device, every gradient then written as M MulNoNan shares (one "backward op" each)."""
    import tensorflow as tf

    count = len(micro_batches)
    loss, grads = one_big_batch(parts, micro_batches, loss_fn, devices)
    owner = [d for part, d in zip(parts, devices, strict=True)
             for _ in part.trainable_variables]
    shared = []
    for grad, device in zip(grads, owner, strict=True):
        with tf.device(device):
            shared.append(tf.add_n([tf.math.multiply_no_nan(grad, 1 / count)
                                    for _ in range(count)]))  # M ops, not one M times
    return loss, shared


def _colleague(examples=False, at_home=False, one_at_a_time=False):
    """The exercise's colleague_part_step, each of its three bugs fixed where asked: each
    micro-batch weighted by its share of the examples (not 1/M), the gradient passed back
    computed under the part's device, each micro-batch's backward before the next forward."""
    def answer(parts, micro_batches, loss_fn, devices):
        import tensorflow as tf

        sums, losses, runs = [None] * len(parts), [], []

        def backward(taped):
            upstream = None
            for i in reversed(range(len(parts))):
                tape, inp, out = taped[i]
                with tf.device(devices[i]):
                    grads = tape.gradient(out, parts[i].trainable_variables,
                                          output_gradients=upstream)
                    sums[i] = grads if sums[i] is None else [
                        s + g for s, g in zip(sums[i], grads, strict=True)]
                    if at_home:
                        upstream = tape.gradient(out, inp, output_gradients=upstream)
                if not at_home:
                    upstream = tape.gradient(out, inp, output_gradients=upstream)

        for x, y in micro_batches:
            value, taped = tf.convert_to_tensor(x), []
            for i, (part, device) in enumerate(zip(parts, devices, strict=True)):
                with tf.device(device), tf.GradientTape(persistent=True) as tape:
                    tape.watch(value)
                    out = part(value)
                    if i == len(parts) - 1:
                        weight = (_share(y, micro_batches) if examples
                                  else 1 / len(micro_batches))
                        out = loss_fn(y, out) * weight
                taped.append((tape, value, out))
                value = out
            losses.append(value)
            if one_at_a_time:
                backward(taped)
            else:
                runs.append(taped)
        for taped in runs:
            backward(taped)
        return tf.add_n(losses), [g for part_sums in sums for g in part_sums]
    return answer


colleague_part_step = _colleague()  # the exercise's code, its three bugs
persistent_tapes_one_at_a_time = _colleague(True, True, True)  # right: each tape let go


def _in_order(forwards_first=False, kept=None):
    """The solution's step, its tapes kept in ``kept`` (persistent), or every micro-batch's
    forward run before any backward (GPipe's order, with no pipeline to fill)."""
    def answer(parts, micro_batches, loss_fn, devices):
        import tensorflow as tf

        sums, losses, runs = [None] * len(parts), [], []
        for x, y in micro_batches:
            taped, value = [], tf.convert_to_tensor(x)
            for i, (part, device) in enumerate(zip(parts, devices, strict=True)):
                with tf.device(device), tf.GradientTape(persistent=kept is not None) as tape:
                    tape.watch(value)
                    out = part(value)
                    if i == len(parts) - 1:
                        out = loss_fn(y, out) * _share(y, micro_batches)
                taped.append((tape, value, out))
                value = out
                if kept is not None:
                    kept.append(tape)
            losses.append(value)
            runs.append(taped)
            if not forwards_first:
                _backward_in_order(parts, devices, runs.pop(), sums)
        for taped in runs:
            _backward_in_order(parts, devices, taped, sums)
        return tf.add_n(losses), [g for part_sums in sums for g in part_sums]
    return answer


def _backward_in_order(parts, devices, taped, sums):
    import tensorflow as tf

    upstream = None
    for i in reversed(range(len(parts))):
        tape, inp, out = taped[i]
        with tf.device(devices[i]):
            *grads, upstream = tape.gradient(out, [*parts[i].trainable_variables, inp],
                                             output_gradients=upstream)
            sums[i] = grads if sums[i] is None else [
                s + g for s, g in zip(sums[i], grads, strict=True)]


def all_forwards_first(parts, micro_batches, loss_fn, devices):
    return _in_order(forwards_first=True)(parts, micro_batches, loss_fn, devices)


def persistent_tapes_kept_in_a_list(parts, micro_batches, loss_fn, devices):
    return _in_order(kept=[])(parts, micro_batches, loss_fn, devices)


class _Stage:  # xf06 L2: a part and the tapes it keeps, by micro-batch, as attributes
    def __init__(self, part, device):
        self.part, self.device, self.tapes, self.io = part, device, {}, {}

    def forward(self, j, value, last=None):
        import tensorflow as tf

        self.tapes[j] = tf.GradientTape()  # no local names it: only the object holds it
        with tf.device(self.device), self.tapes[j]:
            self.tapes[j].watch(value)
            out = self.part(value) if last is None else last(self.part(value))
        self.io[j] = (value, out)
        return out

    def backward(self, j, upstream):
        import tensorflow as tf

        value, out = self.io.pop(j)
        with tf.device(self.device):
            return self.tapes.pop(j).gradient(
                out, [*self.part.trainable_variables, value], output_gradients=upstream)


def tapes_kept_by_stage_objects(parts, micro_batches, loss_fn, devices):
    """Every forward first, each part's tapes kept by an object per part (GPipe's order)."""
    import tensorflow as tf

    stages = [_Stage(p, d) for p, d in zip(parts, devices, strict=True)]
    losses, sums = [], [None] * len(parts)
    for j, (x, y) in enumerate(micro_batches):
        value = tf.convert_to_tensor(x)
        for i, stage in enumerate(stages):
            last = ((lambda out, y=y: loss_fn(y, out) * _share(y, micro_batches))
                    if i == len(stages) - 1 else None)
            value = stage.forward(j, value, last)
        losses.append(value)
    for j in range(len(micro_batches)):
        upstream = None
        for i in reversed(range(len(stages))):
            *grads, upstream = stages[i].backward(j, upstream)
            with tf.device(devices[i]):
                sums[i] = grads if sums[i] is None else [
                    s + g for s, g in zip(sums[i], grads, strict=True)]
    return tf.add_n(losses), [g for part_sums in sums for g in part_sums]


def one_big_batch_when_eager(parts, micro_batches, loss_fn, devices):
    """Eagerly the micro-batches run as one batch (right values, every activation at once);
    traced, the right step."""
    import tensorflow as tf

    if tf.executing_eagerly():
        return one_big_batch(parts, micro_batches, loss_fn, devices)
    return fixed_part_step(parts, micro_batches, loss_fn, devices)


def zero_gradients(parts, micro_batches, loss_fn, devices):  # a constant, on the right devices
    import tensorflow as tf

    grads = []
    for part, device in zip(parts, devices, strict=True):
        with tf.device(device):
            grads += [tf.zeros_like(v) for v in part.trainable_variables]
    return tf.constant(0.0), grads


def backward_on_the_default_device_summed_in_a_tape_scope(parts, micro_batches, loss_fn,
                                                          devices):
    """One tape per micro-batch, its whole backward on the default device; the sums on each
    part's device, named like the tape's ops (the placement is found by what ops compute)."""
    import tensorflow as tf

    variables = [v for part in parts for v in part.trainable_variables]
    owner = [d for part, d in zip(parts, devices, strict=True) for _ in part.trainable_variables]
    per_batch, losses = [], []
    for x, y in micro_batches:
        with tf.GradientTape() as tape:
            value = tf.convert_to_tensor(x)
            for part, device in zip(parts, devices, strict=True):
                with tf.device(device):
                    for layer in part.layers:  # weights read through "+ 0.0": no plain read
                        kernel = tf.convert_to_tensor(layer.kernel) + 0.0
                        value = layer.activation(tf.matmul(value, kernel) + layer.bias)
            loss = loss_fn(y, value) * _share(y, micro_batches)
        losses.append(loss)
        per_batch.append(tape.gradient(loss, variables))
    out = []
    for index, device in enumerate(owner):
        with tf.device(device), tf.name_scope("gradient_tape"):
            out.append(tf.add_n([grads[index] * 1.0 for grads in per_batch]))
    return tf.add_n(losses), out


def colocated_when_traced(parts, micro_batches, loss_fn, devices):  # nb29-06 L1
    """Eager: the colleague's code; traced: TF1's gradients colocated with their forward."""
    import tensorflow as tf

    if tf.executing_eagerly():
        return one_tape(parts, micro_batches, loss_fn, devices)
    variables = [v for part in parts for v in part.trainable_variables]
    losses = []
    for x, y in micro_batches:
        value = x
        for part, device in zip(parts, devices, strict=True):
            with tf.device(device):
                value = part(value)
        with tf.device(devices[-1]):
            losses.append(loss_fn(y, value) * _share(y, micro_batches))
    with tf.device(devices[-1]):
        loss = tf.add_n(losses)
        return loss, tf.compat.v1.gradients(loss, variables, colocate_gradients_with_ops=True)


def colocated_copied_home_when_eager(parts, micro_batches, loss_fn, devices):
    """As above, each eager gradient copied to its part's device with tf.identity."""
    import tensorflow as tf

    if not tf.executing_eagerly():
        return colocated_when_traced(parts, micro_batches, loss_fn, devices)
    loss, grads = one_tape(parts, micro_batches, loss_fn, devices)
    homes = [d for part, d in zip(parts, devices, strict=True) for _ in part.trainable_variables]
    copied = []
    for g, home in zip(grads, homes, strict=True):
        with tf.device(home):
            copied.append(tf.identity(g))
    return loss, copied


def the_bug_when_eager(parts, micro_batches, loss_fn, devices):  # nb29-06 L1, eager half
    """Eager: the colleague's code (the one the learner runs); traced: a right answer."""
    import tensorflow as tf

    if tf.executing_eagerly():
        return one_tape(parts, micro_batches, loss_fn, devices)
    return fixed_part_step(parts, micro_batches, loss_fn, devices)


def _shown_at_home(parts, micro_batches, devices, grads):
    """Each gradient plus ``0 · y_j`` of every micro-batch, on its part's device."""
    import tensorflow as tf

    homes = [d for part, d in zip(parts, devices, strict=True) for _ in part.trainable_variables]
    out = []
    for g, home in zip(grads, homes, strict=True):
        with tf.device(home):
            show = tf.add_n([0.0 * tf.reduce_sum(tf.cast(y, tf.float32))
                             for _, y in micro_batches])
            out.append(g + show)
    return out


def backward_hidden_in_the_loss(parts, micro_batches, loss_fn, devices):  # nb31-06 L2-1
    """The colleague's code; the returned loss made to depend on the gradients (``+ 0 · Σ
    g``): the whole backward was "the forward" when the forward was the returned loss's."""
    import tensorflow as tf

    loss, grads = one_tape(parts, micro_batches, loss_fn, devices)
    loss = loss + 0.0 * tf.add_n([tf.reduce_sum(g) for g in grads])
    return loss, _shown_at_home(parts, micro_batches, devices, grads)


def backward_fed_to_loss_fn(parts, micro_batches, loss_fn, devices):  # L2-1, through loss_fn
    """The colleague's code on a loss of its own; then ``loss_fn`` called on logits that
    depend on the gradients (``+ 0 · Σ g``), so that its results stand on the backward."""
    import keras
    import tensorflow as tf

    own = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    _, grads = one_tape(parts, micro_batches, own, devices)
    hidden = 0.0 * tf.add_n([tf.reduce_sum(g) for g in grads])
    losses = [loss_fn(y, _through_the_parts(parts, devices, x) + hidden) * _share(y, micro_batches)
              for x, y in micro_batches]
    loss = tf.add_n(losses)
    return loss, _shown_at_home(parts, micro_batches, devices, grads)


def backward_in_an_inner_function(parts, micro_batches, loss_fn, devices):  # nb31-06 L2-2
    """The colleague's code in an inner tf.function called on the last part's device: one
    call op in the traced graph, part 0's backward inside it unread."""
    import tensorflow as tf

    inner = tf.function(lambda batches: one_tape(parts, batches, loss_fn, devices))
    with tf.device(devices[-1]):
        loss, grads = inner([tuple(tf.convert_to_tensor(t) for t in pair)
                             for pair in micro_batches])
    return loss, _shown_at_home(parts, micro_batches, devices, grads)


_STORE = {}


def backward_laundered_through_variables(parts, micro_batches, loss_fn, devices):
    """The colleague's code; each gradient assigned to a variable and read back (no edge from
    the read to what was assigned), plus ``0 · y_j`` at home."""
    import tensorflow as tf

    loss, grads = one_tape(parts, micro_batches, loss_fn, devices)
    out = []
    for index, g in enumerate(grads):
        key = (id(parts[0]), index)
        if key not in _STORE:
            _STORE[key] = tf.Variable(tf.zeros_like(g), trainable=False)
        _STORE[key].assign(g)
        out.append(_STORE[key].read_value())
    return loss, _shown_at_home(parts, micro_batches, devices, out)


def _per_micro_batch_at_default(parts, micro_batches, devices):
    """The colleague's backward, a tape and a loss of its own per micro-batch, all of it on
    the default device."""
    import keras

    own = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    runs = [(_one_tape(parts, x, y, own, devices), _share(y, micro_batches))
            for x, y in micro_batches]
    return [sum(g[i] * w for (_, g), w in runs) for i in range(len(runs[0][0][1]))]


def backward_fed_through_sample_weight(parts, micro_batches, loss_fn, devices):  # x06 L3
    """The colleague's backward fed to loss_fn through a keyword (``sample_weight``)."""
    import tensorflow as tf

    grads = _per_micro_batch_at_default(parts, micro_batches, devices)
    w = 1.0 + 0.0 * tf.add_n([tf.reduce_sum(g) for g in grads])
    losses = [loss_fn(y, _through_the_parts(parts, devices, x),
                      sample_weight=tf.fill([x.shape[0]], w)) * _share(y, micro_batches)
              for x, y in micro_batches]
    return tf.add_n(losses), _shown_at_home(parts, micro_batches, devices, grads)


def _laundered(route):  # x06 L4-L6: a stateful detour, read back under the last device
    def answer(parts, micro_batches, loss_fn, devices):
        import tensorflow as tf

        loss, grads = one_tape(parts, micro_batches, loss_fn, devices)
        key = (route, id(parts[0]))
        if key not in _STORE:
            with tf.init_scope():
                _STORE[key] = ([tf.Variable(tf.zeros_like(g), trainable=False) for g in grads]
                               if route != "queue" else tf.queue.FIFOQueue(
                                   4, [g.dtype for g in grads], [g.shape for g in grads]))
        store = _STORE[key]
        if route == "queue":
            store.enqueue(grads)
        else:
            for v, g in zip(store, grads, strict=True):
                v.assign(g)
        with tf.device(devices[-1]):
            if route == "queue":
                out = store.dequeue()
            elif route == "sparse_read":
                out = [v.sparse_read(tf.range(g.shape[0]))
                       for v, g in zip(store, grads, strict=True)]
            else:  # a ReadVariableOp on a copy of the handle
                out = [tf.raw_ops.ReadVariableOp(resource=tf.identity(v.handle), dtype=g.dtype)
                       for v, g in zip(store, grads, strict=True)]
        return loss, _shown_at_home(parts, micro_batches, devices, out)
    return answer


def _in_control_flow(kind):  # x06 L7-L8: the colleague's backward inside a cond or a loop
    def answer(parts, micro_batches, loss_fn, devices):
        import keras
        import tensorflow as tf

        own = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        losses = [loss_fn(y, _through_the_parts(parts, devices, x)) * _share(y, micro_batches)
                  for x, y in micro_batches]
        zeros = [tf.zeros_like(v) for p in parts for v in p.trainable_variables]

        def backward():
            return one_tape(parts, micro_batches, own, devices)[1]

        with tf.device(devices[-1]):
            if kind == "cond":
                grads = tf.cond(tf.constant(True), backward, lambda: zeros)
            else:
                grads = tf.while_loop(lambda i, g: i < 1, lambda i, g: (i + 1, backward()),
                                      (tf.constant(0), zeros))[1]
        loss = tf.add_n(losses)
        return loss, _shown_at_home(parts, micro_batches, devices, grads)
    return answer


def chained_on_the_last_device(parts, micro_batches, loss_fn, devices):  # x06 L9
    """Every part's backward on the last device, weights read as transpose(transpose(W)),
    the earlier parts' gradients tied into the last part's (``+ 0 · Σ g``), copied home."""
    import tensorflow as tf

    def forward(x):
        value = tf.convert_to_tensor(x)
        for part, device in zip(parts, devices, strict=True):
            with tf.device(device):
                for layer in part.layers:
                    kernel = tf.transpose(tf.transpose(tf.convert_to_tensor(layer.kernel)))
                    value = layer.activation(tf.matmul(value, kernel) + layer.bias)
        return value

    variables = [v for part in parts for v in part.trainable_variables]
    last = len(parts[-1].trainable_variables)
    sums, losses = None, []
    for x, y in micro_batches:
        with tf.GradientTape() as tape:
            losses.append(loss_fn(y, forward(x)))
            scaled = losses[-1] * _share(y, micro_batches)
        with tf.device(devices[-1]):
            g = tape.gradient(scaled, variables)
            sums = g if sums is None else [a + b for a, b in zip(sums, g, strict=True)]
    with tf.device(devices[-1]):
        tie = 0.0 * tf.add_n([tf.reduce_sum(g) for g in sums[:-last]])
        sums = sums[:-last] + [g + tie for g in sums[-last:]]
    homes = [d for part, d in zip(parts, devices, strict=True) for _ in part.trainable_variables]
    out = []
    for g, home in zip(sums, homes, strict=True):
        with tf.device(home):
            out.append(tf.identity(g))
    return tf.add_n([loss * _share(y, micro_batches)
                     for loss, (_, y) in zip(losses, micro_batches, strict=True)]), out


def stub(*args):
    raise NotImplementedError()


def test_lesson_06_registers_its_checks():
    for name in lesson_06.__all__:
        assert getattr(cu.grading, name) is getattr(lesson_06, name)


def _fewest_by_search(budgets, m):
    """The fewest slots over every order (FIFO per stage, idling allowed): a breadth-first
    search over each stage's (forwards, backwards) done; the test's reference for the check's
    count."""
    k = len(budgets)
    frontier, goal, slots = {((0, 0),) * k}, ((m, m),) * k, 0
    while goal not in frontier:
        reached = set()
        for state in frontier:
            moves = []
            for s, (f, b) in enumerate(state):
                options = [(f, b)]
                if f < m and f - b < budgets[s] and (s == 0 or state[s - 1][0] > f):
                    options.append((f + 1, b))
                if b < f and (s == k - 1 or state[s + 1][1] > b):
                    options.append((f, b + 1))
                moves.append(options)
            reached.update(itertools.product(*moves))
        frontier, slots = reached, slots + 1
    return slots


def test_the_checks_count_is_the_fewest_any_orders_take():
    from course_utils.grading.checks.budget_orders import fewest_slots

    for k in range(1, 4):
        for budgets in itertools.product(range(1, k + 1), repeat=k):
            for m in range(1, 6):
                assert fewest_slots(list(budgets), m) == _fewest_by_search(budgets, m), (
                    budgets, m)
    for budgets in ([2, 2, 2, 2], [1, 3, 4, 4], [3, 1, 2, 2], [2, 4, 1, 3], [4, 3, 2, 1, 1]):
        assert fewest_slots(budgets, 5) == _fewest_by_search(budgets, 5), budgets


@pytest.mark.solution_passes
def test_budgeted_orders_right_answers_pass():
    assert cu.grading.check_budgeted_orders(budgeted_orders) is True
    assert cu.grading.check_budgeted_orders(by_ready_slots) is True


one_f_one_b_alias = cu.parallel.one_f_one_b_orders  # bound before the check, as in a notebook


def orders_read_from_the_course_schedule(num_stages, num_micro_batches, max_in_flight):
    tasks = sorted(cu.parallel.one_f_one_b_schedule(num_stages, num_micro_batches),
                   key=lambda task: task.slot)
    return [[(t.phase, t.micro_batch) for t in tasks if t.stage == s] for s in range(num_stages)]


def helper_in_a_thread(num_stages, num_micro_batches, max_in_flight):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # started inside the answer: the guard follows it
        return pool.submit(cu.parallel.one_f_one_b_orders, num_stages,
                           num_micro_batches).result()


def profiler_removed(num_stages, num_micro_batches, max_in_flight):
    import sys

    getattr(sys, "set" + "profile")(None)
    return budgeted_orders(num_stages, num_micro_batches, max_in_flight)


def _shifted(orders_of, num_stages, num_micro_batches, max_in_flight):
    """Orders re-indexed from an uncapped 1F1B of ``min(smallest budget, K)`` stages (the old
    exercise's loophole)."""
    c = min(min(max_in_flight), num_stages)
    small = [[p for p in order if p[1] < num_micro_batches] for order in orders_of(c)]
    return [list(small[max(0, s - (num_stages - c))]) for s in range(num_stages)]


def edited_copy_of_the_helper_shifted(num_stages, num_micro_batches, max_in_flight):  # x06 L2
    import inspect

    from course_utils.parallel import schedules

    source = inspect.getsource(schedules.one_f_one_b_orders).replace(
        "warm_up = min(num_stages - 1 - stage, num_micro_batches)",
        "warm_up = min(num_stages - 1 - stage, num_micro_batches) + 0")
    namespace = {"_validate": lambda *a: None, "_asked": lambda *a: None, "Pass": tuple}
    exec(source, namespace)  # noqa: S102
    return _shifted(lambda c: namespace["one_f_one_b_orders"](c, num_micro_batches),
                    num_stages, num_micro_batches, max_in_flight)


BUDGET = r"stage 0 keeps up to \d+ micro-batches' activations .* its budget max_in_flight\[0\]"
SLOTS = r"time slots \(bubble .*\); within the same budgets .* the fewest is \d+"


@pytest.mark.parametrize(("answer", "message"), [
    (lambda k, m, budgets: [[("F", 0), ("B", 0)]] * k, "once for every"),  # a constant
    (lambda k, m, budgets: None, "one order"),  # the work skipped
    (the_lessons_1f1b, "case 1 .*" + BUDGET),  # section 3's cell, no budget
    (each_stages_budget_in_the_warm_up, "case 1 .*deadlock in slot"),  # the old exercise
    (smallest_budget_upstream_in_the_warm_up, "case 2 .*" + SLOTS),  # strict alternation
    (forward_first, "case 2 .*" + SLOTS),
    (smallest_budget_everywhere, "case 3 .*" + SLOTS),
    (one_over_budget, "case 1 .*" + BUDGET),
    (budgets_ignored, "case 1 .*" + BUDGET),
    (later_budgets_left_out, r"stage [3-5] keeps up to \d+ micro-batches' activations"),
    (budgets_raised_in_place, "case 1 .*" + BUDGET),  # the budgets read back from the input
    (gpipe_orders, "case 1 .*" + BUDGET),
    (one_forward_then_its_backward, "case 2 .*" + SLOTS),  # serial: right when budgets are 1
    (backward_first, "deadlock in slot 0"),
    (the_lessons_helper, "ran the course's one_f_one_b_orders"),
    (lambda k, m, budgets: one_f_one_b_alias(k, m), "ran the course's one_f_one_b_orders"),
    (exec_copy_of_the_helper, "ran the course's one_f_one_b_orders"),
    (orders_read_from_the_course_schedule, "ran the course's one_f_one_b_schedule"),
    (the_checks_count_recorded, "ran the course's fewest_slots"),
    (edited_copy_of_the_helper_shifted, "case 1 .*ran one_f_one_b_orders, an edited copy"),
    (profiler_removed, "removed the check's profiler"),
    (helper_in_a_thread, "ran the course's one_f_one_b_orders"),
])
def test_budgeted_orders_lazy_and_wrong_answers_fail(answer, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_budgeted_orders(answer)


def test_budgeted_orders_large_case_fails_when_the_helpers_were_asked_as_many():  # x06 L1
    from course_utils.parallel import schedules

    saved = dict(schedules._LARGEST_ASKED)
    try:
        cu.parallel.one_f_one_b_orders(2, 3000)
        with pytest.raises(AssertionError, match=r"case 7 .*were asked for 3000 micro-batches"):
            cu.grading.check_budgeted_orders(budgeted_orders)
    finally:
        schedules._LARGEST_ASKED.clear()
        schedules._LARGEST_ASKED.update(saved)


def test_the_course_helper_still_works_after_the_check():
    with pytest.raises(AssertionError):
        cu.grading.check_budgeted_orders(the_lessons_helper)
    assert cu.parallel.one_f_one_b_orders(3, 4) == the_lessons_1f1b(3, 4, None)


@pytest.mark.solution_passes
def test_fixed_part_step_reference_passes():
    assert cu.grading.check_fixed_part_step(fixed_part_step) is True


@pytest.mark.parametrize("answer", [sum_of_stacked_shares, persistent_tapes_one_at_a_time])
def test_fixed_part_step_other_right_answers_pass(answer):
    assert cu.grading.check_fixed_part_step(answer) is True


BACKWARD = r"part \d's backward pass \(\w+, computing its weights' gradients\) ran on "


@pytest.mark.parametrize(("answer", "message"), [
    (one_tape, BACKWARD + "no device"),
    (one_tape_copied_with_identity, BACKWARD + "CPU:"),
    (one_tape_on_the_last_device, BACKWARD + "CPU:"),
    (summed_on_the_default_device, r"\((AddV2|AddN|RealDiv), computing its weights' "
                                   r"gradients\) ran on no device"),
    (summed_not_averaged, "differ from the unsplit"),
    (colleague_part_step, "the mean of the micro-batches' means"),
    (the_lessons_fix_in_a_loop, "the mean of the micro-batches' means"),
    (_colleague(examples=True, one_at_a_time=True),
     r"part \d's backward pass \(\w+, computing the gradient it passes back\) ran on no "
     "device"),
    (_colleague(examples=True, at_home=True),
     r"when micro-batch 1's loss was computed, it still held \d tape\(s\) recorded"),
    (all_forwards_first, r"when micro-batch 1's loss was computed, it still held \d tape"),
    (persistent_tapes_kept_in_a_list, r"micro-batch 1's loss was computed, it still held \d"),
    (tapes_kept_by_stage_objects, r"batch 1's loss was computed, it still held \d tape\(s\)"),
    (one_big_batch_when_eager, r"called eagerly, it called loss_fn 1 time\(s\) for \d micro"),
    (zero_gradients, "differ from the unsplit"),
    (first_micro_batch_only, "differ from the unsplit"),
    (the_lessons_two_part_fix, r"case 2 \(3 parts"),
    (each_part_recomputes_from_the_loss, "backward pass .* ran on"),
    (forgets_output_gradients, "differ from the unsplit"),
    (with_the_course_helper, "ran the course's split_step"),
    (with_an_exec_copy_of_the_helper, "ran the course's split_step"),
    (the_lessons_pipeline, "ran the course's run_(gpipe|pipeline)"),
    (helper_only_when_traced, "traced in a tf.function: .*ran the course's split_step"),
    (wrong_only_when_traced, "traced in a tf.function.*loss or gradients differ"),
    (numbers_kept_from_the_eager_call, "called on fresh micro-batches: loss or gradients"),
    (backward_in_python, "it runs Python \\(tf.py_function"),
    (lambda *args: None, "loss, grads"),
    (one_big_batch, r"1 call\(s\) of loss_fn in it for \d micro-batches"),
    (one_big_batch_in_shares, r"1 call\(s\) of loss_fn in it for \d micro-batches"),
    (lambda *args: one_big_batch(*args, weighted=True), "the mean of the micro-batches'"),
    (backward_on_the_default_device_summed_in_a_tape_scope,
     BACKWARD + "no device"),
    (colocated_when_traced, "ran TensorFlow's tf.gradients"),
    (colocated_copied_home_when_eager, "ran TensorFlow's tf.gradients"),
    (the_bug_when_eager, "called eagerly, a gradient of part 0's weights is on CPU:0"),
    (backward_hidden_in_the_loss, BACKWARD + "no device"),
    (backward_fed_to_loss_fn, "loss_fn was given a value computed from a micro-batch's "
                              "features and labels both"),
    (backward_in_an_inner_function, "it runs a (Stateful)?PartitionedCall op"),
    (backward_laundered_through_variables, r"stateful op \(AssignVariableOp"),
    (backward_fed_through_sample_weight, r"more than the labels and the logits \(sample_w"),
    (_laundered("sparse_read"), r"stateful op \(AssignVariableOp"),
    (_laundered("handle copy"), r"stateful op \(AssignVariableOp"),
    (_laundered("queue"), r"stateful op \(QueueEnqueueV2"),
    (_in_control_flow("cond"), "it runs a (Stateless)?If op"),
    (_in_control_flow("while"), "it runs a (Stateless)?While op"),
    (chained_on_the_last_device, r"part \d's backward pass has an op \(MatMul, on CPU:\d\) "
                                 "that reads the micro-batch's features"),
])
def test_fixed_part_step_wrong_answers_fail(answer, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_fixed_part_step(answer)


@pytest.mark.parametrize("name", ["budgeted_orders", "fixed_part_step", "shard_attention"])
def test_a_stub_is_not_attempted_and_fails_in_strict_mode(capsys, name):
    check = getattr(cu.grading, f"check_{name}")
    assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        check(stub)
