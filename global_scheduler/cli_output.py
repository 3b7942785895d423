"""How the operator commands print workloads and clusters: kubectl's ``-o``.

- ``table`` (the default): the columns an operator scans, sized to fit a 100-column terminal for
  typical names and messages; a column empty in every row is left out (no CLUSTER while all are pending).
  On a terminal narrower than the table the last column (MESSAGE) is cut with "…" to fit; in a pipe
  nothing is cut.
- ``wide``: more columns (full ID, region, nodes, class, …), never cut, as ``kubectl -o wide``.
- ``json`` / ``yaml``: the proto message (google.protobuf.json_format, field names as in
  protos/global_api.proto), a list of them for ``ls`` and ``clusters``.
- ``name``: ``workload/ID`` (or ``cluster/NAME``) one per line, for scripts.

Cells are plain text, two spaces apart (kubectl's tabwriter puts three; two leave MESSAGE more room), and
the table's ID is the first 8 hex digits (more where two rows share them): a message that contains
``[red]`` prints as itself, and nothing here depends on rich's column shrinking, which drops whole
columns when a table is wider than the terminal.

Only the standard library at import (the command tree is built on every ``meridian`` start);
protobuf and yaml are imported by the functions that format with them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

OUTPUT_FORMATS = ("table", "wide", "json", "yaml", "name")
OUTPUT_HELP = "table | wide | json | yaml | name"
# IDs are 32 hex digits; the table shows at least this many, more where two rows would share them (as git
# abbreviates commits), and every command takes a unique prefix. Eight leave room for MESSAGE in 100 columns.
SHORT_ID_CHARS = 8
# The MESSAGE column keeps at least this many characters when a narrow terminal cuts it.
MIN_FLEXIBLE_CHARS = 12
COLUMN_GAP = "  "


class OutputFormatError(ValueError):
    """An ``-o`` value that is none of :data:`OUTPUT_FORMATS`."""


def check_output_format(value: str) -> str:
    if value not in OUTPUT_FORMATS:
        raise OutputFormatError(f"unknown output format {value!r}: use one of {', '.join(OUTPUT_FORMATS)}")
    return value


def human_age(seconds: float) -> str:
    """Elapsed time as kubectl's AGE column writes it (k8s.io/apimachinery duration.HumanDuration):
    ``45s``, ``3m20s``, ``42m``, ``5h12m``, ``30h``, ``3d4h``, ``20d``, ``2y``."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    return f"{d // 365}y"


@dataclass(frozen=True)
class Column:
    """One table column: its header, its cell ("" = empty), whether only ``-o wide`` shows it, and
    whether it may be cut to fit the terminal (the last one, at most one per table)."""

    header: str
    cell: Callable[[Any, bool, float], str]  # (message, wide, now_unix_s) -> text
    wide_only: bool = False
    flexible: bool = False


def _state(w: Any) -> str:
    from global_scheduler.client import state_name

    return state_name(w.state)


def _nodes(w: Any) -> str:
    if not w.nodes:
        return ""
    return w.nodes[0] + (f" +{len(w.nodes) - 1}" if len(w.nodes) > 1 else "")


def _clock(unix_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s)) if unix_s else ""


WORKLOAD_COLUMNS: tuple[Column, ...] = (
    Column("ID", lambda w, wide, now: w.id),  # the table's is short_id_chars() long: see render_workloads
    Column("NAME", lambda w, wide, now: w.spec.name),
    Column("TENANT", lambda w, wide, now: w.spec.tenant),
    Column("STATE", lambda w, wide, now: _state(w)),
    Column("CLUSTER", lambda w, wide, now: w.cluster),
    Column("READY", lambda w, wide, now: f"{w.ready_replicas}/{w.spec.replicas}" if w.cluster else "",
           wide_only=True),
    Column("REGION", lambda w, wide, now: w.region, wide_only=True),
    Column("NODES", lambda w, wide, now: _nodes(w), wide_only=True),
    Column("REPLICAS", lambda w, wide, now: str(w.spec.replicas) if w.spec.replicas else "", wide_only=True),
    Column("CLASS", lambda w, wide, now: w.spec.workload_class, wide_only=True),
    Column("ATTEMPT", lambda w, wide, now: str(w.attempt) if w.attempt else "", wide_only=True),
    Column("NOT BEFORE", lambda w, wide, now: _clock(w.not_before_unix_s), wide_only=True),
    Column("AGE", lambda w, wide, now: human_age(now - w.created_unix_s) if w.created_unix_s else ""),
    Column("MESSAGE", lambda w, wide, now: w.message, flexible=True),
)


def _free_of(free: float, total: float, unit: str = "") -> str:
    return f"{free:.0f}/{total:.0f}{unit}"


CLUSTER_COLUMNS: tuple[Column, ...] = (
    Column("CLUSTER", lambda c, wide, now: c.name),
    Column("REGION", lambda c, wide, now: c.region),
    Column("STATUS", lambda c, wide, now: "Ready" if c.ready else "NotReady"),
    Column("NODES", lambda c, wide, now: str(c.nodes)),
    Column("FREE CPU", lambda c, wide, now: _free_of(c.free_milli_cpu / 1000, c.allocatable_milli_cpu / 1000)),
    Column("FREE MEMORY", lambda c, wide, now: _free_of(c.free_memory_bytes / 2**30,
                                                        c.allocatable_memory_bytes / 2**30, "Gi")),
    Column("FREE GPU", lambda c, wide, now: _free_of(c.free_gpus, c.gpus) if c.gpus else ""),
    # A cluster whose nodes report no carbon source sends 0 with carbon_unknown: not a clean grid.
    Column("CARBON(g/kWh)", lambda c, wide, now: "unknown" if c.carbon_unknown else f"{c.carbon_g_per_kwh:.0f}"),
    Column("PRICE(EUR/MWh)", lambda c, wide, now: f"{c.price_per_mwh:.0f}" if c.price_per_mwh else "",
           wide_only=True),
    Column("QUEUED", lambda c, wide, now: str(c.queued_workloads), wide_only=True),
    Column("LAST SEEN", lambda c, wide, now: human_age(now - c.last_seen_unix_s) if c.last_seen_unix_s else "",
           wide_only=True),
)


def render_table(columns: Sequence[Column], items: Sequence[Any], *, wide: bool = False, width: int | None = None,
                 hide: Collection[str] = (), now_unix_s: float | None = None) -> str:
    """The rows as kubectl prints them: upper-case headers, cells left-aligned, two spaces between
    columns, "-" in an empty cell of a column that has values elsewhere. A column empty in every row
    is left out, as are those named in ``hide`` (the TENANT of ``ls --tenant``, as kubectl leaves
    NAMESPACE out within one namespace). With ``width`` (a terminal's) and not ``wide``, the flexible
    column is cut with "…" so that each line fits, keeping at least :data:`MIN_FLEXIBLE_CHARS` of it."""
    now = time.time() if now_unix_s is None else now_unix_s
    chosen = [c for c in columns if (wide or not c.wide_only) and c.header not in hide]
    cells = [[c.cell(item, wide, now) for c in chosen] for item in items]
    keep = [i for i in range(len(chosen)) if any(row[i] for row in cells)]
    headers = [chosen[i].header for i in keep]
    rows = [[row[i] or "-" for i in keep] for row in cells]
    widths = [max([len(h), *(len(r[j]) for r in rows)]) for j, h in enumerate(headers)]
    flexible = [j for j, i in enumerate(keep) if chosen[i].flexible]
    if width is not None and not wide and flexible:
        j = flexible[0]
        others = sum(widths) - widths[j] + len(COLUMN_GAP) * (len(widths) - 1)
        room = max(width - others, MIN_FLEXIBLE_CHARS, len(headers[j]))
        if widths[j] > room:
            widths[j] = room
            for r in rows:
                if len(r[j]) > room:
                    r[j] = r[j][:room - 1] + "…"
    lines = [COLUMN_GAP.join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
             for line in (headers, *rows)]
    return "\n".join(lines)


def message_dict(message: Any) -> dict[str, Any]:
    """The proto as its JSON mapping (field names as in the .proto, enums by name, int64 as strings)."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(message, preserving_proto_field_name=True)


def render(items: Sequence[Any], output: str, *, kind: str, as_list: bool, columns: Sequence[Column],
           name_of: Callable[[Any], str], width: int | None = None, hide: Collection[str] = (),
           now_unix_s: float | None = None) -> str:
    """``items`` (workloads or clusters) in ``output`` format; ``as_list`` makes json/yaml a list even
    of one (``ls``, ``clusters``) rather than the one message (``get``, ``cancel``)."""
    check_output_format(output)
    if output == "name":
        return "\n".join(f"{kind}/{name_of(item)}" for item in items)
    if output in ("json", "yaml"):
        payload: Any = [message_dict(x) for x in items] if as_list else message_dict(items[0])
        if output == "json":
            return json.dumps(payload, indent=2)
        import yaml

        return yaml.safe_dump(payload, sort_keys=False, allow_unicode=True).rstrip("\n")
    return render_table(columns, items, wide=output == "wide", width=width, hide=hide, now_unix_s=now_unix_s)


def short_id_chars(ids: Collection[str]) -> int:
    """How much of each ID the table shows: :data:`SHORT_ID_CHARS`, or more until no two rows share it."""
    n, distinct = SHORT_ID_CHARS, set(ids)
    while len({i[:n] for i in distinct}) < len(distinct):
        n += 1
    return n


def render_workloads(items: Sequence[Any], output: str, *, as_list: bool = False, width: int | None = None,
                     hide: Collection[str] = (), now_unix_s: float | None = None) -> str:
    n = short_id_chars([w.id for w in items])
    columns = [Column("ID", lambda w, wide, now: w.id if wide else w.id[:n]), *WORKLOAD_COLUMNS[1:]]
    return render(items, output, kind="workload", as_list=as_list, columns=columns,
                  name_of=lambda w: w.id, width=width, hide=hide, now_unix_s=now_unix_s)


def render_clusters(items: Sequence[Any], output: str, *, width: int | None = None,
                    now_unix_s: float | None = None) -> str:
    return render(items, output, kind="cluster", as_list=True, columns=CLUSTER_COLUMNS,
                  name_of=lambda c: c.name, width=width, now_unix_s=now_unix_s)


def watch_key(w: Any) -> tuple[Any, ...]:
    """What a watch line shows, less its time: a snapshot with the same key prints nothing."""
    return (w.state, w.cluster, w.region, w.attempt, w.message, tuple(w.nodes), w.not_before_unix_s,
            w.ready_replicas)


def watch_line(w: Any, output: str) -> str:
    """One line per change: ``HH:MM:SS  STATE  CLUSTER  MESSAGE`` (UTC, the change's time); ``wide``
    adds region, attempt and nodes; ``json`` is one compact object a line (JSON Lines), ``yaml`` one
    document per change, ``name`` the workload's ``workload/ID``."""
    check_output_format(output)
    if output == "name":
        return f"workload/{w.id}"
    if output == "json":
        return json.dumps(message_dict(w), separators=(",", ":"))
    if output == "yaml":
        import yaml

        return "---\n" + yaml.safe_dump(message_dict(w), sort_keys=False, allow_unicode=True).rstrip("\n")
    stamp = time.strftime("%H:%M:%S", time.gmtime(w.updated_unix_s))
    if output == "wide":
        return (f"{stamp}  {_state(w):<10} {w.cluster or '-':<16} {w.region or '-':<12} "
                f"attempt {w.attempt:<3} {_nodes(w) or '-':<20} {w.message}").rstrip()
    return f"{stamp}  {_state(w):<10} {w.cluster or '-':<16} {w.message}".rstrip()
