"""YAML for manifests, bounded: a "billion laughs" document of nested aliases is tiny as text but expands
exponentially once walked (validation, JSON), which would hang `folio up` or the CLI. A document whose
expanded size (nodes, counting every alias as a copy of what it names) passes the budget is refused with a
clear error; real manifests have a few hundred nodes."""

from __future__ import annotations

from typing import Any

import yaml

MAX_EXPANDED_NODES = 100_000


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size

    def compose_node(self, parent: Any, index: Any) -> Any:
        node = super().compose_node(parent, index)
        size = self._sizes.get(id(node))
        if size is None:  # a new node (an alias returns one already sized)
            if isinstance(node, yaml.SequenceNode):
                size = 1 + sum(self._sizes.get(id(c), 1) for c in node.value)
            elif isinstance(node, yaml.MappingNode):
                size = 1 + sum(self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1) for k, v in node.value)
            else:
                size = 1
            self._sizes[id(node)] = size
        if size > MAX_EXPANDED_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"the document expands to more than {MAX_EXPANDED_NODES} nodes (nested aliases?)",
                node.start_mark,
            )
        return node

    def compose_document(self) -> Any:
        self._sizes = {}
        return super().compose_document()


def load_all(text: str | bytes) -> list[Any]:
    """Every document of ``text`` (safe types only, bounded expansion); raises yaml.YAMLError."""
    return list(yaml.load_all(text, Loader=_BoundedLoader))  # a SafeLoader subclass: safe types only
