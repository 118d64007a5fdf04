"""Bank world: money moves consistently, limits and eligibility are enforced."""

from __future__ import annotations

import pytest

from envace.core.errors import error_code, is_error
from envace.envs.bank import BankWorld


@pytest.fixture
def bank() -> BankWorld:
    return BankWorld(2)


def ok(world: BankWorld, tool: str, **args) -> dict:
    result = world.call(tool, args)
    assert not is_error(result), result
    return result


def ids(bank: BankWorld) -> tuple[str, str]:
    accounts = ok(bank, "list_accounts")["accounts"]
    return accounts[0]["account_id"], accounts[1]["account_id"]  # checking, savings


def available(bank: BankWorld, account: str) -> float:
    return float(ok(bank, "get_balance", account_id=account)["available"])


def test_transfer_moves_money_and_books_both_sides(bank):
    chk, sav = ids(bank)
    a, b = available(bank, chk), available(bank, sav)
    r = ok(bank, "transfer_funds", from_account_id=sav, to_account_id=chk, amount=125.5, memo="rent")
    assert r["amount"] == "125.50" and float(r["from_available_after"]) == pytest.approx(b - 125.5)
    assert available(bank, chk) == pytest.approx(a + 125.5)
    assert available(bank, sav) == pytest.approx(b - 125.5)
    newest = ok(bank, "list_transactions", account_id=chk, limit=1)["transactions"][0]
    assert (newest["amount"], newest["category"], newest["date"]) == ("125.50", "transfer", "2025-09-15")


def test_transfer_errors(bank):
    chk, sav = ids(bank)
    cases = [({"amount": 10}, "SAME_ACCOUNT", chk, chk),
             ({"amount": 10.005}, "INVALID_AMOUNT", sav, chk),
             ({"amount": 5000.01}, "TRANSFER_LIMIT_EXCEEDED", sav, chk),
             ({"amount": available(bank, chk) + 1}, "INSUFFICIENT_FUNDS", chk, sav),
             ({"amount": 10}, "ACCOUNT_NOT_FOUND", "chk-0000", sav),
             ({"amount": -5}, "INVALID_PARAMETERS", chk, sav)]
    for extra, code, src, dst in cases:
        r = bank.call("transfer_funds", {"from_account_id": src, "to_account_id": dst, **extra})
        assert error_code(r) == code, (extra, r)


def test_pending_holds_reduce_available():
    for seed in range(40):
        w = BankWorld(seed)
        a = w.row("SELECT * FROM accounts WHERE pending_cents > 0")
        if a:
            b = ok(w, "get_balance", account_id=a["id"])
            assert float(b["available"]) == pytest.approx(float(b["balance"]) - float(b["pending"]))
            return
    pytest.fail("no account with pending holds in 40 seeds")


def test_pay_bill_once_from_checking_only(bank):
    chk, sav = ids(bank)
    bill = ok(bank, "list_bills", status="due")["bills"][0]
    assert error_code(bank.call("pay_bill", {"bill_id": bill["bill_id"],
                                             "from_account_id": sav})) == "ACCOUNT_NOT_ELIGIBLE"
    before = available(bank, chk)
    r = ok(bank, "pay_bill", bill_id=bill["bill_id"], from_account_id=chk)
    assert r["amount"] == bill["amount"] and r["confirmation"].startswith("PMT-")
    assert available(bank, chk) == pytest.approx(before - float(bill["amount"]))
    assert bill["bill_id"] in [b["bill_id"] for b in ok(bank, "list_bills", status="paid")["bills"]]
    assert error_code(bank.call("pay_bill", {"bill_id": bill["bill_id"],
                                             "from_account_id": chk})) == "BILL_ALREADY_PAID"


def test_card_freeze_and_unfreeze(bank):
    card = ok(bank, "list_cards")["cards"][0]["card_id"]
    if ok(bank, "list_cards")["cards"][0]["status"] == "frozen":
        ok(bank, "unfreeze_card", card_id=card)
    assert ok(bank, "freeze_card", card_id=card)["status"] == "frozen"
    assert ok(bank, "list_cards")["cards"][0]["status"] == "frozen"
    assert error_code(bank.call("freeze_card", {"card_id": card})) == "CARD_ALREADY_FROZEN"
    ok(bank, "unfreeze_card", card_id=card)
    assert error_code(bank.call("unfreeze_card", {"card_id": card})) == "CARD_NOT_FROZEN"
    assert error_code(bank.call("freeze_card", {"card_id": "card-0"})) == "CARD_NOT_FOUND"


def test_transaction_filters(bank):
    chk, _ = ids(bank)
    dining = ok(bank, "list_transactions", account_id=chk, category="dining", limit=50)
    assert dining["transactions"] and all(t["category"] == "dining" for t in dining["transactions"])
    window = ok(bank, "list_transactions", account_id=chk, date_from="2025-09-01",
                date_to="2025-09-07", limit=50)["transactions"]
    assert all("2025-09-01" <= t["date"] <= "2025-09-07" for t in window)
    dates = [t["date"] for t in window]
    assert dates == sorted(dates, reverse=True)
    page = ok(bank, "list_transactions", account_id=chk, limit=2)
    assert page["count"] == 2 and page["has_more"]


def test_dispute_unauthorized_credits_and_only_once(bank):
    chk, _ = ids(bank)
    t = bank.rows("SELECT * FROM transactions WHERE card_id IS NOT NULL ORDER BY id")[0]
    before = available(bank, chk)
    r = ok(bank, "dispute_transaction", transaction_id=t["id"], reason="unauthorized")
    assert r["provisional_credit"] == f"{-t['amount_cents'] / 100:.2f}"
    assert available(bank, chk) == pytest.approx(before - t["amount_cents"] / 100)
    assert ok(bank, "get_transaction", transaction_id=t["id"])["dispute_id"] == r["dispute_id"]
    assert error_code(bank.call("dispute_transaction", {"transaction_id": t["id"],
                                                        "reason": "duplicate"})) == "ALREADY_DISPUTED"
    income = bank.rows("SELECT id FROM transactions WHERE amount_cents > 0")[0]["id"]
    assert error_code(bank.call("dispute_transaction", {"transaction_id": income,
                                                        "reason": "duplicate"})) == "NOT_DISPUTABLE"
    other = bank.rows("SELECT id FROM transactions WHERE card_id IS NOT NULL ORDER BY id")[1]["id"]
    r2 = ok(bank, "dispute_transaction", transaction_id=other, reason="duplicate")
    assert r2["provisional_credit"] == "0.00" and r2["dispute_id"] != r["dispute_id"]
