"""Shop tasks: scenarios (each solves its task on a live ShopWorld) and example samplers."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from envace.envs.shop import CATALOGUE, RETURN_REASONS, RETURN_WINDOW_DAYS, STATUSES, ShopWorld
from envace.envs.taskgen import Draft, TaskSet, need
from envace.envs.world import World, money

REASON_WORDS = {"damaged": "it arrived damaged", "wrong_item": "it's the wrong item",
                "not_as_described": "it's not as described",
                "no_longer_needed": "I no longer need it"}
PLURAL_REASON_WORDS = {"damaged": "they arrived damaged", "wrong_item": "they're the wrong items",
                       "not_as_described": "they're not as described",
                       "no_longer_needed": "I no longer need them"}
PAY_WORDS = {"card": "my card", "store_credit": "store credit"}
REFUND_TO = {"card": "your card", "store_credit": "your store credit"}
TODAY = ShopWorld.today


def _product(d: Draft, min_stock: int = 1) -> dict[str, Any]:
    return d.pick("SELECT * FROM products WHERE stock >= ?", min_stock)


def _order_on_unique_date(d: Draft, status_sql: str) -> dict[str, Any]:
    """An order the user can name by its date alone (no other order that day)."""
    return d.pick(f"SELECT * FROM orders o WHERE {status_sql} AND (SELECT COUNT(*) FROM orders x "
                  "WHERE x.placed_on = o.placed_on) = 1")


def _returnable_lines(d: Draft, order_id: str | None = None) -> list[dict[str, Any]]:
    cutoff = str(TODAY - timedelta(days=RETURN_WINDOW_DAYS))
    return d.rows("SELECT i.*, p.name, o.placed_on FROM order_items i "
                  "JOIN orders o ON o.id = i.order_id JOIN products p ON p.id = i.product_id "
                  "WHERE o.status = 'delivered' AND o.delivered_on >= ? AND i.returned_quantity = 0 "
                  "AND (? IS NULL OR o.id = ?) ORDER BY i.order_id, p.name",
                  cutoff, order_id, order_id)


def _units(q: int, name: str) -> str:
    return f"the {name}" if q == 1 else f"{q} x {name}"


def _buy(d: Draft, product: dict[str, Any], qty: int, speed: str, pay: str) -> dict:
    """Reference steps of buying ``qty`` of ``product``; the caller found the product already."""
    d.do("add_to_cart", product_id=product["id"], quantity=qty)
    order = d.do("place_order", shipping_speed=speed, payment_method=pay)
    d.expect_call("add_to_cart", product_id=product["id"], quantity=qty)
    d.expect_call("place_order", shipping_speed=speed, payment_method=pay)
    oid = order["order_id"]
    d.expect_state(f"SELECT product_id, quantity FROM order_items WHERE order_id = '{oid}'")
    d.expect_state(f"SELECT status, shipping_speed, payment_method FROM orders WHERE id = '{oid}'")
    return order


def _payment(d: Draft, total_cents: int) -> str:
    credit = d.world.scalar("SELECT store_credit_cents FROM account")
    return d.rng.choice(["card", "store_credit"]) if credit >= total_cents else "card"


def _total_cents(price: int, qty: int, speed: str) -> int:
    sub = price * qty
    fee = 1299 if speed == "express" else 0 if sub >= 5000 else 499
    return sub + fee


# -- difficulty 1 -------------------------------------------------------------------------

def price_check(d: Draft) -> None:
    p = _product(d, 0)
    d.ask(f"How much does the {p['name']} cost, and is it in stock?")
    d.do("search_products", query=p["name"])
    info = d.do("get_product", product_id=p["id"])
    d.expect_call("get_product", product_id=p["id"])
    stock = f"{info['stock']} in stock" if info["stock"] else "it is sold out"
    d.answer(f"The {p['name']} costs ${info['price']}; {stock}.", info["price"])


def tracking_number(d: Draft) -> None:
    o = _order_on_unique_date(d, "status IN ('shipped', 'delivered')")
    d.ask(f"What is the tracking number of my order from {o['placed_on']}?")
    d.do("list_orders")
    t = d.do("track_shipment", order_id=o["id"])
    d.expect_call("track_shipment", order_id=o["id"])
    d.answer(f"Order {o['id']} ships with {t['carrier']}, tracking number {t['tracking_number']}.",
             t["tracking_number"])


def add_to_cart(d: Draft) -> None:
    qty = d.rng.randint(1, 3)
    p = _product(d, qty)
    d.ask(f"Put {_units(qty, p['name'])} in my cart and tell me the cart subtotal.")
    d.do("search_products", query=p["name"])
    cart = d.do("add_to_cart", product_id=p["id"], quantity=qty)["cart"]
    d.expect_call("add_to_cart", product_id=p["id"], quantity=qty)
    d.expect_state("SELECT product_id, quantity FROM cart_items")
    d.answer(f"Added. Your cart subtotal is ${cart['subtotal']}.", cart["subtotal"])


def credit_and_order_total(d: Draft) -> None:
    o = _order_on_unique_date(d, "1")
    d.ask(f"How much store credit do I have, and what was the total of my order from "
          f"{o['placed_on']}?")
    acct = d.do("get_account")
    orders = d.do("list_orders")["orders"]
    total = next(x["total"] for x in orders if x["order_id"] == o["id"])
    d.expect_call("get_account")
    d.expect_call("list_orders")
    d.answer(f"You have ${acct['store_credit']} in store credit; order {o['id']} came to "
             f"${total}.", acct["store_credit"], total)


# -- difficulty 2 -------------------------------------------------------------------------

def cancel_order(d: Draft) -> None:
    latest = d.rows("SELECT * FROM orders ORDER BY num DESC LIMIT 1")[0]
    if latest["status"] == "placed" and d.rng.random() < 0.4:
        o, phrase = latest, "my most recent order"
    else:
        o = _order_on_unique_date(d, "status = 'placed'")
        phrase = f"my order from {o['placed_on']}"
    d.ask(f"Please cancel {phrase} and tell me how much I will get back.")
    d.do("list_orders")
    r = d.do("cancel_order", order_id=o["id"])
    d.expect_call("cancel_order", order_id=o["id"])
    d.expect_state(f"SELECT status FROM orders WHERE id = '{o['id']}'")
    amount = r["refund"]["amount"]
    d.answer(f"Order {o['id']} is cancelled; ${amount} goes back to "
             f"{REFUND_TO[r['refund']['method']]}.", amount)


def cancel_or_track(d: Draft) -> None:
    o = _order_on_unique_date(d, "status IN ('placed', 'shipped')")
    d.ask(f"Cancel my order from {o['placed_on']}. If it has already shipped, tell me its "
          "tracking number instead.")
    d.do("list_orders")
    if o["status"] == "placed":
        r = d.do("cancel_order", order_id=o["id"])
        d.expect_call("cancel_order", order_id=o["id"])
        d.answer(f"Order {o['id']} is cancelled; ${r['refund']['amount']} will be refunded.",
                 r["refund"]["amount"])
    else:
        t = d.do("track_shipment", order_id=o["id"])
        d.expect_call("track_shipment", order_id=o["id"])
        d.answer(f"Order {o['id']} already shipped, so it can't be cancelled. Tracking: "
                 f"{t['carrier']} {t['tracking_number']}.", t["tracking_number"])
    d.expect_state(f"SELECT status FROM orders WHERE id = '{o['id']}'")


def buy_product(d: Draft) -> None:
    qty = d.rng.randint(1, 2)
    p = _product(d, qty)
    speed = d.rng.choice(["standard", "express"])
    pay = _payment(d, _total_cents(p["price_cents"], qty, speed))
    d.ask(f"Order {_units(qty, p['name'])} with {speed} shipping, paid with {PAY_WORDS[pay]}. "
          "What is the total?")
    d.do("search_products", query=p["name"])
    order = _buy(d, p, qty, speed, pay)
    d.answer(f"Order {order['order_id']} is placed; the total is ${order['total']}.", order["total"])


def return_item(d: Draft) -> None:
    lines = _returnable_lines(d)
    need(lines)
    ln = d.rng.choice(lines)
    reason = d.rng.choice(RETURN_REASONS)
    by_id = d.rng.random() < 0.5
    where = f"order {ln['order_id']}" if by_id else f"my order from {ln['placed_on']}"
    if not by_id:
        need(len(d.rows("SELECT id FROM orders WHERE placed_on = ?", ln["placed_on"])) == 1)
    d.ask(f"I want to return {_units(ln['quantity'], ln['name'])} from {where}; "
          f"{REASON_WORDS[reason]}. How much will I get back?")
    if not by_id:
        d.do("list_orders")
    d.do("get_order", order_id=ln["order_id"])
    r = d.do("return_item", order_id=ln["order_id"], product_id=ln["product_id"],
             quantity=ln["quantity"], reason=reason)
    d.expect_call("return_item", order_id=ln["order_id"], product_id=ln["product_id"],
                  quantity=ln["quantity"], reason=reason)
    d.expect_state(f"SELECT quantity, reason FROM returns WHERE order_id = '{ln['order_id']}'")
    amount = r["refund"]["amount"]
    d.answer(f"Return {r['return_id']} is approved; you will get ${amount} back.", amount)


def cheaper_of_two(d: Draft) -> None:
    a, b = d.rng.sample(d.rows("SELECT * FROM products WHERE stock > 0 ORDER BY id"), 2)
    need(a["price_cents"] != b["price_cents"])
    cheap = min(a, b, key=lambda p: p["price_cents"])
    d.ask(f"Add whichever is cheaper, the {a['name']} or the {b['name']}, to my cart.")
    d.do("search_products", query=a["name"])
    d.do("search_products", query=b["name"])
    d.do("add_to_cart", product_id=cheap["id"], quantity=1)
    d.expect_call("add_to_cart", product_id=cheap["id"], quantity=1)
    d.expect_state("SELECT product_id, quantity FROM cart_items")
    d.answer(f"The {cheap['name']} is cheaper at ${money(cheap['price_cents'])}; it is in your "
             "cart.", money(cheap["price_cents"]))


# -- difficulty 3 -------------------------------------------------------------------------

def cheapest_in_category(d: Draft) -> None:
    category = d.rng.choice(list(CATALOGUE))
    stocked = d.rows("SELECT * FROM products WHERE category = ? AND stock > 0 "
                     "ORDER BY price_cents, id", category)
    need(len(stocked) >= 3 and stocked[0]["price_cents"] < stocked[1]["price_cents"])
    cap = (stocked[-1]["price_cents"] // 1000 + 1) * 10  # a round cap above all of them
    p, speed = stocked[0], "express"
    pay = _payment(d, _total_cents(p["price_cents"], 1, speed))
    d.ask(f"Buy the cheapest in-stock {category} item under ${cap} with express shipping, paid "
          f"with {PAY_WORDS[pay]}. Tell me what it was and the order total.")
    d.do("search_products", query="", category=category, max_price=cap, in_stock_only=True)
    order = _buy(d, p, 1, speed, pay)
    d.answer(f"I ordered the {p['name']} (order {order['order_id']}); the total is "
             f"${order['total']}.", p["name"], order["total"])


def cancel_and_reorder(d: Draft) -> None:
    o = _order_on_unique_date(d, "status = 'placed'")
    lines = d.rows("SELECT i.*, p.name, p.price_cents FROM order_items i JOIN products p "
                   "ON p.id = i.product_id WHERE order_id = ? ORDER BY p.id", o["id"])
    need(len(lines) >= 2)
    keep = d.rng.choice(lines)
    d.ask(f"Cancel my order from {o['placed_on']} and reorder only {_units(keep['quantity'], keep['name'])}"
          " with standard shipping, paid by card. Tell me the refund and the new total.")
    d.do("list_orders")
    d.do("get_order", order_id=o["id"])
    r = d.do("cancel_order", order_id=o["id"])
    d.expect_call("cancel_order", order_id=o["id"])
    d.expect_state(f"SELECT status FROM orders WHERE id = '{o['id']}'")
    product = {"id": keep["product_id"]}
    order = _buy(d, product, keep["quantity"], "standard", "card")
    d.answer(f"Cancelled {o['id']} (refund ${r['refund']['amount']}) and placed "
             f"{order['order_id']} for ${order['total']}.", r["refund"]["amount"], order["total"])


def return_two_items(d: Draft) -> None:
    by_order: dict[str, list[dict[str, Any]]] = {}
    for ln in _returnable_lines(d):
        by_order.setdefault(ln["order_id"], []).append(ln)
    need(any(len(v) >= 2 for v in by_order.values()))
    oid = d.rng.choice(sorted(k for k, v in by_order.items() if len(v) >= 2))
    first, second = d.rng.sample(by_order[oid], 2)
    reason = d.rng.choice(RETURN_REASONS)
    d.ask(f"Return {_units(first['quantity'], first['name'])} and "
          f"{_units(second['quantity'], second['name'])} from order {oid}; "
          f"{PLURAL_REASON_WORDS[reason]}. "
          "What is my total refund?")
    d.do("get_order", order_id=oid)
    cents = 0
    for ln in (first, second):
        r = d.do("return_item", order_id=oid, product_id=ln["product_id"],
                 quantity=ln["quantity"], reason=reason)
        d.expect_call("return_item", order_id=oid, product_id=ln["product_id"],
                      quantity=ln["quantity"])
        cents += round(float(r["refund"]["amount"]) * 100)
    d.expect_state(f"SELECT product_id, quantity FROM returns WHERE order_id = '{oid}' "
                   "ORDER BY product_id")
    d.answer(f"Both returns are approved; your total refund is ${money(cents)}.", money(cents))


def better_rated(d: Draft) -> None:
    a, b = d.rng.sample(d.rows("SELECT * FROM products WHERE stock >= 2 ORDER BY id"), 2)
    need(a["rating"] != b["rating"])
    best = max(a, b, key=lambda p: p["rating"])
    d.ask(f"Which is rated higher, the {a['name']} or the {b['name']}? Put 2 of the better-rated "
          "one in my cart and tell me its rating.")
    for p in (a, b):
        d.do("search_products", query=p["name"])
        d.do("get_product", product_id=p["id"])
    d.do("add_to_cart", product_id=best["id"], quantity=2)
    d.expect_call("get_product", product_id=a["id"])
    d.expect_call("get_product", product_id=b["id"])
    d.expect_call("add_to_cart", product_id=best["id"], quantity=2)
    d.expect_state("SELECT product_id, quantity FROM cart_items")
    d.answer(f"The {best['name']} is rated higher ({best['rating']}); 2 are in your cart.",
             str(best["rating"]))


# -- example samplers: plausible arguments for each tool, from the world's own data -------

def _any(w: World, rng: random.Random, sql: str) -> Any:
    rows = sorted(w.db.execute(sql).fetchall())  # sorted: never depend on the query plan
    return rng.choice(rows)[0] if rows else None


def _some_product(w: World, rng: random.Random) -> str:
    return _any(w, rng, "SELECT id FROM products")


def _some_order(w: World, rng: random.Random) -> str:
    return _any(w, rng, "SELECT id FROM orders")


def _return_args(w: World, rng: random.Random) -> dict[str, Any] | None:
    row = w.db.execute("SELECT i.order_id, i.product_id, i.quantity FROM order_items i JOIN "
                       "orders o ON o.id = i.order_id WHERE o.status = 'delivered' "
                       "ORDER BY i.order_id, i.product_id").fetchall()
    if not row:
        return None
    oid, pid, q = rng.choice(row)
    return {"order_id": oid, "product_id": pid, "quantity": q, "reason": rng.choice(RETURN_REASONS)}


SAMPLERS = {
    "search_products": lambda w, r: r.choice([
        {"query": _any(w, r, "SELECT name FROM products")},
        {"query": _any(w, r, "SELECT name FROM products").split()[-1].lower()},
        {"query": "", "category": r.choice(list(CATALOGUE)), "in_stock_only": True}]),
    "get_product": lambda w, r: {"product_id": _some_product(w, r)},
    "add_to_cart": lambda w, r: {"product_id": _some_product(w, r), "quantity": r.randint(1, 2)},
    "remove_from_cart": lambda w, r: {"product_id": _some_product(w, r)},
    "view_cart": lambda w, r: {},
    "place_order": lambda w, r: {"shipping_speed": r.choice(["standard", "express"]),
                                 "payment_method": "card"},
    "list_orders": lambda w, r: r.choice([{}, {"status": r.choice(STATUSES)}]),
    "get_order": lambda w, r: {"order_id": _some_order(w, r)},
    "track_shipment": lambda w, r: {"order_id": _some_order(w, r)},
    "cancel_order": lambda w, r: {"order_id": r.random() < 0.7 and _any(
        w, r, "SELECT id FROM orders WHERE status = 'placed'") or _some_order(w, r)},
    "return_item": _return_args,
    "get_account": lambda w, r: {},
}

TASKS = TaskSet(
    world="shop",
    scenarios={1: [price_check, tracking_number, add_to_cart, credit_and_order_total],
               2: [cancel_order, cancel_or_track, buy_product, return_item, cheaper_of_two],
               3: [cheapest_in_category, cancel_and_reorder, return_two_items, better_rated]},
    samplers=SAMPLERS,
)
