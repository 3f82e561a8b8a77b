"""Request bodies, read and parsed by the endpoints themselves: FastAPI would read and
parse a declared body before any dependency runs (the token check included) and on the
event loop. Here the body is read after the access check (:data:`RawBody`, a dependency
listed after it) and validated in the threadpool (:func:`parse`, called by the ``def``
endpoint); :func:`body_doc` declares it in the OpenAPI schema."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

__all__ = ["RawBody", "body_doc", "parse"]

M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], raw: bytes) -> M:
    """``raw`` (a JSON body) as ``model``, strictly; RequestValidationError if it is not.
    Runs in the threadpool (a 16 MiB body takes seconds)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(
            [
                {"loc": ("body", *e["loc"]), "msg": e["msg"], "type": e["type"]}
                for e in exc.errors(include_url=False, include_input=False)
            ]
        ) from None


def body_doc(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """The ``requestBody`` of an endpoint that reads its body itself."""
    return {
        "requestBody": {
            "required": required,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }


async def raw_body(request: Request) -> bytes:
    """The request body, read only once the token was accepted (a dependency listed after
    the access check)."""
    return await request.body()


RawBody = Annotated[bytes, Depends(raw_body)]
