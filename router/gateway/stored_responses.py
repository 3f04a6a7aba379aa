"""Stateful Responses requests go to the engine that stored the response they continue.

A Responses request naming ``previous_response_id`` can only be served by the engine holding
that response (router.core.response_homes remembers which, bounded). Its candidates narrow to
that engine, so the decision, its load accounting and its flow control run as for any request,
and nothing is retried elsewhere; an id this gateway never saw answered, or whose engine no
longer serves the model, is a 404 naming ``previous_response_id``. Each 200 answer on
``/v1/responses`` teaches the id it carries (``router.gateway.upstream.headers.response_id``).
"""

from __future__ import annotations

from router.core.response_homes import ResponseHomes
from router.gateway.openai.errors import NotFound
from router.gateway.openai.request import RESPONSES, Inbound
from router.gateway.upstream.headers import response_id

FIELD = "previous_response_id"


def candidates(homes: ResponseHomes, inbound: Inbound, cands: tuple[str, ...]) -> tuple[str, ...]:
    """``cands``, or only the engine holding the response the request continues."""
    previous = inbound.body.get(FIELD)
    if previous is None:
        return cands
    if not isinstance(previous, str) or not previous:
        raise NotFound(f"'{FIELD}' must be a non-empty string", FIELD)
    home = homes.candidates(previous, cands)
    if not home:
        raise NotFound(
            f"Response '{previous}' is not known here, or the engine that stored it no longer "
            f"serves model '{inbound.model}'",
            FIELD,
            "previous_response_not_found",
        )
    return home


def learn(homes: ResponseHomes, route: str, first: bytes, engine: str) -> None:
    """Remember the engine of the response a 200 answer on ``route`` starts with (``first``)."""
    if route == RESPONSES:
        found = response_id(first)
        if found is not None:
            homes.learn(found, engine)
