from envace.core.errors import INVALID_PARAMETERS, TOOL_NOT_AVAILABLE, error_code
from envace.core.types import ToolCall, ToolSpec
from envace.core.validate import validate_call

TOOLS = [ToolSpec.model_validate({"type": "function", "function": {
    "name": "cancel_order", "parameters": {"type": "object", "properties": {
        "order_id": {"type": "string"}, "reason": {"type": "string", "enum": ["changed_mind", "damaged"]}},
        "required": ["order_id"], "additionalProperties": False}}})]


def test_valid_call():
    assert validate_call(ToolCall(name="cancel_order", arguments={"order_id": "o-1"}), TOOLS) is None


def test_unknown_tool_lists_available():
    err = validate_call(ToolCall(name="drop_db", arguments={}), TOOLS)
    assert error_code(err) == TOOL_NOT_AVAILABLE and err["error"]["available"] == ["cancel_order"]


def test_schema_violations_name_the_field():
    for args, needle in [({}, "order_id"), ({"order_id": 5}, "order_id"),
                         ({"order_id": "o-1", "reason": "bored"}, "reason"), ({"order_id": "o", "x": 1}, "x")]:
        err = validate_call(ToolCall(name="cancel_order", arguments=args), TOOLS)
        assert error_code(err) == INVALID_PARAMETERS, args
        assert needle in err["error"]["message"], (args, err)
