"""Documentation citations (issue 15): every citation in the repository can be followed from the
repository alone. Code and docs cite papers by arXiv id and the project's own
docs/TECHNIQUES.md by section anchor; nothing cites a document that is not in the repository."""
import os
import re
import subprocess

import pytest

from helpers import REPO

TECHNIQUES = os.path.join(REPO, "docs", "TECHNIQUES.md")
SKIPPED_DIRS = {".git", ".venv", "build", "__pycache__", ".pytest_cache"}

# Built from pieces so that this file does not cite what it looks for.
_MISSING_DOC = "SP" + "EC"
DANGLING = re.compile(r"(?<![A-Za-z])" + _MISSING_DOC + r"(?![A-Za-z])")
DANGLING_FILE = re.compile(re.escape(_MISSING_DOC.lower() + ".md"), re.IGNORECASE)
ANCHOR_CITATION = re.compile(r"TECHNIQUES\.md#([A-Za-z0-9_-]+)")
ARXIV_ID = re.compile(r"arXiv:(\d{4}\.\d{4,5})")


def repository_files():
    """Tracked files plus untracked ones git does not ignore (walk the tree without git)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                             cwd=REPO, capture_output=True, check=True).stdout
        paths = [p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for root, dirs, files in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
            paths += [os.path.relpath(os.path.join(root, f), REPO) for f in files]
    return sorted(p for p in paths if os.path.isfile(os.path.join(REPO, p)))


def text_files():
    """(relative path, text) of every repository file that is text (no NUL byte)."""
    result = []
    for path in repository_files():
        with open(os.path.join(REPO, path), "rb") as f:
            data = f.read()
        if b"\0" not in data:
            result.append((path, data.decode("utf-8", errors="replace")))
    return result


def github_anchors(markdown):
    """Anchors GitHub generates for the headings of ``markdown`` (lowercase, punctuation dropped,
    spaces to '-', '-1', '-2', ... on repeats), plus explicit ``<a id=...>`` / ``<a name=...>``."""
    anchors, seen, fenced = set(), {}, False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    anchors.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", markdown))
    return anchors


def test_github_anchor_rules():
    anchors = github_anchors("# Tensor Chain\n## Metrics not comparable with fairseq's\n"
                             "### H-SoftPOS\n## Notes\n## Notes\n```\n# not a heading\n```\n")
    assert anchors == {"tensor-chain", "metrics-not-comparable-with-fairseqs", "h-softpos",
                       "notes", "notes-1"}


def test_no_citation_of_a_document_outside_the_repository():
    offenders = [f"{path}:{n}: {line.strip()}"
                 for path, text in text_files()
                 for n, line in enumerate(text.splitlines(), 1)
                 if DANGLING.search(line) or DANGLING_FILE.search(line)]
    assert offenders == [], "\n".join(offenders)


def test_every_techniques_anchor_cited_exists():
    with open(TECHNIQUES, encoding="utf-8") as f:
        doc = f.read()
    anchors = github_anchors(doc)
    cited = {}
    for path, text in text_files():
        for anchor in ANCHOR_CITATION.findall(text):
            cited.setdefault(anchor, path)
    # links inside TECHNIQUES.md itself: ](#anchor)
    for anchor in re.findall(r"\]\(#([A-Za-z0-9_-]+)\)", doc):
        cited.setdefault(anchor, "docs/TECHNIQUES.md")
    assert len(cited) >= 20  # the code cites the sections; an empty scan would prove nothing
    missing = {anchor: path for anchor, path in cited.items() if anchor not in anchors}
    assert missing == {}, missing


def test_every_cited_arxiv_id_is_in_the_references():
    with open(TECHNIQUES, encoding="utf-8") as f:
        references = f.read().split("\n## References", 1)[1]
    listed = set(ARXIV_ID.findall(references))
    cited = {}
    for path, text in text_files():
        if path.startswith("data/"):  # third-party corpus licences cite their own sources
            continue
        for arxiv in ARXIV_ID.findall(text):
            cited.setdefault(arxiv, path)
    assert {"2305.10991", "2101.00234", "2405.14159", "2311.01906", "2404.12362"} <= listed
    missing = {arxiv: path for arxiv, path in cited.items() if arxiv not in listed}
    assert missing == {}, missing


def test_tests_cited_in_techniques_exist():
    """``tests/FILE.py::test_name`` and the ``::test_name`` shorthand that follows it name real tests."""
    with open(TECHNIQUES, encoding="utf-8") as f:
        doc = f.read()
    current, cited, missing = None, 0, []
    for full_file, full_name, short_name in re.findall(
            r"`tests/(\w+\.py)::(\w+)`|`::(\w+)`", doc):
        if full_file:
            current, name = full_file, full_name
        else:
            assert current is not None, short_name
            name = short_name
        with open(os.path.join(REPO, "tests", current), encoding="utf-8") as f:
            if not re.search(rf"^def {name}\(", f.read(), re.MULTILINE):
                missing.append(f"tests/{current}::{name}")
        cited += 1
    assert cited >= 40
    assert missing == [], missing


@pytest.mark.parametrize("doc", ["README.md", os.path.join("docs", "DESIGN.md")])
def test_techniques_is_linked(doc):
    with open(os.path.join(REPO, doc), encoding="utf-8") as f:
        assert re.search(r"\]\((docs/)?TECHNIQUES\.md\)", f.read())
