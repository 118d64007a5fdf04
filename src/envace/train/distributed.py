"""Multi-process role-wise GRPO: DDP through accelerate by default, or FSDP (``parallel="fsdp"``,
torch's FSDP2 ``fully_shard``; accelerate still launches the processes and owns the process
group). No home-made distributed code: processes, the process group, gradient all-reduce (DDP)
or reduce-scatter (FSDP) all belong to accelerate and torch.distributed.

What each step does on N processes (launched by ``accelerate launch``):

1. **Rollouts are split by task.** Every rank draws the same step tasks (``step_tasks`` is a
   function of seed and step) and keeps its share (:func:`shard_tasks`, task ``i`` on rank
   ``i % N``), so all G trajectories of a task live on one rank.
2. **Advantages are computed over the whole group.** :func:`compute_advantages_global` gathers
   a light summary of every rank's turn-samples (group id, role, reward, empty flag: no token
   ids) and runs :func:`~envace.train.advantages.compute_advantages` on the union, then keeps
   this rank's samples. The result is exactly the single-process one, also when a group's G
   trajectories are spread over ranks.
3. **One optimiser step on the global batch**, by the one updater
   (:meth:`~envace.train.step.GRPOUpdater.step`, the same code as in one process, once
   :func:`prepare_updaters` has attached the accelerator): each role's loss is normalised by
   the *global* count of that role's tokens or samples, divided by N because DDP averages
   gradients, so the synchronised gradient equals the single-process full-batch gradient.
4. **Under FSDP, rollouts use a replica.** Ranks generate different tasks with different lengths,
   which a sharded model cannot do (its forwards all-gather in lockstep), so each rank keeps the
   original, whole-weight model for rollouts, evals and checkpoints, and trains a sharded copy;
   after every update the replica's trained weights are refreshed from the shards.

This module holds the setup (accelerator, wrapping, sharding), the task split, the global
advantages and checkpoint helpers; the per-step collectives are in ``train.collectives``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import warnings
from datetime import timedelta
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs, broadcast_object_list
from torch import nn

from envace.core.types import Role, Trajectory
from envace.train.advantages import ScoredSample, advantage_stats, compute_advantages, is_empty_generation
from envace.train.collectives import (  # noqa: F401 - re-exported: the job reads them from here
    gather_objects, is_main_process, launched_distributed, merge_rank_stats, num_processes, process_index)
from envace.train.forward import decoder_and_head
from envace.train.step import GRPOUpdater

T = TypeVar("T")

_WORLD_ENV = ("WORLD_SIZE", "ACCELERATE_NUM_PROCESSES")


# ---------------------------------------------------------------------------- setup


def make_accelerator(timeout_s: float | None = None, **kwargs: Any) -> Any | None:
    """An ``accelerate.Accelerator`` when launched with more than one process, else None (the
    single-process path then stays exactly as it is). ``kwargs`` go to ``Accelerator``; the
    strategy (DDP / FSDP / DeepSpeed), mixed precision and the number of processes come from
    the accelerate config given to ``accelerate launch``. ``timeout_s`` is the process group's
    collective timeout (torch's default is 10 to 30 minutes: too short when the other ranks
    wait at a barrier while rank 0 runs a long SFT warm start)."""
    if not launched_distributed():
        return None
    if "cpu" not in kwargs and not _has_accelerator_device():
        # accelerate only sets up a CPU process group (gloo) when asked to run on CPU.
        kwargs["cpu"] = True
    handlers = list(kwargs.get("kwargs_handlers") or [])
    if not any(isinstance(h, DistributedDataParallelKwargs) for h in handlers):
        # No collective in DDP's forward: the loss may call the decoder a data-dependent number of
        # times per micro-batch (a shared prompt prefix runs once, then the rows' own tokens), so
        # ranks can differ in their number of forwards, and DDP's default buffer broadcast at
        # every forward would then pair up wrongly and hang. An LLM's buffers (rotary
        # frequencies) are constants: there is nothing to broadcast.
        handlers.append(DistributedDataParallelKwargs(broadcast_buffers=False))
    if timeout_s is not None:
        handlers.append(InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s)))
    kwargs["kwargs_handlers"] = handlers
    accelerator = Accelerator(**kwargs)
    if accelerator.gradient_accumulation_steps != 1:
        raise ValueError("envace accumulates micro-batches itself (grpo.micro_batch_tokens); set "
                         "gradient_accumulation_steps to 1 in the accelerate / DeepSpeed config")
    return accelerator


def _has_accelerator_device() -> bool:
    probe = getattr(torch, "accelerator", None)
    if probe is not None and hasattr(probe, "is_available"):
        return bool(probe.is_available())
    return torch.cuda.is_available()


class _HiddenStates(nn.Module):
    """What DDP wraps: the LM's decoder (hidden states), so the loss can run the vocabulary head
    on the generated positions only, as in one process. It holds the whole LM, so DDP registers
    (and all-reduces) every parameter, the head's included: DDP's gradient hooks fire wherever
    in the step's graph a parameter is used."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, **kwargs: Any) -> Any:
        parts = decoder_and_head(self.lm)
        assert parts is not None
        return parts[0](**kwargs)


class _DDPScorer(nn.Module):
    """What the forward (train/forward.py) sees under DDP: ``get_decoder()`` runs the DDP-wrapped decoder (one DDP
    forward per micro-batch, as DDP needs), ``get_output_embeddings()`` the head under
    accelerate's autocast (the decoder's output is in the mixed-precision dtype)."""

    def __init__(self, accelerator: Any, wrapped: nn.Module, lm: nn.Module) -> None:
        super().__init__()
        self.wrapped = wrapped
        self._accelerator = accelerator
        self._lm = [lm]  # not a submodule: its parameters are the wrapped ones

    def get_decoder(self) -> Any:
        return _DDPDecoder(self.wrapped, decoder_and_head(self._lm[0])[0])  # type: ignore[index]

    def get_output_embeddings(self) -> Any:
        head = decoder_and_head(self._lm[0])[1]  # type: ignore[index]
        accelerator = self._accelerator

        def run(h: torch.Tensor) -> torch.Tensor:
            with accelerator.autocast():
                return head(h)

        return run

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # not used by the forward; kept usable
        return self._lm[0](*args, **kwargs)


class _DDPDecoder:
    """The DDP-wrapped decoder as the loss sees a decoder: calls go through DDP (so its gradient
    hooks see every use), while ``config`` and the ``forward`` signature are the inner decoder's
    (the loss reads them, e.g. to run a shared prompt prefix once with a KV cache and the rows'
    own tokens on top: two DDP forwards before one backward, which DDP allows: autograd sums a
    parameter's uses, so its gradient hook fires once per backward). Ranks may then run different
    numbers of forwards, which is why :func:`make_accelerator` turns DDP's buffer broadcast off."""

    def __init__(self, wrapped: nn.Module, inner: nn.Module) -> None:
        self._wrapped = wrapped
        self.config = getattr(inner, "config", None)

        def forward(*args: Any, **kwargs: Any) -> Any:
            return wrapped(*args, **kwargs)

        self.forward = functools.wraps(inner.forward)(forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapped(*args, **kwargs)


class _ForwardOnly(nn.Module):
    """What the forward sees under FSDP / DeepSpeed: only the wrapper's own forward (full logits
    of the score window), which is where those engines gather and release their shards. It has
    no decoder, so the loss never runs a shared prompt prefix separately: one forward per
    micro-batch on every rank, as the shards' all-gathers need."""

    def __init__(self, wrapped: nn.Module) -> None:
        super().__init__()
        self.wrapped = wrapped

    def forward(self, **kwargs: Any) -> Any:
        return self.wrapped(**kwargs)


_SHARDED = ("FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA")


def prepare_updaters(accelerator: Any | None, updaters: Mapping[str, GRPOUpdater], parallel: str = "ddp",
                     optimizer_states: Mapping[str, Mapping[str, Any]] | None = None,
                     ) -> dict[str, GRPOUpdater]:
    """Attach the accelerator to each updater: its model and optimiser go through
    ``accelerator.prepare`` (one pair per call, as FSDP needs), or are sharded
    (``parallel="fsdp"``, see :func:`_fully_shard`). Without an accelerator (single process)
    the updaters come back unchanged. Call once, after checkpoints were loaded into the models
    and optimisers; under FSDP the optimisers are rebuilt over the shards, and
    ``optimizer_states`` (saved full state dicts, by updater key) are loaded into them.

    Under DDP (and a single accelerate process) the decoder is what gets wrapped, so the loss
    keeps scoring only generated positions with the vocabulary head; under FSDP / DeepSpeed the
    whole LM is wrapped and the loss goes through its forward (logits of the score window).
    """
    if accelerator is None:
        return dict(updaters)
    if parallel == "fsdp":
        states = optimizer_states or {}
        return {key: _fully_shard(accelerator, up, states.get(key)) for key, up in updaters.items()}
    if parallel != "ddp":
        raise ValueError(f"parallel must be 'ddp' or 'fsdp', not {parallel!r}")
    kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
    out: dict[str, GRPOUpdater] = {}
    for key, up in updaters.items():
        if kind not in _SHARDED and decoder_and_head(up.model) is not None:
            with warnings.catch_warnings():  # torch renamed it; accelerate's DDP kwargs know only the old name
                warnings.filterwarnings("ignore", message=".*broadcast_buffers. is deprecated", category=FutureWarning)
                wrapped, optimizer = accelerator.prepare(_HiddenStates(up.model), up.optimizer)
            scorer: nn.Module = _DDPScorer(accelerator, wrapped, up.model)
        else:
            wrapped, optimizer = accelerator.prepare(up.model, up.optimizer)
            scorer = _ForwardOnly(wrapped)
        out[key] = up.attach(accelerator, trained=wrapped, scorer=scorer, stepper=optimizer)
    return out


def _fully_shard(accelerator: Any, up: GRPOUpdater, optimizer_state: Mapping[str, Any] | None) -> GRPOUpdater:
    """FSDP2 on a deep copy of the updater's model: each decoder layer is one shard group (its
    weights are gathered for its forward and backward only), the root holds the rest (embeddings,
    head, final norm). The original model stays whole on every rank as the rollout replica. The
    optimiser is rebuilt over the sharded parameters with the same class and hyper-parameters."""
    # FSDP's modules take about a second to import; only parallel: fsdp needs them
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if up.scheduler is not None:
        raise ValueError("parallel: fsdp rebuilds the optimiser over the shards; an LR scheduler is not supported")
    if len(up.optimizer.param_groups) != 1:
        raise ValueError("parallel: fsdp rebuilds the optimiser over the shards; it needs one parameter group")
    precision = str(getattr(accelerator, "mixed_precision", "no") or "no")
    if precision not in ("no", "bf16"):
        raise ValueError(f"parallel: fsdp supports mixed_precision 'no' or 'bf16', not {precision!r}")
    # bf16 compute, fp32 master weights and gradient reduction (what accelerate's bf16 means under DDP).
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16" \
        else MixedPrecisionPolicy()
    mesh = init_device_mesh(torch.device(accelerator.device).type, (num_processes(accelerator),))
    model = copy.deepcopy(up.model)
    parts = decoder_and_head(model)
    layers = getattr(parts[0], "layers", None) if parts is not None else None
    for layer in layers or []:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    old = up.optimizer
    accepted = inspect.signature(type(old)).parameters  # AdamW's defaults hold a key its constructor refuses
    defaults = {k: v for k, v in old.param_groups[0].items() if k in accepted and k != "params"}
    optimizer = type(old)([p for p in model.parameters() if p.requires_grad], **defaults)
    if optimizer_state is not None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, _keyed_by_name(optimizer_state, model, optimizer),
                                 options=StateDictOptions(full_state_dict=True))
    up.optimizer = optimizer  # the shards' optimiser is the one checkpoints save (gathered)
    return up.attach(accelerator, trained=model, scorer=_ForwardOnly(model), stepper=optimizer, replica=up.model)


def _keyed_by_name(state: Mapping[str, Any], model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """A saved optimiser state dict keyed by parameter name, as set_optimizer_state_dict needs.
    Saved entries map to ``optimizer``'s parameters by position, as torch's own load_state_dict
    maps them: so both a gathered FSDP state (keyed by name) and a DDP / one-process one (keyed
    by index) load."""
    names = {id(p): n for n, p in model.named_parameters()}
    mine = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    saved = [k for g in state["param_groups"] for k in g["params"]]
    if len(saved) != len(mine):
        raise ValueError(f"the saved optimiser state has {len(saved)} parameters, the model {len(mine)}")
    rename = dict(zip(saved, mine))
    return {"state": {rename[k]: v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [rename[k] for k in g["params"]]} for g in state["param_groups"]]}


def optimizers_of(updaters: Mapping[str, GRPOUpdater]) -> dict[str, Any]:
    """What checkpoints save of the optimisers: the torch optimisers (accelerate's wrapper shares
    the updater's optimiser and its state, so saving and loading go through the plain one);
    under FSDP their full state dicts gathered from the shards, keyed by parameter name: a
    collective (every rank calls it), whose result only rank 0 holds."""
    out: dict[str, Any] = {}
    for key, u in updaters.items():
        if u.replica is not None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            out[key] = get_optimizer_state_dict(u.trained, u.optimizer,
                                                options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            out[key] = u.optimizer
    return out


def barrier(accelerator: Any | None) -> None:
    """Wait for every rank (no-op in one process)."""
    if accelerator is not None:
        accelerator.wait_for_everyone()


def end(accelerator: Any | None) -> None:
    """Wait for every rank, then take the process group down (no-op in one process)."""
    if accelerator is not None:
        accelerator.wait_for_everyone()
        accelerator.end_training()


def require_replicated(accelerator: Any | None) -> None:
    """The training job generates its rollouts with each rank's own whole copy of the weights
    (the transformers backend) and saves checkpoints from rank 0's copy; its FSDP keeps such a
    copy beside the shards (``parallel: fsdp``). accelerate's own FSDP and DeepSpeed engines do
    not: refuse them with a clear message instead of a hang or a checkpoint of one shard."""
    if accelerator is None:
        return
    kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
    if kind in _SHARDED:
        raise ValueError(
            f"envace train does not run under accelerate's {kind} engine: launch it with a plain multi-process "
            "accelerate config (MULTI_GPU / MULTI_CPU) and set `parallel: fsdp` in the training config for "
            "sharded training (torch FSDP2, with a whole-weight copy per rank for rollouts). DeepSpeed is not "
            "supported (see docs/scaling.md)")


def broadcast_object(accelerator: Any | None, obj: T) -> T:
    """Rank 0's ``obj`` on every rank (pickled; for small things such as a run directory path)."""
    if num_processes(accelerator) == 1:
        return obj
    return broadcast_object_list([obj], from_process=0)[0]


def replicas_agree(accelerator: Any | None, models: Mapping[str, nn.Module]) -> bool:
    """Whether every rank holds the same trainable weights (exactly: under DDP the gradients are
    all-reduced and each rank's optimiser takes the same step, so the replicas stay bitwise
    equal unless a rank started from other weights or another optimiser state)."""
    if num_processes(accelerator) == 1:
        return True
    params = [p for key in sorted(models) for p in models[key].parameters() if p.requires_grad]
    sums = torch.stack([p.detach().sum(dtype=torch.float64) for p in params]).tolist() if params else []
    per_rank = gather_objects(accelerator, [sums])
    return all(r == per_rank[0] for r in per_rank)


# ---------------------------------------------------------------------------- rollouts


def shard_tasks(tasks: Sequence[T], accelerator: Any | None) -> list[T]:
    """This rank's share of the step's tasks: task ``i`` goes to rank ``i % N``, so each task's G
    trajectories stay on one rank. Every rank must pass the same list in the same order."""
    n, rank = num_processes(accelerator), process_index(accelerator)
    return list(tasks[rank::n])


def rank_seed(seed: int | None, accelerator: Any | None) -> int | None:
    """A per-rank sampling seed (rank 0 keeps ``seed``), so ranks do not share random streams."""
    if seed is None:
        return None
    return seed + 1_000_003 * process_index(accelerator)


def gather_trajectories(accelerator: Any | None, trajectories: list[Trajectory]) -> list[Trajectory]:
    """All ranks' trajectories of the step (for logging on the main process)."""
    return gather_objects(accelerator, trajectories)


def gather_in_task_order(accelerator: Any | None, trajectories: list[Trajectory],
                         tasks: Sequence[Any]) -> list[Trajectory]:
    """Every rank's trajectories, back in the order of ``tasks`` (each with an ``id``); one process:
    ``trajectories`` as they are."""
    if num_processes(accelerator) == 1:
        return trajectories
    index = {t.id: i for i, t in enumerate(tasks)}
    gathered = gather_trajectories(accelerator, trajectories)
    return sorted(gathered, key=lambda t: (index.get(t.task_id, len(index)), t.trajectory_index))


def device(accelerator: Any | None, preference: str = "auto") -> Any:
    """The torch device this process computes on: the accelerator's rank device, else
    ``preference`` (``auto``: cuda when available, else cpu)."""
    if accelerator is not None:
        return accelerator.device
    if preference == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return preference


# ---------------------------------------------------------------------------- advantages


@dataclass(frozen=True)
class _SampleMeta:
    """What compute_advantages reads of a TurnSample; ``gen_ids`` is () for an empty generation
    and one placeholder id otherwise (emptiness is decided on the sample's own rank)."""

    group_id: str
    role: Role
    gen_ids: tuple[int, ...]
    format_ok: bool | None = None
    example_match: float | None = None


@dataclass(frozen=True)
class _TrajectoryMeta:
    reward: float
    samples: tuple[_SampleMeta, ...]


def compute_advantages_global(accelerator: Any | None, trajectories: Iterable[Trajectory],
                              roles: Collection[Role] | None = None, **settings: Any) -> list[ScoredSample]:
    """:func:`~envace.train.advantages.compute_advantages` (its keyword ``settings``) over every
    rank's trajectories; returns this rank's scored samples, in the order compute_advantages gives
    them. Only a few fields per sample are gathered, no token ids."""
    local = list(trajectories)
    if num_processes(accelerator) == 1:
        return compute_advantages(local, roles=roles, **settings)
    content_free = settings.get("content_free_ids", ())
    summary = [_TrajectoryMeta(reward=float(t.reward), samples=tuple(
        _SampleMeta(s.group_id, s.role, () if is_empty_generation(s, content_free) else (-1,),
                    getattr(s, "format_ok", None), getattr(s, "example_match", None))
        for s in t.samples)) for t in local]
    per_rank: list[list[_TrajectoryMeta]] = gather_objects(accelerator, [summary])
    rank = process_index(accelerator)
    offset = sum(len(t.samples) for r in per_rank[:rank] for t in r)
    union = [t for r in per_rank for t in r]
    scored = compute_advantages(union, **settings)  # type: ignore[arg-type]
    mine = [s for t in local for s in t.samples]
    out: list[ScoredSample] = []
    for sample, g in zip(mine, scored[offset : offset + len(mine)]):
        if roles is not None and sample.role not in roles:
            continue
        out.append(ScoredSample(sample=sample, advantage=g.advantage, reward=g.reward))
    return out


@dataclass(frozen=True)
class _ScoredMeta:
    role: Role
    reward: float
    advantage: float


def global_advantage_stats(accelerator: Any | None, scored: Sequence[ScoredSample]) -> dict[str, float]:
    """:func:`~envace.train.advantages.advantage_stats` over every rank's scored samples (a few
    numbers per sample are gathered, no token ids)."""
    if num_processes(accelerator) == 1:
        return advantage_stats(scored)
    mine = [_ScoredMeta(s.role, s.reward, s.advantage) for s in scored]
    return advantage_stats(gather_objects(accelerator, mine))  # type: ignore[arg-type]
