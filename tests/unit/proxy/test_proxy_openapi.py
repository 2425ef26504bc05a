"""farm.proxy.openapi: the proxy's OpenAPI document names every route the proxy serves, with the
body its parser reads."""

from __future__ import annotations

from farm.proxy.openapi import proxy_openapi
from farm.proxy.routes import FORMATS, proxy_routes


def test_the_document_has_every_route_the_proxy_serves() -> None:
    served = {route.path.removeprefix("/proxy/{trial}/v1") for route in proxy_routes(lambda _: None)}  # type: ignore[arg-type, return-value]
    assert set(proxy_openapi()["paths"]) == served


def test_each_format_route_takes_its_parsers_body_and_answers_its_error_shape() -> None:
    doc = proxy_openapi()
    for path in [*FORMATS, "/messages/count_tokens"]:
        post = doc["paths"][path]["post"]
        ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.removeprefix("#/components/schemas/") in doc["components"]["schemas"]
        error = post["responses"]["400"]["content"]["application/json"]["schema"]
        assert ("type" in error["required"]) == path.startswith("/messages"), path
