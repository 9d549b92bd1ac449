"""What lesson 02's checks share: the learner's strategy, a small model in its scope, the
per-example loss, and telling a stub from an attempt before anything is traced."""

from __future__ import annotations

from typing import Any

__all__ = ["mirrored_strategy", "per_example_loss", "raises_own_stub", "small_model"]


def mirrored_strategy() -> Any:
    """The notebook's own ``cu.make_strategy("mirrored")`` (a second one would clash)."""
    from course_utils.strategies import make_strategy

    return make_strategy("mirrored", verbose=False)


def raises_own_stub(fn: Any, *args: Any) -> bool:
    """True when ``fn(*args)`` raises the NotImplementedError of its own stub.

    A real attempt may fail on the placeholder arguments in any other way, or not at all. The
    checks run the learner's code inside ``tf.function``, where a stub could not be told from an
    error, so they look first.
    """
    try:
        fn(*args)
    except NotImplementedError as error:
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        return tb is not None and tb.tb_frame.f_code is getattr(fn, "__code__", None)
    except Exception:  # noqa: BLE001 - a real attempt fails on the placeholders: fine
        return False
    return False


def small_model(strategy: Any, rng: Any, name: str) -> tuple[Any, Any, Any, int, int]:
    """A small classifier built in the scope, data for it, and its sizes."""
    import keras

    from course_utils.data import teacher_classification
    from course_utils.models import mlp

    features, classes = rng.randint(4, 10), rng.randint(2, 5)
    x, y = teacher_classification(256, features, classes, seed=rng.randint(0, 999))
    keras.utils.set_random_seed(rng.randint(0, 2**31 - 1))
    with strategy.scope():
        model = mlp(features, classes, hidden_units=(8,), name=name)
    return model, x, y, features, classes


def per_example_loss() -> Any:
    """Sparse categorical cross-entropy from logits, one loss per example."""
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
