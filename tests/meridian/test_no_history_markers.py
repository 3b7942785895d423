"""Code and current docs say why things are as they are, not when they changed.

The history of attempts lives in ``docs/history/`` (and in git). Outside it, three forms of reference to
that history may not appear in the product, the tests, the README or the user docs: a diary's numbered
entry (a section sign followed by ``0`` and a letter, or the word "entry" and a number), a working
session's number (the word "session" and a number), and a benchmark output file named after a session
(``bench-out/`` … ``-s`` and a number).
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
             if (match := MARKER.search(line))]
    assert found == []


def _forms(number: int) -> list[str]:
    """Each form the pattern must find, built from its parts so this file holds none of them."""
    section, session, entry = "§0", "ses" + "sion", "en" + "try"
    return [f"chosen by the rule of {section}q", f"(a hyper-parameter, {entry} {number})",
            f"{session} {number}'s runs", f"the {session}-{number} split",
            f"--json bench-out/s{number}-online.json", f"bench-out/routing-s{number}-same.json"]


def test_the_pattern_finds_the_forms_it_is_meant_to() -> None:
    for line in _forms(7):
        assert MARKER.search(line), line
    for line in ("FGD paper, §3–4", "the traces README §5b", "an entry point", "bench-out/online-default.json",
                 "bench-out/openb-speed-1seed.json", "bench-out/seed-50x200.json"):
        assert not MARKER.search(line), line
