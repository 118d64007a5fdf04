"""The notes service's logic, free of MCP: the server exposes it, the task generator computes
expected results with it. State is one ``Notes`` object per server process (per episode under
stdio, where envace starts one process per episode); ``reset(seed)`` rebuilds it."""

from __future__ import annotations

import random

TOPICS = {
    "groceries": ["milk", "eggs", "bread", "coffee", "apples", "rice"],
    "travel": ["passport", "tickets", "charger", "adapter", "sunscreen"],
    "work": ["quarterly report", "budget review", "client call", "team offsite"],
    "books": ["Dune", "Emma", "Ulysses", "Beloved", "Middlemarch"],
    "garden": ["tomatoes", "basil", "compost", "roses", "mulch"],
}
TAGS = ["home", "urgent", "later", "family", "office"]


class Notes:
    def __init__(self, seed: int = 0) -> None:
        rng = random.Random(f"notes:{seed}")
        self.notes: dict[str, dict] = {}
        self.next_id = 100 + seed * 10
        for topic in rng.sample(sorted(TOPICS), 4):
            items = rng.sample(TOPICS[topic], 3)
            self._add(f"{topic.title()} list", ", ".join(items), rng.choice(TAGS))

    def _add(self, title: str, body: str, tag: str) -> dict:
        note = {"id": f"n{self.next_id}", "title": title, "body": body, "tag": tag}
        self.next_id += 1
        self.notes[note["id"]] = note
        return note

    def list_notes(self, tag: str | None = None) -> list[dict]:
        return [{"id": n["id"], "title": n["title"], "tag": n["tag"]}
                for n in self.notes.values() if tag is None or n["tag"] == tag]

    def get_note(self, note_id: str) -> dict:
        if note_id not in self.notes:
            raise KeyError(f"no note {note_id}")
        return dict(self.notes[note_id])

    def search_notes(self, text: str) -> list[dict]:
        t = text.lower()
        return [{"id": n["id"], "title": n["title"]} for n in self.notes.values()
                if t in n["title"].lower() or t in n["body"].lower()]

    def create_note(self, title: str, body: str, tag: str = "later") -> dict:
        if tag not in TAGS:
            raise ValueError(f"unknown tag {tag!r}; tags: {', '.join(TAGS)}")
        return self._add(title, body, tag)

    def delete_note(self, note_id: str) -> dict:
        if note_id not in self.notes:
            raise KeyError(f"no note {note_id}")
        del self.notes[note_id]
        return {"deleted": note_id}
