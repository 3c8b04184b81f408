"""What a Prometheus scrape of the exporter reads, parsed the way Prometheus parses it."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlmon.service.export.exporter import MetricsState
from rlmon.service.export.http import build_registry

__all__ = ["Labels", "Samples", "exposition", "labels", "parse_samples", "scrape"]

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Samples = dict[tuple[str, Labels], float]  # (sample name, labels) -> value


def labels(**kw: str) -> Labels:
    """The key of a sample's labels in :data:`Samples`."""
    return tuple(sorted(kw.items()))


def exposition(state: MetricsState) -> str:
    """The text /metrics serves for ``state`` (rlmon's collector, without process metrics)."""
    return generate_latest(build_registry(state, process=False)).decode()


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by (name, labels)."""
    return {(s.name, labels(**s.labels)): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(state: MetricsState) -> Samples:
    """Every sample a scrape of ``state`` reads."""
    return parse_samples(exposition(state))
