"""One tiny export holding a stream per divergence scenario, so a single classification (one
Spark job, a few seconds) covers every class; each test then looks at its own stream.

Every stream has replicas n1, n2, n3 (primary n1) and seqs 1..10 under epoch 1 unless its
scenario says otherwise; every node holds the same metadata view (applied index 100) except
where a scenario changes one.
"""

from __future__ import annotations

from dataclasses import replace

from tests.audit.frames import NODES, Copy, Export, View, consumer_row, digest, records

LAST = 10


def add_clean(export: Export, stream: str, *, view: View | None = None,
           nodes: tuple[str, ...] = NODES) -> dict[str, Copy]:
    view = view or View(stream)
    copies = {node: Copy(node, stream, records(stream, range(1, LAST + 1))) for node in nodes}
    export.copies += copies.values()
    for node in NODES:
        export.views[node].append(replace(view))
    return copies


def build() -> Export:
    export = Export(copies=[], views={node: [] for node in NODES})
    add_clean(export, "s_clean")

    copies = add_clean(export, "s_hole")
    for seq in (4, 5, 6):
        del copies["n2"].records[seq]

    copies = add_clean(export, "s_tail")
    copies["n3"].records |= {seq: (1, digest("s_tail", seq, "x")) for seq in (11, 12, 13)}

    copies = add_clean(export, "s_content")
    copies["n3"].records[7] = (1, digest("s_content", 7, "other"))

    history = ((1, 1), (2, 6))
    copies = add_clean(export, "s_epoch", view=View("s_epoch", history=history))
    for node in NODES:
        copies[node].records |= records("s_epoch", range(6, LAST + 1), epoch=2)
    copies["n3"].records |= {seq: (1, digest("s_epoch", seq, "old")) for seq in (6, 7, 8)}

    copies = add_clean(export, "s_head")
    for seq in (1, 2, 3):
        del copies["n3"].records[seq]

    copies = add_clean(export, "s_retention")  # the primary trimmed, the replicas not yet
    for seq in (1, 2, 3):
        del copies["n1"].records[seq]

    unknown = Copy("n1", "s_unknown", records("s_unknown", range(1, 4)))
    export.copies.append(unknown)

    add_clean(export, "s_unlisted", view=View("s_unlisted", replicas=("n1", "n2")))

    add_clean(export, "s_notexp", view=View("s_notexp", replicas=("n1", "n2", "n4")),
           nodes=("n1", "n2"))

    add_clean(export, "s_meta")
    n3_view = next(v for v in export.views["n3"] if v.stream == "s_meta")
    n3_view.primary = "n2"

    add_clean(export, "s_consumer")
    export.consumers += [consumer_row(node, stream="s_consumer") for node in NODES]
    export.consumers.append(consumer_row("n2", stream="s_consumer", holder="store",
                                         ack_floor=4))
    export.consumers += [consumer_row(node, stream="s_consumer", consumer="d",
                                      delivered_seq=12, ack_floor=11, acked=(13,))
                         for node in NODES]

    copies = add_clean(export, "s_lag")
    for seq in (8, 9, 10):
        del copies["n3"].records[seq]

    copies = add_clean(export, "s_fallback")  # seq 9 survives on n1 only, yet is committed
    del copies["n2"].records[9]
    for seq in (9, 10):
        del copies["n3"].records[seq]

    copies = add_clean(export, "s_ambiguous")
    for node in NODES:
        copies[node].records[5] = (1, digest("s_ambiguous", 5, node))

    copies = add_clean(export, "s_absent")
    export.copies.remove(copies["n3"])

    # A majority holds seq 5 under an epoch the history lacks.
    copies = add_clean(export, "s_majority_bad_epoch")
    for node in ("n1", "n2"):
        copies[node].records[5] = (2, digest("s_majority_bad_epoch", 5))

    copies = add_clean(export, "s_primary_tail")
    copies["n1"].records |= {seq: (1, digest("s_primary_tail", seq)) for seq in (11, 12)}
    return export
