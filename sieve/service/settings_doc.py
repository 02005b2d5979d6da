"""docs/configuration.md, generated from the settings classes themselves: each field's type, default, bounds and
`description=`, grouped by the `# comment` lines that head groups of fields in the class body. Regenerate with

    python -m sieve.service.settings_doc > docs/configuration.md      (or: sieve settings --markdown)

tests/test_readme_and_cli.py fails when the committed file differs from what this renders.
"""
from __future__ import annotations

import inspect
import re
import types
import typing
from pathlib import Path

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

REGENERATE = "python -m sieve.service.settings_doc > docs/configuration.md"
INTRO = f"""# Configuration

<!-- Generated from the settings' own descriptions by sieve/service/settings_doc.py; do not edit by hand.
     Regenerate: {REGENERATE} -->

Every setting is an environment variable, read once at start-up into one settings object and handed to whatever
needs it. An optional setting is unset when its variable is absent. A `SIEVE_*_PATH` may name a checkpoint
shipped inside the package as `shipped:NAME` (`shipped:cmc`, `shipped:cmc-fusion`, `shipped:cross-encoder`).
Dictionaries are given as JSON; booleans as `true`/`false` (or `1`/`0`).
"""
GROUP_COMMENT = re.compile(r"^    # (?P<title>.+)$")
FIELD_LINE = re.compile(r"^    (?P<name>[a-z_][a-z0-9_]*)\s*:")


def registered_stages() -> list:
    """Every stage this installation registers: the core's and the plugins' (sieve/pipeline/registry.py)."""
    import sieve.stages  # noqa: F401 (registers the core stages)
    from sieve.pipeline import registry

    registry.load_plugins()
    return registry.stages()


def settings_sections() -> list[tuple[str, type[BaseSettings]]]:
    """The settings classes that configuration.md documents, in order: (section title, class): the service's,
    then each registered stage's own class."""
    from sieve.service.config import Settings

    sections, seen = [("Service", Settings)], {Settings}
    for spec in registered_stages():
        if spec.settings is not None and spec.settings not in seen:
            seen.add(spec.settings)
            sections.append((f"Stage `{spec.name}`" + (" (research)" if spec.research else ""), spec.settings))
    return sections


def stages_table(specs) -> str:
    """Which request value names each stage, and which settings it reads (from the registry)."""
    rows = ["## Stages\n", "Each stage a request can name (`retriever`, `rerank`, `ce_model`, `/rerank` `model`), from "
            "the stage registry; a stage's own settings class is listed below the service's.\n",
            "| stage | role | what it is | service settings it reads | own settings | score keys | timing keys |",
            "|---|---|---|---|---|---|---|"]
    for spec in specs:
        reads = ", ".join(f"`SIEVE_{name.upper()}`" for name in spec.reads) or "-"
        own = ", ".join(f"`SIEVE_{name.upper()}`" for name in spec.settings.model_fields) if spec.settings else "-"
        rows.append(f"| `{spec.name}` | {spec.role} | {spec.summary}{' (research)' if spec.research else ''} | "
                    f"{reads} | {own} | {', '.join(spec.scores)} | {', '.join(spec.timings)} |")
    return "\n".join(rows) + "\n"


def render(sections: list[tuple[str, type[BaseSettings]]], specs=None) -> str:
    parts = [INTRO, stages_table(registered_stages() if specs is None else specs)]
    for title, cls in sections:
        module = cls.__module__.replace(".", "/") + ".py"
        parts.append(f"## {title}\n\n`{cls.__name__}` in `{module}`.\n")
        for group, names in field_groups(cls):
            if group:
                parts.append(f"### {group}\n")
            parts.append(table(cls, names))
    return "\n".join(parts)


def field_groups(cls: type[BaseSettings]) -> list[tuple[str | None, list[str]]]:
    """Fields in declaration order, under the comment line that precedes them in the class body (None: no comment)."""
    fields = cls.model_fields
    groups: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in inspect.getsource(cls).splitlines():
        if comment := GROUP_COMMENT.match(line):
            groups.append((heading(comment["title"]), []))
        elif (field := FIELD_LINE.match(line)) and field["name"] in fields:
            groups[-1][1].append(field["name"])
    listed = {name for _, names in groups for name in names}
    groups[0][1].extend(name for name in fields if name not in listed)  # inherited or generated fields
    return [(title, names) for title, names in groups if names]


def heading(comment: str) -> str:
    """The comment as a heading: first letter upper-cased unless the word is a name (annCUR, CMC)."""
    first = comment.split()[0]
    return comment[0].upper() + comment[1:] if first.islower() else comment


def table(cls: type[BaseSettings], names: list[str]) -> str:
    prefix = cls.model_config.get("env_prefix", "")
    rows = ["| variable | type | default | description |", "|---|---|---|---|"]
    for name in names:
        info = cls.model_fields[name]
        cells = (f"`{(prefix + name).upper()}`", type_of(info), default_of(info), info.description or "")
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def type_of(info: FieldInfo) -> str:
    return type_name(info.annotation) + bounds(info)


def type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        named = " or ".join(type_name(a) for a in args if a is not type(None))
        return named + (", optional" if type(None) in args else "")
    if origin is typing.Literal:
        return " / ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin is dict:
        return "JSON object"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path", SecretStr: "secret"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds(info: FieldInfo) -> str:
    symbols = {annotated_types.Ge: (">=", "ge"), annotated_types.Gt: (">", "gt"), annotated_types.Le: ("<=", "le"),
               annotated_types.Lt: ("<", "lt")}
    found = [f"{symbol} {value_text(getattr(m, attr))}" for m in info.metadata
             for symbol, attr in [symbols.get(type(m), (None, None))] if symbol]
    return f" ({', '.join(found)})" if found else ""


def default_of(info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=True)
    return "unset" if value is None else f"`{value_text(value)}`"


def value_text(value) -> str:
    """Machine-independent: a path under the home directory is written from `~`."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Path):
        home = Path.home()
        return "~/" + value.relative_to(home).as_posix() if value.is_relative_to(home) else value.as_posix()
    if isinstance(value, dict):
        import json

        return json.dumps(value)
    return str(value)


def main() -> None:
    print(render(settings_sections()), end="")


if __name__ == "__main__":
    main()
