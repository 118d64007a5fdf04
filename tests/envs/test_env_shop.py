"""Shop world: writes show up in later reads, domain errors are the realistic ones."""

from __future__ import annotations

import pytest

from envace.core.errors import error_code, is_error
from envace.envs.shop import ShopWorld


@pytest.fixture
def shop() -> ShopWorld:
    return ShopWorld(11)


def ok(world: ShopWorld, tool: str, **args) -> dict:
    result = world.call(tool, args)
    assert not is_error(result), result
    return result


def in_stock(shop: ShopWorld, at_least: int = 1) -> dict:
    return shop.rows("SELECT * FROM products WHERE stock >= ? ORDER BY id", at_least)[0]


def test_search_finds_by_name_and_filters(shop):
    p = in_stock(shop)
    hits = ok(shop, "search_products", query=p["name"].lower())["results"]
    assert [h["product_id"] for h in hits] == [p["id"]]
    cheap = ok(shop, "search_products", query="", max_price=20)["results"]
    assert all(float(h["price"]) <= 20 for h in cheap)
    books = ok(shop, "search_products", query="", category="books", in_stock_only=True)
    assert all(h["category"] == "books" and h["in_stock"] for h in books["results"])
    assert error_code(shop.call("search_products", {"query": "x", "category": "cars"})) == "INVALID_PARAMETERS"


def test_cart_then_order_changes_stock_orders_and_cart(shop):
    p = in_stock(shop, 2)
    assert ok(shop, "add_to_cart", product_id=p["id"], quantity=2)["cart"]["item_count"] == 2
    before = {o["order_id"] for o in ok(shop, "list_orders")["orders"]}
    order = ok(shop, "place_order", shipping_speed="express", payment_method="card")
    assert order["order_id"] not in before and order["status"] == "placed"
    assert float(order["total"]) == pytest.approx(2 * p["price_cents"] / 100 + 12.99)
    assert ok(shop, "list_orders")["orders"][0]["order_id"] == order["order_id"]
    assert ok(shop, "get_product", product_id=p["id"])["stock"] == p["stock"] - 2
    assert ok(shop, "view_cart")["items"] == []
    assert error_code(shop.call("place_order", {"shipping_speed": "standard",
                                                "payment_method": "card"})) == "CART_EMPTY"


def test_cart_rejects_more_than_stock_and_unknown_products(shop):
    p = in_stock(shop)
    r = shop.call("add_to_cart", {"product_id": p["id"], "quantity": p["stock"] + 1})
    assert error_code(r) == "OUT_OF_STOCK" and r["error"]["available"] == p["stock"]
    assert error_code(shop.call("add_to_cart", {"product_id": "p-0", "quantity": 1})) == "PRODUCT_NOT_FOUND"
    assert error_code(shop.call("remove_from_cart", {"product_id": p["id"]})) == "CART_ITEM_NOT_FOUND"


def test_store_credit_must_cover_the_total(shop):
    credit = shop.scalar("SELECT store_credit_cents FROM account")
    p = shop.rows("SELECT * FROM products WHERE stock > 0 AND price_cents > ?", credit)[0]
    ok(shop, "add_to_cart", product_id=p["id"], quantity=1)
    r = shop.call("place_order", {"shipping_speed": "standard", "payment_method": "store_credit"})
    assert error_code(r) == "INSUFFICIENT_FUNDS"
    assert shop.query("SELECT COUNT(*) FROM cart_items") == [[1]]  # failed order left the cart


def test_cancel_refunds_once_and_only_unshipped_orders(shop):
    placed = shop.rows("SELECT id FROM orders WHERE status = 'placed'")[0]["id"]
    total = ok(shop, "get_order", order_id=placed)["total"]
    r = ok(shop, "cancel_order", order_id=placed)
    assert r["refund"]["amount"] == total and r["status"] == "cancelled"
    assert ok(shop, "get_order", order_id=placed)["status"] == "cancelled"
    assert ok(shop, "get_order", order_id=placed)["refunded"] == total
    assert error_code(shop.call("cancel_order", {"order_id": placed})) == "ORDER_NOT_CANCELLABLE"
    delivered = shop.rows("SELECT id FROM orders WHERE status = 'delivered'")[0]["id"]
    assert error_code(shop.call("cancel_order", {"order_id": delivered})) == "ORDER_NOT_CANCELLABLE"
    assert error_code(shop.call("cancel_order", {"order_id": "o-1"})) == "ORDER_NOT_FOUND"


def _returnable(seed_range=range(40)):
    for seed in seed_range:
        w = ShopWorld(seed)
        rows = w.rows("SELECT i.*, o.payment_method FROM order_items i JOIN orders o ON o.id = "
                      "i.order_id WHERE o.status = 'delivered' AND o.delivered_on >= '2025-02-12'")
        if rows:
            return w, rows[0]
    raise AssertionError("no returnable line in 40 seeds")


@pytest.mark.parametrize("reason,fee_pct", [("damaged", 0), ("no_longer_needed", 10)])
def test_return_refunds_item_price_minus_fee(reason, fee_pct):
    w, ln = _returnable()
    gross = ln["quantity"] * ln["unit_price_cents"]
    r = ok(w, "return_item", order_id=ln["order_id"], product_id=ln["product_id"],
           quantity=ln["quantity"], reason=reason)
    assert r["refund"]["amount"] == f"{(gross - gross * fee_pct // 100) / 100:.2f}"
    item = next(i for i in ok(w, "get_order", order_id=ln["order_id"])["items"]
                if i["product_id"] == ln["product_id"])
    assert item["returned_quantity"] == ln["quantity"]
    again = w.call("return_item", {"order_id": ln["order_id"], "product_id": ln["product_id"],
                                   "quantity": 1, "reason": reason})
    assert error_code(again) == "INVALID_QUANTITY"


def test_return_rules():
    w = ShopWorld(11)
    old = w.rows("SELECT i.* FROM order_items i JOIN orders o ON o.id = i.order_id "
                 "WHERE o.status = 'delivered' AND o.delivered_on < '2025-02-12'")
    if old:
        assert error_code(w.call("return_item", {"order_id": old[0]["order_id"],
                                                 "product_id": old[0]["product_id"],
                                                 "quantity": 1, "reason": "damaged"})) == "RETURN_WINDOW_CLOSED"
    placed = w.rows("SELECT i.* FROM order_items i JOIN orders o ON o.id = i.order_id "
                    "WHERE o.status = 'placed'")[0]
    assert error_code(w.call("return_item", {"order_id": placed["order_id"],
                                             "product_id": placed["product_id"], "quantity": 1,
                                             "reason": "damaged"})) == "ORDER_NOT_RETURNABLE"


def test_track_shipment_by_status(shop):
    for o in shop.rows("SELECT * FROM orders"):
        r = shop.call("track_shipment", {"order_id": o["id"]})
        if o["status"] == "cancelled":
            assert error_code(r) == "NO_SHIPMENT"
        elif o["status"] == "placed":
            assert r["status"] == "processing" and r["tracking_number"] is None
        else:
            assert r["tracking_number"] == o["tracking_number"] and r["carrier"]


def test_store_credit_refund_goes_back_to_credit():
    for seed in range(60):
        w = ShopWorld(seed)
        o = w.row("SELECT id FROM orders WHERE status = 'placed' AND payment_method = 'store_credit'")
        if o:
            break
    else:
        pytest.skip("no store-credit order in 60 seeds")
    before = ok(w, "get_account")["store_credit"]
    refund = ok(w, "cancel_order", order_id=o["id"])["refund"]
    assert refund["method"] == "store_credit"
    after = ok(w, "get_account")["store_credit"]
    assert float(after) == pytest.approx(float(before) + float(refund["amount"]))
