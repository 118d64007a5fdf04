"""Defaults fitted to a user's task file: token caps, warm-start epochs and eval episodes.

The shipped defaults suit the embedded worlds. A task file brings its own sizes: a reference turn
longer than ``rollout.caller_max_new_tokens`` is cut off and never parses as a tool call, a recorded
result longer than the simulator's cap is never whole JSON, forty warm-start samples at two epochs
are a handful of updates, and one greedy episode on a few held-out tasks cannot show a gain. So a
task-file run sizes each setting the user did not set from the file itself (its references and
examples), and says what it chose and why. A setting given in the config or with ``--set`` is kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.core.toolcall import RESULT_CLOSE, format_tool_call
from envace.core.types import Task
from envace.experiments.config import TrainConfig
from envace.rollout.sources import dump_result
from envace.train.sft import recorded_text

TOKEN_MARGIN = 1.25  # a sampled turn runs a little longer than the reference's own wording
TOKEN_SLACK = 8
MIN_CAP, MAX_CAP = 64, 1024  # below 64 a turn with a sentence before its call is cut
SFT_UPDATES = 40  # optimiser steps the warm start should get at least (epochs over the samples)
MIN_EPOCHS, MAX_EPOCHS = 2, 10
# The caller's samples are repeated up to this many times an epoch, until they are as many as the
# simulator's: on the helpdesk the caller was a fifth of the warm start and invented tool names
# (docs/notes/2026-12-07-caller-warm-start.md).
MAX_CALLER_REPEATS = 4
EVAL_EPISODES = 80  # held-out episodes per eval: enough that a 0.1 gain is about two standard errors
MAX_EVAL_SAMPLES = 8
EVAL_TEMPERATURE = 0.5


@dataclass
class Fitted:
    """The run's config with the fitted settings, and one note per setting: ``key=value (why)``."""

    cfg: TrainConfig
    notes: list[str] = field(default_factory=list)


def _cap(longest: int) -> int:
    return min(MAX_CAP, max(MIN_CAP, 16 * math.ceil((longest * TOKEN_MARGIN + TOKEN_SLACK) / 16)))


def _tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def caller_turns(tasks: Sequence[Task]) -> list[str]:
    """The caller turns the references hold: each call as the caller writes it, and each answer."""
    out = []
    for t in tasks:
        if t.reference is not None:
            out += [format_tool_call(c) for c in t.reference.calls]
            out += [t.reference.answer] if t.reference.answer else []
    return out


def recorded_results(tasks: Sequence[Task]) -> list[str]:
    """The simulator turns the file records: reference results and examples, as the simulator writes them."""
    out = []
    for t in tasks:
        if t.reference is not None:
            out += [recorded_text(c.result) + RESULT_CLOSE for c in t.reference.calls if c.result is not None]
        out += [recorded_text(e.result) + RESULT_CLOSE for e in t.examples]
    return out


def estimated_role_samples(cfg: TrainConfig, pool: Sequence[Task], replayable: Sequence[Task]) -> tuple[int, int]:
    """About how many (caller, simulator) samples the warm start has before ``sft.caller_repeats``:
    a caller sample per replayed task, a simulator sample per replayed call and per distinct
    recorded example (before any is dropped)."""
    replays = list(replayable)[: cfg.sft.trajectories]
    caller = len(replays) if "caller" in cfg.sft.roles else 0
    sim = 0
    if "simulator" in cfg.sft.roles:
        with_sim = replays if cfg.sft.simulator_trajectories is None else replays[: cfg.sft.simulator_trajectories]
        sim += sum(len(t.reference.calls) for t in with_sim if t.reference is not None)
        distinct = {dump_result([e.tool, e.arguments, e.result]) for t in pool for e in t.examples}
        limit = len(distinct) if cfg.sft.example_samples is None else cfg.sft.example_samples
        sim += min(len(distinct), limit)
    return caller, sim


def estimated_sft_samples(cfg: TrainConfig, pool: Sequence[Task], replayable: Sequence[Task]) -> int:
    """About how many samples an epoch of the warm start trains on."""
    caller, sim = estimated_role_samples(cfg, pool, replayable)
    return caller * cfg.sft.caller_repeats + sim


def measuring_tokenizer(model: str) -> tuple[Any, str]:
    """The tokenizer that counts a turn's tokens: the model directory's own, else SmolLM2's (the
    named and from-scratch models use it; for another model it is an estimate, and said so)."""
    from envace.policy.loading import smollm2_tokenizer

    path = Path(model).expanduser()
    if path.is_dir() and (path / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path), ""
    named = model in ("smollm2", "tiny") or model.startswith(("tiny:", "llama:"))
    return smollm2_tokenizer(), "" if named else " (counted with SmolLM2's tokenizer)"


def _recipe(cfg: TrainConfig, bf16: bool, anchor: bool, warm: bool) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The SmolLM2 recipe that learned on the embedded worlds (configs/smollm2_cpu.yaml), for the
    settings a task-file run left unset: after a short warm start a small model's T=1 samples are
    mostly not tool calls, a sampled rehearsed world is mostly noise, RL without the warm start's
    anchor unlearns what the start solved, and a fresh Adam at full rate can collapse the policy in
    one update. bf16 where this machine computes it natively; evals at the start, half-way and the
    end (each scores the policy twice: real and rehearsal-judged)."""
    out: dict[str, dict[str, Any]] = {}
    notes: list[str] = []

    def take(section: str, key: str, value: Any, why: str) -> None:
        given = (cfg if not section else getattr(cfg, section)).model_fields_set
        if key not in given:
            out.setdefault(section, {})[key] = value
            notes.append(f"{section + '.' if section else ''}{key}={value}{why}")

    take("rollout", "temperature", 0.7, " (a small model's T=1 samples after a short warm start are mostly "
         "not tool calls)")
    take("rollout", "simulator_temperature", 0.0, " (a greedy rehearsed world: a real API answers a call "
         "the same way each time)")
    if anchor:  # the anchor's samples are the warm start's: it needs tasks the warm start can replay
        take("grpo", "anchor_coef", 1.0, " (each update also fits warm-start samples, so RL keeps what SFT taught)")
    if warm:
        take("sft", "lr", 5e-4, " (the recipe's warm-start rate: at 2e-4 the helpdesk caller still chose the "
             "wrong first tool for most held-out requests)")
    take("grpo", "warmup_steps", 3, "")
    take("grpo", "norm_by_std", True, "")
    if bf16:
        take("", "mixed_precision", "bf16", " (this machine computes bf16 natively: about twice as fast)")
        take("rollout", "dtype", "bfloat16", "")
    if cfg.steps >= 4 and cfg.eval.every and "every" not in cfg.eval.model_fields_set:
        take("eval", "every", cfg.steps // 2, " (start, half-way and end: each eval runs real and "
             "rehearsal-judged)")
    return out, notes


def fit_to_data(cfg: TrainConfig, pool: Sequence[Task], replayable: Sequence[Task], eval_tasks: int,
                tokenizer: Any = None, counted: str = "", bf16: bool = False) -> Fitted:
    """``cfg`` with the settings the user did not set fitted to a task file's ``pool`` (the train
    tasks), ``replayable`` (those the warm start can replay, in its order) and ``eval_tasks`` (how
    many held-out tasks the eval runs). Unchanged for the embedded worlds and benchmarks, whose
    shipped defaults were chosen for them."""
    if cfg.task_file is None or cfg.bench is not None:
        return Fitted(cfg)
    notes: list[str] = []
    rollout: dict[str, Any] = {}
    sft: dict[str, Any] = {}
    ev: dict[str, Any] = {}
    given = cfg.rollout.model_fields_set
    if tokenizer is not None:
        turns = caller_turns(pool)
        if turns and "caller_max_new_tokens" not in given:
            longest = max(_tokens(tokenizer, t) for t in turns) + 1  # + EOS after an answer
            rollout["caller_max_new_tokens"] = _cap(longest)
            notes.append(f"rollout.caller_max_new_tokens={rollout['caller_max_new_tokens']} (the longest reference "
                         f"turn is {longest} tokens{counted}, +25%)")
        results = recorded_results(pool)
        if results and "simulator_max_new_tokens" not in given:
            longest = max(_tokens(tokenizer, r) for r in results)
            rollout["simulator_max_new_tokens"] = _cap(longest)
            clipped = " (capped)" if _cap(longest) < longest else ""
            notes.append(f"rollout.simulator_max_new_tokens={rollout['simulator_max_new_tokens']}{clipped} (the "
                         f"longest recorded result is {longest} tokens{counted}, +25%)")
    warm = cfg.sft.enabled and cfg.sft.init_from is None
    if warm and "caller_repeats" not in cfg.sft.model_fields_set:
        caller, sim = estimated_role_samples(cfg, pool, replayable)
        repeats = min(MAX_CALLER_REPEATS, math.ceil(sim / caller)) if caller else 1
        if repeats > 1:
            sft["caller_repeats"] = repeats
            notes.append(f"sft.caller_repeats={repeats} (about {caller} caller samples beside {sim} simulator "
                         "samples: a caller that has not learnt the tool names gives RL nothing to start from)")
    if warm and "epochs" not in cfg.sft.model_fields_set:
        n = estimated_sft_samples(cfg.model_copy(update={"sft": cfg.sft.model_copy(update=sft)}), pool, replayable)
        if n:
            per_epoch = math.ceil(n / cfg.sft.batch_samples)
            sft["epochs"] = min(MAX_EPOCHS, max(MIN_EPOCHS, math.ceil(SFT_UPDATES / per_epoch)))
            notes.append(f"sft.epochs={sft['epochs']} (about {n} warm-start samples, {per_epoch} updates an epoch: "
                         f"at least {SFT_UPDATES} updates)")
    set_eval = cfg.eval.model_fields_set
    if eval_tasks and "samples" not in set_eval and eval_tasks < EVAL_EPISODES:
        temperature = cfg.eval.temperature if "temperature" in set_eval else EVAL_TEMPERATURE
        if temperature > 0:
            ev["samples"] = min(MAX_EVAL_SAMPLES, math.ceil(EVAL_EPISODES / eval_tasks))
            ev["temperature"] = temperature
            notes.append(f"eval.samples={ev['samples']} at eval.temperature={temperature} ({eval_tasks} held-out "
                         f"tasks: one greedy episode each moves in steps of {1 / eval_tasks:.2f}; "
                         f"{ev['samples'] * eval_tasks} sampled episodes show a smaller gain)")
    recipe, why = _recipe(cfg, bf16, anchor=bool(replayable), warm=warm)
    for section, values in recipe.items():
        target = {"rollout": rollout, "eval": ev, "sft": sft}.get(section)
        if target is not None:
            target.update(values)
    notes += why
    update: dict[str, Any] = {k: v for k, v in recipe.get("", {}).items()}
    if "grpo" in recipe:
        update["grpo"] = cfg.grpo.model_copy(update=recipe["grpo"])
    if rollout:
        update["rollout"] = cfg.rollout.model_copy(update=rollout)
    if sft:
        update["sft"] = cfg.sft.model_copy(update=sft)
    if ev:
        update["eval"] = cfg.eval.model_copy(update=ev)
    return Fitted(cfg.model_copy(update=update) if update else cfg, notes)
