"""The training job: SFT warm start, then role-wise GRPO with one response source, evaluated in
the real world every N steps, checkpointed every step, resumable.

The same job runs on one process or on several under ``accelerate launch`` (DDP): each rank
rolls out its share of the step's tasks, advantages are centred over every rank's samples, the
update is one synchronised optimiser step on the global batch, and rank 0 alone writes the run
directory (see :mod:`envace.train.distributed`). With one process every distributed call is the
single-process one."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from envace.core.jsonl import read_jsonl_dicts, save_jsonl
from envace.core.prompts import PromptStyle
from envace.core.types import Task, Trajectory
from envace.experiments.config import TrainConfig
from envace.experiments.metrics_log import MetricsLog
from envace.experiments.trackers import (after_warm_start, json_config, make_trackers, replay_warm_start,
                                         warm_start_steps)
from envace.experiments.eval_models import run_config, train_style
from envace.experiments.factory import GenerationSettings, make_actor, make_judge
from envace.experiments.rollout_backends import rollout_backends
from envace.experiments.models import RunModels, frozen_copy, load_frozen, load_policy, split_for_mode, with_lora
from envace.experiments.failures import failure_rows
from envace.experiments.gap import GapParts, failure_metrics, gap_metrics, gap_sources, run_gap
from envace.experiments.progress import JobClock, StepProgress, metrics_table
from envace.experiments.report import write_train_report
from envace.experiments.rundir import RunDir
from envace.experiments.tasksets import (EvalKind, TaskSet, WorldTasks, eval_kind, eval_tasks, eval_world, real_eval_tasks,
                                         sampled_pool, task_set, train_tasks)
from envace.experiments.train_step import Trainer, own_forward_logprobs, train_step
from envace.policy.allocator import cap_heap_blocks, release_freed_memory
from envace.policy.data_tokenizer import train_data_tokenizer
from envace.policy.loading import scratch_llama, smollm2_tokenizer
from envace.policy.threads import AdaptiveThreads
from envace.policy.transformers_backend import TransformersBackend, generation_dtype
from envace.rollout.diagnostics import Truncation, truncated_fractions, truncation_counts
from envace.rollout.sources import RealSource
from envace.train.checkpoint import (find_latest, load_checkpoint, read_optimizer_state, resolve_checkpoint,
                                     save_checkpoint)
from envace.train.copy_warmup import copy_warmup, data_vocabulary
from envace.train.sft import (WarmStartData, oracle_warm_start, replayable, run_sft, target_turn_lengths,
                              why_not_replayable)
from envace.train import distributed as dist
from envace.train.step import UpdaterConfig, updaters_for_mode

SFT_DIR = "sft"
CKPT_DIR = "checkpoints"
# Collective timeout on several processes: the other ranks wait while rank 0 runs the warm start.
DIST_TIMEOUT_S = 3 * 3600
# Above this share of cut-off turns the cap, not the policy, decides many episodes. A tiny model's
# simulator loops now and then (7% of its turns at a 320 cap that fits 93% of real results).
TRUNCATION_WARN = 0.10


def prompt_style(cfg: TrainConfig) -> PromptStyle:
    return cfg.prompt  # the prompt section is the style


def generation_settings(cfg: TrainConfig, temperature: float | None = None) -> GenerationSettings:
    return cfg.rollout.generation(cfg.prompt, temperature)


def example_limit(cfg: TrainConfig) -> int:
    """How many recorded examples become simulator samples (``sft.example_samples``; None: all of a
    task file's, none of the embedded worlds'); 0 without the simulator role."""
    if "simulator" not in cfg.sft.roles:
        return 0
    if cfg.sft.example_samples is not None:
        return cfg.sft.example_samples
    return 0 if cfg.task_file is None else 1_000_000


def sft_possible(cfg: TrainConfig, tasks: list[Task]) -> bool:
    """The warm start has something to train on: a reference it can replay (in a real world, or
    from its recorded results) or, with the simulator role, recorded examples."""
    return cfg.sft.enabled and (
        any(replayable(t, cfg.world) and t.reference is not None and t.reference.calls for t in tasks)
        or (example_limit(cfg) > 0 and any(t.examples for t in tasks)))


def warm_start_data(cfg: TrainConfig, tasks: list[Task], tokenizer: Any,
                    example_pool: list[Task] | None = None) -> WarmStartData:
    """The warm start's data: the oracle's replays of ``tasks`` and, as ``sft.example_samples``
    says, ``example_pool``'s recorded examples, as the run's sft section asks."""
    return oracle_warm_start(tasks, tokenizer, prompt_style(cfg), roles=cfg.sft.roles,
                             simulator_tasks=cfg.sft.simulator_trajectories, world=cfg.world,
                             error_probes=cfg.sft.error_probes, example_tasks=example_pool or (),
                             example_limit=example_limit(cfg), seed=cfg.seed)


def warm_start_samples(cfg: TrainConfig, tasks: list[Task], tokenizer: Any) -> list:
    """The SFT samples of the oracle's trajectories on ``tasks``, as the run's sft section asks."""
    return warm_start_data(cfg, tasks, tokenizer).samples


def sft_tasks(cfg: TrainConfig, pool: list[Task]) -> list[Task]:
    """The warm start's tasks: a function of the seed, so ``sft.init_from`` runs agree on them."""
    usable = [t for t in pool if replayable(t, cfg.world)]
    return random.Random(cfg.seed).sample(usable, min(cfg.sft.trajectories, len(usable)))


def anchor_pool(cfg: TrainConfig, tokenizer: Any) -> list:
    """The samples ``grpo.anchor_coef`` draws from: the warm start's own SFT samples (its oracle
    trajectories, as ``sft_tasks`` picks them: the same on every rank and in a resumed run)."""
    tasks = sft_tasks(cfg, train_tasks(cfg)) if cfg.bench is None else []
    if not tasks:
        raise ValueError("grpo.anchor_coef: the anchor replays the embedded worlds' oracle (as the SFT warm start "
                         "does); these train tasks have no reference solution in a real world; set anchor_coef: 0")
    return warm_start_samples(cfg, tasks, tokenizer)


def rl_tasks(cfg: TrainConfig, pool: list[Task]) -> list[Task]:
    """The tasks GRPO draws from: by default the train tasks the warm start did not imitate.
    A small model re-solves its SFT tasks from memory (far above its test success; figures in
    docs/notes/2026-12-results-history.md), so RL on them rewards recall, not the skill the test
    split asks for."""
    if not (sft_possible(cfg, pool) and cfg.rl_fresh_tasks):
        return pool
    seen = {t.id for t in sft_tasks(cfg, pool)}
    fresh = [t for t in pool if t.id not in seen]
    return fresh or pool


def grpo_pool(cfg: TrainConfig) -> list[Task]:
    """The tasks GRPO draws its steps from (the embedded worlds' or a task file's; a benchmark's:
    tasksets.BenchTasks): with ``rl_pool``, a fixed sample of them (seeded)."""
    return sampled_pool(cfg, rl_tasks(cfg, train_tasks(cfg)))


def evaluate_real(model: torch.nn.Module, tokenizer: Any, tasks: list, cfg: TrainConfig,
                  accelerator: Any | None = None, task_set: TaskSet | None = None, judge: Any = None,
                  kind: EvalKind = "real", log: Any = None, sim_model: torch.nn.Module | None = None,
                  details: dict[str, Any] | None = None,
                  backends: Any = None) -> tuple[dict[str, float], list[Trajectory]]:
    """Success on held-out tasks with the real world answering, whatever the training source:
    ``task_set`` plays them (a benchmark's: its entries, environment and scorer; its real source
    is the run's, so worlds resolve once per run). Without one, the worlds' tasks with a real
    source made and closed here; ``kind="rehearsal"``: no real world exists, the policy rehearses
    the responses (nothing is recorded for training). ``log``: a line per turn.
    On several processes each rank runs its share of the tasks; every rank gets all of them.
    With a real world and ``eval.rehearsal_gap``, the same tasks also run rehearsal-judged
    (``sim_model`` rehearsing, default ``model``) beside the real run, with the rehearse role's
    fidelity (experiments/gap.py); ``details`` receives their trajectories and fidelity pairs.
    ``backends``: generate on these (the run's rollout backends, holding the current weights)
    instead of on ``model`` in process."""
    gen = generation_settings(cfg, temperature=cfg.eval.temperature)
    if backends is not None:
        backend = backends.caller
    else:
        backend = TransformersBackend(model, tokenizer, device=dist.device(accelerator, cfg.device),
                                      max_batch=gen.max_batch, dtype=generation_dtype(cfg.rollout.dtype),
                                      kv_reuse_tokens=cfg.rollout.kv_reuse_tokens)
    mine, actor = dist.shard_tasks(tasks, accelerator), make_actor(backend, gen, cfg.seed)
    k = cfg.eval.samples
    ts = task_set or WorldTasks(cfg, [], tasks, kind, RealSource(eval_world(cfg)))
    try:
        trajs = ts.evaluate(mine, actor, backend, gen, cfg.seed, judge=judge, log=log)
    finally:
        if task_set is None:
            ts.close()
    release_freed_memory()
    gap = None
    if ts.checklist and ts.kind == "real" and cfg.eval.rehearsal_gap:
        if backends is not None:
            sim = backends.simulator
        elif sim_model is None or sim_model is model:
            sim = backend
        else:
            sim = TransformersBackend(sim_model, tokenizer, device=dist.device(accelerator, cfg.device),
                                      max_batch=gen.max_batch, dtype=generation_dtype(cfg.rollout.dtype))
        gap = run_gap(mine, trajs, actor, gap_sources(sim, gen.style, gen.simulator_max_new_tokens,
                                                      cfg.eval.temperature, cfg.seed, gen.examples_as_recorded),
                      cfg.rollout.max_turns, k, judge=judge, log=log)
        gap = GapParts(dist.gather_in_task_order(accelerator, gap.rehearsal, tasks),
                       dist.gather_objects(accelerator, gap.pairs))
    trajs = dist.gather_in_task_order(accelerator, trajs, tasks)
    n = len(trajs)
    solved = {t.task_id for t in trajs if t.solved}
    metrics = {"eval/success": sum(t.solved for t in trajs) / n,
               "eval/tasks_solved": len(solved) / len({t.task_id for t in trajs}),
               "eval/reward": sum(t.reward for t in trajs) / n,
               "eval/tool_calls": sum(t.tool_calls for t in trajs) / n,
               "eval/parse_failures": sum(t.parse_failures for t in trajs) / n,
               **{f"eval/{k}": v for k, v in truncated_fractions(trajs).items()}}
    if ts.checklist:
        metrics.update(failure_metrics(tasks, trajs))
    if gap is not None:
        metrics.update(gap_metrics(tasks, trajs, gap))
        if details is not None:
            details.update(rehearsal=gap.rehearsal, pairs=gap.pairs)
    return metrics, trajs


class FlatGroups:
    """Says once, in the log, when most task groups of several steps in a row had one reward for
    all their episodes: such groups give no gradient, and a run that looks stuck often is this (a
    near-deterministic policy at its rollout temperature: measured in docs/notes)."""

    def __init__(self, log: Any, share: float = 0.75, steps: int = 3) -> None:
        self.log, self.share, self.steps, self.streak, self.said = log, share, steps, 0, False

    def check(self, step: int, row: dict[str, Any]) -> None:
        zero = row.get("adv_zero_frac/caller")
        self.streak = self.streak + 1 if zero is not None and zero >= self.share else 0
        if self.streak >= self.steps and not self.said and self.log is not None:
            self.said = True
            entropy = "".join(f"; {k} {v:.3f}" for k, v in row.items() if k.endswith("/entropy"))
            self.log(f"note: steps {step - self.steps + 1}-{step}: in >= {self.share:.0%} of the caller's task groups "
                     f"every episode got the same reward, so they gave no gradient (train rows: "
                     f"adv_zero_frac/caller{entropy}). "
                     "More varied episodes help: a higher rollout.temperature or group_size, or a shorter warm start; "
                     "dynamic_sampling: N rolls out more tasks until enough groups have signal")


def run_policy(cfg: TrainConfig, saved: Path | None = None) -> tuple[torch.nn.Module, Any]:
    """The policy a run starts from (LoRA applied) and its tokenizer: ``cfg.model``; with
    ``sft.vocab``, a from-scratch model sized to a data tokenizer: the one saved with the warm
    start in ``saved`` (a resumed run's or ``sft.init_from``'s sft dir), else one trained now on
    the warm start's oracle text (deterministic, so every rank builds the same)."""
    if cfg.sft.vocab is None:
        return load_policy(cfg.model, cfg.lora)
    if saved is not None and saved.exists():
        saved = resolve_checkpoint(saved)
        if not (saved / "tokenizer_config.json").is_file():
            raise ValueError(f"sft.vocab: the warm start {saved} holds no tokenizer: it was trained without "
                             "sft.vocab; use the same sft.vocab as the run that made it")
        tok = AutoTokenizer.from_pretrained(saved)
        if len(tok) > cfg.sft.vocab:
            raise ValueError(f"sft.vocab: the warm start {saved} has a {len(tok)}-token vocabulary, not a data "
                             f"vocabulary of at most {cfg.sft.vocab}; use the same sft.vocab as the run that made it")
    else:
        base = smollm2_tokenizer()
        samples = warm_start_samples(cfg, sft_tasks(cfg, train_tasks(cfg)), base)
        tok = train_data_tokenizer((base.decode(s.prompt_ids + s.gen_ids) for s in samples), cfg.sft.vocab, base)
    return with_lora(scratch_llama(cfg.model, tok), cfg.lora), tok


def _on_step(bar: StepProgress, threads: AdaptiveThreads | None):
    last_release = [time.perf_counter()]

    def on_step(step: int, total: int, loss: float) -> None:
        bar.update(step, total, {"loss": loss})
        if threads is not None:
            threads.check()
        if time.perf_counter() - last_release[0] > 10:  # a trim walks the heap: not after every fast step
            release_freed_memory()
            last_release[0] = time.perf_counter()

    return on_step


def _warm_start_rows(run: RunDir):
    """Per-step rows of the warm start's phases into metrics.jsonl (``step`` 0: before GRPO, so a
    resume keeps them; ``global_step`` counts every warm-start step, copy warm-up then SFT); the
    trackers get them when the run makes them (trackers.replay_warm_start)."""
    count = {"global": 0}

    def for_phase(phase: str):
        def on_row(values: dict[str, float]) -> None:
            count["global"] += 1
            count[phase] = count.get(phase, 0) + 1
            run.log_metrics({"phase": phase, "step": 0, "global_step": count["global"],
                             f"{phase}/step": count[phase], **values})

        return on_row

    return for_phase


def prompt_mismatch(warm: Path, cfg: TrainConfig) -> str:
    """The prompt settings in which the run that made the warm start ``warm`` differs from ``cfg``,
    as ``field: theirs -> ours`` (empty when they agree, or when no run config is found)."""
    theirs = train_style(run_config(warm))
    if theirs is None:
        return ""
    ours = prompt_style(cfg)
    return ", ".join(f"prompt.{f}: {getattr(theirs, f)} -> {getattr(ours, f)}"
                     for f in PromptStyle.model_fields if getattr(theirs, f) != getattr(ours, f))


def warm_start(policy: torch.nn.Module, tokenizer: Any, cfg: TrainConfig, run: RunDir, log,
               clock: JobClock | None = None, threads: AdaptiveThreads | None = None) -> None:
    if not cfg.sft.enabled:
        return
    if cfg.sft.init_from:
        # Same start for several runs (e.g. the three sources compared): train it once.
        src = Path(cfg.sft.init_from)
        if not src.exists():
            raise FileNotFoundError(f"sft.init_from: {src} does not exist")
        load_checkpoint(src, policy, restore_rng=False)
        save_checkpoint(run.path / SFT_DIR, policy, step=0, keep_last=1, tokenizer=tokenizer)
        log(f"SFT warm start loaded from {src}")
        mismatch = prompt_mismatch(src, cfg)
        if mismatch:
            log(f"warning: sft.init_from: the warm start was trained with other prompt settings ({mismatch}): "
                "its roles will see prompts unlike the ones they learnt")
        return
    pool = train_tasks(cfg)
    if not sft_possible(cfg, pool):
        log("SFT warm start skipped: no train task has a reference to replay (in a real world, or from results "
            "recorded in reference.calls[i].result) nor recorded examples for the simulator role (set "
            "sft.enabled: false to silence this); GRPO starts from the model as loaded")
        return
    tasks = sft_tasks(cfg, pool)
    data = warm_start_data(cfg, tasks, tokenizer, pool)
    data.skipped = Counter(why for t in pool if (why := why_not_replayable(t, cfg.world)) is not None)
    log(f"warm start data: {data.describe()}")
    samples = data.samples
    if cfg.sft.caller_repeats > 1:
        samples = [s for s in samples for _ in range(cfg.sft.caller_repeats if s.role == "caller" else 1)]
        log(f"sft.caller_repeats={cfg.sft.caller_repeats}: each epoch trains every caller sample "
            f"{cfg.sft.caller_repeats} times ({len(samples)} samples an epoch)")
    if not samples:
        log("SFT warm start skipped: it has no samples left (see the line above); GRPO starts from the model "
            "as loaded")
        return
    for role, lengths in target_turn_lengths(samples).items():
        cap = getattr(cfg.rollout, f"{role}_max_new_tokens")
        over = sum(n > cap for n in lengths) / len(lengths)
        if over > TRUNCATION_WARN and cfg.rollout.truncation_warnings:
            log(f"warning: {over:.0%} of the oracle's {role} turns are longer than rollout.{role}_max_new_tokens="
                f"{cap} (longest {max(lengths)} tokens): the policy cannot write them whole; raise the cap")
    t0 = time.perf_counter()
    clock = clock or job_clock(cfg)
    on_row = _warm_start_rows(run)
    if cfg.sft.copy_warmup_steps:
        vocab = data_vocabulary((s.prompt_ids + s.gen_ids for s in samples), limit=cfg.sft.copy_warmup_vocab)
        bar = StepProgress("copy warm-up", total=cfg.sft.copy_warmup_steps, clock=clock)
        results = [s.gen_ids for s in samples if s.role == "simulator"]  # the real tool results
        if cfg.sft.copy_warmup_data and not results:
            log("warning: sft.copy_warmup_data is ignored: the warm start has no simulator samples (real tool "
                "results) to copy; the warm-up copies random spans only")
        cw = copy_warmup(policy, vocab, cfg.sft.copy_warmup_steps, lr=cfg.sft.copy_warmup_lr,
                         span=cfg.sft.copy_warmup_span, seed=cfg.seed,
                         on_step=_on_step(bar, threads), data=results,
                         data_frac=cfg.sft.copy_warmup_data if results else 0.0,
                         data_span=cfg.sft.copy_warmup_data_span, on_row=on_row("copy"))
        bar.close()
        log(f"copy warm-up: {cw.steps} steps over {cw.vocabulary} data tokens, loss {cw.first_loss:.3f} -> "
            f"{cw.last_loss:.3f}, copy accuracy {cw.accuracy:.3f}")
        run.log_metrics({"phase": "sft", "step": 0, "copy/last_loss": cw.last_loss, "copy/accuracy": cw.accuracy,
                         "copy/seconds": time.perf_counter() - t0})
    log(f"SFT warm start: {data.in_world + data.from_records} oracle trajectories, {len(samples)} samples, "
        f"{cfg.sft.epochs} epochs")
    bar = StepProgress("sft", total=None, clock=clock)
    stats = run_sft(policy, samples, epochs=cfg.sft.epochs, lr=cfg.sft.lr, micro_batch_tokens=cfg.sft.micro_batch_tokens,
                    batch_samples=cfg.sft.batch_samples, schedule=cfg.sft.schedule,
                    seed=cfg.seed, pad_id=tokenizer.pad_token_id or 0,
                    on_step=_on_step(bar, threads), mixed_precision=cfg.mixed_precision, on_row=on_row("sft"),
                    gradient_checkpointing=cfg.grpo.gradient_checkpointing)
    bar.close()
    run.log_metrics({"phase": "sft", "step": 0, "sft/first_loss": stats.first_loss, "sft/last_loss": stats.last_loss,
                     "sft/samples": stats.samples, "sft/tokens": stats.tokens, "sft/seconds": time.perf_counter() - t0,
                     "sft/replays_in_world": data.in_world, "sft/replays_from_records": data.from_records,
                     "sft/example_samples": data.example_samples,
                     "sft/replays_dropped": sum(len(ids) for ids in data.dropped.values())})
    save_checkpoint(run.path / SFT_DIR, policy, step=0, keep_last=1, tokenizer=tokenizer)


@dataclass
class TrainState:
    run: RunDir
    models: RunModels
    updaters: dict
    start_step: int
    start_model: torch.nn.Module  # the warm-started policy, frozen: the simulator baseline
    accelerator: Any | None = None  # several processes (accelerate); None: one process


def _updater_config(cfg: TrainConfig, tokenizer: Any) -> UpdaterConfig:
    """The updater's frozen settings, built once: the ``grpo`` section's fields of the same name,
    the sampler's temperatures (so new and old log-probs compare) and the pad id."""
    return UpdaterConfig.from_sections(cfg.grpo, temperature=cfg.rollout.temperature,
                                       simulator_temperature=cfg.rollout.simulator_temperature,
                                       pad_id=tokenizer.pad_token_id or 0, mixed_precision=cfg.mixed_precision,
                                       old_logprobs="current" if own_forward_logprobs(cfg) else "sampler")


def prepare(cfg: TrainConfig, resume: str | Path | None, log, accelerator: Any | None = None,
            clock: JobClock | None = None, threads: AdaptiveThreads | None = None,
            on_run: Any = None) -> TrainState:
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    main = dist.is_main_process(accelerator)
    if resume is None:
        # Rank 0 creates the run directory and runs the warm start; the other ranks wait for its
        # path, then load the warm-started weights from it as a resumed run does.
        created = None
        if main:
            created = RunDir.create(cfg.out, "train", cfg.model_dump(mode="json"), seed=cfg.seed)
            log(f"run directory: {created.path}")
            if on_run is not None:
                on_run(created.path)
            init = Path(cfg.sft.init_from) if cfg.sft.enabled and cfg.sft.init_from else None
            policy, tok = run_policy(cfg, init)
            policy.to(dist.device(accelerator, cfg.device))
            warm_start(policy, tok, cfg, created, log, clock, threads)
        run = RunDir(Path(dist.broadcast_object(accelerator, str(created.path) if created else "")))
    else:
        run = RunDir.open(resume)
    if resume is not None and main and _warm_start_lost(cfg, run):
        # Killed during the warm start: no GRPO step exists yet, so redo it rather than train GRPO
        # from the untrained model (which a bare resume would silently do).
        log(f"resuming {run.path}: the SFT warm start did not finish; redoing it")
        init = Path(cfg.sft.init_from) if cfg.sft.init_from else None
        policy, tok = run_policy(cfg, init)
        policy.to(dist.device(accelerator, cfg.device))
        _clear_phase(run, "sft")
        _clear_phase(run, "copy")
        warm_start(policy, tok, cfg, run, log, clock, threads)
    if resume is not None or not main:
        policy, tok = run_policy(cfg, run.path / SFT_DIR)
        policy.to(dist.device(accelerator, cfg.device))
        if (run.path / SFT_DIR).exists():
            load_checkpoint(run.path / SFT_DIR, policy, restore_rng=False)
    start_model = frozen_copy(policy)
    models = split_for_mode(policy, tok, cfg.mode)
    ref = {k: start_model for k in models.trained} if cfg.grpo.kl_coef > 0 else None
    # every model of the mode: caller_only's frozen simulator (models.extra) gets no updater but must be there
    updaters = updaters_for_mode(models.spec, {**models.extra, **models.trained}, _updater_config(cfg, tok),
                                 ref_models=ref)
    start_step = 0
    # FSDP rebuilds the optimisers over the shards: their saved state is loaded after sharding.
    fsdp = cfg.parallel == "fsdp" and accelerator is not None
    optimizer_states = None
    if resume is not None:
        latest = find_latest(run.path / CKPT_DIR)
        if latest is not None:
            loaded = load_checkpoint(latest, models.trained,
                                     None if fsdp else {k: u.optimizer for k, u in updaters.items()})
            start_step = loaded.step
            if fsdp:
                optimizer_states = {k: read_optimizer_state(latest, k) for k in updaters}
            if main:
                _truncate_logs(run, start_step)
        log(f"resuming {run.path} after step {start_step}")
    # After the checkpoint is loaded on every rank: DDP wraps the models, or FSDP shards copies of
    # them (models.trained stay whole: the rollout replicas); unchanged in one process.
    updaters = dist.prepare_updaters(accelerator, updaters, cfg.parallel, optimizer_states)
    return TrainState(run=run, models=models, updaters=updaters, start_step=start_step, start_model=start_model,
                      accelerator=accelerator)


def _warm_start_lost(cfg: TrainConfig, run: RunDir) -> bool:
    """The run should have a warm start and has no complete one, and no GRPO checkpoint either."""
    if not cfg.sft.enabled or find_latest(run.path / CKPT_DIR) is not None:
        return False
    if find_latest(run.path / SFT_DIR) is not None:
        return False
    return bool(cfg.sft.init_from) or sft_possible(cfg, train_tasks(cfg))


def _clear_phase(run: RunDir, phase: str) -> None:
    """Drop a redone phase's metric rows, so they do not count twice."""
    path = run.path / "metrics.jsonl"
    if path.exists():
        save_jsonl(path, [r for r in read_jsonl_dicts(path) if r.get("phase") != phase])


def _truncate_logs(run: RunDir, step: int) -> None:
    """Drop log rows of steps after the checkpoint: they are redone, and must not count twice."""
    for name in ("metrics.jsonl", "trajectories.jsonl", "evals.jsonl", "eval_failures.jsonl",
                 "evals_rehearsal.jsonl", "eval_fidelity.jsonl"):
        path = run.path / name
        if path.exists():
            rows = read_jsonl_dicts(path)
            save_jsonl(path, [r for r in rows if r.get("step", 0) <= step])


def _tag(trajs: list[Trajectory], step: int, kind: str) -> list[dict]:
    return [{"step": step, "kind": kind, **t.model_dump(mode="json", exclude_none=True)} for t in trajs]


def job_plan(cfg: TrainConfig, resume: bool) -> list[tuple[str, str]]:
    """The phases this job will run, in order, with their size: the whole job, announced up front
    (each phase's bar then says ``[k/n]``)."""
    warm = cfg.sft.enabled and cfg.sft.init_from is None and not resume
    plan = []
    if warm and cfg.sft.copy_warmup_steps:
        plan.append(("copy warm-up", f"{cfg.sft.copy_warmup_steps:,} steps"))
    if warm:
        plan.append(("sft", f"up to {cfg.sft.trajectories} reference replays x {cfg.sft.epochs} epochs (replayed in "
                            "a real world or from recorded results; recorded examples train the rehearse role)"))
    n, kind = _eval_size(cfg)
    evals = f", {kind} eval every {cfg.eval.every}" if cfg.eval.every else ""
    if cfg.steps:  # steps: 0 is an SFT-only run (its eval, if any, is of the warm start)
        plan.append(("train", f"{cfg.steps} GRPO steps x {cfg.tasks_per_step} tasks x G={cfg.group_size}{evals}"))
    if _final_eval_wanted(cfg):
        plan.append(("final eval", f"{kind} on {n} tasks x {cfg.eval.samples} episodes"))
    return plan


def _eval_size(cfg: TrainConfig) -> tuple[int, str]:
    """How many tasks the eval runs, and what kind of eval it is (real-world / rehearsal-judged), as
    the run will find them; a config the run will refuse keeps the configured count. Remembered per
    config and task-file version: the plan asks several times, and tasks without tools list them
    from their world (an MCP server is started for it)."""
    if cfg.bench is not None:
        return cfg.eval.tasks, "real-world"
    stamp = ""
    if cfg.task_file is not None and Path(cfg.task_file).exists():
        st = Path(cfg.task_file).stat()
        stamp = f"{st.st_mtime_ns}:{st.st_size}"
    key = cfg.model_dump_json() + stamp
    if key not in _EVAL_SIZES:
        try:
            held_out = real_eval_tasks(cfg, grpo_pool(cfg)) if cfg.eval.split == "pool" else eval_tasks(cfg)
            kind = eval_kind(cfg, held_out)
            _EVAL_SIZES[key] = len(held_out), "real-world" if kind == "real" else "rehearsal-judged"
        except (ValueError, OSError):  # the run says what is wrong where it meets it
            return cfg.eval.tasks, "real-world"
        while len(_EVAL_SIZES) > 16:
            _EVAL_SIZES.pop(next(iter(_EVAL_SIZES)))
    return _EVAL_SIZES[key]


_EVAL_SIZES: dict[str, tuple[int, str]] = {}


def fitted_to_data(cfg: TrainConfig, log: Any = None) -> TrainConfig:
    """A task-file run's config with the settings the user left unset (token caps, warm-start
    epochs, eval episodes) fitted to the file (experiments/data_defaults.py); ``log`` says which
    and why. Other runs keep their config."""
    if cfg.task_file is None or cfg.bench is not None:
        return cfg
    from envace.experiments.data_defaults import fit_to_data, measuring_tokenizer

    pool = train_tasks(cfg)
    n_eval, _ = _eval_size(cfg)
    tokenizer, counted = measuring_tokenizer(cfg.model)
    from envace.policy.loading import bf16_is_fast

    fitted = fit_to_data(cfg, pool, sft_tasks(cfg, pool), n_eval, tokenizer, counted,
                         bf16=bf16_is_fast(cfg.device))
    if fitted.notes and log is not None:
        log("fitted to the task file (set any of these to choose otherwise): " + "; ".join(fitted.notes))
    return fitted.cfg


def _final_eval_wanted(cfg: TrainConfig) -> bool:
    """With ``steps: 0`` the end is the start: ``eval.at_start: false`` then means no eval at all
    (an SFT-only run, e.g. a world model measured by ``eval --fidelity`` instead)."""
    return cfg.steps > 0 or cfg.eval.at_start


def job_clock(cfg: TrainConfig, resume: bool = False) -> JobClock:
    """The job's phases, for ``[k/n]`` labels and the whole-job ETA on every progress line."""
    return JobClock([name for name, _ in job_plan(cfg, resume)])


def train(cfg: TrainConfig, resume: str | Path | None = None, log=print,
          on_run: Any = None) -> RunDir:
    """``on_run``: called with the run directory as soon as it exists (so an interrupt can name it)."""
    threads = AdaptiveThreads(cfg.threads, log)  # re-checked between steps: other jobs come and go
    cap_heap_blocks(None if cfg.mmap_threshold_kib is None else cfg.mmap_threshold_kib * 1024)
    acc = dist.make_accelerator(timeout_s=DIST_TIMEOUT_S)  # None unless launched with several processes
    dist.require_replicated(acc)
    main = dist.is_main_process(acc)
    if not main:
        log = _silent  # noqa: F811 - rank 0 speaks for the run
    if resume is None:
        cfg = fitted_to_data(cfg, log)
    plan = job_plan(cfg, resume is not None)
    clock = job_clock(cfg, resume is not None)
    log("plan: " + " -> ".join(f"{i}/{len(plan)} {name} ({what})" for i, (name, what) in enumerate(plan, 1)))
    tasks = task_set(cfg, rl_tasks)
    st = prepare(cfg, resume, log, acc, clock, threads, on_run=on_run)
    run, models = st.run, st.models
    metrics_log = None
    if main:
        warm_rows = [r for r in run.metrics() if r.get("phase") in ("copy", "sft")]
        trackers = make_trackers(cfg.report_to, run.path, run.path.name, json_config(cfg.model_dump(mode="json")),
                                 project=cfg.tracker_project, wandb_mode=cfg.wandb_mode,
                                 resume_step=st.start_step if resume is not None else None)
        if resume is None:
            replay_warm_start(trackers, warm_rows)
        trackers = after_warm_start(trackers, warm_start_steps(warm_rows))
        metrics_log = MetricsLog(run, trackers, samples_every=cfg.report_samples_every)
    tok = models.tokenizer
    anchors = anchor_pool(cfg, tok) if cfg.grpo.anchor_coef > 0 else []
    if anchors:
        log(f"anchor: {cfg.grpo.anchor_samples} of the warm start's {len(anchors)} SFT samples per step, "
            f"weight {cfg.grpo.anchor_coef}")
    held_out, kind = tasks.held_out, tasks.kind
    log(tasks.describe_eval())
    eos_ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()  # an EOS-only turn is empty
    device = dist.device(acc, cfg.device)
    sim_model = models.for_role("simulator")
    if cfg.source == "simulator":
        sim_model = st.start_model if cfg.sim_model is None else load_frozen(cfg.sim_model)
    backends = rollout_backends(cfg, models, sim_model, tok, device, run.path)
    if backends.pushers:
        log(f"rollouts on {cfg.rollout.backend} ({cfg.rollout.server_url or cfg.model}); the trainer's weights are "
            f"pushed before the first rollout and after every update"
            + ("; rollout log-probs are recomputed by the trainer" if backends.recompute else ""))
        backends.sync()
    if dist.num_processes(acc) > 1:
        log(f"{dist.num_processes(acc)} processes ({getattr(acc.distributed_type, 'value', acc.distributed_type)}): {cfg.tasks_per_step} tasks x "
            f"{cfg.group_size} trajectories per step, split by task")

    watch_train, watch_eval = TruncationWatch(cfg, log), TruncationWatch(cfg, log, " in the eval")

    judge = make_judge(cfg.judge, backends.caller)
    trainer = Trainer(cfg, tasks, models, st.updaters, backends, generation_settings(cfg), eos_ids, judge, anchors, acc)

    def do_eval(step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        details: dict[str, Any] = {}
        metrics, trajs = evaluate_real(models.for_role("caller"), tok, held_out, cfg, acc, tasks, judge=judge,
                                       log=log, sim_model=sim_model, details=details,
                                       backends=backends if cfg.eval_on_rollout_backend else None)
        clock.estimate("final eval", time.perf_counter() - t0)  # the same tasks and samples every time
        watch_eval.add(trajs)
        if main:
            run.add_trajectories(_tag(trajs, step, "eval"), name="evals.jsonl")
            if tasks.checklist:  # per-episode failure classes, real and rehearsal-judged (experiments/failures.py)
                run.add_trajectories(failure_rows(held_out, trajs, step=step, source=kind)
                                     + failure_rows(held_out, details.get("rehearsal", []), step=step,
                                                    source="rehearsal_judged"), name="eval_failures.jsonl")
            if details:
                run.add_trajectories(_tag(details["rehearsal"], step, "rehearsal_eval"), name="evals_rehearsal.jsonl")
                run.add_trajectories([{"step": step, **p.model_dump(mode="json")} for p in details["pairs"]],
                                     name="eval_fidelity.jsonl")
            metrics_log.log({"phase": "eval", "step": step, "eval_kind": kind, **metrics})
        return metrics

    # Decided on rank 0 (the one that writes metrics.jsonl), so every rank evaluates together.
    eval0 = dist.broadcast_object(acc, main and cfg.eval.at_start and st.start_step == 0
                                  and not any(m.get("phase") == "eval" for m in run.metrics()))
    if eval0:
        log(metrics_table(f"step 0 {kind} eval on {len(held_out)} {cfg.eval.split} tasks", do_eval(0)))
    bar = StepProgress("train", total=cfg.steps, start=st.start_step, clock=clock) if main else None
    flat = FlatGroups(log if main else None)
    for step in range(st.start_step + 1, cfg.steps + 1):
        threads.check()
        row, trajs = train_step(trainer, step)
        watch_train.add(trajs)
        flat.check(step, row)
        checkpoint = step % cfg.checkpoint.every == 0 or step == cfg.steps
        # Every rank: under FSDP gathering the optimiser state is a collective.
        optimizers = dist.optimizers_of(st.updaters) if checkpoint else None
        if main:
            run.add_trajectories(_tag(trajs, step, "train"))
            metrics_log.log(row)
            metrics_log.samples(trajs, step)
            if checkpoint:
                save_checkpoint(run.path / CKPT_DIR, models.trained, optimizers, step=step,
                                keep_last=cfg.checkpoint.keep_last, tokenizer=tok)
        if checkpoint and not dist.replicas_agree(acc, models.trained):
            raise RuntimeError(f"step {step}: the ranks' weights differ (a rank started from other weights or "
                               "optimiser state); the checkpoint holds rank 0's")
        shown = {"R_caller": row.get("reward/caller"), "R_sim": row.get("reward/simulator"),
                 "kl": _first(row, "kl"),
                 "tok/s": row["gen_tokens_per_s"]}
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.steps:
            shown.update({"eval": do_eval(step)["eval/success"]})
        if bar is not None:
            bar.update(step, cfg.steps, shown)
    if bar is not None:
        bar.close()
    # Also after a resume whose run was killed during its final eval: that eval is redone.
    final_missing = dist.broadcast_object(acc, main and _final_eval_wanted(cfg) and not any(
        m.get("phase") == "eval" and m.get("step") == cfg.steps for m in run.metrics()))
    if final_missing:
        final = do_eval(cfg.steps)
        log(metrics_table(f"final {kind} eval (step {cfg.steps})", final))
    tasks.close()

    if main:
        metrics_log.close()
        write_train_report(run)
    dist.end(acc)  # every rank waits for rank 0's report, then the process group closes
    return run


@dataclass
class TruncationWatch:
    """Says once per role when, over the run so far, more than TRUNCATION_WARN of its turns stopped
    at ``rollout.<role>_max_new_tokens``: counted over all steps, so one step where the simulator
    loops does not set it off, while a cap that cuts the data's turns does within a step or two."""

    cfg: TrainConfig
    log: Any
    where: str = ""
    counts: dict[str, Truncation] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)

    def add(self, trajectories: list[Trajectory]) -> None:
        for role, new in truncation_counts(trajectories).items():
            c = self.counts.setdefault(role, Truncation())
            c.cut, c.looped, c.turns = c.cut + new.cut, c.looped + new.looped, c.turns + new.turns
            if (c.cut > TRUNCATION_WARN * c.turns and role not in self.warned
                    and self.cfg.rollout.truncation_warnings):
                self.warned.add(role)
                self.log(self.message(role, c))

    def message(self, role: str, c: Truncation) -> str:
        cap = getattr(self.cfg.rollout, f"{role}_max_new_tokens")
        head = (f"warning: {c.cut / c.turns:.0%} of {role} turns{self.where} stopped at "
                f"rollout.{role}_max_new_tokens={cap} without ending; a cut-off turn "
                f"{'is not a parseable tool call' if role == 'caller' else 'is not JSON'}")
        if 2 * c.looped > c.cut:  # mostly loops: a bigger cap buys longer loops, not whole turns
            temp = "rollout.simulator_temperature" if role == "simulator" else "rollout.temperature"
            return (f"{head}. {c.looped} of the {c.cut} were repeating themselves (a decoding loop), so a "
                    f"higher cap will not help: more SFT, or sampling the role ({temp} > 0), may")
        return f"{head}: raise the cap"


def _silent(*_: Any, **__: Any) -> None:
    pass


def _first(stats: dict[str, float], suffix: str) -> float | None:
    for k, v in stats.items():
        if k.endswith("/" + suffix):
            return v
    return None
