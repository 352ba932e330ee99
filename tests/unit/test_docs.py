"""The manual: ``docs/`` builds with MkDocs in strict mode (every page in the nav, every link
and anchor between pages resolving), and the README stays a short entry point whose links to
repository files all hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
README_MAX_LINES = 300
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    """Markdown text without its fenced blocks and code spans (their brackets are no links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The ids MkDocs gives a page's headings (Python-Markdown's toc slugs)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slugify(re.sub(r"[`*]", "", title), "-") for title in HEADING.findall(text)}


def test_the_docs_build_in_strict_mode(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"mkdocs build --strict exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )


def test_the_readme_has_at_most_300_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move detail to docs/"
    )


def test_every_file_the_readme_links_to_exists():
    targets = LINK.findall(prose(README.read_text(encoding="utf-8")))
    relative = [t for t in targets if not SCHEME.match(t) and not t.startswith("#")]
    assert relative, "no relative link found in README.md: is the pattern still right?"
    broken = []
    for target in relative:
        path, _, anchor = target.partition("#")
        file = REPO / path
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor in {path}")
    assert not broken, "README.md links that do not hold:\n" + "\n".join(broken)
