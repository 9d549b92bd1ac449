"""Sharding a model's state over data-parallel replicas (ZeRO, Rajbhandari et al., 2020; FSDP).

Plain data parallelism keeps on every replica the whole parameters, gradients and optimizer
state. ZeRO keeps each of them once across the ``N`` replicas, cut into ``N`` shards:

- stage 1: the optimizer state (Adam's two slots) is sharded; each replica updates its shard of
  the parameters and the updated shards are gathered (an all-gather);
- stage 2: the gradients too (a reduce-scatter gives each replica the sum of its shard only);
- stage 3 (FSDP): the parameters too, gathered layer by layer when a pass needs them.

The parameters are flattened into one vector and cut into ``N`` equal shards, the last one
padded, as FSDP's flat parameters are; PyTorch's ``ZeroRedundancyOptimizer`` instead gives each
whole parameter to one rank ("Each parameter belongs to a single rank and is not divided among
ranks", its documentation).
"""

from __future__ import annotations

__all__ = ["ZERO_STAGES", "zero_bytes_per_device", "zero_shard_bounds"]

ZERO_STAGES = {
    0: "nothing (plain data parallelism)",
    1: "optimizer state",
    2: "optimizer state, gradients",
    3: "optimizer state, gradients, parameters",
}


def zero_shard_bounds(num_params: int, num_replicas: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each replica's shard of a flat vector of ``num_params`` values.

    Every shard is ``ceil(num_params / num_replicas)`` long except where the vector ends (the
    padding of the last shards is not stored here).
    """
    if num_params < 1 or num_replicas < 1:
        raise ValueError(f"num_params and num_replicas must be at least 1, got {num_params} "
                         f"and {num_replicas}")
    size = -(-num_params // num_replicas)
    return [(min(r * size, num_params), min((r + 1) * size, num_params))
            for r in range(num_replicas)]


def zero_bytes_per_device(num_params: int, num_replicas: int, stage: int,
                          bytes_per_value: int = 4, optimizer_slots: int = 2) -> dict[str, int]:
    """Bytes one replica keeps under ZeRO ``stage`` (0-3): parameters, gradients, optimizer state.

    A sharded term is one padded shard, ``ceil(num_params / num_replicas)`` values; a replicated
    one is all ``num_params``. Activations are not included: ZeRO-DP's stages do not shard them
    (ZeRO-R's partitioned activation checkpointing does, Rajbhandari et al., section 6.1).
    """
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    zero_shard_bounds(num_params, num_replicas)  # validates the sizes
    shard = -(-num_params // num_replicas)
    parameters = shard if stage >= 3 else num_params
    gradients = shard if stage >= 2 else num_params
    state = shard if stage >= 1 else num_params
    row = {"parameters": parameters * bytes_per_value,
           "gradients": gradients * bytes_per_value,
           "optimizer_state": optimizer_slots * state * bytes_per_value}
    row["total"] = sum(row.values())
    return row
