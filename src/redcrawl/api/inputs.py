"""Request bodies of the HTTP API (what clients send), with the limits and patterns the
OpenAPI schema shows and the checks that refuse what a crawl cannot store."""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    Tag,
    field_validator,
)

from redcrawl.callbacks import callback_name_problem, framework_names
from redcrawl.settings import PRIORITY_LIMIT
from redcrawl.urls import url_problem

__all__ = [
    "MAX_BODY_CHARS",
    "MAX_DELAY",
    "MAX_HEADERS",
    "MAX_LIST_LIMIT",
    "MAX_URL_LENGTH",
    "META_VALUE_SCHEMA",
    "REQUEST_ID_PATTERN",
    "HostOverrideIn",
    "RequestIn",
    "RequeueIn",
    "SubmitIn",
]

MAX_URL_LENGTH = 8192
MAX_BODY_CHARS = 1_000_000
MAX_HEADERS = 100
MAX_DELAY = 30 * 24 * 3600.0
"""Longest delay of a submitted request: 30 days."""
MAX_LIST_LIMIT = 1000
MAX_REQUEUE_IDS = 10_000
HARD_MAX_BATCH = 100_000
"""The largest REDCRAWL_API_MAX_BATCH allows; the schema served shows the configured one."""
REQUEST_ID_PATTERN = r"^([0-9a-fA-F]{40}|#[0-9]{1,20})$"
CALLBACK_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_H = "[0-9A-Fa-f]{1,4}"
_IPV6 = (
    f"(?:(?:{_H}:){{7}}{_H}|(?:{_H}:){{1,6}}:|(?:{_H}:){{1,6}}:{_H}"
    f"|(?:{_H}:){{1,5}}(?::{_H}){{1,2}}|(?:{_H}:){{1,4}}(?::{_H}){{1,3}}"
    f"|(?:{_H}:){{1,3}}(?::{_H}){{1,4}}|(?:{_H}:){{1,2}}(?::{_H}){{1,5}}"
    f"|{_H}:(?::{_H}){{1,6}}|:(?:(?::{_H}){{1,6}}|:))"
)
_PORT = r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?"
URL_PATTERN = (
    r"^[Hh][Tt][Tt][Pp][Ss]?://(?:[^\x00-\x20\x7f/?#@\[\]\\]*@)?"
    rf"(?:{_LABEL}(?:\.{_LABEL})*\.?|\[{_IPV6}\]){_PORT}"
    r"(?:[/?#][^\x00-\x20\x7f]*)?$"
)
_URL = re.compile(URL_PATTERN)
"""An absolute http(s) URL with an ASCII host name or IP literal (IDNA names in their
``xn--`` form), no whitespace or control characters; :func:`redcrawl.urls.url_problem`
checks the rest (IPv6 literal syntax)."""
_FRAMEWORK_NAMES: list[JsonValue] = [
    n for n in sorted(framework_names()) if n.isidentifier() and not n.startswith("_")
]
"""Names the callback pattern allows that are refused anyway (Scrapy's own methods)."""
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
"""A body with ``body_base64: true``: standard base64, padded."""
METHOD_PATTERN = r"^[A-Za-z]{1,16}$"
HEADER_NAME_PATTERN = r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}$"

HeaderName = Annotated[str, Field(pattern=HEADER_NAME_PATTERN)]
HeaderValue = Annotated[str, Field(max_length=8192, pattern=r"^[^\r\n\x00]*$")]
HeaderPair = tuple[HeaderName, HeaderValue]


def _value_form(value: Any) -> str:
    return "(many)" if isinstance(value, list) else "(one)"


def _headers_form(value: Any) -> str:
    return "(list)" if isinstance(value, list) else "(map)"


# Each union below is checked in the form the caller sent (a list, or not), so that a bad
# value is one error against that form, not one per form it was never meant for; the tags
# (which no header name can be) are left out of an error's location (errors.location).
HeaderValues = Annotated[
    Annotated[HeaderValue, Tag("(one)")] | Annotated[list[HeaderValue], Tag("(many)")],
    Discriminator(_value_form),
]
HeaderMap = Annotated[
    dict[HeaderName, HeaderValues],
    Field(max_length=MAX_HEADERS, json_schema_extra={"additionalProperties": False}),
]
HeaderList = Annotated[list[HeaderPair], Field(max_length=MAX_HEADERS)]
Headers = Annotated[
    Annotated[HeaderMap, Tag("(map)")] | Annotated[HeaderList, Tag("(list)")],
    Discriminator(_headers_form),
]
UNION_TAGS = frozenset({"(one)", "(many)", "(map)", "(list)"})
"""The tags of the unions above, as they appear in a validation error's location."""


def _whole(value: Any) -> Any:
    # JSON Schema's "integer" includes 5.0; strict mode still refuses "5" and true
    return int(value) if isinstance(value, float) and value.is_integer() else value


WholeNumber = Annotated[int, BeforeValidator(_whole)]
"""An integer; a float with no fractional part (``5.0``) counts as one, as in JSON Schema."""
RequestId = Annotated[
    str, Field(pattern=REQUEST_ID_PATTERN, examples=["0123456789abcdef0123456789abcdef01234567"])
]


class _Strict(BaseModel):
    """Input: unknown fields refused, and no coercion ("5" is not an int, 0 not a bool)."""

    model_config = ConfigDict(extra="forbid", strict=True)


INT_MIN, INT_MAX = -(2**63), 2**64 - 1
"""The integers a stored request's meta can hold (msgpack's int64 and uint64)."""
META_VALUE_SCHEMA: dict[str, JsonValue] = {
    "description": "A meta value: JSON, with finite numbers and integers of 64 bits.",
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "string"},
        {"type": "integer", "minimum": INT_MIN, "maximum": INT_MAX},
        {"type": "number", "not": {"type": "integer"}},
        {"type": "array", "items": {"$ref": "#/components/schemas/MetaValue"}},
        {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/MetaValue"}},
    ],
}
"""The schema of a meta value (the OpenAPI component ``MetaValue``). As in JSON Schema, a
number without a fractional part (``2.0``, ``1e300``) is an integer."""


def _meta_problem(value: Any, where: str) -> str | None:
    """What in ``value`` (meta, at ``where``) cannot be stored, or None."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"{where} is NaN or infinite: JSON numbers must be finite"
        if value.is_integer() and not INT_MIN <= value <= INT_MAX:
            return f"{where} = {value!r} is an integer that does not fit in 64 bits"
    elif isinstance(value, int) and not isinstance(value, bool):
        if not INT_MIN <= value <= INT_MAX:
            return f"{where} = {value} does not fit in 64 bits; store it as a string"
    elif isinstance(value, dict):
        for k, v in value.items():
            found = _meta_problem(v, f"{where}[{k!r}]")
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _meta_problem(v, f"{where}[{i}]")
            if found:
                return found
    return None


def _body_rules(schema: dict[str, Any]) -> None:
    """The body's rules depend on body_base64: text up to MAX_BODY_CHARS, or base64. The
    length limit sits in the text branch only: a schema generator asked to break it inside
    the base64 pattern would need strings no generator can build."""
    body = schema["properties"]["body"]
    limit = body.pop("maxLength")
    schema["anyOf"] = [
        {"properties": {"body_base64": {"const": False}, "body": {"maxLength": limit}}},
        {
            "required": ["body_base64"],
            "properties": {
                "body_base64": {"const": True},
                "body": {"pattern": BASE64_PATTERN, "description": f"At most {limit} characters."},
            },
        },
    ]


class RequestIn(_Strict):
    """One request to add to a crawl's frontier."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra=lambda schema: _body_rules(schema)
    )

    url: str = Field(
        min_length=1,
        max_length=MAX_URL_LENGTH,
        json_schema_extra={"pattern": URL_PATTERN},
        description="Absolute http:// or https:// URL with a valid host (IDNA names as xn--...).",
        examples=["https://example.com/page/1"],
    )
    method: str = Field(default="GET", pattern=METHOD_PATTERN, description="HTTP method.")
    body: str = Field(
        default="",
        max_length=MAX_BODY_CHARS,
        description="Request body: text (sent as UTF-8), or base64 with body_base64.",
    )
    body_base64: bool = Field(default=False, description="The body is base64-encoded bytes.")
    headers: Headers = Field(
        default_factory=dict,
        description="Headers: {name: value or [values]} or [[name, value], ...].",
    )
    meta: dict[str, Any] = Field(
        default_factory=dict,
        description="Scrapy request meta (a JSON object).",
        json_schema_extra={"additionalProperties": {"$ref": "#/components/schemas/MetaValue"}},
    )
    priority: WholeNumber = Field(default=0, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)
    callback: str | None = Field(
        default=None,
        pattern=CALLBACK_PATTERN,
        max_length=200,
        json_schema_extra={"not": {"enum": _FRAMEWORK_NAMES}},
        description="Name of the spider method to call (default: parse).",
    )
    dont_filter: bool = Field(default=False, description="Skip dedupe: always accepted.")
    delay: float = Field(
        default=0.0,
        ge=0.0,
        le=MAX_DELAY,
        allow_inf_nan=False,
        description="Seconds before the request becomes ready.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        problem = url_problem(url)
        if problem is None and not _URL.fullmatch(url):
            problem = (
                "it has whitespace, control characters or a backslash, or a host "
                "that is not ASCII (write IDNA names as xn--...)"
            )
        if problem is not None:
            raise ValueError(
                f"{problem}: give an absolute http:// or https:// URL with a valid host"
            )
        return url

    @field_validator("callback", mode="before")
    @classmethod
    def _callback(cls, name: Any) -> Any:
        # before the pattern, so that the message says why ("private", "Scrapy's")
        problem = callback_name_problem(name) if isinstance(name, str) and name else None
        if problem is not None:
            raise ValueError(f"{problem}; name a public method of your spider")
        return name

    @field_validator("meta")
    @classmethod
    def _storable(cls, meta: dict[str, Any]) -> dict[str, Any]:
        problem = _meta_problem(meta, "meta")
        if problem is not None:
            raise ValueError(problem)
        return meta

    def body_bytes(self) -> bytes:
        if not self.body_base64:
            return self.body.encode("utf-8", "surrogatepass")
        try:
            return base64.b64decode(self.body, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"body is not valid base64 ({exc})") from None

    def header_pairs(self) -> list[tuple[str, list[str]]]:
        if isinstance(self.headers, list):
            merged: dict[str, list[str]] = {}
            for name, value in self.headers:
                merged.setdefault(name, []).append(value)
            return list(merged.items())
        return [(k, v if isinstance(v, list) else [v]) for k, v in self.headers.items()]


class SubmitIn(_Strict):
    requests: list[RequestIn] = Field(
        min_length=1, max_length=HARD_MAX_BATCH, description="1 to REDCRAWL_API_MAX_BATCH requests."
    )
    recrawl: bool = Field(
        default=False,
        description="Accept requests that are already DONE "
        "(crawl them again); requests still stored stay duplicates.",
    )


class RequeueIn(_Strict):
    ids: list[RequestId] | None = Field(
        default=None,
        max_length=MAX_REQUEUE_IDS,
        description="Dead request ids; null: all, up to limit.",
    )
    limit: WholeNumber = Field(
        default=1000,
        ge=1,
        le=MAX_REQUEUE_IDS,
        description="Most requests requeued when ids is null.",
    )


class HostOverrideIn(_Strict):
    """A change to the operator's override of one politeness key: a field given sets it,
    ``null`` removes it, a field left out stays as it is."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"not": {"required": ["block_until", "block_for"]}},
    )

    delay: float | None = Field(
        default=None,
        ge=0.0,
        le=86400.0,
        allow_inf_nan=False,
        description="Seconds between two fetch starts of the key (wins over every other delay).",
    )
    concurrency: Annotated[int, Field(ge=1, le=10_000), BeforeValidator(_whole)] | None = Field(
        default=None, description="Most requests of the key in flight."
    )
    block_until: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="Serve nothing of the key until then: seconds since the epoch (Redis "
        "clock), at most a day in the past and 30 days ahead (the bounds shown are those "
        "of when the schema was served).",
    )
    block_for: float | None = Field(
        default=None,
        ge=0.001,
        le=30 * 86400.0,
        allow_inf_nan=False,
        description="Block for this many seconds from now (instead of block_until).",
    )
    paused: bool | None = Field(default=None, description="true: serve nothing of the key.")
