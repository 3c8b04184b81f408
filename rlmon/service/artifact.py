"""A checked-in file (or a marked block of one) rendered from code: what each producer of
:mod:`rlmon.service.generated` hands ``rlmon generate``. Its own module, below the producers, so
that the registry that imports them by name is not imported back by them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Artifact"]


@dataclass(frozen=True, slots=True)
class Artifact:
    """A file (or, with ``block``, a marked block inside a file) rendered from code."""

    path: str  # relative to the project root
    render: Callable[[], str]
    block: str | None = None
    # for a generated part of a hand-written file that has no comments to mark it (JSON): puts
    # what `render` gives into the current file
    splice: Callable[[str, str], str] | None = None

    def _markers(self) -> tuple[str, str]:
        return (f"<!-- generated:{self.block}:start -->\n", f"<!-- generated:{self.block}:end -->")

    def expected(self, current: str | None) -> str:
        """The file's content as it should be, given its current content."""
        body = self.render()
        if self.splice is not None:
            if current is None:
                raise ValueError(f"{self.path} is missing: only a part of it is generated")
            return self.splice(current, body)
        if self.block is None:
            return body
        start, end = self._markers()
        text = current or ""
        if start not in text or end not in text:
            raise ValueError(f"{self.path} lacks the markers {start.strip()} ... {end}")
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        return head + start + body + end + tail
