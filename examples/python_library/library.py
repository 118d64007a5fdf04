"""A lending library as plain Python: the public methods are the tools envace gives the agent.

envace derives each tool's JSON schema from the type hints and the docstring (``Args:``), makes
one ``Library`` per episode and calls ``reset(**env.args)`` on it, so episodes never share state.
A method that raises becomes a structured tool error the agent can read and recover from.
``@envace.readonly`` marks the tools that only read; any other tool counts as one that writes, and
the reward compares every write an episode makes with the reference solution's.
"""

from __future__ import annotations

import random

import envace

TITLES = [("Dune", "Frank Herbert"), ("Emma", "Jane Austen"), ("Beloved", "Toni Morrison"),
          ("Ulysses", "James Joyce"), ("Middlemarch", "George Eliot"), ("Solaris", "Stanislaw Lem"),
          ("Hamlet", "William Shakespeare"), ("Walden", "Henry David Thoreau"), ("Kindred", "Octavia Butler"),
          ("Persuasion", "Jane Austen"), ("Neuromancer", "William Gibson"), ("Dracula", "Bram Stoker")]
MEMBERS = ["Ada", "Ben", "Chloe", "Dev", "Eli", "Fay", "Gus", "Hana"]


class Library:
    def reset(self, seed: int = 0) -> None:
        rng = random.Random(f"library:{seed}")
        picked = rng.sample(TITLES, 8)
        self.books = {f"b{10 + i}": {"id": f"b{10 + i}", "title": t, "author": a, "copies": rng.randint(0, 2)}
                      for i, (t, a) in enumerate(picked)}
        self.members = {f"m{i + 1}": name for i, name in enumerate(rng.sample(MEMBERS, 4))}
        self.loans: list[dict] = []

    @envace.readonly
    def search_books(self, query: str) -> list[dict]:
        """Find books whose title or author contains the query (case-insensitive).

        Args:
            query: Part of a title or an author's name.
        """
        q = query.lower()
        return [{"id": b["id"], "title": b["title"], "author": b["author"]}
                for b in self.books.values() if q in b["title"].lower() or q in b["author"].lower()]

    @envace.readonly
    def book_status(self, book_id: str) -> dict:
        """How many copies of a book are on the shelf.

        Args:
            book_id: The book's id, e.g. b12.
        """
        book = self._book(book_id)
        return {"id": book_id, "title": book["title"], "available": book["copies"]}

    @envace.readonly
    def find_member(self, name: str) -> dict:
        """Look up a library member by first name.

        Args:
            name: The member's first name.
        """
        for mid, n in self.members.items():
            if n.lower() == name.strip().lower():
                return {"member_id": mid, "name": n}
        raise LookupError(f"no member named {name!r}")

    def borrow_book(self, member_id: str, book_id: str) -> dict:
        """Lend a copy of a book to a member.

        Args:
            member_id: The member's id, e.g. m2.
            book_id: The book's id, e.g. b12.
        """
        book = self._book(book_id)
        if member_id not in self.members:
            raise LookupError(f"no member {member_id}")
        if book["copies"] < 1:
            raise RuntimeError(f"no copy of {book['title']} is available")
        book["copies"] -= 1
        loan = {"loan_id": f"L{len(self.loans) + 1}", "member_id": member_id, "book_id": book_id}
        self.loans.append(loan)
        return loan

    @envace.readonly
    def list_loans(self, member_id: str) -> list[dict]:
        """The books a member has borrowed and not returned.

        Args:
            member_id: The member's id, e.g. m2.
        """
        return [loan for loan in self.loans if loan["member_id"] == member_id]

    def _book(self, book_id: str) -> dict:
        if book_id not in self.books:
            raise LookupError(f"no book {book_id}")
        return self.books[book_id]
