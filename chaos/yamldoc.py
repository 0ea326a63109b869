"""YAML documents that remember where each value came from.

Scenarios and game-day phases are small YAML files a person edits by hand, so a
mistake must be reported as `FILE:LINE: reason`, before anything starts. PyYAML's
composed node tree carries line numbers; `load` turns it into plain Python values
plus a `Where` that maps a path of keys and indexes back to the line it came
from. Only the safe subset is read (no tags, no objects), and a mapping with a
repeated key is refused (YAML says keys are unique; PyYAML would keep the last).

Aliases (`*name`) are refused while the node tree is composed, before any value
is built: nine anchors of nine aliases each (900 bytes) expand to 9^9 values, and
`&a [*a]` is a list that contains itself; either would exhaust memory or the
stack. Nesting is bounded (MAX_DEPTH) for the same reason: the composer recurses.
No scenario or phase needs either.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from docket.errors import InputError
from docket.inputs import read_text

Path_ = tuple[str | int, ...]


class YamlError(InputError):
    """A YAML input that is missing, unreadable, malformed or has a bad value: FILE:LINE: reason."""


@dataclass
class Where:
    """Maps a path inside the document to a 1-based line of the file."""

    file: str
    lines: dict[Path_, int] = field(default_factory=dict)

    def line(self, path: Sequence[str | int] = ()) -> int:
        path = tuple(path)
        while path and path not in self.lines:
            path = path[:-1]  # a missing key is reported at its parent's line
        return self.lines.get(path, 1)

    def error(self, path: Sequence[str | int], reason: str) -> YamlError:
        """The error to raise for the value at `path`: `FILE:LINE: at a.b[2]: reason`."""
        shown = _show_path(path)
        where = f" at {shown}" if shown else ""
        return YamlError(f"{self.file}:{self.line(path)}:{where} {reason}")


def _show_path(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_PLAIN = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")
MAX_DEPTH = 64  # nested mappings and lists; the deepest real scenario has 4
MAX_NUMBER_CHARS = 32
_NUMBERS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _Refused(yaml.MarkedYAMLError):
    """Raised by the composer; reported as `FILE:LINE: not valid YAML: <problem>`."""


class _Loader(yaml.SafeLoader):
    """The safe loader, composing no alias and no node deeper than MAX_DEPTH."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(
                problem=f"alias *{event.anchor} refused (aliases are not supported: "
                "write the value out)",
                problem_mark=event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(
                    problem=f"nested more than {MAX_DEPTH} levels deep",
                    problem_mark=self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _value(node: yaml.Node, path: Path_, where: Where, loader: yaml.SafeLoader):
    where.lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and node.tag not in _PLAIN:
        # a tag on a collection would be ignored by this walk: refuse it, as the safe loader would
        raise YamlError(f"{where.file}:{node.start_mark.line + 1}: not valid YAML: tag {node.tag}")
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise where.error(path, "a mapping key must be a plain value")
            key = loader.construct_object(key_node)
            if not isinstance(key, str):
                key = str(key)
            if key in out:
                where.lines[(*path, key)] = key_node.start_mark.line + 1
                raise YamlError(
                    f"{where.file}:{key_node.start_mark.line + 1}: key {key!r} repeated"
                )
            out[key] = _value(value_node, (*path, key), where, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_value(item, (*path, i), where, loader) for i, item in enumerate(node.value)]
    if node.tag in _NUMBERS and len(node.value) > MAX_NUMBER_CHARS:
        # int() of a 5,000-digit scalar raises (Python's 4,300-digit limit); none is needed
        raise where.error(path, f"a number of more than {MAX_NUMBER_CHARS} characters")
    return loader.construct_object(node)


def loads(text: str, file: str) -> tuple[object, Where]:
    """Parse one YAML document; YamlError names the file and line of any problem."""
    where = Where(file)
    try:
        loader = _Loader(text)  # the reader refuses control characters here
    except yaml.YAMLError as exc:
        raise YamlError(f"{file}:1: not valid YAML: {str(exc).splitlines()[0]}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise YamlError(f"{file}:1: empty document")
        return _value(node, (), where, loader), where
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        problem = exc.problem or exc.context or "not valid YAML"
        raise YamlError(f"{file}:{line}: not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:  # a reader error: control characters, bad encoding
        raise YamlError(f"{file}:1: not valid YAML: {str(exc).splitlines()[0]}") from None
    finally:
        loader.dispose()


def load(path: str | os.PathLike) -> tuple[object, Where]:
    """Read and parse a YAML file (missing, empty, binary or huge: one-line InputError)."""
    text = read_text(Path(path), "YAML file", max_bytes=1024 * 1024)
    return loads(text, str(path))
