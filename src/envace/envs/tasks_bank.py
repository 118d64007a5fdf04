"""Bank tasks: scenarios (each solves its task on a live BankWorld) and example samplers."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from envace.envs.bank import DISPUTE_REASONS, MERCHANTS, BankWorld
from envace.envs.taskgen import Draft, TaskSet, need
from envace.envs.world import World, money

TODAY = BankWorld.today


def _account(d: Draft, kind: str | None = None) -> dict[str, Any]:
    return d.pick("SELECT * FROM accounts WHERE ? IS NULL OR type = ?", kind, kind)


def _checking(d: Draft) -> dict[str, Any]:
    return d.rows("SELECT * FROM accounts WHERE type = 'checking'")[0]


def _available(a: dict[str, Any]) -> int:
    return a["balance_cents"] - a["pending_cents"]


def _lone_charge(d: Draft) -> dict[str, Any]:
    """A card purchase the user can name by merchant and date alone."""
    return d.pick("SELECT * FROM transactions t WHERE card_id IS NOT NULL AND status = 'posted' "
                  "AND (SELECT COUNT(*) FROM transactions x WHERE x.date = t.date "
                  "AND x.description = t.description) = 1")


def _amount(cents: int) -> float | int:
    """The number a user would type: 250 rather than 250.0."""
    return cents // 100 if cents % 100 == 0 else cents / 100


def _find_charge(d: Draft, t: dict[str, Any]) -> None:
    d.do("list_accounts")
    d.do("list_transactions", account_id=t["account_id"], date_from=t["date"], date_to=t["date"])


def _due_bill(d: Draft) -> dict[str, Any]:
    return d.pick("SELECT b.*, p.name FROM bills b JOIN payees p ON p.id = b.payee_id "
                  "WHERE b.status = 'due'")


# -- difficulty 1 -------------------------------------------------------------------------

def balance(d: Draft) -> None:
    a = _account(d)
    d.ask(f"How much money is available in my {a['nickname']} account?")
    d.do("list_accounts")
    b = d.do("get_balance", account_id=a["id"])
    d.expect_call("get_balance", account_id=a["id"])
    d.answer(f"Your {a['nickname']} has ${b['available']} available.", b["available"])


def freeze_card(d: Draft) -> None:
    _switch_card(d, "active", "freeze_card", "I lost my debit card ending in {last4}. Please freeze it.",
                 "Your card ending in {last4} is now frozen.")


def unfreeze_card(d: Draft) -> None:
    _switch_card(d, "frozen", "unfreeze_card", "I found my card ending in {last4}; please unfreeze it.",
                 "The card ending in {last4} is active again.")


def _switch_card(d: Draft, status: str, tool: str, ask: str, answer: str) -> None:
    """A card in ``status`` is asked to change by ``tool``; ``ask`` / ``answer`` name it by ``{last4}``."""
    c = d.pick(f"SELECT * FROM cards WHERE status = '{status}'")
    d.ask(ask.format(last4=c["last4"]))
    d.do("list_cards")
    d.do(tool, card_id=c["id"])
    d.expect_call(tool, card_id=c["id"])
    d.expect_state("SELECT id, status FROM cards ORDER BY id")
    d.answer(answer.format(last4=c["last4"]))


def charge_amount(d: Draft) -> None:
    t = _lone_charge(d)
    d.ask(f"How much did I pay at {t['description']} on {t['date']}?")
    _find_charge(d, t)
    d.expect_call("list_transactions", account_id=t["account_id"])
    paid = money(-t["amount_cents"])
    d.answer(f"You paid ${paid} at {t['description']} on {t['date']}.", paid)


# -- difficulty 2 -------------------------------------------------------------------------

def transfer(d: Draft) -> None:
    src, dst = d.rng.sample(d.rows("SELECT * FROM accounts ORDER BY rowid"), 2)
    need(_available(src) >= 2000)
    cents = d.rng.randint(10, min(_available(src) // 100, 3000)) * 100
    if d.rng.random() < 0.4:
        cents += d.rng.choice([25, 50, 75])
    need(cents <= _available(src))
    amount = _amount(cents)
    d.ask(f"Move ${money(cents)} from my {src['nickname']} to my {dst['nickname']}, then tell me "
          f"what is left available in {src['nickname']}.")
    d.do("list_accounts")
    r = d.do("transfer_funds", from_account_id=src["id"], to_account_id=dst["id"], amount=amount)
    d.expect_call("transfer_funds", from_account_id=src["id"], to_account_id=dst["id"],
                  amount=amount)
    d.expect_state("SELECT id, balance_cents FROM accounts ORDER BY id")
    d.answer(f"Done. {src['nickname']} now has ${r['from_available_after']} available.",
             r["from_available_after"])


def pay_bill(d: Draft) -> None:
    b, chk = _due_bill(d), _checking(d)
    need(_available(chk) >= b["amount_cents"])
    d.ask(f"Pay my {b['name']} bill from my checking account and give me the confirmation number.")
    d.do("list_bills", status="due")
    d.do("list_accounts")
    r = d.do("pay_bill", bill_id=b["id"], from_account_id=chk["id"])
    d.expect_call("pay_bill", bill_id=b["id"], from_account_id=chk["id"])
    d.expect_state(f"SELECT status, paid_from FROM bills WHERE id = '{b['id']}'")
    d.answer(f"Paid ${r['amount']} to {b['name']}; confirmation {r['confirmation']}.",
             r["confirmation"])


def dispute_charge(d: Draft) -> None:
    t = _lone_charge(d)
    reason = d.rng.choice(DISPUTE_REASONS)
    why = {"unauthorized": "I never made it", "duplicate": "I was charged twice",
           "incorrect_amount": "the amount is wrong", "not_received": "I never got the goods"}
    d.ask(f"Dispute my {t['description']} charge from {t['date']}: {why[reason]}. "
          "Will I get a provisional credit?")
    _find_charge(d, t)
    r = d.do("dispute_transaction", transaction_id=t["id"], reason=reason)
    d.expect_call("dispute_transaction", transaction_id=t["id"], reason=reason)
    d.expect_state(f"SELECT status FROM transactions WHERE id = '{t['id']}'")
    credit = r["provisional_credit"]
    if credit != "0.00":
        d.answer(f"Dispute {r['dispute_id']} is open; ${credit} was credited provisionally.",
                 r["dispute_id"], credit)
    else:
        d.answer(f"Dispute {r['dispute_id']} is open; no provisional credit for this reason.",
                 r["dispute_id"])


def category_spend(d: Draft) -> None:
    chk = _checking(d)
    category = d.rng.choice(list(MERCHANTS))
    end = TODAY - timedelta(days=d.rng.randint(1, 10))
    start = end - timedelta(days=d.rng.choice([6, 13]))
    found = d.rows("SELECT amount_cents FROM transactions WHERE account_id = ? AND category = ? "
                   "AND date BETWEEN ? AND ?", chk["id"], category, str(start), str(end))
    need(2 <= len(found) <= 10)
    d.ask(f"How much did I spend on {category} from my checking account between {start} and {end}?")
    d.do("list_accounts")
    d.do("list_transactions", account_id=chk["id"], date_from=str(start), date_to=str(end),
         category=category)
    d.expect_call("list_transactions", account_id=chk["id"], category=category)
    total = money(-sum(r["amount_cents"] for r in found))
    d.answer(f"You spent ${total} on {category} in {len(found)} transactions.", total)


# -- difficulty 3 -------------------------------------------------------------------------

def fraud_response(d: Draft) -> None:
    t = _lone_charge(d)
    card = d.rows("SELECT * FROM cards WHERE id = ?", t["card_id"])[0]
    need(card["status"] == "active")
    d.ask(f"I didn't make the {t['description']} charge on {t['date']}. Dispute it as "
          "unauthorized, freeze the card it was made with, and give me the dispute id.")
    _find_charge(d, t)
    d.do("get_transaction", transaction_id=t["id"])
    d.do("list_cards")
    d.do("freeze_card", card_id=card["id"])
    r = d.do("dispute_transaction", transaction_id=t["id"], reason="unauthorized")
    d.expect_call("freeze_card", card_id=card["id"])
    d.expect_call("dispute_transaction", transaction_id=t["id"], reason="unauthorized")
    d.expect_state("SELECT id, status FROM cards ORDER BY id")
    d.expect_state(f"SELECT status FROM transactions WHERE id = '{t['id']}'")
    d.answer(f"Card ending {card['last4']} is frozen and dispute {r['dispute_id']} is open "
             f"(provisional credit ${r['provisional_credit']}).", r["dispute_id"])


def cover_then_pay(d: Draft) -> None:
    b, chk = _due_bill(d), _checking(d)
    sav = _account(d, "savings")
    need(_available(sav) >= b["amount_cents"])
    d.ask(f"Transfer exactly the amount of my {b['name']} bill from my {sav['nickname']} to "
          "checking, then pay that bill from checking.")
    d.do("list_bills", status="due")
    d.do("list_accounts")
    amount = _amount(b["amount_cents"])
    d.do("transfer_funds", from_account_id=sav["id"], to_account_id=chk["id"], amount=amount)
    r = d.do("pay_bill", bill_id=b["id"], from_account_id=chk["id"])
    d.expect_call("transfer_funds", from_account_id=sav["id"], to_account_id=chk["id"],
                  amount=amount)
    d.expect_call("pay_bill", bill_id=b["id"], from_account_id=chk["id"])
    d.expect_state(f"SELECT status FROM bills WHERE id = '{b['id']}'")
    d.expect_state("SELECT id, balance_cents FROM accounts ORDER BY id")
    d.answer(f"Moved ${r['amount']} to checking and paid {b['name']} "
             f"(confirmation {r['confirmation']}).", r["amount"])


def pay_all_due(d: Draft) -> None:
    bills = d.rows("SELECT * FROM bills WHERE status = 'due' ORDER BY due_date, id")
    chk = _checking(d)
    need(2 <= len(bills) <= 4 and sum(b["amount_cents"] for b in bills) <= _available(chk))
    d.ask("Pay all of my due bills from my checking account and tell me the total paid.")
    d.do("list_bills", status="due")
    d.do("list_accounts")
    for b in bills:
        d.do("pay_bill", bill_id=b["id"], from_account_id=chk["id"])
        d.expect_call("pay_bill", bill_id=b["id"], from_account_id=chk["id"])
    d.expect_state("SELECT COUNT(*) FROM bills WHERE status = 'due'")
    total = money(sum(b["amount_cents"] for b in bills))
    d.answer(f"Paid {len(bills)} bills, ${total} in total.", total)


def biggest_charge_dispute(d: Draft) -> None:
    chk = _checking(d)
    category = d.rng.choice(list(MERCHANTS))
    since = TODAY - timedelta(days=14)
    found = d.rows("SELECT * FROM transactions WHERE account_id = ? AND category = ? AND date >= ? "
                   "AND card_id IS NOT NULL ORDER BY amount_cents", chk["id"], category, str(since))
    need(len(found) >= 2 and found[0]["amount_cents"] < found[1]["amount_cents"])
    t = found[0]  # most negative = biggest charge
    d.ask(f"Find my biggest {category} charge in checking since {since} and dispute it as "
          "incorrect_amount. Tell me the merchant and amount.")
    d.do("list_accounts")
    d.do("list_transactions", account_id=chk["id"], date_from=str(since), category=category,
         limit=50)
    d.do("dispute_transaction", transaction_id=t["id"], reason="incorrect_amount")
    d.expect_call("dispute_transaction", transaction_id=t["id"], reason="incorrect_amount")
    d.expect_state(f"SELECT status FROM transactions WHERE id = '{t['id']}'")
    paid = money(-t["amount_cents"])
    d.answer(f"The biggest was {t['description']} for ${paid}; it is now disputed.",
             t["description"], paid)


# -- example samplers ---------------------------------------------------------------------

def _any(w: World, rng: random.Random, sql: str) -> Any:
    rows = sorted(w.db.execute(sql).fetchall())  # sorted: never depend on the query plan
    return rng.choice(rows)[0] if rows else None


def _some_account(w: World, r: random.Random) -> str:
    return _any(w, r, "SELECT id FROM accounts ORDER BY rowid")


def _transactions(w: World, r: random.Random) -> dict[str, Any]:
    args: dict[str, Any] = {"account_id": _some_account(w, r), "limit": r.choice([3, 5])}
    if args["account_id"].startswith("chk") and r.random() < 0.5:  # savings hold no purchases
        args["category"] = r.choice(list(MERCHANTS))
    return args


def _transfer(w: World, r: random.Random) -> dict[str, Any]:
    ids = [x[0] for x in w.db.execute("SELECT id FROM accounts ORDER BY rowid")]
    src, dst = r.sample(ids, 2)
    return {"from_account_id": src, "to_account_id": dst, "amount": r.randint(2, 40) * 25}


SAMPLERS = {
    "list_accounts": lambda w, r: {},
    "get_balance": lambda w, r: {"account_id": _some_account(w, r)},
    "list_transactions": _transactions,
    "get_transaction": lambda w, r: {"transaction_id": _any(w, r, "SELECT id FROM transactions")},
    "transfer_funds": _transfer,
    "list_payees": lambda w, r: {},
    "list_bills": lambda w, r: r.choice([{}, {"status": r.choice(["due", "paid"])}]),
    "pay_bill": lambda w, r: {"bill_id": _any(w, r, "SELECT id FROM bills"),
                              "from_account_id": _some_account(w, r)},
    "list_cards": lambda w, r: {},
    "freeze_card": lambda w, r: {"card_id": _any(w, r, "SELECT id FROM cards")},
    "unfreeze_card": lambda w, r: {"card_id": _any(w, r, "SELECT id FROM cards")},
    "dispute_transaction": lambda w, r: {
        "transaction_id": _any(w, r, "SELECT id FROM transactions WHERE card_id IS NOT NULL"),
        "reason": r.choice(DISPUTE_REASONS)},
}

TASKS = TaskSet(
    world="bank",
    scenarios={1: [balance, freeze_card, unfreeze_card, charge_amount],
               2: [transfer, pay_bill, dispute_charge, category_spend],
               3: [fraud_response, cover_then_pay, pay_all_due, biggest_charge_dispute]},
    samplers=SAMPLERS,
)
