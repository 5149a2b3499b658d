"""OpenAI-style error objects: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from moepack.serve.schemas import FIELD_RULES, UNSUPPORTED_PART
from pydantic import ValidationError
from starlette.responses import JSONResponse

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
          404: "invalid_request_error", 405: "invalid_request_error",
          408: "invalid_request_error", 413: "invalid_request_error",
          431: "invalid_request_error", 429: "requests", 500: "server_error",
          503: "server_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_validation(e: ValidationError) -> ApiError:
    """The first problem pydantic found, said the way the API says it."""
    errors = e.errors(include_url=False)
    # A list where a union takes a string or a list (`content`, `prompt`) fails both members;
    # the string member's "should be a valid string" comes first and would hide what is wrong
    # inside the list.
    err = next((x for x in errors if x["type"] == UNSUPPORTED_PART), None) or next(
        (x for x in errors if not (x["type"] == "string_type" and isinstance(
            x.get("input"), list))), errors[0])
    if err["type"] == "json_invalid":
        return ApiError(400, f"We could not parse the JSON body of your request: {err['msg']}",
                        code="invalid_json")
    # union members add their type name to loc ('prompt', 'str'): keep the field path only
    loc = [str(p) for p in err["loc"] if not (isinstance(p, str) and (
        p in {"str", "int", "float", "bool"} or p.startswith(("list[", "function-", "literal["))
        or p[:1].isupper()))]
    param = ".".join(loc) or None
    msg = err["msg"]
    rule = FIELD_RULES.get(loc[0]) if loc else None
    if rule and err["type"] != "missing":
        return ApiError(400, f"{loc[0]} must be {rule}", param=loc[0], code="invalid_value")
    if err["type"] == "model_type" and not loc:
        msg = "The request body must be a JSON object"
    return ApiError(400, f"{param}: {msg}" if param else msg, param=param,
                    code="invalid_value" if err["type"] != "missing" else "missing_required")
