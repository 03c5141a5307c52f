"""The offline corpora the draft heads learn from, and their whole-file train / held-out split.

Three sources of text, all installed on the machine, nothing downloaded:

* ``code``: the CPython standard library sources, ``lib/python3.X/**/*.py`` minus
  ``site-packages``;
* ``python-docs``: the Python 3.11 documentation's reST sources (Debian ``python3.11-doc``,
  ``/usr/share/doc/python3.11/html/_sources/**/*.rst.txt``);
* ``postgresql-docs``: the PostgreSQL 15 manual (Debian ``postgresql-doc-15``,
  ``/usr/share/doc/postgresql-doc-15/html/*.html``), reduced to text.

The ``english`` training domain is python-docs plus postgresql-docs. Every file has a *split
key*; a file is held out iff ``int(sha256(key)[:8], 16) % 10 == 0``. The keys of code and Python
documentation files are ``code/<relpath>`` and ``english/<relpath>``, as in the first heads'
recipe, so the files held out then are held out now. Instruction prompts made from a file
inherit its side of the split (``heads_prompts.py``).
"""

from __future__ import annotations

import hashlib
import html.parser
import re
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Source", "SOURCES", "HELDOUT_MOD", "split_hash", "is_heldout", "list_files", "read_text"]

HELDOUT_MOD = 10  # one file in ten is held out


@dataclass(frozen=True)
class Source:
    """One folder of offline text files.

    Attributes:
        name: the source's name (``code``, ``python-docs``, ``postgresql-docs``).
        root: the folder.
        pattern: the glob of its files.
        key_prefix: split keys are ``key_prefix + relpath``.
        install: how to get the folder when it is missing.
    """

    name: str
    root: Path
    pattern: str
    key_prefix: str
    install: str

    def key(self, rel: str) -> str:
        return self.key_prefix + rel


SOURCES = {
    s.name: s for s in (
        Source("code", Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}",
               "*.py", "code/", "a CPython installation with its standard library"),
        Source("python-docs", Path("/usr/share/doc/python3.11/html/_sources"), "*.rst.txt", "english/",
               "apt-get install -y python3.11-doc"),
        Source("postgresql-docs", Path("/usr/share/doc/postgresql-doc-15/html"), "*.html", "english/postgresql/",
               "apt-get install -y postgresql-doc-15"),
    )
}


def split_hash(key: str) -> int:
    """The 32-bit hash that orders files and decides their side of the split."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


def is_heldout(key: str) -> bool:
    return split_hash(key) % HELDOUT_MOD == 0


def list_files(source: Source) -> list[str]:
    """Relative paths of a source's files, sorted.

    Raises:
        SystemExit: the folder is missing (the message says how to install it).
    """
    if not source.root.is_dir():
        raise SystemExit(f"corpus folder {source.root} for {source.name!r} is missing ({source.install})")
    return sorted(str(p.relative_to(source.root)) for p in source.root.rglob(source.pattern)
                  if p.is_file() and "site-packages" not in p.parts)


class _HtmlText(html.parser.HTMLParser):
    """The text of a DocBook HTML page without its navigation bars, one paragraph per block."""

    _BLOCKS = {"p", "pre", "li", "dt", "dd", "h1", "h2", "h3", "h4", "tr", "div", "table", "title"}
    _NAV = {"navheader", "navfooter"}
    _HIDDEN = {"head", "script", "style"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._nav_depth = 0  # > 0 inside a navigation bar: the number of open divs there
        self._hidden = 0  # > 0 inside <head>, <script> or <style>
        self._pre = 0  # > 0 inside <pre>: keep the whitespace

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._nav_depth:
            self._nav_depth += tag == "div"
            return
        if tag == "div" and set((dict(attrs).get("class") or "").split()) & self._NAV:
            self._nav_depth = 1
        self._hidden += tag in self._HIDDEN
        self._pre += tag == "pre"
        if tag in self._BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if self._nav_depth:
            self._nav_depth -= tag == "div"
            return
        self._hidden -= tag in self._HIDDEN and self._hidden > 0
        self._pre -= tag == "pre" and self._pre > 0
        if tag in self._BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._nav_depth or self._hidden:
            return
        self.parts.append(data if self._pre else re.sub(r"\s+", " ", data))

    def text(self) -> str:
        blocks = (b.strip("\n") for b in re.split(r"\n{2,}", "".join(self.parts)))
        return "\n\n".join(b.strip() if "\n" not in b else b for b in blocks if b.strip()) + "\n"


def read_text(source: Source, rel: str) -> str:
    """A file's text: as it is, or an HTML page reduced to its readable text."""
    raw = (source.root / rel).read_text(encoding="utf-8", errors="replace")
    if not rel.endswith(".html"):
        return raw
    parser = _HtmlText()
    parser.feed(raw)
    parser.close()
    return parser.text()
