"""A static HTML trajectory viewer of an eval run (one self-contained file, no scripts).

Per condition and task: the instruction, the rehearsal memory, the committed real run turn by
turn — each real tool response beside the rehearsed response to the same call where a rehearsal
made it — the checklist verdicts, and the imagined attempts. Then the fidelity pairs, rehearsed
vs real side by side. Every piece of model or task text goes through ``html.escape``.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from envace.core.jsonl import atomic_write_text, read_jsonl_dicts
from envace.core.types import solved
from envace.experiments.rundir import RunDir

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
details{margin:.3em 0 .3em 1em}summary{cursor:pointer}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font-size:12px}
table{border-collapse:collapse;width:100%;margin:.4em 0}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
th{background:#f3f3f3;text-align:left}.ok{color:#137333}.bad{color:#b3261e}.na{color:#777}
.assistant{background:#f5f9ff}.tool{background:#fbfbf3}.user{background:#f6f6f6}.mem{background:#f4fff4;padding:4px}
.tag{font-size:11px;border-radius:3px;padding:0 4px;background:#eee;margin-left:4px}
"""

MAX_FIDELITY_ROWS = 600
MAX_ATTEMPTS_SHOWN = 8


def esc(x: Any) -> str:
    return html.escape(x if isinstance(x, str) else json.dumps(x, ensure_ascii=False), quote=True)


def _call_key(call: dict[str, Any]) -> str:
    return json.dumps({"name": call.get("name"), "arguments": call.get("arguments", {})}, sort_keys=True)


def _steps(messages: list[dict]) -> list[tuple[dict | None, dict]]:
    """Each tool message with the call it answered (None for a malformed call)."""
    out = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        calls = m.get("tool_calls") or []
        j, answers = i + 1, []
        while j < len(messages) and messages[j].get("role") == "tool":
            answers.append(messages[j])
            j += 1
        out += list(zip(calls, answers)) if calls else [(None, a) for a in answers]
    return out


def _mark(v: Any) -> str:
    if v is None:
        return '<span class="na">–</span>'
    return '<span class="ok">✓</span>' if v else '<span class="bad">✗</span>'


def _content(traj: dict, msgs: list[dict], i: int) -> str:
    """A message's cell: its text; for an assistant turn its tool calls as well (a call parsed
    from a server's structured reply has no text), and the episode's final answer where the turn
    that ended it carries no text of its own, so no cell is blank without saying why."""
    m = msgs[i]
    text = m.get("content", "") or ""
    if m.get("role") != "assistant":
        return f"<pre>{esc(text)}</pre>"
    parts = [f"<pre>{esc(text)}</pre>"] if text.strip() else []
    calls = m.get("tool_calls") or []
    if calls and not text.strip():
        parts += [f"<pre><b>call</b> {esc(c.get('name', ''))} {esc(c.get('arguments', {}))}</pre>" for c in calls]
    last = not any(n.get("role") == "assistant" for n in msgs[i + 1:])
    if last and not calls and traj.get("stop_reason") == "final_answer":
        answer = traj.get("final_answer") or traj.get("answer") or text
        if not text.strip():
            parts.append(f"<pre>{esc(answer)}</pre>" if str(answer).strip() else
                         "<span class='na'>(final answer: the model ended the episode with an empty turn)</span>")
        parts.insert(0, '<span class="tag">final answer</span>')
    return "".join(parts) or "<span class='na'>(empty turn)</span>"


def _turns_table(traj: dict, counterpart: dict[str, str] | None = None) -> str:
    msgs = traj.get("messages", [])
    answered = {id(a): c for c, a in _steps(msgs)}
    cols = "<tr><th>#</th><th>role</th><th>content</th>" + ("<th>rehearsed response to the same call</th>"
                                                          if counterpart is not None else "") + "</tr>"
    rows = [cols]
    for i, m in enumerate(msgs):
        role = m.get("role", "")
        tag = ""
        if role == "tool":
            tag = '<span class="tag">rehearsed</span>' if m.get("rehearsed") else '<span class="tag">real</span>'
        right = ""
        if counterpart is not None:
            other = ""
            call = answered.get(id(m))
            if role == "tool" and call is not None:
                other = counterpart.get(_call_key(call), "")
            right = f"<td><pre>{esc(other)}</pre></td>" if other else "<td></td>"
        rows.append(f'<tr class="{esc(role)}"><td>{i}</td><td>{esc(role)}{tag}</td>'
                    f"<td>{_content(traj, msgs, i)}</td>{right}</tr>")
    return "<table>" + "".join(rows) + "</table>"


def _verdicts(traj: dict) -> str:
    items = []
    for v in traj.get("verdicts", []):
        item = v.get("item", {})
        what = {k: item[k] for k in ("tool", "args", "query", "text", "criterion") if item.get(k) not in (None, {}, "")}
        items.append(f"<li>{_mark(v.get('met'))} <b>{esc(item.get('kind', ''))}</b> {esc(what)} "
                     f"<span class='na'>{esc(v.get('detail', ''))}</span></li>")
    return "<ul>" + "".join(items) + "</ul>" if items else "<p class='na'>no checklist</p>"


def _committed_section(committed: list[dict], rehearsals: list[dict]) -> str:
    by_mode_task: dict[tuple[str, str], list[dict]] = {}
    for r in rehearsals:
        by_mode_task.setdefault((r["mode"], r["task_id"]), []).append(r)
    for v in by_mode_task.values():
        v.sort(key=lambda r: r["attempt"])
    conds: dict[str, list[dict]] = {}
    for r in committed:
        conds.setdefault(r["condition"], []).append(r)
    parts = ["<h2>Committed runs (real world)</h2>"]
    for cond, rows in conds.items():
        wins = sum(bool(r["success"]) for r in rows)
        parts.append(f"<details><summary><b>{esc(cond)}</b> — success {wins}/{len(rows)}</summary>")
        for r in rows:
            traj = r["trajectory"]
            attempts = [a for a in by_mode_task.get((r["mode"], r["task_id"]), []) if a["attempt"] < r["budget"]]
            counterpart: dict[str, str] = {}
            for a in attempts:
                for call, ans in _steps(a["trajectory"].get("messages", [])):
                    if call is not None:
                        counterpart.setdefault(_call_key(call), ans.get("content", ""))
            user = next((m.get("content", "") for m in traj.get("messages", []) if m.get("role") == "user"), "")
            parts.append(f"<details><summary>{_mark(r['success'])} {esc(r['task_id'])} — reward "
                         f"{r['reward']:.2f}, {r['real_calls']} real calls, {r['tokens']['total']} tokens</summary>")
            parts.append(f"<p><b>Instruction:</b> {esc(user)}</p>")
            if r.get("memory"):
                note = f" — {esc(r['memory_note'])}" if r.get("memory_note") else ""
                parts.append(f"<p><b>Rehearsal memory</b> <span class='tag'>{esc(r['memory_source'])}</span>{note}</p>"
                             f"<div class='mem'><pre>{esc(r['memory'])}</pre></div>")
                if r.get("memory_raw") and r.get("memory_source") != "model":
                    parts.append(f"<details><summary>model summary (rejected)</summary><pre>{esc(r['memory_raw'])}"
                                 "</pre></details>")
            parts.append(f"<p><b>Committed run</b> (stop: {esc(traj.get('stop_reason', ''))})</p>")
            parts.append(_turns_table(traj, counterpart if attempts else None))
            parts.append("<p><b>Checklist</b></p>" + _verdicts(traj))
            for a in attempts[:MAX_ATTEMPTS_SHOWN]:
                at = a["trajectory"]
                seen = (f"<p><b>Memory this attempt saw:</b></p><div class='mem'><pre>{esc(a['memory_seen'])}</pre></div>"
                        if a.get("memory_seen") else "")
                parts.append(f"<details><summary>imagined attempt {a['attempt'] + 1} ({esc(a['mode'])}) — "
                             f"stop {esc(at.get('stop_reason', ''))}, {a['caller_tokens'] + a['simulator_tokens']} "
                             f"tokens</summary>{seen}{_turns_table(at)}</details>")
            if len(attempts) > MAX_ATTEMPTS_SHOWN:
                parts.append(f"<p class='na'>({len(attempts) - MAX_ATTEMPTS_SHOWN} more attempts not shown)</p>")
            parts.append("</details>")
        parts.append("</details>")
    return "".join(parts)


def _fidelity_section(fidelity: list[dict]) -> str:
    parts = [f"<h2>World-model fidelity: rehearsed vs real ({len(fidelity)} responses)</h2>", "<table>",
             "<tr><th>world / task</th><th>origin</th><th>call</th><th>real response</th><th>rehearsed response</th>"
             "<th>format</th><th>parsed</th><th>structure</th><th>value</th><th>exact</th><th>error agrees</th></tr>"]
    for p in fidelity[:MAX_FIDELITY_ROWS]:
        m = p.get("match", {})
        call = f"{p.get('tool')} {json.dumps(p.get('arguments', {}), ensure_ascii=False)}"
        parts.append(
            f"<tr><td>{esc(p.get('world', ''))}<br>{esc(p.get('task_id', ''))}</td><td>{esc(p.get('origin', ''))}</td>"
            f"<td><pre>{esc(call)}</pre></td><td><pre>{esc(p.get('real', ''))}</pre></td>"
            f"<td><pre>{esc(p.get('rehearsed', ''))}</pre></td>"
            + "".join(f"<td>{_mark(m.get(k))}</td>" for k in ("format_ok", "parsed", "structure", "value", "exact", "error_agree"))
            + "</tr>")
    parts.append("</table>")
    if len(fidelity) > MAX_FIDELITY_ROWS:
        parts.append(f"<p class='na'>({len(fidelity) - MAX_FIDELITY_ROWS} more pairs in fidelity.jsonl)</p>")
    return "".join(parts)


def render_viewer(title: str, committed: list[dict], rehearsals: list[dict], fidelity: list[dict]) -> str:
    body = [f"<h1>{esc(title)}</h1>"]
    if committed:
        body.append(_committed_section(committed, rehearsals))
    if fidelity:
        body.append(_fidelity_section(fidelity))
    if not committed and not fidelity:
        body.append("<p>No results.</p>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")


def write_viewer(run: RunDir, committed: list[dict], rehearsals: list[dict], fidelity: list[dict]) -> Path:
    cfg = run.config()
    title = f"envace eval {run.path.name} — model {cfg.get('model')}"
    path = run.path / "viewer.html"
    atomic_write_text(path, render_viewer(title, committed, rehearsals, fidelity))
    return path


MAX_TRAIN_STEPS_SHOWN = 100
MAX_EPISODES_PER_STEP = 16


def _episode(t: dict) -> str:
    user = next((m.get("content", "") for m in t.get("messages", []) if m.get("role") == "user"), "")
    return (f"<details><summary>{_mark(solved(float(t.get('reward', 0.0))))} {esc(t.get('task_id', ''))} #{esc(t.get('trajectory_index', 0))}"
            f" — reward {float(t.get('reward', 0.0)):.2f}, stop {esc(t.get('stop_reason', ''))}, "
            f"{esc(t.get('tool_calls', 0))} calls</summary><p><b>Instruction:</b> {esc(user)}</p>"
            f"{_turns_table(t)}<p><b>Checklist</b></p>{_verdicts(t)}</details>")


def render_train_viewer(title: str, rollouts: list[dict], evals: list[dict]) -> str:
    """A training run's episodes per step: its GRPO rollouts (rehearsed or real responses marked)
    and its evals, each turn by turn with its checklist, as the eval viewer shows them."""
    body = [f"<h1>{esc(title)}</h1>"]
    for name, rows in (("Evaluations (real world)", evals), ("Training rollouts", rollouts)):
        by_step: dict[int, list[dict]] = {}
        for r in rows:
            by_step.setdefault(int(r.get("step", 0)), []).append(r)
        steps = sorted(by_step)
        if len(steps) > MAX_TRAIN_STEPS_SHOWN:  # evenly spread, the last always in
            k = -(-len(steps) // MAX_TRAIN_STEPS_SHOWN)
            steps = sorted(set(steps[::k]) | {steps[-1]})
        body.append(f"<h2>{esc(name)}</h2>" if steps else "")
        for step in steps:
            eps = by_step[step]
            wins = sum(solved(float(t.get("reward", 0.0))) for t in eps)
            mean = sum(float(t.get("reward", 0.0)) for t in eps) / len(eps)
            body.append(f"<details><summary><b>step {step}</b> — solved {wins}/{len(eps)}, mean reward {mean:.2f}"
                        "</summary>" + "".join(_episode(t) for t in eps[:MAX_EPISODES_PER_STEP]))
            if len(eps) > MAX_EPISODES_PER_STEP:
                body.append(f"<p class='na'>({len(eps) - MAX_EPISODES_PER_STEP} more episodes in the JSONL)</p>")
            body.append("</details>")
    if not rollouts and not evals:
        body.append("<p>No episodes yet.</p>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")


def write_train_viewer(run: RunDir) -> Path:
    """``<run>/viewer.html`` of a training run, from trajectories.jsonl and evals.jsonl."""
    def rows(name: str) -> list[dict]:
        path = run.path / name
        return read_jsonl_dicts(path) if path.is_file() else []

    cfg = run.config()
    title = f"envace train {run.path.name} — model {cfg.get('model')}, source {cfg.get('source')}"
    path = run.path / "viewer.html"
    atomic_write_text(path, render_train_viewer(title, rows("trajectories.jsonl"), rows("evals.jsonl")))
    return path
