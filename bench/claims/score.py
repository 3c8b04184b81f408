"""What a claim kind scores: events (precision, recall, delay from the known onset) and ranges
(coverage of the truth, width), as forecasters score forecasts."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

__all__ = ["Score"]


@dataclass
class Score:
    """One claim kind over one set of seeds.

    Events: ``positives`` cases hold something to say, ``found`` of them said it right (recall);
    ``stated`` claims were made, ``true`` of them right (precision); ``delays`` in steps from the
    truth's onset to the step the claim names or is made at. Ranges: ``ranged`` stated ranges,
    ``covered`` of them holding the truth (coverage, the calibration of a "90 %"), ``widths`` each
    range's width over the truth's distance. ``misses`` keeps a few wrong claims to read, ``notes``
a kind's own figures in words."""

    kind: str
    positives: int = 0
    found: int = 0
    negatives: int = 0  # cases where nothing is to be said
    stated: int = 0
    true: int = 0
    delays: list[float] = field(default_factory=list)
    ranged: int = 0
    covered: int = 0
    widths: list[float] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    notes: str = ""  # a kind's own figures besides these (warnings per 1,000 healthy steps)

    def event(self, *, truth: bool, said: bool, right: bool, delay: float | None = None,
              what: str = "") -> None:
        """One case: whether there was something to say, whether a claim was made, whether it
        was right (name and step within the kind's tolerance)."""
        if truth:
            self.positives += 1
            self.found += said and right
        else:
            self.negatives += 1
        if said:
            self.stated += 1
            self.true += right
            if right and delay is not None:
                self.delays.append(delay)
        if said != truth or (said and not right):
            self.miss(what)

    def range(self, *, low: float, high: float, truth: float, what: str = "") -> None:
        """A stated range against the truth it claims to hold."""
        self.ranged += 1
        inside = low <= truth <= high
        self.covered += inside
        self.widths.append((high - low) / max(abs(truth), 1.0))
        if not inside:
            self.miss(f"{what} range {low:g}-{high:g}, truth {truth:g}")

    def miss(self, what: str) -> None:
        if what and len(self.misses) < 5:
            self.misses.append(what)

    @property
    def precision(self) -> float | None:
        return self.true / self.stated if self.stated else None

    @property
    def recall(self) -> float | None:
        return self.found / self.positives if self.positives else None

    @property
    def coverage(self) -> float | None:
        return self.covered / self.ranged if self.ranged else None

    @property
    def false_claims(self) -> int:
        return self.stated - self.true

    def row(self) -> dict[str, str]:
        """The figures as table cells."""
        def share(value: float | None, num: int, den: int) -> str:
            return "-" if value is None else f"{value:.2f} ({num}/{den})"
        delay = "-" if not self.delays else (
            f"{statistics.median(self.delays):.0f} median, {max(self.delays):.0f} max")
        width = "-" if not self.widths else f"{statistics.median(self.widths):.2f}"
        return {"kind": self.kind,
                "precision": share(self.precision, self.true, self.stated),
                "recall": share(self.recall, self.found, self.positives),
                "false claims": f"{self.false_claims} ({self.negatives} silent cases)",
                "delay (steps)": delay,
                "coverage": share(self.coverage, self.covered, self.ranged),
                "width / distance": width, "notes": self.notes or "-"}
