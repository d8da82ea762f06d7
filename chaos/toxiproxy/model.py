"""Toxiproxy's data model as the REST API sees it: the error catalogue (status code and message,
the JSON shape `{"error": ..., "status": ...}`), toxic specs, host:port addresses, and the
validation of every request body. Pure functions, no I/O.

Field names, defaults and messages follow Shopify Toxiproxy v2 (api.go, toxic_collection.go).
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import json
from collections.abc import Mapping, Sequence
from typing import TypeAlias, TypeVar

from .toxics import Toxic, ToxicAttributeError, build_toxic, toxic_types

name_chars_max = 256  # a proxy's or a toxic's name
proxies_max = 4096  # proxies one server holds
toxics_per_proxy_max = 64  # toxics on one proxy, both streams together
default_listen = "127.0.0.1:0"  # a proxy created without `listen`: loopback, any free port

T = TypeVar("T")

Json: TypeAlias = bool | int | float | str | list["Json"] | dict[str, "Json"] | None


class ApiError(Exception):
    """A request the API refuses: HTTP status and Toxiproxy's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict[str, Json]:
        return {"error": self.message, "status": self.status}

    def detail(self, detail: str) -> ApiError:
        """This error with `: detail` after its message (Toxiproxy's joinError)."""
        return ApiError(self.status, f"{self.message}: {detail}")


# The catalogue: Toxiproxy's messages and codes, plus the limits this server adds.
bad_request_body = ApiError(400, "bad request body")
missing_field = ApiError(400, "missing required field")
invalid_stream = ApiError(400, "stream was invalid, can be either upstream or downstream")
invalid_toxic_type = ApiError(400, "invalid toxic type")
invalid_address = ApiError(400, "invalid address")
proxy_not_found = ApiError(404, "proxy not found")
toxic_not_found = ApiError(404, "toxic not found")
proxy_already_exists = ApiError(409, "proxy already exists")
toxic_already_exists = ApiError(409, "toxic already exists")
too_many = ApiError(400, "limit reached")
listen_failed = ApiError(500, "listen failed")


class Stream(enum.Enum):
    """The direction a toxic acts on: upstream = client to server, downstream = back."""

    UPSTREAM = "upstream"
    DOWNSTREAM = "downstream"


@dataclasses.dataclass(frozen=True)
class ToxicSpec:
    """One toxic on one proxy. Replaced (never mutated) by an update."""

    name: str
    stream: Stream
    toxicity: float  # probability, 0..1, that the toxic applies to a connection
    toxic: Toxic

    def to_json(self) -> dict[str, Json]:
        attributes: dict[str, Json] = dict(self.toxic.attributes())
        return {"attributes": attributes, "name": self.name, "type": self.toxic.type_name,
                "stream": self.stream.value, "toxicity": self.toxicity}


@dataclasses.dataclass(frozen=True)
class ProxyInput:
    """A proxy as a create, update or populate body gives it."""

    name: str
    listen: str
    upstream: str
    enabled: bool


def proxy_json(*, name: str, listen: str, upstream: str, enabled: bool,
               toxics: Sequence[ToxicSpec]) -> dict[str, Json]:
    return {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled,
            "toxics": [spec.to_json() for spec in toxics]}


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"; an empty host stays empty (all interfaces).
    Raises ApiError 400 when it is not an address."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise invalid_address.detail(repr(address))
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise invalid_address.detail(repr(address)) from None
    elif ":" in host:
        raise invalid_address.detail(repr(address))
    return host, int(port_text)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def decode_body(body: bytes) -> object:
    """The JSON value of a request body; ApiError 400 when it is not JSON."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request_body.detail(str(exc)) from None


def parse_proxy_create(value: object) -> ProxyInput:
    fields = _object(value)
    return _proxy_input(fields, listen=default_listen, enabled=True, where="")


def parse_proxy_update(value: object, *, current: ProxyInput) -> ProxyInput:
    """The proxy after an update body: fields it leaves out keep their current values."""
    fields = _object(value)
    return ProxyInput(
        name=current.name,
        listen=_optional_address(fields, "listen", current.listen),
        upstream=_optional_address(fields, "upstream", current.upstream),
        enabled=_optional(fields, "enabled", bool, current.enabled),
    )


def parse_populate(value: object) -> list[ProxyInput]:
    """Every proxy of a populate body, all checked before any is created."""
    if not isinstance(value, list):
        raise bad_request_body.detail("expected a JSON array of proxies")
    if len(value) > proxies_max:
        raise too_many.detail(f"at most {proxies_max} proxies")
    return [_proxy_input(_object(item), listen=default_listen, enabled=True,
                         where=f" at proxy {index + 1}")
            for index, item in enumerate(value)]


def parse_toxic_create(value: object) -> ToxicSpec:
    """A new toxic; checks in Toxiproxy's order: body, stream, type, then attributes (the
    duplicate-name check, between type and attributes there, is the caller's)."""
    fields = _object(value)
    stream_text = _optional(fields, "stream", str, Stream.DOWNSTREAM.value).lower()
    try:
        stream = Stream(stream_text)
    except ValueError:
        raise invalid_stream from None
    type_name = _optional(fields, "type", str, "")
    name = _optional(fields, "name", str, "") or f"{type_name}_{stream.value}"
    _check_name(name, "name")
    if type_name not in toxic_types:
        raise invalid_toxic_type
    toxicity = _toxicity(fields.get("toxicity"), 1.0)
    try:
        toxic = build_toxic(type_name, fields.get("attributes"))
    except ToxicAttributeError as exc:
        raise bad_request_body.detail(str(exc)) from None
    return ToxicSpec(name=name, stream=stream, toxicity=toxicity, toxic=toxic)


def parse_toxic_update(value: object, *, current: ToxicSpec) -> ToxicSpec:
    """The toxic after an update body: new attributes over the current ones, and toxicity.
    Name, type and stream cannot change (Toxiproxy ignores them here)."""
    fields = _object(value)
    toxicity = _toxicity(fields.get("toxicity"), current.toxicity)
    try:
        toxic = build_toxic(current.toxic.type_name, fields.get("attributes"),
                            base=current.toxic)
    except ToxicAttributeError as exc:
        raise bad_request_body.detail(str(exc)) from None
    return dataclasses.replace(current, toxicity=toxicity, toxic=toxic)


def _object(value: object) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise bad_request_body.detail("expected a JSON object")
    return value


def _proxy_input(fields: Mapping[str, object], *, listen: str, enabled: bool,
                 where: str) -> ProxyInput:
    name = _optional(fields, "name", str, "")
    if not name:
        raise missing_field.detail(f"name{where}")
    _check_name(name, "name")
    upstream = _optional(fields, "upstream", str, "")
    if not upstream:
        raise missing_field.detail(f"upstream{where}")
    split_address(upstream)
    return ProxyInput(name=name, listen=_optional_address(fields, "listen", listen),
                      upstream=upstream, enabled=_optional(fields, "enabled", bool, enabled))


def _optional(fields: Mapping[str, object], key: str, kind: type[T], default: T) -> T:
    value = fields.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise bad_request_body.detail(f"field {key!r} must be a {kind.__name__}")
    return value


def _optional_address(fields: Mapping[str, object], key: str, default: str) -> str:
    address = _optional(fields, key, str, "") or default
    split_address(address)
    return address


def _toxicity(raw: object, default: float) -> float:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0.0 <= raw <= 1.0:
        raise bad_request_body.detail("toxicity must be a number in 0..1")
    return float(raw)


def _check_name(name: str, what: str) -> None:
    if len(name) > name_chars_max:
        raise bad_request_body.detail(f"{what} longer than {name_chars_max} characters")
