"""VitaBench (Meituan LongCat, MIT): delivery and in-store tasks, tools implemented here.

Each VitaBench task carries its own environment state (time, user profile, locations, weather,
stores/shops with products, existing orders and reservations), a user scenario and evaluation
criteria (``expected_states``: the orders the episode must leave behind, with ``state_rubrics``;
``overall_rubrics``: natural-language criteria). We implement the two domains' tools ourselves over
that state (``VitaWorld``; none of VitaBench's code is used), check the final orders against
``expected_states`` (any alternative may match), and judge the rubrics through our judge backend
(a policy model answering YES/NO per rubric). A task succeeds when its state check passes and
every overall rubric is judged met (VitaBench counts a task solved only when all rubrics hold).

Data: ``<data>/vitabench/{delivery,instore}/tasks_en.json`` (read in place). OTA and cross-domain
tasks are not in this store (too large); a user with internet takes them from
https://github.com/meituan-longcat/vitabench (``data/``) - their tools are not implemented here.
"""

from __future__ import annotations

import copy
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from envace.benchmarks.base import BenchEpisode, BenchItem, BenchScore, Category, per_category_accuracy
from envace.benchmarks.data import bench_dir
from envace.benchmarks.judge import YesNoJudge
from envace.benchmarks.users import DEFAULT_GUIDELINES, LLMUser
from envace.core.errors import INVALID_PARAMETERS, tool_error
from envace.core.types import FunctionSpec, Task, ToolCall, ToolSpec

DOMAINS = ["delivery", "instore"]
NOT_HERE = {"ota": "OTA (travel) tasks are not in the data store (too large); tools not implemented",
            "cross_domain": "cross-domain tasks are not in the data store and need the OTA tools"}
# paid, and the later stages of a paid order (the shop took it, it is on its way or delivered; a paid
# reservation or voucher not used yet, or used): an expected state taken later in the day shows those
PAID = {"paid", "processed", "in-progress", "delivered", "unconsumed", "consumed"}

_S = {"type": "string"}
_PRODUCTS = {"type": "array", "items": {"type": "object", "properties": {
    "product_id": _S, "quantity": {"type": "integer", "minimum": 1}, "attributes": _S},
    "required": ["product_id", "quantity"]}, "description": "Products and quantities to order."}


def _spec(name: str, description: str, props: dict[str, Any] | None = None, required: tuple[str, ...] = ()) -> ToolSpec:
    return ToolSpec(function=FunctionSpec(name=name, description=description, parameters={
        "type": "object", "properties": props or {}, "required": list(required)}))


COMMON_TOOLS = [
    _spec("get_current_time", "The current date and time."),
    _spec("get_user_profile", "The user's profile and historical preferences."),
    _spec("get_user_locations", "The user's saved addresses (with coordinates)."),
    _spec("get_weather", "Weather forecast for a city and date.", {"city": _S, "date": {**_S, "description": "YYYY-MM-DD"}}),
    _spec("list_orders", "The user's orders and reservations."),
    _spec("pay_order", "Pay an unpaid order or reservation.", {"order_id": _S}, ("order_id",)),
    _spec("cancel_order", "Cancel an order or reservation.", {"order_id": _S}, ("order_id",)),
]
DELIVERY_TOOLS = [
    _spec("search_stores", "Search delivery stores by keyword (name, product or tag); empty keyword lists all.",
          {"keyword": _S}),
    _spec("get_store_products", "The products a store sells.", {"store_id": _S}, ("store_id",)),
    _spec("distance_to_store", "Distance in metres from an address of the user to a store.",
          {"store_id": _S, "address": _S}, ("store_id", "address")),
    _spec("create_delivery_order", "Create an (unpaid) delivery order.",
          {"store_id": _S, "products": _PRODUCTS, "address": _S, "delivery_time": _S, "note": _S},
          ("store_id", "products", "address")),
]
INSTORE_TOOLS = [
    _spec("search_shops", "Search in-store service shops by keyword (name, product or tag).", {"keyword": _S}),
    _spec("get_shop_products", "The products (vouchers, services) a shop sells.", {"shop_id": _S}, ("shop_id",)),
    _spec("distance_to_store", "Distance in metres from an address of the user to a shop.",
          {"store_id": _S, "address": _S}, ("store_id", "address")),
    _spec("create_instore_order", "Create an (unpaid) in-store order.", {"shop_id": _S, "products": _PRODUCTS},
          ("shop_id", "products")),
    _spec("book_table", "Book a table or visit at a shop that takes bookings; the booking is unpaid until paid "
          "where the shop charges a deposit.",
          {"shop_id": _S, "book_time": {**_S, "description": "YYYY-MM-DD HH:MM:SS"},
           "customer_count": {"type": "integer", "minimum": 1}}, ("shop_id", "book_time", "customer_count")),
    _spec("make_reservation", "Reserve a visit at a shop (free; no payment needed).",
          {"shop_id": _S, "reservation_time": {**_S, "description": "YYYY-MM-DD HH:MM:SS"},
           "customer_count": {"type": "integer", "minimum": 1}}, ("shop_id", "reservation_time", "customer_count")),
]


def _haversine(a: dict, b: dict) -> float:
    la1, lo1, la2, lo2 = map(math.radians, (a["latitude"], a["longitude"], b["latitude"], b["longitude"]))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    return 2 * 6371000 * math.asin(math.sqrt(h))


class VitaWorld:
    """One task's environment: its stores/shops, orders and reservations, as a World-like object."""

    def __init__(self, task: dict[str, Any]) -> None:
        self.task_id, self.domain = str(task["id"]), task["domain"]
        self.env = copy.deepcopy(task["environment"])
        self.orders: dict[str, dict] = dict(self.env.get("orders") or {})
        self.reservations: dict[str, dict] = dict(self.env.get("reservations") or {})
        self.books: dict[str, dict] = dict(self.env.get("books") or {})
        self.stores: dict[str, dict] = self.env.get("stores") or self.env.get("shops") or {}
        self.calls: list[tuple[ToolCall, dict]] = []
        self._seq = 0
        self._specs = COMMON_TOOLS + (DELIVERY_TOOLS if self.domain == "delivery" else INSTORE_TOOLS)

    # -- World interface
    def tools(self) -> list[ToolSpec]:
        return [ToolSpec.model_validate(s.model_dump()) for s in self._specs]

    def call(self, name: str, arguments: dict) -> dict:
        args = dict(arguments) if isinstance(arguments, dict) else {}
        fn = getattr(self, f"_t_{name}", None) if name in {s.name for s in self._specs} else None
        if fn is None:
            result = tool_error("TOOL_NOT_AVAILABLE", f"Tool {name!r} is not available")
        else:
            try:
                result = fn(**args)
            except TypeError as e:
                result = tool_error(INVALID_PARAMETERS, str(e))
            except (KeyError, ValueError) as e:
                result = tool_error("NOT_FOUND", str(e).strip("'\""))
        self.calls.append((ToolCall(name=str(name), arguments=copy.deepcopy(args)), result))
        return result

    # -- helpers
    def _now(self) -> str:
        return self.env["time"]

    def _new_id(self) -> str:
        self._seq += 1
        return f"{self.task_id}T{self._seq:02d}" if self.domain == "delivery" else f"{self.task_id}T{self._seq:03d}"

    def _store(self, store_id: str) -> dict:
        if store_id not in self.stores:
            raise KeyError(f"store {store_id} not found")
        return self.stores[store_id]

    def _lines(self, store: dict, products: list[dict]) -> tuple[list[dict], float]:
        by_id = {p["product_id"]: p for p in store.get("products", [])}
        lines, total = [], 0.0
        for line in products:
            p = by_id.get(line.get("product_id"))
            if p is None:
                raise KeyError(f"product {line.get('product_id')} not sold by {store.get('store_id') or store.get('shop_id')}")
            q = int(line.get("quantity", 1))
            if "quantity" in p and isinstance(p["quantity"], int) and p.get("quantity", 1) < q:
                raise ValueError(f"product {p['product_id']} is sold out")
            lines.append({"product_id": p["product_id"], "price": p["price"], "quantity": q,
                          "attributes": line.get("attributes", "")})
            total += p["price"] * q
        return lines, round(total, 2)

    def _summary(self, s: dict) -> dict:
        return {"id": s.get("store_id") or s.get("shop_id"), "name": s.get("name") or s.get("shop_name"),
                "score": s.get("score"), "tags": s.get("tags", []), "address": s.get("location", {}).get("address"),
                **({"enable_reservation": s.get("enable_reservation")} if "enable_reservation" in s else {})}

    def _search(self, keyword: str = "") -> dict:
        kw = (keyword or "").lower()
        hits = []
        for s in self.stores.values():
            text = " ".join([str(s.get("name") or s.get("shop_name") or ""), *s.get("tags", []),
                             *[p.get("name", "") + " " + " ".join(p.get("tags", [])) for p in s.get("products", [])]])
            if not kw or any(w in text.lower() for w in kw.split()):
                hits.append(self._summary(s))
        return {"stores": hits}

    # -- tools
    def _t_get_current_time(self) -> dict:
        return {"time": self._now()}

    def _t_get_user_profile(self) -> dict:
        return {"user_id": self.env.get("user_id"), "profile": self.env.get("user_historical_behaviors", {})}

    def _t_get_user_locations(self) -> dict:
        return {"locations": self.env.get("location", [])}

    def _t_get_weather(self, city: str = "", date: str = "") -> dict:
        rows = [w for w in self.env.get("weather", []) if (not city or city.lower().split()[0] in w["city"].lower())
                and (not date or w["datetime"] == date)]
        return {"weather": rows}

    def _t_list_orders(self) -> dict:
        return {"orders": list(self.orders.values()), "reservations": list(self.reservations.values()),
                **({"bookings": list(self.books.values())} if self.domain == "instore" else {})}

    def _record(self, order_id: str) -> dict | None:
        return self.orders.get(order_id) or self.reservations.get(order_id) or self.books.get(order_id)

    def _t_pay_order(self, order_id: str) -> dict:
        rec = self._record(order_id)
        if rec is None:
            raise KeyError(f"order {order_id} not found")
        if rec["status"] != "unpaid":
            return tool_error("INVALID_STATE", f"order {order_id} is {rec['status']}, not unpaid")
        rec["status"], rec["update_time"] = "paid", self._now()
        return {"order_id": order_id, "status": "paid"}

    def _t_cancel_order(self, order_id: str) -> dict:
        rec = self._record(order_id)
        if rec is None:
            raise KeyError(f"order {order_id} not found")
        if rec["status"] in ("cancelled", "delivered"):
            return tool_error("INVALID_STATE", f"order {order_id} is {rec['status']}")
        rec["status"], rec["update_time"] = "cancelled", self._now()
        return {"order_id": order_id, "status": "cancelled"}

    def _t_search_stores(self, keyword: str = "") -> dict:
        return self._search(keyword)

    _t_search_shops = _t_search_stores

    def _t_get_store_products(self, store_id: str) -> dict:
        return {"products": self._store(store_id).get("products", [])}

    def _t_get_shop_products(self, shop_id: str) -> dict:
        return self._t_get_store_products(shop_id)

    def _t_distance_to_store(self, store_id: str, address: str) -> dict:
        store = self._store(store_id)
        loc = next((l for l in self.env.get("location", []) if l["address"] == address
                    or address.lower() in l["address"].lower()), None)
        if loc is None or "latitude" not in store.get("location", {}):
            raise KeyError(f"address {address!r} is not one of the user's saved locations")
        return {"store_id": store_id, "distance_m": round(_haversine(loc, store["location"]))}

    def _t_create_delivery_order(self, store_id: str, products: list[dict], address: str, delivery_time: str = "",
                                 note: str = "") -> dict:
        store = self._store(store_id)
        lines, total = self._lines(store, products)
        loc = next((l for l in self.env.get("location", []) if l["address"] == address), {"address": address})
        oid = self._new_id()
        self.orders[oid] = {"order_id": oid, "order_type": "delivery", "user_id": self.env.get("user_id"),
                            "store_id": store_id, "note": note, "location": loc, "dispatch_time": "",
                            "shipping_time": None, "delivery_time": delivery_time, "total_price": total,
                            "create_time": self._now(), "update_time": self._now(), "status": "unpaid",
                            "products": lines}
        return {"order_id": oid, "total_price": total, "status": "unpaid"}

    def _t_create_instore_order(self, shop_id: str, products: list[dict]) -> dict:
        shop = self._store(shop_id)
        lines, total = self._lines(shop, products)
        oid = self._new_id()
        self.orders[oid] = {"order_id": oid, "order_type": "instore", "user_id": self.env.get("user_id"),
                            "store_id": shop_id, "note": "", "location": None, "total_price": total,
                            "create_time": self._now(), "update_time": self._now(), "status": "unpaid",
                            "products": lines}
        return {"order_id": oid, "total_price": total, "status": "unpaid"}

    def _t_book_table(self, shop_id: str, book_time: str, customer_count: int) -> dict:
        shop = self._store(shop_id)
        if not shop.get("enable_book"):
            return tool_error("NOT_SUPPORTED", f"shop {shop_id} does not take bookings")
        price = shop.get("book_price") or 0
        bid = self._new_id()
        self.books[bid] = {"book_id": bid, "shop_id": shop_id, "book_time": book_time,
                           "customer_count": int(customer_count), "book_price": price,
                           "customer_id": self.env.get("user_id"), "status": "unpaid" if price > 0 else "paid",
                           "update_time": self._now()}
        return {"book_id": bid, "book_price": price, "status": self.books[bid]["status"]}

    def _t_make_reservation(self, shop_id: str, reservation_time: str, customer_count: int) -> dict:
        self._store(shop_id)  # a free reservation: any shop takes one (as in VitaBench), nothing to pay
        rid = self._new_id()
        self.reservations[rid] = {"reservation_id": rid, "shop_id": shop_id, "reservation_time": reservation_time,
                                  "update_time": self._now(), "customer_id": self.env.get("user_id"),
                                  "customer_count": int(customer_count), "status": "unconsumed"}
        return {"reservation_id": rid, "status": "unconsumed"}


# -- state check ------------------------------------------------------------------------------


def _status_ok(want: str, got: str) -> bool:
    return want == got or (want in PAID and got in PAID)


def _order_matches(want: dict, got: dict) -> bool:
    for key, time_key in (("reservation_id", "reservation_time"), ("book_id", "book_time")):
        if key in want:  # a reservation or a (deposit) booking
            return (key in got and got.get("shop_id") == want.get("shop_id")
                    and str(got.get(time_key, ""))[:16] == str(want.get(time_key, ""))[:16]
                    and int(got.get("customer_count", 0)) == int(want.get("customer_count", 0))
                    and _status_ok(want.get("status", ""), got.get("status", "")))
    if "reservation_id" in got or "book_id" in got:
        return False
    if got.get("store_id") != want.get("store_id") or not _status_ok(want.get("status", ""), got.get("status", "")):
        return False
    items = lambda o: Counter((p.get("product_id"), int(p.get("quantity", 1))) for p in o.get("products", []))  # noqa: E731
    return items(want) == items(got)


def check_state(world: VitaWorld, expected_states: list[dict]) -> dict[str, Any]:
    """Do the final orders/reservations satisfy one of the expected states (required orders all
    present, matched one-to-one on store, products and quantities, status)?"""
    final = list(world.orders.values()) + list(world.reservations.values()) + list(world.books.values())
    for k, alt in enumerate(expected_states or []):
        free = list(final)
        ok = True
        for want in alt.get("required_orders", []):
            hit = next((g for g in free if _order_matches(want, g)), None)
            if hit is None:
                ok = False
                break
            free.remove(hit)
        if ok:
            return {"state_ok": True, "matched_alternative": k}
    return {"state_ok": not expected_states, "matched_alternative": None}


# -- rubric judge -----------------------------------------------------------------------------

JUDGE_SYSTEM = ("You grade a conversation between a user and an assistant that uses tools. Answer YES if the "
                "conversation and the final orders satisfy the criterion, NO otherwise, then one short reason.")


class RubricJudge(YesNoJudge):
    """Judges each rubric YES/NO with a policy backend (our judge backend; any model spec)."""

    def __init__(self, backend: Any, max_new_tokens: int = 16) -> None:
        super().__init__(backend, system=JUDGE_SYSTEM, max_new_tokens=max_new_tokens)


def transcript(episode: BenchEpisode, world: VitaWorld | None) -> str:
    lines = [f"{m.role}: {m.content}" for m in episode.messages if m.role in ("user", "assistant")]
    if world is not None:
        lines.append("final orders: " + json.dumps(list(world.orders.values()) + list(world.reservations.values()),
                                                  ensure_ascii=False)[:3000])
    return "\n".join(lines)


# -- the adapter ------------------------------------------------------------------------------


def _task_file(domain: str, data_dir: str | Path | None) -> Path:
    return bench_dir("vitabench", data_dir) / domain / "tasks_en.json"


def scenario_text(task: dict[str, Any]) -> str:
    prof = task.get("user_scenario", {}).get("user_profile", {})
    profile = "; ".join(f"{k}: {v}" for k, v in prof.items())
    return f"Profile: {profile}\nInstructions: {task.get('instructions', '')}"


class VitaBenchAdapter:
    name = "vitabench"
    title = "VitaBench (Meituan; life-service agent tasks)"
    licence = "MIT"
    needs = "its task files in <data>/vitabench/ (no package); a user-simulator and a judge model"

    def __init__(self) -> None:
        self.judge: RubricJudge | None = None

    def available(self, data_dir: Path | None = None) -> tuple[bool, str]:
        found = [d for d in DOMAINS if _task_file(d, data_dir).exists()]
        if found:
            return True, f"task files for {', '.join(found)} at {bench_dir('vitabench', data_dir)}"
        return False, f"no task files under {bench_dir('vitabench', data_dir)}"

    def categories(self) -> list[Category]:
        return ([Category(d, True, "", "domain") for d in DOMAINS]
                + [Category(d, False, f"not available here: {why}", "domain") for d, why in NOT_HERE.items()])

    def count(self, category: str, data_dir: Path | None = None, version: str | None = None) -> int | None:
        p = _task_file(category, data_dir) if category in DOMAINS else None
        return len(json.loads(p.read_text())) if p is not None and p.exists() else None

    def load(self, category: str, limit: int | None = None, data_dir: Path | str | None = None,
             version: str | None = None) -> list[BenchItem]:
        if category not in DOMAINS:
            raise ValueError(f"vitabench category {category!r} is not available here: "
                             f"{NOT_HERE.get(category, 'choose delivery or instore')}")
        path = _task_file(category, data_dir)
        if not path.exists():
            raise ValueError(f"no VitaBench task file at {path}")
        raw = json.loads(path.read_text())
        raw = raw[:limit] if limit else raw
        items = []
        for t in raw:
            tools = VitaWorld(t).tools()
            task = Task(id=f"vita-{category}-{t['id']}", domain=category, instruction="(waiting for the user)",
                        tools=tools)
            items.append(BenchItem(benchmark="vitabench", category=category, task=task, max_steps=20,
                                   user_scenario=scenario_text(t), raw={"task": t}, version=str(path)))
        return items

    def make_world(self, item: BenchItem) -> VitaWorld:
        return VitaWorld(item.raw["task"])

    def make_user(self, backend: Any, seed: int | None = 0) -> LLMUser:
        return LLMUser(backend, guidelines=DEFAULT_GUIDELINES, seed=seed)

    def set_judge(self, backend: Any) -> None:
        self.judge = RubricJudge(backend)

    def score(self, item: BenchItem, episode: BenchEpisode, world: Any | None = None) -> BenchScore:
        t = item.raw["task"]
        if world is None:  # rehearsal episodes: replay the caller's calls on the real state
            world = self.make_world(item)
            for c in episode.all_calls:
                world.call(c.name, c.arguments)
        crit = t.get("evaluation_criteria", {})
        state = check_state(world, crit.get("expected_states", []))
        rubrics = crit.get("overall_rubrics", [])
        met: list[bool] | None = self.judge.judge(rubrics, transcript(episode, world)) if self.judge else None
        rubric_ok = all(met) if met is not None else None
        valid = state["state_ok"] and (rubric_ok is not False) and not episode.force_terminated
        detail = {**state, "rubrics": len(rubrics), "rubrics_met": None if met is None else sum(met),
                  "rubric_ok": rubric_ok, "force_terminated": episode.force_terminated}
        reward = (float(state["state_ok"]) + (sum(met) / len(met) if met else float(state["state_ok"]))) / 2
        return BenchScore(item_id=item.id, category=item.category, valid=valid, reward=reward, detail=detail)

    def aggregate(self, scores: list[BenchScore]) -> dict[str, Any]:
        per = per_category_accuracy(scores)
        for cat, row in per.items():
            rows = [s.detail for s in scores if s.category == cat]
            row["state_ok"] = sum(r["state_ok"] for r in rows) / len(rows)
        return {"per_category": per, "note": "success = state check passed and every overall rubric judged met"}


def gold_world(item: BenchItem) -> VitaWorld:
    """A world driven to the first expected state through our own tools (a known-correct run)."""
    t = item.raw["task"]
    world = VitaWorld(t)
    alt = (t["evaluation_criteria"].get("expected_states") or [{}])[0]
    for want in alt.get("required_orders", []):
        have = world.orders.get(want.get("order_id"))
        if have is not None and _order_matches({**want, "status": have["status"]}, have):
            # a pre-existing order (same store and products): drive it to the wanted status
            if want["status"] == "cancelled":
                world.call("cancel_order", {"order_id": want["order_id"]})
            elif want["status"] in PAID and have["status"] == "unpaid":
                world.call("pay_order", {"order_id": want["order_id"]})
            continue
        if "book_id" in want:
            r = world.call("book_table", {"shop_id": want.get("shop_id", ""), "book_time": want.get("book_time", ""),
                                          "customer_count": want.get("customer_count", 1)})
            oid = r.get("book_id")
            if oid and want.get("status") in PAID and r.get("status") != "unpaid":
                continue
        elif "reservation_id" in want:
            r = world.call("make_reservation", {"shop_id": want.get("shop_id", ""),
                                                "reservation_time": want.get("reservation_time", ""),
                                                "customer_count": want.get("customer_count", 1)})
            oid = r.get("reservation_id")
        else:
            prods = [{"product_id": p.get("product_id", ""), "quantity": p.get("quantity", 1)} for p in want.get("products", [])]
            if want.get("order_type") == "delivery":
                addr = (want.get("location") or {}).get("address", "")
                r = world.call("create_delivery_order", {"store_id": want["store_id"], "products": prods, "address": addr})
            else:
                r = world.call("create_instore_order", {"shop_id": want.get("store_id") or want.get("shop_id", ""), "products": prods})
            oid = r.get("order_id")
        if oid and want.get("status") in PAID:
            world.call("pay_order", {"order_id": oid})
        elif oid and want.get("status") == "cancelled":
            world.call("cancel_order", {"order_id": oid})
    return world
