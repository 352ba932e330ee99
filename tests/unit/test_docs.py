"""The manual: ``docs/`` builds with MkDocs in strict mode (every page in the nav, every link
and anchor between pages resolving), and the README stays a short entry point whose links to
repository files all hold. The benchmarks' figures live in the pages ``make bench`` writes
(``docs/benchmarks/``), linked from the manual and restated nowhere else."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType
from urllib.parse import urljoin, urlsplit

import pytest
from markdown.extensions.toc import slugify

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
BENCH = REPO / "bench"
BENCH_PAGES = DOCS / "benchmarks"
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


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The manual built once, strictly: a warning (a broken link, a page left out) fails it."""
    directory = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(directory)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"mkdocs build --strict exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
    return directory


def test_the_docs_build_in_strict_mode(site):
    assert (site / "index.html").is_file()


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


# --- The benchmarks' pages -------------------------------------------------------------------

# A number as the pages and the prose write it: digits, a decimal point, thousands separators.
NUMBER = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w]|[.,]\d)")
BOLD = re.compile(r"\*\*([^*\n]+)\*\*")
TABLE_RULE = re.compile(r"^\|[\s:|-]+\|$")


def benches() -> list[ModuleType]:
    """Every benchmark script (``bench/*_bench.py``), imported: a new one is held to the same;
    and the drill, which writes a page of figures too."""
    modules = [importlib.import_module(f"bench.{p.stem}") for p in sorted(BENCH.glob("*_bench.py"))]
    assert modules, "no bench/*_bench.py found: is the pattern still right?"
    return [*modules, importlib.import_module("streamfleet_dev.wsapi.drill")]


def outputs() -> dict[Path, str]:
    """Every file a bench declares it writes (its module's ``OUTPUTS``), and which bench."""
    found = {}
    for module in benches():
        declared = getattr(module, "OUTPUTS", ())
        assert declared, f"{module.__name__} declares no OUTPUTS: what does it write?"
        found.update({Path(path).resolve(): module.__name__ for path in declared})
    return found


def figures(text: str) -> list[str]:
    """The numbers of a text that can be figures. Settings are round (0.5 s, 20 streams, 2,000
    connections), measurements rarely are: left out are whole numbers below 100 or ending in
    0, and decimals below 10 that are a multiple of 0.5."""
    found = []
    for number in NUMBER.findall(text):
        plain = number.replace(",", "")
        value = Decimal(plain)
        if "." in plain:
            if value < 10 and (value * 2) == (value * 2).to_integral_value():
                continue
        elif value < 100 or value % 10 == 0:
            continue
        found.append(plain)
    return found


def measured(page: Path) -> set[str]:
    """A generated page's measured figures: the numbers in its tables' cells (not the first
    column, which names the measure, nor a target column) and in its bold text."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found: set[str] = set()
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = [cell.lower() for cell in cells]
        elif not TABLE_RULE.match(line.strip()):
            for name, cell in list(zip(header, cells, strict=False))[1:]:
                if "target" not in name:
                    found.update(figures(cell))
    for bold in BOLD.findall(text):
        found.update(figures(bold))
    return found


def restated(number: str, page_figures: set[str]) -> bool:
    """``number`` is one of the figures, as written or rounded (to 3 significant digits or more:
    fewer match too much by chance)."""
    if number in page_figures:
        return True
    digits = number.replace(".", "").lstrip("0")
    if len(digits) < 3:
        return False
    places = Decimal(1).scaleb(-len(number.partition(".")[2]))
    return any(
        Decimal(figure).quantize(places) == Decimal(number)
        for figure in page_figures
        if len(figure.partition(".")[2]) > len(number.partition(".")[2])
    )


def blocks(text: str) -> list[str]:
    """A page's paragraphs, list blocks and table rows (each row on its own), code left out."""
    found = []
    for block in re.split(r"\n\s*\n", prose(text)):
        lines = block.strip().splitlines()
        if lines and all(line.startswith("|") for line in lines):
            found.extend(lines)
        elif lines:
            found.append(block)
    return found


def links_to(block: str, page: Path, target: Path) -> bool:
    """Whether ``block`` of ``page`` links to the file ``target``."""
    for link in LINK.findall(block):
        path = link.partition("#")[0]
        if path and not SCHEME.match(path) and (page.parent / path).resolve() == target:
            return True
    return False


class _References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.extend(value for name, value in attrs if name in ("href", "src") and value)


def site_links(site: Path) -> dict[str, set[str]]:
    """Every file of the built site a page links to (``href`` or ``src``), and from which pages."""
    linked: dict[str, set[str]] = {}
    for html in site.rglob("*.html"):
        page = "/" + html.relative_to(site).as_posix()
        parser = _References()
        parser.feed(html.read_text(encoding="utf-8"))
        for reference in parser.found:
            url = urlsplit(urljoin(page, reference))
            if url.scheme or url.netloc:
                continue
            path = url.path + ("index.html" if url.path.endswith("/") else "")
            linked.setdefault(path, set()).add(page)
    return linked


def site_path(output: Path) -> str:
    """Where MkDocs puts a file of ``docs/`` (pages as ``<name>/index.html``)."""
    relative = output.relative_to(DOCS).as_posix()
    return "/" + (
        relative.removesuffix(".md") + "/index.html" if output.suffix == ".md" else relative
    )


def test_every_bench_writes_its_figures_into_the_manual():
    declared = outputs()
    elsewhere = [
        f"{bench}: {path}" for path, bench in declared.items() if path.parent != BENCH_PAGES
    ]
    assert not elsewhere, "bench outputs outside docs/benchmarks/:\n" + "\n".join(elsewhere)
    missing = [f"{bench}: {path.name}" for path, bench in declared.items() if not path.is_file()]
    assert not missing, "bench outputs not committed in docs/benchmarks/:\n" + "\n".join(missing)
    stray = sorted(p.name for p in BENCH_PAGES.iterdir() if p.resolve() not in declared)
    assert not stray, f"files in docs/benchmarks/ that no bench writes: {stray}"
    results = sorted(p.name for p in BENCH.iterdir() if p.is_file() and p.suffix != ".py")
    assert not results, f"bench/ holds the scripts only, its results go to docs/: {results}"


def test_every_bench_page_says_make_bench_writes_it_and_names_its_run():
    for path, bench in outputs().items():
        if path.suffix != ".md":
            continue
        head = []  # the text above the page's first table or section
        for line in path.read_text(encoding="utf-8").splitlines()[1:]:
            if line.startswith(("|", "## ")):
                break
            head.append(line)
        head_text = "\n".join(head)
        assert re.search(r"`make (bench|drill)` writes this page", head_text), (
            f"{path.name}: no banner"
        )
        assert f"`python -m {bench}`" in head_text, f"{path.name}: does not name {bench}"
        assert re.search(r"\d{4}-\d{2}-\d{2}", head_text), f"{path.name}: no date of its run"
        assert "CPUs" in head_text, f"{path.name}: does not name the machine"


def test_every_bench_output_is_linked_from_the_built_site(site):
    linked = site_links(site)
    unlinked = []
    for output in outputs():
        target = site_path(output)
        assert (site / target.lstrip("/")).is_file(), f"{target} is not in the built site"
        if not linked.get(target, set()) - {target}:
            unlinked.append(target)
    assert not unlinked, f"bench outputs no other page of the site links to: {unlinked}"


def test_a_quick_live_delivery_run_does_not_write_over_the_manual(tmp_path):
    from bench import fanout_bench

    assert fanout_bench.results_path({"quick": False, "logs": str(tmp_path)}) == (
        fanout_bench.RESULTS
    )
    quick = fanout_bench.results_path({"quick": True, "logs": str(tmp_path)})
    assert quick.parent == tmp_path


def test_no_page_restates_the_bench_figures():
    """A measured figure lives in the page the bench writes: the manual links to it. A block
    (paragraph, list or table row) of a hand-written page restates a bench page when it holds
    two or more of its figures (one number alone matches by chance: a drill's 2.67 s and the
    live-delivery bench's); outside ``docs/benchmarks.md``, which says how the benches measure
    and links to every page, such a block must link to the page its figures come from (a
    claim's bound beside its source)."""
    generated = {p: measured(p) for p in outputs() if p.suffix == ".md"}
    assert all(generated.values()), "a bench page without figures: is measured() still right?"
    hand_written = [p for p in [README, *DOCS.rglob("*.md")] if p.resolve().parent != BENCH_PAGES]
    overview = (DOCS / "benchmarks.md").resolve()
    found = []
    for page in hand_written:
        for block in blocks(page.read_text(encoding="utf-8")):
            numbers = set(figures(block))
            for source, page_figures in generated.items():
                copies = sorted(n for n in numbers if restated(n, page_figures))
                linked = page.resolve() != overview and links_to(block, page, source)
                if len(copies) >= 2 and not linked:
                    found.append(
                        f"{page.relative_to(REPO)}: {copies} from {source.relative_to(REPO)} in "
                        f"{block[:80]!r}"
                    )
    assert not found, "figures restated from the bench pages (link to them):\n" + "\n".join(found)
