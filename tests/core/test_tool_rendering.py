"""The compact tool rendering of the caller's (and the rehearse role's) prompt: flat schemas read
exactly as the trained checkpoints saw them; a nested argument shows its keys, which are optional,
their enums and the item type of its lists."""

from typing import Literal

from hypothesis import given, settings, strategies as st
from pydantic import BaseModel, TypeAdapter
from typing_extensions import NotRequired, TypedDict

from envace.core.prompts import compact_signature, tools_text
from envace.core.types import FunctionSpec, ToolSpec
from envace.envs.registry import resolve_world

# Every embedded tool's signature as the compact format rendered it before nested arguments were
# spelled out (the checkpoints trained on the three worlds saw exactly these): it must not move.
EMBEDDED = [
    'search_products(query: string, category?: "electronics"|"kitchen"|"outdoor"|"home"|"books"|"toys", '
    'max_price?: number, in_stock_only?: boolean)',
    'get_product(product_id: string)',
    'add_to_cart(product_id: string, quantity: integer)',
    'remove_from_cart(product_id: string)',
    'view_cart()',
    'place_order(shipping_speed: "standard"|"express", payment_method: "card"|"store_credit")',
    'list_orders(status?: "placed"|"shipped"|"delivered"|"cancelled")',
    'get_order(order_id: string)',
    'track_shipment(order_id: string)',
    'cancel_order(order_id: string, reason?: string)',
    'return_item(order_id: string, product_id: string, quantity: integer, reason: '
    '"damaged"|"wrong_item"|"not_as_described"|"no_longer_needed")',
    'get_account()',
    'list_events(date_from?: string, date_to?: string)',
    'get_event(event_id: string)',
    'find_free_slots(date: string, duration_minutes: integer, earliest?: string, latest?: string)',
    'create_event(title: string, date: string, start_time: string, duration_minutes: integer, location?: string, '
    'attendees?: list[string])',
    'reschedule_event(event_id: string, date: string, start_time: string, duration_minutes?: integer)',
    'cancel_event(event_id: string, notify_attendees?: boolean)',
    'invite_attendee(event_id: string, email: string)',
    'remove_attendee(event_id: string, email: string)',
    'respond_to_event(event_id: string, response: "accepted"|"declined"|"tentative")',
    'search_contacts(query: string)',
    'check_availability(email: string, date: string)',
    'list_accounts()',
    'get_balance(account_id: string)',
    'list_transactions(account_id: string, date_from?: string, date_to?: string, category?: '
    '"groceries"|"dining"|"transport"|"shopping"|"entertainment"|"health"|"income"|"transfer"|"bills"|"adjustment"'
    '|"fees", search?: string, limit?: integer)',
    'get_transaction(transaction_id: string)',
    'transfer_funds(from_account_id: string, to_account_id: string, amount: number, memo?: string)',
    'list_payees()',
    'list_bills(status?: "due"|"paid")',
    'pay_bill(bill_id: string, from_account_id: string)',
    'list_cards()',
    'freeze_card(card_id: string)',
    'unfreeze_card(card_id: string)',
    'dispute_transaction(transaction_id: string, reason: "unauthorized"|"duplicate"|"incorrect_amount"|'
    '"not_received")',
]


def _tool(parameters: dict, name: str = "t", description: str = "") -> ToolSpec:
    return ToolSpec(function=FunctionSpec(name=name, description=description, parameters=parameters))


def test_the_embedded_worlds_tools_render_byte_for_byte_as_before():
    tools = [t for w in ("shop", "calendar", "bank") for t in resolve_world(w).tools()]
    assert [compact_signature(t).split(" - ", 1)[0] for t in tools] == EMBEDDED
    shop = {t.name: t for t in tools}
    assert compact_signature(shop["search_products"]) == (
        'search_products(query: string, category?: "electronics"|"kitchen"|"outdoor"|"home"|"books"|"toys", '
        'max_price?: number, in_stock_only?: boolean) - Search the product catalogue by keywords. Returns at most '
        '10 matches, sorted by name.')


def test_a_nested_object_shows_its_keys_which_are_optional_their_enums_and_list_items():
    tool = _tool({"type": "object", "properties": {
        "ticket_id": {"type": "string"},
        "changes": {"type": "object", "required": ["status"], "properties": {
            "status": {"type": "string", "enum": ["open", "closed"]},
            "add_labels": {"type": "array", "items": {"type": "string"}},
            "owner": {"type": "object", "properties": {"id": {"type": "integer"}}}}},
        "lines": {"type": "array", "items": {"type": "object", "required": ["sku"], "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer"}}}},
        "meta": {"type": "object", "additionalProperties": {"type": "number"}},
        "any_obj": {"type": "object"},
    }, "required": ["ticket_id", "changes"]}, "update", "Change it.")
    assert compact_signature(tool) == (
        'update(ticket_id: string, changes: {status: "open"|"closed", add_labels?: list[string], '
        'owner?: {id?: integer}}, lines?: list[{sku: string, qty?: integer}], meta?: dict[string, number], '
        'any_obj?: object) - Change it.')


class Filters(TypedDict):
    status: NotRequired[Literal["open", "closed"]]
    labels: NotRequired[list[str]]
    assignee: NotRequired[str]


class Args(BaseModel):
    filters: Filters | None = None
    mode: Literal["fast"] = "fast"
    limit: int = 10


def test_a_pydantic_schema_refs_and_unions_read_as_the_same_shape():
    """An MCP server on the official SDK lists pydantic's schema: $ref into $defs, anyOf with null."""
    schema = TypeAdapter(Args).json_schema()
    assert "$defs" in schema and "anyOf" in schema["properties"]["filters"]
    assert compact_signature(_tool(schema, "search")) == (
        'search(filters?: {status?: "open"|"closed", labels?: list[string], assignee?: string}|null, '
        'mode?: "fast", limit?: integer)')


def test_a_recursive_schema_stops_and_an_unresolvable_ref_is_any():
    node = {"type": "object", "properties": {"name": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}
    text = compact_signature(_tool({"type": "object", "$defs": {"Node": node}, "properties": {
        "tree": {"$ref": "#/$defs/Node"}, "gone": {"$ref": "#/$defs/Missing"}, "far": {"$ref": "other.json#/x"}}}))
    assert text.startswith("t(tree?: {name?: string, children?: list[{name?: string, children?: list[")
    assert text.endswith("gone?: any, far?: any)") and len(text) < 400


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(
                               st.sampled_from(["type", "properties", "items", "enum", "anyOf", "oneOf", "allOf",
                                                "$ref", "required", "const", "additionalProperties", "x"]) | st.text(
                                   max_size=4), c, max_size=4), max_leaves=25)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=5), json_values, max_size=4), json_values)
def test_any_parameters_a_file_may_hold_render_without_raising(props, required):
    tool = ToolSpec.model_construct(function=FunctionSpec.model_construct(
        name="t", description="", parameters={"type": "object", "properties": props, "required": required}))
    assert compact_signature(tool).startswith("t(")
    assert tools_text([tool], "compact")
