"""Code and current docs say why things are as they are, not when they changed.

The history of attempts lives in ``docs/history/`` (and in git): outside it, no reference to a diary's
numbered entries (``§0k``, "entry 4"), to a working session ("session 9", "session-5 split") or to a
benchmark output named after one (``bench-out/s9-…``) may appear in the product, the tests, the
README or the user docs.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"§0[a-z]|\b[Ss]ession[ -][0-9]+|bench-out/(?:[A-Za-z0-9_.]+-)*s[0-9]+[-.]|\b[Ee]ntry [0-9]+\b")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".proto"}
SKIPPED = {".venv", ".git", "history", "meridian.egg-info", "bench-out", "__pycache__"}


def _scanned() -> list[Path]:
    return [path for path in ROOT.rglob("*")
            if path.suffix in SUFFIXES and path.is_file() and not SKIPPED & set(path.relative_to(ROOT).parts)]


def test_no_numbered_history_marker_outside_docs_history() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}: {match.group(0)}"
             for path in _scanned()
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if path != Path(__file__) and (match := MARKER.search(line))]
    assert found == []


def test_the_pattern_finds_the_markers_it_is_meant_to() -> None:
    for line in ("chosen by the rule of bench-learned §0k", "(a hyper-parameter, entry 4)",
                 "session 9's runs", "the session-5 split", "--json bench-out/s9-online.json",
                 "bench-out/routing-s5-samework.json", "bench-out/api-quiet-s2.json"):
        assert MARKER.search(line), line
    for line in ("FGD paper, §3–4", "the traces README §5b", "an entry point", "bench-out/online-default.json"):
        assert not MARKER.search(line), line
