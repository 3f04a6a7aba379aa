"""The ``models`` section: the names clients may call a model by, and the request rewritten to
the name the engines serve.

    models:
      aliases: {ALIAS: SERVED_NAME}      # exact names
      patterns:                          # then these, in order: the first that matches wins
        - {match: "gpt-4*", model: SERVED_NAME}

A request's ``model`` is looked up among the ``aliases`` first, then matched against each
pattern in turn. A pattern is a glob over the whole name: ``*`` matches any run of characters,
``?`` one character, everything else itself (case matters, as in model names). Patterns are a
list, not glob keys in the ``aliases`` mapping, because overlapping globs need an order that
says which wins, and a mapping's order does not survive every tool that writes one (Helm
renders mappings sorted by key).

A target may be another alias: chains are followed when the section is loaded, so a request is
rewritten once, to a name no alias renames again; an alias naming itself, or a chain that comes
back to where it started, is a config error that names the alias. A pattern's target is followed
through the aliases the same way. A name that is an alias wins over an engine serving it under
that name: the operator said so.

The rewrite (``ModelAliases.rewrite``) happens before routing: the routing text's namespace, the
model the engines are asked for and the forwarded bytes all carry the served name. The
gateway forwards the client's bytes as they came, so only a request whose model an alias renames
is re-serialised, once. ``GET /v1/models`` lists every alias whose target an engine serves, as
that model's card under the alias's name (router.gateway.fleet.pool); patterns match names
nobody can list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import orjson

from router.core.fields import ConfigFields
from router.gateway.openai.request import Inbound

# Far above any fleet's model names, low enough that a lookup stays a dict hit and a few
# dozen pattern matches.
MAX_ALIASES = 10_000
MAX_PATTERNS = 256
MAX_NAME_CHARS = 256
# The separator routing_text puts between a model and its LoRA adapter in a namespace.
_LORA_SEPARATOR = "\x1f"


def glob_regex(glob: str) -> re.Pattern[str]:
    """A glob over a whole model name (``*``, ``?``) as a compiled regular expression."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
    return re.compile("".join(parts), re.DOTALL)


@dataclass(frozen=True, slots=True)
class Pattern:
    """One ``patterns`` entry: its glob, compiled, and the served name it rewrites to."""

    match: str
    model: str
    regex: re.Pattern[str] = field(compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ModelAliases:
    """The ``models`` section: exact aliases (chains followed) and ordered patterns."""

    aliases: Mapping[str, str] = field(default_factory=dict)
    patterns: tuple[Pattern, ...] = ()

    def served(self, model: str) -> str | None:
        """The served name ``model`` is rewritten to, or None when no alias renames it."""
        target = self.aliases.get(model)
        if target is None:
            for p in self.patterns:
                if p.regex.fullmatch(model):
                    target = p.model
                    break
        return None if target is None or target == model else target

    def rewrite(self, inbound: Inbound, raw: bytes) -> tuple[Inbound, bytes]:
        """``inbound`` and its bytes naming the served model; as they are when no alias
        renames it."""
        if not self.aliases and not self.patterns:
            return inbound, raw
        served = self.served(inbound.model)
        if served is None:
            return inbound, raw
        # The bytes parsed as a JSON object already: what orjson read, it writes back.
        body = orjson.loads(raw)
        body["model"] = served
        raw = orjson.dumps(body)
        ns = inbound.text.namespace
        old = inbound.model
        if ns == old or ns.startswith(old + _LORA_SEPARATOR):
            ns = served + ns[len(old) :]
        return replace(
            inbound,
            body={**inbound.body, "model": served},
            text=replace(inbound.text, namespace=ns),
            model=served,
        ), raw


def _name(f: ConfigFields, where: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        f.fail(where, f"must be a model name of 1 to {MAX_NAME_CHARS} characters, got {value!r}")
    return value


def _follow(f: ConfigFields, aliases: Mapping[str, str], start: str) -> str:
    """Where the chain of aliases from ``start`` ends; a cycle is a config error."""
    seen = [start]
    name = aliases[start]
    while name in aliases:
        if name in seen:
            loop = " -> ".join([*seen[seen.index(name) :], name])
            what = "names itself" if len(seen) == 1 else f"is part of a cycle ({loop})"
            f.fail(f.at(f"aliases.{start}"), f"the alias {what}")
        seen.append(name)
        name = aliases[name]
    return name


def models(f: ConfigFields | None) -> ModelAliases:
    """Decode the ``models`` section (None: no aliases)."""
    if f is None:
        return ModelAliases()
    raw: dict[str, str] = {}
    a = f.sub("aliases")
    if a is not None:
        if len(a.data) > MAX_ALIASES:
            a.fail(a.path, f"at most {MAX_ALIASES} aliases")
        for key in list(a.data):
            where = a.at(str(key))
            raw[_name(a, where, key)] = _name(a, where, a.data[key])
            a.used.add(key)
        a.done()
    flat: dict[str, str] = {}
    for alias, target in raw.items():
        if alias == target:
            f.fail(f.at(f"aliases.{alias}"), "the alias names itself")
        flat[alias] = _follow(f, raw, alias)
    entries = f.items("patterns")
    if len(entries) > MAX_PATTERNS:
        f.fail(f.at("patterns"), f"at most {MAX_PATTERNS} patterns")
    patterns: list[Pattern] = []
    for e in entries:
        glob = _name(e, e.at("match"), e.text("match", "", required=True))
        target = _name(e, e.at("model"), e.text("model", "", required=True))
        e.done()
        patterns.append(Pattern(glob, flat.get(target, target), glob_regex(glob)))
    f.done()
    return ModelAliases(flat, tuple(patterns))
