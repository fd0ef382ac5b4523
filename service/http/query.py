"""The query string of the API routes, taken strictly: a parameter the route does not take, and a
one-value parameter given twice, are refused (422) rather than guessed at. FastAPI alone ignores
a parameter it does not know (``?outputtype=npy`` would get the default, an MP4) and keeps the
last of repeated values.

What a route takes is what it declares — the query parameters of its dependencies, the same ones
its OpenAPI document lists — so the check and the docs cannot disagree. A parameter declared as a
list (``shape``: ``requests`` sends a list as ``shape=1&shape=16&…``) may repeat.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from ..problem import Problem

# How alike a misspelt name must be to a known one for the answer to suggest it (difflib's ratio).
SUGGESTION_CUTOFF = 0.6


@dataclass(frozen=True)
class RouteQuery:
    """The query parameters a route takes, and those of them that take several values."""

    names: frozenset[str]
    lists: frozenset[str]


def _query_fields(dependant: Dependant) -> Iterator[Any]:
    yield from dependant.query_params
    for sub in dependant.dependencies:
        yield from _query_fields(sub)


def _takes_many(annotation: Any) -> bool:
    """``list[str]``, ``list[str] | None`` and the like: a parameter that may repeat."""
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return any(get_origin(member) in (list, tuple, set, frozenset) for member in members)


def route_query(route: APIRoute) -> RouteQuery:
    """The query parameters ``route`` declares (a walk of a few dependencies: microseconds)."""
    fields = list(_query_fields(route.dependant))
    return RouteQuery(frozenset(field.alias for field in fields),
                      frozenset(field.alias for field in fields if _takes_many(field.field_info.annotation)))


def nearest_name(name: str, known: frozenset[str]) -> str | None:
    """The known parameter ``name`` most likely meant (case aside), if any is alike enough."""
    matches = difflib.get_close_matches(name.lower(), sorted(known), n=1, cutoff=SUGGESTION_CUTOFF)
    return matches[0] if matches else None


def check_query(pairs: list[tuple[str, str]], query: RouteQuery) -> None:
    """422 ``unknown-parameter`` for the first parameter ``query`` does not name, then 422
    ``repeated-parameter`` for the first one-value parameter given more than once."""
    for name, _ in pairs:
        if name not in query.names:
            nearest = nearest_name(name, query.names)
            hint = f": did you mean {nearest!r}?" if nearest else "" if query.names else ": this route takes none"
            raise Problem(422, "unknown-parameter", f"unknown query parameter {name!r}{hint}",
                          expected=sorted(query.names), received=name)
    seen: dict[str, list[str]] = {}
    for name, value in pairs:
        seen.setdefault(name, []).append(value)
    for name, values in seen.items():
        if len(values) > 1 and name not in query.lists:
            raise Problem(422, "repeated-parameter", f"query parameter {name!r} is given {len(values)} times; it "
                          "takes one value", expected=f"{name} once", received=values)


async def strict_query(request: Request) -> None:
    """The dependency: ``check_query`` against the route that matched."""
    route = request.scope.get("route")
    if isinstance(route, APIRoute):
        check_query(request.query_params.multi_items(), route_query(route))


StrictQueryDep = Depends(strict_query)
