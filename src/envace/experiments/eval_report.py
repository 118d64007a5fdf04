"""Report of an eval run: success table with bootstrap CIs, sweep and fidelity plots, viewer."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from envace.core.jsonl import read_jsonl_dicts
from envace.experiments.failures import CLASS_WORDS, FAILURE_CLASSES
from envace.experiments.figures import save_figure
from envace.experiments.rundir import RunDir
from envace.experiments.stats import bootstrap_ci, paired_bootstrap_diff
from envace.experiments.viewer import write_viewer
from envace.testtime.fidelity import summarize_fidelity

MODE_ORDER = {"none": 0, "parallel": 1, "sequential": 2}


def eval_rows(run: RunDir) -> tuple[list[dict], list[dict], list[dict]]:
    """(committed rows, rehearsal rows, fidelity pair rows) of an eval run."""
    return (read_jsonl_dicts(run.path / "committed.jsonl"), read_jsonl_dicts(run.path / "rehearsals.jsonl"),
            read_jsonl_dicts(run.path / "fidelity.jsonl"))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def condition_table(rows: list[dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """One row per condition: success with its 95% bootstrap CI over tasks, the paired
    difference to no rehearsal (budget 0) where that ran, and the costs per task."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["condition"], []).append(r)
    order = sorted(groups, key=lambda c: (MODE_ORDER.get(groups[c][0]["mode"], 9), groups[c][0]["budget"]))
    base = {r["task_id"]: float(r["success"]) for r in groups.get("none", [])}
    out = []
    for cond in order:
        rs = groups[cond]
        succ = [float(r["success"]) for r in rs]
        mean, lo, hi = bootstrap_ci(succ, seed=seed)
        row: dict[str, Any] = {
            "condition": cond, "mode": rs[0]["mode"], "budget": rs[0]["budget"], "tasks": len(rs),
            "success": mean, "success_lo": lo, "success_hi": hi,
            "reward": _mean([r["reward"] for r in rs]),
        }
        paired = [(float(r["success"]), base[r["task_id"]]) for r in rs if r["task_id"] in base]
        if cond != "none" and paired:
            d, dlo, dhi = paired_bootstrap_diff([a for a, _ in paired], [b for _, b in paired], seed=seed)
            row.update({"delta": d, "delta_lo": dlo, "delta_hi": dhi})
        n = len(rs)
        row.update({
            "real_calls_per_task": sum(r["real_calls"] for r in rs) / n,
            "real_calls_during_rehearsal": max(r["real_calls_during_rehearsal"] for r in rs),
            "rehearsal_tokens_per_task": sum(r["tokens"]["rehearsal"] for r in rs) / n,
            "memory_tokens_per_task": sum(r["tokens"]["memory"] for r in rs) / n,
            "commit_tokens_per_task": sum(r["tokens"]["commit"] for r in rs) / n,
            "tokens_per_task": sum(r["tokens"]["total"] for r in rs) / n,
            "seconds_per_task": sum(r["seconds"]["total"] for r in rs) / n,
            "model_memories": sum(r["memory_source"] == "model" for r in rs),
            "rule_fallbacks": sum(r["memory_source"] == "rule" and bool(r.get("memory_note")) for r in rs),
            "parse_failures_per_task": sum(r["trajectory"].get("parse_failures", 0) for r in rs) / n,
            "imagined_reward": _mean([x for r in rs for x in r.get("imagined_rewards", [])]),
        })
        out.append(row)
    return out


def _f(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def condition_markdown(table: list[dict]) -> list[str]:
    lines = ["| condition | tasks | success [95% CI] | Δ vs no rehearsal [95% CI] | real calls/task | "
             "real calls in rehearsal | tokens/task (rehearsal + memory + commit) | s/task | model memories |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        delta = (f"{r['delta']:+.3f} [{r['delta_lo']:+.3f}, {r['delta_hi']:+.3f}]" if "delta" in r else "–")
        lines.append(
            f"| {r['condition']} | {r['tasks']} | {r['success']:.3f} [{r['success_lo']:.3f}, {r['success_hi']:.3f}] | "
            f"{delta} | {r['real_calls_per_task']:.2f} | {r['real_calls_during_rehearsal']} | "
            f"{r['tokens_per_task']:.0f} ({r['rehearsal_tokens_per_task']:.0f} + {r['memory_tokens_per_task']:.0f} + "
            f"{r['commit_tokens_per_task']:.0f}) | {r['seconds_per_task']:.1f} | "
            f"{r['model_memories']}/{r['tasks']} |")
    return lines


FID_COLUMNS = ("n", "format_ok", "parsed", "structure", "value", "field_accuracy", "exact", "error_agree", "code_match")


def fidelity_markdown(rows: list[dict], keys: tuple[str, ...]) -> list[str]:
    head = list(keys) + list(FID_COLUMNS)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(_f(r.get(k)) for k in head) + " |")
    return lines


def plot_sweep(table: list[dict], path: Path, title: str = "") -> Path | None:
    """Success (with CI) and cost vs rehearsal budget, one line per mode; budget 0 shared."""
    if not table:
        return None
    import matplotlib  # half a second to import: only when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = sorted({r["budget"] for r in table})
    xpos = {b: i for i, b in enumerate(budgets)}
    none = [r for r in table if r["budget"] == 0]
    modes = [m for m in ("parallel", "sequential") if any(r["mode"] == m for r in table)] or ["none"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for k, mode in enumerate(modes):
        pts = sorted(none + [r for r in table if r["mode"] == mode and r["budget"] > 0], key=lambda r: r["budget"])
        xs = [xpos[r["budget"]] + (k - (len(modes) - 1) / 2) * 0.06 for r in pts]
        ys = [r["success"] for r in pts]
        err = [[r["success"] - r["success_lo"] for r in pts], [r["success_hi"] - r["success"] for r in pts]]
        axes[0].errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=mode)
        axes[1].plot(xs, [r["tokens_per_task"] for r in pts], marker="o", label=mode)
        axes[2].plot(xs, [r["seconds_per_task"] for r in pts], marker="o", label=mode)
    labels = ("success (real world) [95% CI]", "generated tokens per task", "seconds per task")
    for ax, lab in zip(axes, labels):
        ax.set_xticks(range(len(budgets)), [str(b) for b in budgets])
        ax.set_xlabel("rehearsal budget (imagined episodes per task)")
        ax.set_ylabel(lab)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylim(-0.05, 1.05)
    axes[0].set_title(title or "private rehearsal: success vs budget", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_fidelity(world_rows: list[dict], tool_rows: list[dict], path: Path) -> Path | None:
    """Bars per world (all metrics) and per tool (structure, value, field accuracy, exact)."""
    if not world_rows:
        return None
    import matplotlib  # half a second to import: only when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ("format_ok", "parsed", "structure", "value", "exact", "error_agree")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, max(4, 0.28 * len(tool_rows) + 1.5)),
                                   gridspec_kw={"width_ratios": [1, 1.3]})
    labels = [f"{r['world']} ({r['origin']})" for r in world_rows]
    width = 0.8 / len(metrics)
    for j, m in enumerate(metrics):
        vals = [r.get(m) if r.get(m) is not None else 0.0 for r in world_rows]
        ax1.bar([i + (j - (len(metrics) - 1) / 2) * width for i in range(len(world_rows))], vals, width, label=m)
    ax1.set_xticks(range(len(world_rows)), labels, rotation=20, fontsize=8)
    ax1.set_ylim(0, 1.05)
    ax1.set_ylabel("rate over rehearsed responses")
    ax1.set_title("world-model fidelity per world", fontsize=10)
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3, axis="y")
    tmetrics = ("structure", "value", "field_accuracy", "exact")
    ys = list(range(len(tool_rows)))
    h = 0.8 / len(tmetrics)
    for j, m in enumerate(tmetrics):
        vals = [r.get(m) if r.get(m) is not None else 0.0 for r in tool_rows]
        ax2.barh([y + (j - (len(tmetrics) - 1) / 2) * h for y in ys], vals, h, label=m)
    ax2.set_yticks(ys, [f"{r['world']}/{r['tool']} (n={r['n']})" for r in tool_rows], fontsize=7)
    ax2.invert_yaxis()
    ax2.set_xlim(0, 1.05)
    ax2.set_title("per tool (oracle trajectories)", fontsize=10)
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return save_figure(fig, path)


def write_eval_report(run: RunDir) -> Path:
    """summary.md, sweep.png, fidelity.png and viewer.html of an eval run directory."""
    cfg = run.config()
    committed, rehearsals, fidelity = eval_rows(run)
    seed = int(cfg.get("seed", 0) or 0)
    lines = [f"# Eval run `{run.path.name}`", ""]
    res = cfg.get("resolved", {})
    lines.append(f"model `{cfg.get('model')}`" + (f" (caller `{res.get('caller_model')}`, rehearsal "
                                                  f"`{res.get('simulator_model')}`)" if res else "")
                 + f", world(s) `{cfg.get('task_file') or cfg.get('world')}`, split `{cfg.get('split')}`, "
                 f"seed {cfg.get('seed')}")
    for note in res.get("notes") or []:
        lines.append(f"\n> {note}")
    lines.append("")
    if committed:
        table = condition_table(committed, seed=seed)
        lines += ["## Private rehearsal: success vs budget", "",
                  f"memory `{cfg.get('memory')}`, rehearsal temperature {cfg.get('rehearsal_temperature')}, "
                  f"committed run temperature {cfg.get('temperature')}, max {cfg.get('max_turns')} turns. Success = "
                  "every checklist item met in the committed real run; 95% CIs: percentile bootstrap over tasks "
                  f"(2000 resamples, seed {seed}); Δ is paired by task. Costs per task: real tool calls (the "
                  "committed run only: the real worlds received none during rehearsal), generated tokens "
                  "(rehearsal caller + rehearsed responses, memory summaries, committed run), generation "
                  "seconds attributed per episode in batched runs.", ""]
        lines += condition_markdown(table)
        lines.append("")
        if plot_sweep(table, run.path / "sweep.png") is not None:
            lines += ["![budget sweep](sweep.png)", ""]
    if fidelity:
        by_world = summarize_fidelity(fidelity, ("origin", "world"))
        by_tool = summarize_fidelity(fidelity, ("origin", "world", "tool"))
        lines += ["## World-model fidelity", "",
                  "Each real tool response of real trajectories is rehearsed by the model from the same history "
                  "(greedy) and compared: `format_ok` JSON in the `<execution_result>` tags (strict); `parsed` a JSON value could be read (the content metrics read the first JSON value of a response that broke the tags); `structure` same key sets recursively; "
                  "`value` same ids/amounts/counts/status fields (keys `id`/`*_id`, or with a word amount, price, "
                  "total, subtotal, balance, refund, count, status); `field_accuracy` per field; `exact` same JSON; "
                  "`error_agree` error vs success agrees; `code_match` same error code when both err. Origin "
                  "`probe`: a real call with an id replaced by one that does not exist.", ""]
        lines += fidelity_markdown(by_world, ("origin", "world")) + [""]
        lines += ["### Per tool", ""] + fidelity_markdown(by_tool, ("origin", "world", "tool")) + [""]
        tool_rows = [r for r in by_tool if r["origin"] == "oracle"] or by_tool
        if plot_fidelity(by_world, tool_rows, run.path / "fidelity.png") is not None:
            lines += ["![fidelity](fidelity.png)", ""]
    lines += gap_section(run)
    if not committed and not fidelity:
        lines += ["(no results in this run directory yet)", ""]
    viewer = write_viewer(run, committed, rehearsals, fidelity)
    lines += [f"Trajectories, memories and rehearsed vs real responses: [{viewer.name}]({viewer.name})", ""]
    return run.write_text("summary.md", "\n".join(lines))


def gap_section(run: RunDir) -> list[str]:
    """The rehearsal gap of the plain real run: real vs rehearsal-judged success, the rehearse
    role's fidelity on the real calls and the recorded examples, and the failure classes."""
    rows = [r for r in run.metrics() if r.get("phase") == "gap"]
    if not rows:
        return []
    g = rows[-1]
    lines = ["## Rehearsal gap", "",
             "The plain real run's tasks again, with the same policy rehearsing every tool response and judged as a "
             "rehearsal training step is (no world: only what the trajectory shows counts).", "",
             "| real success | rehearsal-judged success | gap | shape failures/episode | answered as recorded/episode |",
             "|---|---|---|---|---|",
             f"| {_f(g.get('eval/success'))} | {_f(g.get('eval/rehearsal_success'))} | "
             f"{_f(g.get('eval/rehearsal_gap'))} | {_f(g.get('eval/rehearsal_shape_failures'), 2)} | "
             f"{_f(g.get('eval/rehearsal_as_recorded'), 2)} |", ""]
    pairs = read_jsonl_dicts(run.path / "gap_fidelity.jsonl")
    if pairs:
        lines += ["Fidelity on the user's tools: origin `policy` = each call of the real episodes rehearsed greedily "
                  "from the same history vs the real result (`as_recorded`: answered from a recorded example; "
                  "`recorded_exact`: of the calls matching an example, the recorded result equals the real one); "
                  "origin `example` = each recorded example rehearsed with no history vs its recorded result.", ""]
        cols = ("origin", "n", "format_ok", "structure", "value", "exact", "as_recorded", "recorded_exact")
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in summarize_fidelity(pairs, ("origin",)):
            lines.append("| " + " | ".join(_f(r.get(c)) for c in cols) + " |")
        lines.append("")
    fails = read_jsonl_dicts(run.path / "failures.jsonl")
    if fails:
        lines += ["Failure classes (experiments/failures.py), episodes:", "",
                  "| class | real | rehearsal-judged |", "|---|---|---|"]
        for c in FAILURE_CLASSES:
            n_real = sum(r["class"] == c and r.get("source") == "real" for r in fails)
            n_reh = sum(r["class"] == c and r.get("source") == "rehearsal_judged" for r in fails)
            lines.append(f"| {CLASS_WORDS[c]} | {n_real} | {n_reh} |")
        lines.append("")
    return lines


def print_eval_summary(run: RunDir) -> None:
    committed, _, fidelity = eval_rows(run)
    console = Console()
    if committed:
        t = Table(title=f"private rehearsal ({run.path.name})")
        for col in ("condition", "success [95% CI]", "Δ vs none", "real calls/task", "tokens/task", "s/task"):
            t.add_column(col)
        for r in condition_table(committed, seed=int(run.config().get("seed", 0) or 0)):
            t.add_row(r["condition"], f"{r['success']:.3f} [{r['success_lo']:.2f}, {r['success_hi']:.2f}]",
                      f"{r['delta']:+.3f}" if "delta" in r else "–", f"{r['real_calls_per_task']:.2f}",
                      f"{r['tokens_per_task']:.0f}", f"{r['seconds_per_task']:.1f}")
        console.print(t)
    gap = [r for r in run.metrics() if r.get("phase") == "gap"]
    if gap:
        g = gap[-1]
        console.print(f"rehearsal gap: real success {_f(g.get('eval/success'))}, rehearsal-judged "
                      f"{_f(g.get('eval/rehearsal_success'))}; rehearsed = real for {_f(g.get('eval/fidelity_exact'))} of "
                      f"{_f(g.get('eval/fidelity_n'), 0)} calls, recorded examples reproduced "
                      f"{_f(g.get('eval/example_exact'))} (summary.md: failure classes)")
    if fidelity:
        t = Table(title="world-model fidelity")
        for col in ("origin", "world", *FID_COLUMNS):
            t.add_column(col)
        for r in summarize_fidelity(fidelity, ("origin", "world")):
            t.add_row(*[_f(r.get(c)) for c in ("origin", "world", *FID_COLUMNS)])
        console.print(t)
