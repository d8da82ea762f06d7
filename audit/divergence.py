"""A divergence as the driver holds it: one collected DIVERGENCES row, evidence parsed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Divergence:
    stream: str
    node: str
    cls: str
    first_seq: int | None = None
    last_seq: int | None = None
    seqs: int | None = None
    consumer: str | None = None
    holder: str | None = None
    sources: tuple[str, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Divergence:
        evidence = row.get("evidence") or "{}"
        return cls(stream=row["stream"], node=row["node"], cls=row["class"],
                   first_seq=row.get("first_seq"), last_seq=row.get("last_seq"),
                   seqs=row.get("seqs"), consumer=row.get("consumer"), holder=row.get("holder"),
                   sources=tuple(row.get("sources") or ()),
                   evidence=json.loads(evidence) if isinstance(evidence, str) else dict(evidence))

    def span(self) -> str:
        """"7", "2-6" or "" (a divergence of a whole copy, view or consumer)."""
        if self.first_seq is None:
            return ""
        if self.first_seq == self.last_seq:
            return str(self.first_seq)
        return f"{self.first_seq}-{self.last_seq}"

    def label(self) -> str:
        """E.g. "HOLE 2-6 on n2 of s", "CONSUMER c (store) on n2 of s"."""
        what = " ".join(part for part in (self.cls, self.span()) if part)
        if self.consumer is not None:
            what += f" {self.consumer} ({self.holder})"
        return f"{what} on {self.node} of {self.stream}"

    def sort_key(self) -> tuple[str, str, str, int, str]:
        return (self.stream, self.node, self.cls, self.first_seq or 0, self.consumer or "")

    def to_json(self) -> dict[str, Any]:
        return {"stream": self.stream, "node": self.node, "class": self.cls,
                "first_seq": self.first_seq, "last_seq": self.last_seq, "seqs": self.seqs,
                "consumer": self.consumer, "holder": self.holder, "sources": list(self.sources),
                "evidence": self.evidence}
