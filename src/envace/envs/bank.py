"""A retail bank: accounts, balances, transactions, transfers, bills, cards and disputes."""

from __future__ import annotations

import random
from datetime import date, timedelta
from typing import Any

from envace.envs.world import DATE, ID, MONEY, ToolFailure, World, enum, integer, money, parse_date, prop, to_cents, tool

MERCHANTS: dict[str, list[tuple[str, int, int]]] = {
    # category: [(merchant, min, max amount in dollars)]
    "groceries": [("Whole Harvest Market", 18, 160), ("FreshCo", 9, 90), ("Corner Grocer", 4, 40)],
    "dining": [("Blue Fig Cafe", 5, 25), ("Luigi's Trattoria", 30, 120), ("Sushi Zen", 20, 90),
               ("Burger Barn", 8, 30)],
    "transport": [("Metro Transit", 3, 60), ("RideNow", 9, 45), ("Shell Station", 25, 80)],
    "shopping": [("Amazon", 10, 250), ("Target", 12, 180), ("Book Nook", 8, 60)],
    "entertainment": [("StreamFlix", 15, 23), ("Cineplex", 12, 48), ("Spotify", 11, 17)],
    "health": [("CityPharm", 6, 70), ("FitLife Gym", 35, 60)],
}
CATEGORIES = [*MERCHANTS, "income", "transfer", "bills", "adjustment", "fees"]
BILLERS = [("City Power & Light", "utilities"), ("AquaWorks Water", "utilities"),
           ("FiberNet Internet", "internet"), ("Metro Mobile", "phone"),
           ("SafeHome Insurance", "insurance"), ("Union Credit Card", "credit_card")]
GOALS = ["Vacation Fund", "House Fund", "Emergency Fund"]
PEOPLE = ["Alex Morgan", "Jamie Chen", "Priya Patel", "Sam Rivera", "Taylor Brooks"]
DISPUTE_REASONS = ["unauthorized", "duplicate", "incorrect_amount", "not_received"]
TRANSFER_LIMIT_CENTS = 500_000
DISPUTE_WINDOW_DAYS = 60

SCHEMA = """
CREATE TABLE customer(name TEXT);
CREATE TABLE accounts(id TEXT PRIMARY KEY, type TEXT, nickname TEXT, last4 TEXT,
                      balance_cents INT, pending_cents INT);
CREATE TABLE transactions(id TEXT PRIMARY KEY, num INT, account_id TEXT, date TEXT,
                          description TEXT, category TEXT, amount_cents INT, status TEXT,
                          card_id TEXT);
CREATE TABLE payees(id TEXT PRIMARY KEY, name TEXT, category TEXT, last4 TEXT);
CREATE TABLE bills(id TEXT PRIMARY KEY, payee_id TEXT, amount_cents INT, due_date TEXT,
                   status TEXT, paid_on TEXT, paid_from TEXT);
CREATE TABLE cards(id TEXT PRIMARY KEY, last4 TEXT, account_id TEXT, status TEXT,
                   daily_limit_cents INT);
CREATE TABLE disputes(id TEXT PRIMARY KEY, transaction_id TEXT, reason TEXT, status TEXT,
                      provisional_credit_cents INT, created_on TEXT);
"""


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


class BankWorld(World):
    name = "bank"
    today = date(2025, 9, 15)
    schema = SCHEMA

    def populate(self, rng: random.Random) -> None:
        self.db.execute("INSERT INTO customer VALUES (?)", (rng.choice(PEOPLE),))
        accounts = [("checking", "Everyday Checking"), ("savings", "Rainy Day Savings")]
        if rng.random() < 0.5:
            accounts.append(("savings", rng.choice(GOALS)))
        ids = []
        numbers = iter(rng.sample(range(1000, 10000), 6))  # distinct last-4 digits for ids
        for kind, nickname in accounts:
            last4 = str(next(numbers))
            aid = f"{'chk' if kind == 'checking' else 'sav'}-{last4}"
            ids.append(aid)
            balance = rng.randint(300, 6000) if kind == "checking" else rng.randint(800, 25000)
            pending = rng.choice([0, 0, rng.randint(5, 180)]) * 100 if kind == "checking" else 0
            self.db.execute("INSERT INTO accounts VALUES (?,?,?,?,?,?)",
                            (aid, kind, nickname, last4, balance * 100 + rng.randint(0, 99), pending))
        cards = [f"card-{next(numbers)}" for _ in range(rng.randint(1, 2))]
        for cid in cards:
            self.db.execute("INSERT INTO cards VALUES (?,?,?,?,?)",
                            (cid, cid[-4:], ids[0], "frozen" if rng.random() < 0.15 else "active",
                             rng.choice([1000, 2500, 5000]) * 100))
        self._populate_transactions(rng, ids, cards)
        self._populate_bills(rng)

    def _populate_transactions(self, rng: random.Random, accounts: list[str], cards: list[str]) -> None:
        rows = []
        for back in range(45, 0, -1):
            day = self.today - timedelta(days=back)
            if day.day in (1, 15):
                rows.append((accounts[0], day, "ACME Corp Payroll", "income",
                             rng.randint(2400, 3800) * 100, None))
            if day.day == 28:
                for aid in accounts[1:]:
                    rows.append((aid, day, "Interest payment", "income", rng.randint(50, 2500), None))
            for _ in range(rng.choice([0, 1, 1, 2, 3])):
                category = rng.choice(list(MERCHANTS))
                merchant, lo, hi = rng.choice(MERCHANTS[category])
                cents = rng.randint(lo * 100, hi * 100)
                rows.append((accounts[0], day, merchant, category, -cents, rng.choice(cards)))
        base = rng.randint(10000, 90000)
        self.db.executemany(
            "INSERT INTO transactions VALUES (?,?,?,?,?,?,?,'posted',?)",
            [(f"t-{base + k}", base + k, a, str(d), desc, cat, amt, card)
             for k, (a, d, desc, cat, amt, card) in enumerate(rows)])
        self.start_sequence("disputes", rng.randint(300, 900))

    def _populate_bills(self, rng: random.Random) -> None:
        base = rng.randint(100, 900)
        for k, (name, category) in enumerate(rng.sample(BILLERS, rng.randint(3, 5))):
            pid = f"py-{base + k}"
            self.db.execute("INSERT INTO payees VALUES (?,?,?,?)", (pid, name, category, _digits(rng, 4)))
            lo, hi = (9000, 32000) if category == "insurance" else (2500, 18000)  # cents
            due = rng.random() < 0.7
            self.db.execute(
                "INSERT INTO bills VALUES (?,?,?,?,?,NULL,NULL)",
                (f"b-{base * 10 + k}", pid, rng.randint(lo, hi),
                 str(self.today + timedelta(days=rng.randint(1, 20) if due else -rng.randint(10, 25))),
                 "due" if due else "paid"))
        self.db.execute("UPDATE bills SET paid_on = date(due_date, '-2 days'), "
                        "paid_from = (SELECT id FROM accounts WHERE type = 'checking') "
                        "WHERE status = 'paid'")

    # -- lookups ------------------------------------------------------------------------

    def _account(self, account_id: str) -> dict[str, Any]:
        return self.by_id("accounts", "account", account_id)

    def _card(self, card_id: str) -> dict[str, Any]:
        return self.by_id("cards", "card", card_id)

    def _transaction(self, transaction_id: str) -> dict[str, Any]:
        return self.by_id("transactions", "transaction", transaction_id)

    def _post(self, account_id: str, description: str, category: str, cents: int) -> str:
        """Book a transaction dated today and move the balance; returns the transaction id."""
        num = self.scalar("SELECT MAX(num) FROM transactions") + 1
        self.db.execute("INSERT INTO transactions VALUES (?,?,?,?,?,?,?,'posted',NULL)",
                        (f"t-{num}", num, account_id, str(self.today), description, category, cents))
        self.db.execute("UPDATE accounts SET balance_cents = balance_cents + ? WHERE id = ?",
                        (cents, account_id))
        return f"t-{num}"

    def _available(self, a: dict[str, Any]) -> int:
        return a["balance_cents"] - a["pending_cents"]

    def _ensure_funds(self, a: dict[str, Any], cents: int) -> None:
        if self._available(a) < cents:
            raise ToolFailure("INSUFFICIENT_FUNDS", f"Account {a['id']} has only "
                              f"{money(self._available(a))} available", available=money(self._available(a)))

    # -- tools --------------------------------------------------------------------------

    @tool("List your accounts (ids, types, nicknames). Use get_balance for balances.")
    def list_accounts(self) -> dict:
        return {"accounts": [{"account_id": a["id"], "type": a["type"], "nickname": a["nickname"],
                              "number": "****" + a["last4"]}
                             for a in self.rows("SELECT * FROM accounts ORDER BY rowid")]}

    @tool("Get the balance of an account. 'available' excludes pending card holds.",
          {"account_id": prop(ID, "Account id, e.g. 'chk-4821'.")}, required=("account_id",))
    def get_balance(self, account_id: str) -> dict:
        a = self._account(account_id)
        return {"account_id": a["id"], "nickname": a["nickname"], "balance": money(a["balance_cents"]),
                "pending": money(a["pending_cents"]), "available": money(self._available(a)),
                "currency": "USD", "as_of": str(self.today)}

    @tool("List an account's transactions, newest first, with optional filters. Debits are "
          "negative amounts.",
          {"account_id": prop(ID, "Account id, e.g. 'chk-4821'."),
           "date_from": prop(DATE, "Earliest date, YYYY-MM-DD."),
           "date_to": prop(DATE, "Latest date, YYYY-MM-DD."),
           "category": enum(CATEGORIES, "Only this spending category."),
           "search": {"type": "string", "maxLength": 100,
                      "description": "Text to find in the merchant/description."},
           "limit": integer(1, 50, "Most transactions to return (default 10).")},
          required=("account_id",))
    def list_transactions(self, account_id: str, date_from: str | None = None,
                          date_to: str | None = None, category: str | None = None,
                          search: str | None = None, limit: int = 10) -> dict:
        self._account(account_id)
        lo = str(parse_date(date_from)) if date_from else "0000-01-01"
        hi = str(parse_date(date_to)) if date_to else "9999-12-31"
        found = self.rows(
            "SELECT * FROM transactions WHERE account_id = ? AND date BETWEEN ? AND ? "
            "AND (? IS NULL OR category = ?) AND instr(lower(description), lower(?)) > 0 "
            "ORDER BY date DESC, num DESC", account_id, lo, hi, category, category, search or "")
        return {"account_id": account_id, "count": min(limit, len(found)),
                "has_more": len(found) > limit,
                "transactions": [{"transaction_id": t["id"], "date": t["date"],
                                  "description": t["description"], "category": t["category"],
                                  "amount": money(t["amount_cents"]), "status": t["status"]}
                                 for t in found[:limit]]}

    @tool("Get one transaction with its card and dispute status.",
          {"transaction_id": prop(ID, "Transaction id, e.g. 't-10432'.")},
          required=("transaction_id",))
    def get_transaction(self, transaction_id: str) -> dict:
        t = self._transaction(transaction_id)
        d = self.row("SELECT id FROM disputes WHERE transaction_id = ?", transaction_id)
        return {"transaction_id": t["id"], "account_id": t["account_id"], "date": t["date"],
                "description": t["description"], "category": t["category"],
                "amount": money(t["amount_cents"]), "status": t["status"],
                "card_last4": t["card_id"][-4:] if t["card_id"] else None,
                "dispute_id": d["id"] if d else None}

    @tool("Move money between two of your accounts (at most 5000.00 per transfer).",
          {"from_account_id": prop(ID, "Account to take the money from."),
           "to_account_id": prop(ID, "Account to put the money in."),
           "amount": MONEY,
           "memo": {"type": "string", "maxLength": 100, "description": "Optional note."}},
          required=("from_account_id", "to_account_id", "amount"), writes=True)
    def transfer_funds(self, from_account_id: str, to_account_id: str, amount: float,
                       memo: str | None = None) -> dict:
        src, dst = self._account(from_account_id), self._account(to_account_id)
        if src["id"] == dst["id"]:
            raise ToolFailure("SAME_ACCOUNT", "Source and destination are the same account")
        cents = to_cents(amount)
        if cents > TRANSFER_LIMIT_CENTS:
            raise ToolFailure("TRANSFER_LIMIT_EXCEEDED", "A single transfer is limited to "
                              f"{money(TRANSFER_LIMIT_CENTS)}", limit=money(TRANSFER_LIMIT_CENTS))
        self._ensure_funds(src, cents)
        out = self._post(src["id"], f"Transfer to {dst['nickname']}", "transfer", -cents)
        self._post(dst["id"], f"Transfer from {src['nickname']}", "transfer", cents)
        src, dst = self._account(from_account_id), self._account(to_account_id)
        return {"transfer_id": "tr-" + out[2:], "status": "completed", "date": str(self.today),
                "from_account_id": src["id"], "to_account_id": dst["id"], "amount": money(cents),
                "memo": memo or "", "from_available_after": money(self._available(src)),
                "to_balance_after": money(dst["balance_cents"])}

    @tool("List the companies you pay bills to.")
    def list_payees(self) -> dict:
        return {"payees": [{"payee_id": p["id"], "name": p["name"], "category": p["category"],
                            "account_number": "****" + p["last4"]}
                           for p in self.rows("SELECT * FROM payees ORDER BY name")]}

    @tool("List your bills with amounts and due dates, soonest due first.",
          {"status": enum(["due", "paid"], "Only bills with this status.")})
    def list_bills(self, status: str | None = None) -> dict:
        bills = self.rows("SELECT b.*, p.name FROM bills b JOIN payees p ON p.id = b.payee_id "
                          "WHERE ?1 IS NULL OR b.status = ?1 ORDER BY due_date, b.id", status)
        return {"bills": [{"bill_id": b["id"], "payee_id": b["payee_id"], "payee_name": b["name"],
                           "amount": money(b["amount_cents"]), "due_date": b["due_date"],
                           "status": b["status"]} for b in bills]}

    @tool("Pay a due bill in full from a checking account.",
          {"bill_id": prop(ID, "Bill id, e.g. 'b-4410'."),
           "from_account_id": prop(ID, "Checking account to pay from.")},
          required=("bill_id", "from_account_id"), writes=True)
    def pay_bill(self, bill_id: str, from_account_id: str) -> dict:
        b = self.row("SELECT b.*, p.name FROM bills b JOIN payees p ON p.id = b.payee_id "
                     "WHERE b.id = ?", bill_id)
        if b is None:
            raise ToolFailure("BILL_NOT_FOUND", f"No bill with id {bill_id!r}")
        a = self._account(from_account_id)
        if b["status"] == "paid":
            raise ToolFailure("BILL_ALREADY_PAID", f"Bill {bill_id} was paid on {b['paid_on']}")
        if a["type"] != "checking":
            raise ToolFailure("ACCOUNT_NOT_ELIGIBLE", "Bills can only be paid from a checking account")
        self._ensure_funds(a, b["amount_cents"])
        tid = self._post(a["id"], b["name"], "bills", -b["amount_cents"])
        self.db.execute("UPDATE bills SET status = 'paid', paid_on = ?, paid_from = ? WHERE id = ?",
                        (str(self.today), a["id"], bill_id))
        return {"bill_id": bill_id, "payee_name": b["name"], "amount": money(b["amount_cents"]),
                "status": "paid", "paid_from": a["id"], "confirmation": "PMT-" + tid[2:],
                "available_after": money(self._available(self._account(a["id"])))}

    @tool("List your debit cards and whether each is active or frozen.")
    def list_cards(self) -> dict:
        return {"cards": [{"card_id": c["id"], "last4": c["last4"], "type": "debit",
                           "account_id": c["account_id"], "status": c["status"],
                           "daily_limit": money(c["daily_limit_cents"])}
                          for c in self.rows("SELECT * FROM cards ORDER BY rowid")]}

    @tool("Temporarily freeze a card so that no new purchases are approved.",
          {"card_id": prop(ID, "Card id, e.g. 'card-4821'.")}, required=("card_id",), writes=True)
    def freeze_card(self, card_id: str) -> dict:
        if self._card(card_id)["status"] == "frozen":
            raise ToolFailure("CARD_ALREADY_FROZEN", f"Card {card_id} is already frozen")
        self.db.execute("UPDATE cards SET status = 'frozen' WHERE id = ?", (card_id,))
        return {"card_id": card_id, "status": "frozen"}

    @tool("Unfreeze a frozen card.",
          {"card_id": prop(ID, "Card id, e.g. 'card-4821'.")}, required=("card_id",), writes=True)
    def unfreeze_card(self, card_id: str) -> dict:
        if self._card(card_id)["status"] != "frozen":
            raise ToolFailure("CARD_NOT_FROZEN", f"Card {card_id} is not frozen")
        self.db.execute("UPDATE cards SET status = 'active' WHERE id = ?", (card_id,))
        return {"card_id": card_id, "status": "active"}

    @tool("Dispute a card purchase from the last 60 days. Unauthorized charges get an immediate "
          "provisional credit.",
          {"transaction_id": prop(ID, "Transaction id, e.g. 't-10432'."),
           "reason": enum(DISPUTE_REASONS, "Why the charge is wrong.")},
          required=("transaction_id", "reason"), writes=True)
    def dispute_transaction(self, transaction_id: str, reason: str) -> dict:
        t = self._transaction(transaction_id)
        if t["amount_cents"] >= 0 or t["card_id"] is None:
            raise ToolFailure("NOT_DISPUTABLE", "Only card purchases can be disputed")
        if t["status"] == "disputed":
            raise ToolFailure("ALREADY_DISPUTED", f"Transaction {transaction_id} is already disputed")
        if (self.today - date.fromisoformat(t["date"])).days > DISPUTE_WINDOW_DAYS:
            raise ToolFailure("DISPUTE_WINDOW_CLOSED", "Purchases older than 60 days cannot be disputed")
        credit = -t["amount_cents"] if reason == "unauthorized" else 0
        did = f"d-{self.next_number('disputes')}"
        self.db.execute("INSERT INTO disputes VALUES (?,?,?,'under_review',?,?)",
                        (did, transaction_id, reason, credit, str(self.today)))
        self.db.execute("UPDATE transactions SET status = 'disputed' WHERE id = ?", (transaction_id,))
        if credit:
            self._post(t["account_id"], f"Provisional credit: {t['description']}", "adjustment", credit)
        return {"dispute_id": did, "transaction_id": transaction_id, "status": "under_review",
                "reason": reason, "provisional_credit": money(credit)}
