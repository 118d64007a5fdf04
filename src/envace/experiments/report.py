"""Reports of a run directory: a PNG learning curve and a markdown summary."""

from __future__ import annotations

import math

import textwrap
from collections import Counter
from pathlib import Path

from envace.core.jsonl import read_jsonl_dicts
from envace.core.types import solved
from envace.envs.registry import spec_label
from envace.experiments.figures import save_figure
from envace.experiments.rundir import RunDir
from envace.experiments.stats import paired_gain


_EVAL_SETS = {"test": "held-out tasks", "pool": "the trained tasks (GRPO pool)", "train": "train-split tasks"}


def eval_set(cfg: dict) -> str:
    """What a run's real-world eval measured (``cfg``: its config.yaml), in words: with
    ``eval.split: pool`` the tasks GRPO trains on, which must not pass for held-out ones; and
    greedy or sampled (``eval.samples`` at ``eval.temperature``), whose figures differ."""
    ev = cfg.get("eval") or {}
    split, samples, temperature = ev.get("split", "test"), ev.get("samples") or 1, ev.get("temperature") or 0.0
    how = "greedy" if temperature == 0 else f"{samples} episode{'s' if samples > 1 else ''} each at T={temperature:g}"
    return f"{_EVAL_SETS.get(split, f'{split} tasks')}, {how}"


def eval_task_success(run: RunDir) -> dict[int, dict[str, float]]:
    """Eval step -> task id -> mean success of that task's real-world eval episodes (evals.jsonl)."""
    path = run.path / "evals.jsonl"
    hits: dict[int, dict[str, list[float]]] = {}
    if path.is_file():
        for row in read_jsonl_dicts(path):
            hits.setdefault(row["step"], {}).setdefault(row["task_id"], []).append(float(solved(row["reward"])))
    return {step: {t: sum(v) / len(v) for t, v in tasks.items()} for step, tasks in hits.items()}


def eval_steps(run: RunDir, by_step: dict[int, dict[str, float]], first: int | None = None,
               last: int | None = None) -> tuple[int, int]:
    """The two eval steps to compare (default: the run's first and last), checked against
    ``by_step`` (its :func:`eval_task_success`); ValueError naming the run when it lacks one."""
    first = min(by_step, default=None) if first is None else first
    last = max(by_step, default=None) if last is None else last
    for step in (first, last):
        if step not in by_step:
            raise ValueError(f"{run.path}: no real-world eval at step {step} in evals.jsonl (have {sorted(by_step)})")
    return first, last


def run_labels(runs: list[RunDir]) -> dict[str, RunDir]:
    """Legend labels for a comparison: each run's source, with its seed where the runs' seeds
    differ, and its directory name only where that still leaves two runs the same."""
    cfgs = [r.config() for r in runs]
    seeds = len({c.get("seed") for c in cfgs}) > 1
    labels = [f"{c.get('source', '?')}" + (f", seed {c.get('seed')}" if seeds else "") for c in cfgs]
    return {(f"{lab} ({r.path.name})" if labels.count(lab) > 1 else lab): r for lab, r in zip(labels, runs)}


# A rise of the mean training reward (last quarter of the steps vs the first) worth a word when
# real success does not follow; below it the per-step noise of a few tasks x G episodes dominates.
REWARD_RISE = 0.05


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def reward_without_success(cfg: dict, train_rows: list[dict], eval_rows: list[dict],
                           by_step: dict[int, dict[str, float]] | None = None) -> str | None:
    """A paragraph when the training reward rose and real-world success did not (its gain is not
    above two paired standard errors, or not positive), else None. ``by_step``: per-task eval
    success (:func:`eval_task_success`) for the paired standard error."""
    real = [r for r in eval_rows if r.get("eval_kind", "real") == "real" and "eval/success" in r]
    if len(train_rows) < 2 or len(real) < 2:
        return None
    w = max(1, len(train_rows) // 4)
    r0 = _mean([r["reward"] for r in train_rows[:w]])
    r1 = _mean([r["reward"] for r in train_rows[-w:]])
    if not r1 - r0 >= REWARD_RISE:
        return None
    first, last = real[0], real[-1]
    se = float("nan")
    if by_step and first["step"] in by_step and last["step"] in by_step:
        gain, se, _ = paired_gain(by_step[first["step"]], by_step[last["step"]])
    else:
        gain = last["eval/success"] - first["eval/success"]
    if gain > 0 and (se != se or gain > 2 * se):  # se NaN: fewer than two tasks, the gain alone
        return None
    source = cfg.get("source", "rehearsal")
    where = {"rehearsal": "in its own rehearsal", "simulator": "against the frozen simulator",
             "real": "on its training tasks"}.get(source, "in training")
    text = (f"**Training reward rose while real-world success did not.** The mean training reward went from "
            f"{r0:.3f} (first {w} step{'s' if w > 1 else ''}) to {r1:.3f} (last {w}), while success on the held-out "
            f"tasks against the real tools moved {gain:+.3f} from step {first['step']} to step {last['step']}"
            + (f" (paired standard error {se:.3f})" if se == se else "") +
            f": the policy learned to succeed {where}, not against the tools.")
    rs = last.get("eval/rehearsal_success")
    if rs is not None and rs == rs:
        text += (f" At step {last['step']} the same policy on the same tasks succeeds {rs:.3f} when it rehearses the "
                 f"tool responses itself (judged as a rehearsal step is) against {last['eval/success']:.3f} with the "
                 f"real tools (gap {last.get('eval/rehearsal_gap', rs - last['eval/success']):+.3f}).")
    fe = last.get("eval/fidelity_exact")
    if fe is not None and fe == fe:
        text += (f" Its rehearsed results equal the real ones for {fe:.0%} of the {last.get('eval/fidelity_n', 0):.0f} "
                 f"calls its real episodes made (same structure {last.get('eval/fidelity_structure', float('nan')):.0%}).")
    if source != "real":
        text += (" Levers: ground the rehearsal (rollout.examples_as_recorded, rollout.example_reward), a warm start "
                 "with more simulator data, or a real-source run from the same start for comparison; the failure "
                 "classes below say what the real episodes get wrong.")
    return text


def gap_markdown(eval_rows: list[dict]) -> list[str]:
    """The rehearsal gap and the rehearse role's fidelity per eval step (rows that measured it)."""
    rows = [r for r in eval_rows if "eval/rehearsal_success" in r]
    if not rows:
        return []
    lines = ["## Rehearsal gap and fidelity on the user's tools", "",
             "The same policy on the same tasks at each eval: against the real tools, and rehearsing every tool "
             "response itself, judged as a rehearsal training step is (no world: only what the trajectory shows). "
             "Fidelity: each call of the real episodes rehearsed greedily from the same history, compared with what "
             "the real tool returned (exact JSON / same key structure / same values that matter), and each recorded "
             "example rehearsed with no history against its recorded result. Shape failures: rehearsed results "
             "that do not fit the tool's declared output schema, per episode.", "",
             "| step | real success | rehearsal-judged success | gap | calls rehearsed | exact | structure | values "
             "| answered as recorded | recorded = real | examples | examples exact | shape failures/ep |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def f(r: dict, key: str, fmt: str = ".3f") -> str:
        v = r.get(key)
        return "–" if v is None or v != v else format(v, fmt)  # nothing to measure (e.g. no call was made)

    for r in rows:
        lines.append("| " + " | ".join([str(r["step"]), f(r, "eval/success"), f(r, "eval/rehearsal_success"),
                                        f(r, "eval/rehearsal_gap", "+.3f"), f(r, "eval/fidelity_n", ".0f"),
                                        f(r, "eval/fidelity_exact"), f(r, "eval/fidelity_structure"),
                                        f(r, "eval/fidelity_value"), f(r, "eval/fidelity_as_recorded"),
                                        f(r, "eval/fidelity_recorded_exact"), f(r, "eval/example_n", ".0f"),
                                        f(r, "eval/example_exact"), f(r, "eval/rehearsal_shape_failures", ".2f")])
                     + " |")
    return lines + [""]


def failure_markdown(run: RunDir) -> list[str]:
    """Failure classes of the real eval episodes at the first and the last eval (eval_failures.jsonl)."""
    from envace.experiments.failures import CLASS_WORDS, FAILURE_CLASSES, failure_table, transition_table

    path = run.path / "eval_failures.jsonl"
    if not path.is_file():
        return []
    rows = read_jsonl_dicts(path)
    real = [r for r in rows if r.get("source") != "rehearsal_judged"]
    steps = sorted({r["step"] for r in real})
    if not steps:
        return []
    a, b = steps[0], steps[-1]
    before = [r for r in real if r["step"] == a]
    after = [r for r in real if r["step"] == b]
    # a schema-only run has no real world: its eval is judged on what each episode shows
    which = "real" if any(r.get("source") != "rehearsal" for r in real) else "rehearsal-judged"
    lines = [f"## Why episodes failed ({which} eval)", "",
             f"Each {which} eval episode in one class (experiments/failures.py): *no call* (no parseable tool call); "
             "*wrong tool* (a needed tool never called, another called instead); *wrong arguments* (a needed call's "
             "tool called with other arguments); *right calls, wrong answer* (every needed call matched, an "
             "answer/state item failed); *gave up* (only needed tools called, then stopped short). Needed calls: "
             "the checklist's `called` items, else the reference's calls.", ""]
    lines += failure_table(before, after, (f"step {a}", f"step {b}")) + [""]
    reh = [r for r in rows if r.get("source") == "rehearsal_judged" and r["step"] == b]
    if reh:
        counts = Counter(r["class"] for r in reh)
        lines += [f"The same tasks rehearsal-judged at step {b}: " + ", ".join(
            f"{CLASS_WORDS[c]} {counts[c]}" for c in FAILURE_CLASSES if counts[c]) + ".", ""]
    if a != b:
        lines += [f"Per task (first episode), step {a} -> step {b}, changed tasks first:", ""]
        lines += transition_table(before, after) + [""]
    return lines


def plot_learning_curve(runs: dict[str, RunDir], path: Path, title: str = "real-world success") -> Path:
    """Eval success vs step for one or more runs (one line each), train reward dashed."""
    import matplotlib

    matplotlib.use("Agg")  # no screen on these machines
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, run in runs.items():
        rows = run.metrics()
        ev = [r for r in rows if r.get("phase") == "eval"]
        tr = [r for r in rows if r.get("phase") == "train"]
        if ev:
            line, = ax1.plot([r["step"] for r in ev], [r["eval/success"] for r in ev], marker="o",
                             label=f"{label} success")
            # the checklist fraction moves before full success does: the earlier sign of learning
            ax1.plot([r["step"] for r in ev], [r.get("eval/reward", float("nan")) for r in ev], ":", marker=".",
                     color=line.get_color(), label=f"{label} reward")
            reh = [r for r in ev if "eval/rehearsal_success" in r]
            if reh:  # the same policy rehearsing its own tool responses: the rehearsal gap
                ax1.plot([r["step"] for r in reh], [r["eval/rehearsal_success"] for r in reh], "--", marker="x",
                         color=line.get_color(), label=f"{label} rehearsal-judged success")
        if tr:
            for role, style in (("caller", "-"), ("simulator", "--")):
                pts = [(r["step"], r[f"reward/{role}"]) for r in tr if f"reward/{role}" in r]
                if pts:
                    ax2.plot(*zip(*pts), style, label=f"{label} {role}")
    sets = sorted({eval_set(run.config()) for run in runs.values()})
    # what was measured goes under the title: as the y label it ran off the figure
    ax1.set_xlabel("step"), ax1.set_ylabel("success / reward in the real worlds")
    ax1.set_title(title + "\n" + textwrap.fill(" / ".join(sets), 60), fontsize=9)
    ax2.set_xlabel("step"), ax2.set_ylabel("mean training reward"), ax2.set_title("training reward per role")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def peak_memory_by_phase(rows: list[dict]) -> dict[str, float]:
    """The process's peak resident memory as it stood at the last row of each phase, in the order
    the phases first appear (a high-water mark: a phase that adds nothing shows the one before)."""
    out: dict[str, float] = {}
    for r in rows:
        if "mem/peak_rss_gib" in r:
            out[str(r.get("phase", "?"))] = float(r["mem/peak_rss_gib"])
    return out


def write_train_report(run: RunDir) -> Path:
    rows = run.metrics()
    cfg = run.config()
    ev = [r for r in rows if r.get("phase") == "eval"]
    tr = [r for r in rows if r.get("phase") == "train"]
    sft = [r for r in rows if r.get("phase") == "sft" and "sft/samples" in r]  # the summary row, not per-step ones
    plot_learning_curve({cfg.get("source", "run"): run}, run.path / "learning_curve.png")
    lines = [f"# Training run `{run.path.name}`", "",
             f"model `{cfg.get('model')}`, source `{cfg.get('source')}`, mode `{cfg.get('mode')}`, "
             f"{cfg.get('steps')} steps x {cfg.get('tasks_per_step')} tasks x G={cfg.get('group_size')}, "
             + (f"tasks `{cfg.get('task_file')}`, real world `{spec_label(cfg.get('world'))}`" if cfg.get("task_file")
              else f"worlds {cfg.get('worlds')}") + f", seed {cfg.get('seed')}", ""]
    if sft:
        s = sft[-1]
        lines.append(f"SFT warm start: {s['sft/samples']} samples, loss {s['sft/first_loss']:.3f} -> "
                     f"{s['sft/last_loss']:.3f} in {s['sft/seconds']:.0f} s")
        lines.append("")
    if memory := peak_memory_by_phase(rows):
        lines += ["Peak resident memory by the end of each phase (GiB): "
                  + ", ".join(f"{phase} {gib:.2f}" for phase, gib in memory.items()), ""]
    if ev:
        if ev[-1].get("eval_kind") == "rehearsal":
            lines += ["## Rehearsal-judged evaluation (no real environment)", "",
                      "No real environment was given, so the policy answered its own tool calls and success counts "
                      "only what a trajectory shows (called / answer_contains / judge items). It is not real-world "
                      f"success ({eval_set(cfg)}).", ""]
        else:
            lines += [f"## Real-world evaluation ({eval_set(cfg)})", ""]
        lines += [
                  "| step | success | tasks solved (any episode) | mean reward | tool calls | parse failures |",
                  "|---|---|---|---|---|---|"]
        # a row of an older run (before eval.samples) or a partial one lacks columns: n/a, not a crash
        lines += [f"| {r['step']} | {_value(r, 'eval/success')} | {_value(r, 'eval/tasks_solved')} | "
                  f"{_value(r, 'eval/reward')} | {_value(r, 'eval/tool_calls', '.2f')} | "
                  f"{_value(r, 'eval/parse_failures', '.2f')} |" for r in ev]
        lines.append("")
        if len(ev) > 1 and (run.path / "evals.jsonl").is_file():
            by_step = eval_task_success(run)
            first, last = eval_steps(run, by_step)
            gain, se, n = paired_gain(by_step[first], by_step[last])
            se_text = f"{se:.3f}" if not math.isnan(se) else "n/a: one task has none"
            lines += [f"Success gain from step {first} to step {last}: **{gain:+.3f}** (paired standard error "
                      f"{se_text} over {n} tasks; under about two standard errors a gain may be noise).", ""]
        warning = reward_without_success(cfg, tr, ev, eval_task_success(run) if (run.path / "evals.jsonl").is_file()
                                         else None)
        if warning:
            lines += [warning, ""]
        lines += gap_markdown(ev)
        lines += failure_markdown(run)
    if tr:
        secs = sum(r["step_s"] for r in tr)
        lines += ["## Training", "", f"{len(tr)} steps in {secs:.0f} s "
                  f"({secs / len(tr):.1f} s/step; rollout {sum(r['rollout_s'] for r in tr) / len(tr):.1f} s, "
                  f"update {sum(r['update_s'] for r in tr) / len(tr):.1f} s)", "",
                  "| step | reward | success | caller R | simulator R | tool calls | sim format failures |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['step']} | {r['reward']:.3f} | {r['success']:.3f} | {_value(r, 'reward/caller')} | "
                  f"{_value(r, 'reward/simulator')} | {r['tool_calls']:.2f} | {r['sim_format_failures']:.2f} |"
                  for r in tr]
        if any(_value(r, k) == "n/a" for r in tr for k in ("reward/caller", "reward/simulator")):
            lines += ["", "n/a: the role had no samples that step (the simulator rehearses only the tool calls "
                      "the caller makes; a step with no call has none), or its mode does not train it."]
    lines += ["", "![learning curve](learning_curve.png)", ""]
    from envace.experiments.viewer import write_train_viewer

    viewer = write_train_viewer(run)
    lines += [f"Episodes per step, turn by turn (rollouts and evals): [{viewer.name}]({viewer.name})", ""]
    return run.write_text("summary.md", "\n".join(lines))


def _value(row: dict, key: str, fmt: str = ".3f") -> str:
    """A table cell: the figure, or ``n/a`` where the row has none (never a bare ``nan``)."""
    v = row.get(key)
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def write_report(run: RunDir) -> Path:
    """The report a run's kind calls for."""
    kind = run.meta().get("kind")
    if kind == "train":
        return write_train_report(run)
    if kind == "eval":
        from envace.experiments.eval_report import write_eval_report

        return write_eval_report(run)
    from envace.experiments.summary import summarize, summary_markdown

    return run.write_text("summary.md", summary_markdown(summarize(run.trajectories()), f"{kind} run {run.path.name}"))


def missing_parts(run: RunDir) -> list[str]:
    """What a run directory does not hold yet, in words (a report of a run that has just started,
    or crashed in its warm start, draws empty plots: say why)."""
    kind = run.meta().get("kind")
    out = []
    if kind == "train":
        rows = run.metrics()
        if not any(r.get("phase") == "train" for r in rows):
            sft = (run.path / "sft").is_dir()
            out.append("no training step logged yet: " + ("the SFT warm start is there, RL has not logged a step"
                                                          if sft else "the run is still in its warm start, or "
                                                          "stopped before its first step") +
                       f" (envace train --resume {run.path} continues it)")
        if not any(r.get("phase") == "eval" for r in rows):
            out.append("no eval yet: the learning curve has no success line (eval.every, or the run's end)")
        if not (run.path / "checkpoints").is_dir():
            out.append("no checkpoint yet")
    elif kind == "eval" and not (run.path / "committed.jsonl").is_file() and not (run.path / "fidelity.jsonl").is_file():
        out.append("no committed or fidelity rows yet: the eval has not finished a condition")
    elif kind not in ("train", "eval") and not run.trajectories():
        out.append("no trajectories yet")
    return out
