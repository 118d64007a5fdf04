"""The few collectives training needs, each a no-op (or the identity) in one process, so the
updater and the job run the same code on 1 and N processes. Processes and the process group
belong to accelerate (``train.distributed.make_accelerator``); ``accelerator`` is its
``Accelerator`` or None (one process)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch
from accelerate.utils import gather_object

T = TypeVar("T")


def launched_distributed() -> bool:
    """True when this process was started as one of several (accelerate launch / torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def num_processes(accelerator: Any | None) -> int:
    return 1 if accelerator is None else int(accelerator.num_processes)


def process_index(accelerator: Any | None) -> int:
    return 0 if accelerator is None else int(accelerator.process_index)


def is_main_process(accelerator: Any | None) -> bool:
    return accelerator is None or bool(accelerator.is_main_process)


def reduce_sum(accelerator: Any | None, values: Sequence[float]) -> list[float]:
    if num_processes(accelerator) == 1:
        return [float(v) for v in values]
    t = torch.tensor(list(values), dtype=torch.float64, device=accelerator.device)
    return [float(v) for v in accelerator.reduce(t, reduction="sum").tolist()]


def reduce_max(accelerator: Any | None, value: int) -> int:
    if num_processes(accelerator) == 1:
        return int(value)
    t = torch.tensor([value], dtype=torch.long, device=accelerator.device)
    return int(accelerator.gather(t).max())


def gather_objects(accelerator: Any | None, items: list[T]) -> list[T]:
    """Every rank's ``items`` concatenated in rank order, on every rank (pickled through
    ``torch.distributed.all_gather_object``, via accelerate)."""
    if num_processes(accelerator) == 1:
        return list(items)
    return list(gather_object(list(items)))


def set_sync(accelerator: Any, value: bool) -> None:
    """accelerate's sync flag: under DeepSpeed it marks the gradient-accumulation boundary."""
    try:
        accelerator.sync_gradients = value
    except AttributeError:  # older accelerate: no setter
        accelerator.gradient_state._set_sync_gradients(value)


_MEAN_PREFIX = ("loss",)  # each rank's loss is its share x N: the global loss is their mean
_SUM_PREFIX = ("tokens", "samples", "skipped_zero_adv", "merged_away")
_TOKEN_WEIGHTED = ("clip_frac", "ratio_mean", "entropy", "kl")


def merge_rank_stats(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Combine the ranks' stats into the values one process would report on the global batch."""
    if not per_rank:
        return {}
    n = len(per_rank)
    out: dict[str, float] = {}
    for key in sorted({k for s in per_rank for k in s}):
        values = [s.get(key, 0.0) for s in per_rank]
        head = key.split("/")[0]
        if head in _MEAN_PREFIX:
            out[key] = sum(values) / n
        elif head in _SUM_PREFIX:
            out[key] = sum(values)
        elif key in ("ratio_max", "logprob_gap_max", "micro_batches"):
            out[key] = max(values)
        elif key in _TOKEN_WEIGHTED:
            present = [(s[key], s.get("tokens", 0.0)) for s in per_rank if key in s]
            weight = sum(w for _, w in present)
            out[key] = sum(v * w for v, w in present) / weight if weight else 0.0
        else:  # padding_frac and anything else: the mean over ranks
            out[key] = sum(values) / n
    return out
