"""An online shop: catalogue, cart, orders, cancellations, item returns and store credit."""

from __future__ import annotations

import random
from datetime import date, timedelta
from typing import Any

from envace.envs.world import ID, ToolFailure, World, enum, integer, money, prop, tool

CATALOGUE: dict[str, tuple[tuple[int, int], list[str]]] = {
    # category: ((min, max) price in dollars, item kinds)
    "electronics": ((15, 240), ["Wireless Earbuds", "Bluetooth Speaker", "USB-C Charger",
                                "Mechanical Keyboard", "Webcam", "Smart Watch", "Portable SSD"]),
    "kitchen": ((9, 160), ["Chef Knife", "French Press", "Cast Iron Skillet", "Blender",
                           "Espresso Cups", "Cutting Board", "Electric Kettle"]),
    "outdoor": ((12, 320), ["Camping Tent", "Hiking Backpack", "Water Bottle", "Headlamp",
                            "Sleeping Bag", "Trekking Poles"]),
    "home": ((8, 120), ["Desk Lamp", "Throw Blanket", "Scented Candle", "Wall Clock",
                        "Towel Set", "Plant Pot"]),
    "books": ((7, 45), ["Cookbook", "Travel Guide", "Mystery Novel", "Poetry Collection",
                        "Field Guide"]),
    "toys": ((6, 90), ["Jigsaw Puzzle", "Building Blocks", "Board Game", "Kite", "Plush Bear"]),
}
BRANDS = ["Aurora", "Nimbus", "Cedar", "Vertex", "Lumen", "Harbor", "Nova", "Summit", "Pebble",
          "Orbit", "Juniper", "Atlas"]
FINISHES = ["matte black", "brushed steel", "forest green", "sand", "navy", "white oak", "coral"]
PEOPLE = ["Alex Morgan", "Jamie Chen", "Priya Patel", "Sam Rivera", "Taylor Brooks", "Noor Haddad"]
STREETS = ["Maple Ave", "Harbor St", "Elm Rd", "Sunset Blvd", "Oak Lane"]
CARRIERS = ["UPS", "FedEx", "USPS"]
RETURN_REASONS = ["damaged", "wrong_item", "not_as_described", "no_longer_needed"]
STATUSES = ["placed", "shipped", "delivered", "cancelled"]
PAYMENT_METHODS = ["card", "store_credit"]
SPEEDS = {"standard": (5, 499), "express": (2, 1299)}  # speed: (days to deliver, fee in cents)
FREE_SHIPPING_CENTS = 5000  # standard shipping is free from this subtotal on
RETURN_WINDOW_DAYS = 30
RESTOCKING_FEE_PCT = 10  # charged on "no_longer_needed" returns only

SCHEMA = """
CREATE TABLE products(id TEXT PRIMARY KEY, name TEXT UNIQUE, category TEXT, price_cents INT,
                      stock INT, rating REAL, description TEXT);
CREATE TABLE account(name TEXT, email TEXT, address TEXT, member_since TEXT,
                     store_credit_cents INT);
CREATE TABLE orders(id TEXT PRIMARY KEY, num INT, placed_on TEXT, status TEXT,
                    shipping_speed TEXT, shipping_cents INT, payment_method TEXT, carrier TEXT,
                    tracking_number TEXT, delivered_on TEXT, refunded_cents INT DEFAULT 0);
CREATE TABLE order_items(order_id TEXT, product_id TEXT, quantity INT, unit_price_cents INT,
                         returned_quantity INT DEFAULT 0, PRIMARY KEY(order_id, product_id));
CREATE TABLE cart_items(product_id TEXT PRIMARY KEY, quantity INT);
CREATE TABLE returns(id TEXT PRIMARY KEY, order_id TEXT, product_id TEXT, quantity INT,
                     reason TEXT, refund_cents INT, fee_cents INT, created_on TEXT);
"""


def _tracking(rng: random.Random, carrier: str) -> str:
    if carrier == "UPS":
        return "1Z" + "".join(rng.choice("0123456789ABCDEFGHJKLMNPRTVWXY") for _ in range(12))
    return "".join(rng.choice("0123456789") for _ in range(12 if carrier == "FedEx" else 20))


class ShopWorld(World):
    name = "shop"
    today = date(2025, 3, 14)
    schema = SCHEMA

    def populate(self, rng: random.Random) -> None:
        ids, products = iter(rng.sample(range(100, 1000), 60)), []
        for category, ((lo, hi), kinds) in CATALOGUE.items():
            for kind in rng.sample(kinds, rng.randint(len(kinds) - 2, len(kinds))):
                cents = rng.randint(lo, hi) * 100 + rng.choice([0, 49, 50, 95, 99])
                stock = 0 if rng.random() < 0.12 else rng.randint(1, 40)
                desc = f"{kind} in {rng.choice(FINISHES)}, {rng.randint(1, 5)}-year warranty."
                products.append((f"p-{next(ids)}", f"{rng.choice(BRANDS)} {kind}", category, cents,
                                 stock, round(rng.uniform(3.0, 5.0), 1), desc))
        self.db.executemany("INSERT INTO products VALUES (?,?,?,?,?,?,?)", products)
        person = rng.choice(PEOPLE)
        self.db.execute(
            "INSERT INTO account VALUES (?,?,?,?,?)",
            (person, person.lower().replace(" ", ".") + "@example.com",
             f"{rng.randint(10, 999)} {rng.choice(STREETS)}, Springfield",
             str(date(rng.randint(2018, 2023), rng.randint(1, 12), 1)),
             rng.randint(0, 120) * 100 + rng.choice([0, 25, 50, 75])),
        )
        self._populate_orders(rng)

    def _populate_orders(self, rng: random.Random) -> None:
        products = self.rows("SELECT id, price_cents FROM products ORDER BY id")
        n = rng.randint(5, 8)
        ages = sorted(rng.sample(range(0, 70), n), reverse=True)
        ages[-1] = min(ages[-1], rng.randint(0, 2))  # the latest order is always still open
        num = rng.randint(1000, 8900)
        for i, age in enumerate(ages):
            num += rng.randint(1, 9)  # other customers' orders sit in between
            placed = self.today - timedelta(days=age)
            speed = rng.choice(["standard", "standard", "express"])
            days, fee = SPEEDS[speed]
            status = "placed" if age <= 2 else "shipped" if age < days + 1 else "delivered"
            if i < n - 1 and rng.random() < 0.15:
                status = "cancelled"
            items = rng.sample(products, rng.randint(1, 3))
            lines = [(p["id"], rng.randint(1, 3), p["price_cents"]) for p in items]
            subtotal = sum(q * c for _, q, c in lines)
            if speed == "standard" and subtotal >= FREE_SHIPPING_CENTS:
                fee = 0
            carrier = rng.choice(CARRIERS) if status in ("shipped", "delivered") else None
            arrived = min(placed + timedelta(days=rng.randint(days, days + 2)), self.today)
            delivered = str(arrived) if status == "delivered" else None
            pay = "store_credit" if rng.random() < 0.2 else "card"
            refunded = subtotal + fee if status == "cancelled" else 0
            self.db.execute(
                "INSERT INTO orders VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (f"o-{num}", num, str(placed), status, speed, fee, pay, carrier,
                 _tracking(rng, carrier) if carrier else None, delivered, refunded),
            )
            self.db.executemany(
                "INSERT INTO order_items VALUES (?,?,?,?,0)", [(f"o-{num}", *ln) for ln in lines]
            )
        self.start_sequence("returns", rng.randint(200, 800))

    # -- lookups ------------------------------------------------------------------------

    def _product(self, product_id: str) -> dict[str, Any]:
        return self.by_id("products", "product", product_id)

    def _order(self, order_id: str) -> dict[str, Any]:
        return self.by_id("orders", "order", order_id)

    def _lines(self, order_id: str) -> list[dict[str, Any]]:
        return self.rows(
            "SELECT i.*, p.name FROM order_items i JOIN products p ON p.id = i.product_id "
            "WHERE order_id = ? ORDER BY p.name", order_id)

    def _credit(self) -> int:
        return self.scalar("SELECT store_credit_cents FROM account")

    def _eta(self, o: dict[str, Any]) -> str:
        return str(date.fromisoformat(o["placed_on"]) + timedelta(days=SPEEDS[o["shipping_speed"]][0]))

    def _cart(self) -> dict[str, Any]:
        lines = self.rows(
            "SELECT c.product_id, p.name, p.price_cents, c.quantity FROM cart_items c "
            "JOIN products p ON p.id = c.product_id ORDER BY p.name")
        subtotal = sum(ln["price_cents"] * ln["quantity"] for ln in lines)
        return {
            "items": [{"product_id": ln["product_id"], "name": ln["name"],
                       "unit_price": money(ln["price_cents"]), "quantity": ln["quantity"],
                       "line_total": money(ln["price_cents"] * ln["quantity"])} for ln in lines],
            "item_count": sum(ln["quantity"] for ln in lines),
            "subtotal": money(subtotal),
            "currency": "USD",
        }

    # -- tools --------------------------------------------------------------------------

    @tool("Search the product catalogue by keywords. Returns at most 10 matches, sorted by name.",
          {"query": {"type": "string", "maxLength": 100,
                     "description": "Keywords matched against product names and categories."},
           "category": enum(list(CATALOGUE), "Only return products in this category."),
           "max_price": prop({"type": "number", "minimum": 0, "maximum": 100000},
                             "Only return products at or below this price in USD."),
           "in_stock_only": {"type": "boolean", "description": "Hide sold-out products."}},
          required=("query",))
    def search_products(self, query: str, category: str | None = None,
                        max_price: float | None = None, in_stock_only: bool = False) -> dict:
        words = query.lower().split()
        hits = []
        for p in self.rows("SELECT * FROM products ORDER BY name"):
            text = f"{p['name']} {p['category']}".lower()
            if not all(w in text or w.rstrip("s") in text for w in words):
                continue
            if category and p["category"] != category:
                continue
            if max_price is not None and p["price_cents"] > round(max_price * 100):
                continue
            if in_stock_only and p["stock"] == 0:
                continue
            hits.append({"product_id": p["id"], "name": p["name"], "category": p["category"],
                         "price": money(p["price_cents"]), "in_stock": p["stock"] > 0})
        return {"query": query, "total_results": len(hits), "results": hits[:10]}

    @tool("Get full details of one product: price, stock level, rating and description.",
          {"product_id": prop(ID, "Product id, e.g. 'p-123'.")}, required=("product_id",))
    def get_product(self, product_id: str) -> dict:
        p = self._product(product_id)
        return {"product_id": p["id"], "name": p["name"], "category": p["category"],
                "price": money(p["price_cents"]), "currency": "USD", "stock": p["stock"],
                "rating": p["rating"], "description": p["description"]}

    @tool("Add a quantity of a product to the shopping cart (adds to any quantity already there).",
          {"product_id": prop(ID, "Product id, e.g. 'p-123'."),
           "quantity": integer(1, 20, "How many units to add.")},
          required=("product_id", "quantity"), writes=True)
    def add_to_cart(self, product_id: str, quantity: int) -> dict:
        p = self._product(product_id)
        have = self.scalar("SELECT quantity FROM cart_items WHERE product_id = ?", product_id) or 0
        if have + quantity > p["stock"]:
            raise ToolFailure("OUT_OF_STOCK", f"Only {p['stock']} units of {p['name']} available",
                              available=p["stock"], in_cart=have)
        self.db.execute("INSERT OR REPLACE INTO cart_items VALUES (?, ?)",
                        (product_id, have + quantity))
        return {"added": {"product_id": product_id, "quantity": quantity}, "cart": self._cart()}

    @tool("Remove a product from the shopping cart entirely.",
          {"product_id": prop(ID, "Product id of the cart line to remove.")},
          required=("product_id",), writes=True)
    def remove_from_cart(self, product_id: str) -> dict:
        if not self.db.execute("DELETE FROM cart_items WHERE product_id = ?", (product_id,)).rowcount:
            raise ToolFailure("CART_ITEM_NOT_FOUND", f"Product {product_id!r} is not in the cart")
        return {"removed": product_id, "cart": self._cart()}

    @tool("Show the current shopping cart with line totals and subtotal.")
    def view_cart(self) -> dict:
        return self._cart()

    @tool("Place an order for everything in the cart. Standard shipping is 4.99 (free from 50.00 "
          "subtotal), express is 12.99. Store credit payment needs enough balance.",
          {"shipping_speed": enum(list(SPEEDS), "Delivery speed."),
           "payment_method": enum(PAYMENT_METHODS, "Pay by the card on file or by store credit.")},
          required=("shipping_speed", "payment_method"), writes=True)
    def place_order(self, shipping_speed: str, payment_method: str) -> dict:
        lines = self.rows("SELECT c.*, p.price_cents, p.stock, p.name FROM cart_items c "
                          "JOIN products p ON p.id = c.product_id")
        if not lines:
            raise ToolFailure("CART_EMPTY", "The cart is empty")
        for ln in lines:
            if ln["quantity"] > ln["stock"]:
                raise ToolFailure("OUT_OF_STOCK", f"Only {ln['stock']} units of {ln['name']} left",
                                  product_id=ln["product_id"], available=ln["stock"])
        subtotal = sum(ln["price_cents"] * ln["quantity"] for ln in lines)
        days, fee = SPEEDS[shipping_speed]
        if shipping_speed == "standard" and subtotal >= FREE_SHIPPING_CENTS:
            fee = 0
        total = subtotal + fee
        if payment_method == "store_credit":
            if self._credit() < total:
                raise ToolFailure("INSUFFICIENT_FUNDS", "Store credit does not cover the total",
                                  store_credit=money(self._credit()), total=money(total))
            self.db.execute("UPDATE account SET store_credit_cents = store_credit_cents - ?",
                            (total,))
        num = self.scalar("SELECT MAX(num) FROM orders") + 1
        oid = f"o-{num}"
        self.db.execute("INSERT INTO orders VALUES (?,?,?,'placed',?,?,?,NULL,NULL,NULL,0)",
                        (oid, num, str(self.today), shipping_speed, fee, payment_method))
        for ln in lines:
            self.db.execute("INSERT INTO order_items VALUES (?,?,?,?,0)",
                            (oid, ln["product_id"], ln["quantity"], ln["price_cents"]))
            self.db.execute("UPDATE products SET stock = stock - ? WHERE id = ?",
                            (ln["quantity"], ln["product_id"]))
        self.db.execute("DELETE FROM cart_items")
        return {"order_id": oid, "status": "placed", "subtotal": money(subtotal),
                "shipping": money(fee), "total": money(total), "payment_method": payment_method,
                "estimated_delivery": str(self.today + timedelta(days=days))}

    @tool("List your orders, newest first.",
          {"status": enum(STATUSES, "Only list orders with this status.")})
    def list_orders(self, status: str | None = None) -> dict:
        orders = self.rows(
            "SELECT o.*, SUM(i.quantity) AS n, SUM(i.quantity * i.unit_price_cents) AS sub "
            "FROM orders o JOIN order_items i ON i.order_id = o.id "
            "WHERE ?1 IS NULL OR o.status = ?1 GROUP BY o.id ORDER BY o.num DESC", status)
        return {"orders": [{"order_id": o["id"], "placed_on": o["placed_on"], "status": o["status"],
                            "total": money(o["sub"] + o["shipping_cents"]), "item_count": o["n"]}
                           for o in orders]}

    @tool("Get one order with its items, prices, payment, shipping and refunds.",
          {"order_id": prop(ID, "Order id, e.g. 'o-1042'.")}, required=("order_id",))
    def get_order(self, order_id: str) -> dict:
        o = self._order(order_id)
        lines = self._lines(order_id)
        subtotal = sum(ln["quantity"] * ln["unit_price_cents"] for ln in lines)
        return {
            "order_id": o["id"], "placed_on": o["placed_on"], "status": o["status"],
            "items": [{"product_id": ln["product_id"], "name": ln["name"],
                       "quantity": ln["quantity"], "unit_price": money(ln["unit_price_cents"]),
                       "line_total": money(ln["quantity"] * ln["unit_price_cents"]),
                       "returned_quantity": ln["returned_quantity"]} for ln in lines],
            "subtotal": money(subtotal), "shipping_speed": o["shipping_speed"],
            "shipping": money(o["shipping_cents"]), "total": money(subtotal + o["shipping_cents"]),
            "payment_method": o["payment_method"], "delivered_on": o["delivered_on"],
            "refunded": money(o["refunded_cents"]),
        }

    @tool("Get shipping status, carrier, tracking number and delivery date of an order.",
          {"order_id": prop(ID, "Order id, e.g. 'o-1042'.")}, required=("order_id",))
    def track_shipment(self, order_id: str) -> dict:
        o = self._order(order_id)
        if o["status"] == "cancelled":
            raise ToolFailure("NO_SHIPMENT", f"Order {order_id} was cancelled and will not ship")
        out = {"order_id": o["id"], "status": {"placed": "processing"}.get(o["status"], o["status"]),
               "carrier": o["carrier"], "tracking_number": o["tracking_number"]}
        if o["status"] == "delivered":
            out["delivered_on"] = o["delivered_on"]
        else:
            out["estimated_delivery"] = self._eta(o)
        return out

    @tool("Cancel an order that has not shipped yet; the full total is refunded to the payment "
          "method used.",
          {"order_id": prop(ID, "Order id, e.g. 'o-1042'."),
           "reason": {"type": "string", "maxLength": 200, "description": "Optional note."}},
          required=("order_id",), writes=True)
    def cancel_order(self, order_id: str, reason: str | None = None) -> dict:
        o = self._order(order_id)
        if o["status"] != "placed":
            raise ToolFailure("ORDER_NOT_CANCELLABLE",
                              f"Order {order_id} is {o['status']} and can no longer be cancelled",
                              status=o["status"])
        lines = self._lines(order_id)
        total = sum(ln["quantity"] * ln["unit_price_cents"] for ln in lines) + o["shipping_cents"]
        self.db.execute("UPDATE orders SET status = 'cancelled', refunded_cents = ? WHERE id = ?",
                        (total, order_id))
        for ln in lines:
            self.db.execute("UPDATE products SET stock = stock + ? WHERE id = ?",
                            (ln["quantity"], ln["product_id"]))
        if o["payment_method"] == "store_credit":
            self.db.execute("UPDATE account SET store_credit_cents = store_credit_cents + ?",
                            (total,))
        return {"order_id": order_id, "status": "cancelled",
                "refund": {"amount": money(total), "method": o["payment_method"]}}

    @tool("Return delivered items within 30 days of delivery. Refund is the item price; "
          "'no_longer_needed' returns carry a 10% restocking fee. Shipping is not refunded.",
          {"order_id": prop(ID, "Order id, e.g. 'o-1042'."),
           "product_id": prop(ID, "Product id of the item to return."),
           "quantity": integer(1, 20, "How many units to return."),
           "reason": enum(RETURN_REASONS, "Why the item is returned.")},
          required=("order_id", "product_id", "quantity", "reason"), writes=True)
    def return_item(self, order_id: str, product_id: str, quantity: int, reason: str) -> dict:
        o = self._order(order_id)
        if o["status"] != "delivered":
            raise ToolFailure("ORDER_NOT_RETURNABLE",
                              f"Order {order_id} is {o['status']}; only delivered orders can be "
                              "returned", status=o["status"])
        deadline = date.fromisoformat(o["delivered_on"]) + timedelta(days=RETURN_WINDOW_DAYS)
        if self.today > deadline:
            raise ToolFailure("RETURN_WINDOW_CLOSED", f"The return window closed on {deadline}",
                              deadline=str(deadline))
        ln = self.row("SELECT * FROM order_items WHERE order_id = ? AND product_id = ?",
                      order_id, product_id)
        if ln is None:
            raise ToolFailure("ITEM_NOT_IN_ORDER", f"Product {product_id} is not in order {order_id}")
        left = ln["quantity"] - ln["returned_quantity"]
        if quantity > left:
            raise ToolFailure("INVALID_QUANTITY", f"Only {left} unit(s) can still be returned",
                              returnable=left)
        gross = quantity * ln["unit_price_cents"]
        fee = gross * RESTOCKING_FEE_PCT // 100 if reason == "no_longer_needed" else 0
        refund = gross - fee
        rid = f"r-{self.next_number('returns')}"
        self.db.execute("INSERT INTO returns VALUES (?,?,?,?,?,?,?,?)",
                        (rid, order_id, product_id, quantity, reason, refund, fee, str(self.today)))
        self.db.execute("UPDATE order_items SET returned_quantity = returned_quantity + ? "
                        "WHERE order_id = ? AND product_id = ?", (quantity, order_id, product_id))
        self.db.execute("UPDATE orders SET refunded_cents = refunded_cents + ? WHERE id = ?",
                        (refund, order_id))
        if o["payment_method"] == "store_credit":
            self.db.execute("UPDATE account SET store_credit_cents = store_credit_cents + ?",
                            (refund,))
        return {"return_id": rid, "order_id": order_id, "product_id": product_id,
                "quantity": quantity, "status": "approved", "restocking_fee": money(fee),
                "refund": {"amount": money(refund), "method": o["payment_method"]}}

    @tool("Get your account: name, email, shipping address and store credit balance.")
    def get_account(self) -> dict:
        a = self.row("SELECT * FROM account")
        assert a is not None
        return {"name": a["name"], "email": a["email"], "shipping_address": a["address"],
                "member_since": a["member_since"], "store_credit": money(a["store_credit_cents"]),
                "currency": "USD"}
