"""Documentation that can be followed and trusted: every citation and every link in the
repository leads somewhere in the repository (papers by arXiv id, docs/TECHNIQUES.md by section
anchor, Markdown links to files and headings that exist), nothing names a tracker's issue
numbers, and the figures README.md repeats are those of the studies they come from."""
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


# ---------------------------------------------------------------------------- links

MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def without_code_blocks(markdown):
    """``markdown`` with its fenced code blocks left out (a link inside one is an example)."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)


def test_every_markdown_link_leads_to_a_file_and_heading_that_exist():
    markdown = {path: text for path, text in text_files() if path.endswith(".md")}
    broken, checked = [], 0
    for path, text in markdown.items():
        for target in MARKDOWN_LINK.findall(without_code_blocks(text)):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            name, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(path), name)) if name else path
            checked += 1
            if not os.path.exists(os.path.join(REPO, linked)):
                broken.append(f"{path}: {target} (no {linked})")
            elif anchor and anchor not in github_anchors(markdown.get(linked, "")):
                broken.append(f"{path}: {target} (no heading #{anchor} in {linked})")
    assert checked >= 100  # README, the docs and the study pages link to each other
    assert broken == [], "\n".join(broken)


# ---------------------------------------------------------------------------- no tracker numbers

# Built from pieces so that this file does not name what it looks for.
TRACKER_NUMBER = re.compile(r"(?<![a-z])issue" + r"s?[\s_#-]*\d", re.IGNORECASE)


def test_no_issue_numbers_anywhere():
    """Docs say what is true now and why, code and tests what they do; neither names the issue
    that asked for it (no reader can look one up). Every tracked text file: docs, headings and
    anchors, --help texts, code, comments, test names."""
    offenders = [f"{path}:{n}: {line.strip()[:120]}"
                 for path, text in text_files()
                 for n, line in enumerate(text.splitlines(), 1) if TRACKER_NUMBER.search(line)]
    assert offenders == [], "\n".join(offenders)


def test_issue_number_pattern():
    samples = ["(@ 14)", "@ 8, item 4", "@s 8 and 14", "#quality-per-parameter-@-14",
               "cpu_d512_@16", "t@ 5", "an @ with 8 sentences", "@s: 3"]
    found = [bool(TRACKER_NUMBER.search(s.replace("@", "Iss" + "ue"))) for s in samples]
    assert found == [True, True, True, True, True, False, False, False]


# ---------------------------------------------------------------------------- imports

PATH_EDIT = re.compile(r"sys" + r"\.path\.(insert|append)")


def test_no_script_or_doc_edits_the_import_path():
    """Scripts, recipes, the packages and the docs import the lab and the plugin as installed
    packages (``make setup`` installs both); none puts scripts/ on ``sys.path`` to reach another
    script. Tests may (they load scripts as modules)."""
    offenders = [f"{path}:{n}: {line.strip()[:120]}"
                 for path, text in text_files() if not path.startswith("tests/")
                 for n, line in enumerate(text.splitlines(), 1) if PATH_EDIT.search(line)]
    assert offenders == [], "\n".join(offenders)


# ---------------------------------------------------------------------------- README figures


def markdown_table(text, header):
    """Rows (lists of cell texts) of the first table of ``text`` whose header row starts with
    the cells ``header``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[:len(header)] == header:
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            return rows
    raise AssertionError(f"no table with the header {header}")


def read(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


def study_deltas(study, label):
    """Δ valid NLL against the frontier at each width, narrowest first, from the report
    ``scripts/quality.py`` wrote for ``docs/study/<study>/``."""
    rows = markdown_table(read(f"docs/study/{study}/table.md"), ["model", "d", "best lr"])
    widths = sorted((int(r[1]), float(r[5].split()[0])) for r in rows if r[0] == label)
    assert [d for d, _ in widths] == [32, 64, 128], (study, label)
    return [delta for _, delta in widths]


def page_cell(page, header, row_label, column):
    rows = markdown_table(read(f"docs/study/{page}/README.md"), header)
    (row,) = [r for r in rows if r[0].strip("*`") == row_label]
    return row[column]


def ratio(text):
    (value,) = re.findall(r"(\d+\.\d+)×", text)
    return value


# (row of README's "Which to pick" that starts with, which triple of that row, study, model)
README_DELTAS = [
    ("a small language model", 0, "wikitext2", "stlm_tied"),
    ("a small language model", 1, "wikitext2", "anthe_lm"),
    ("a small translation model", 0, "ende", "glu"),
    ("a small translation model", 1, "ende", "glu_gates"),
    ("few parameters", 0, "ende", "anthe"),
    ("the Subformer", 0, "ende", "subformer"),
    ("the Subformer", 1, "wikitext2", "subformer_lm"),
]
DELTA_TRIPLE = re.compile(r"([+−]?\d\.\d\d) / ([+−]?\d\.\d\d) / ([+−]?\d\.\d\d)")


def which_to_pick():
    section = read("README.md").split("\n## Which to pick\n", 1)[1].split("\n## ", 1)[0]
    return {row[0]: " | ".join(row[1:]) for row in markdown_table(section, ["you want"])}


def test_readme_quality_figures_are_the_studies():
    rows = which_to_pick()
    triples = {start: [[float(x.replace("−", "-")) for x in triple]
                       for triple in DELTA_TRIPLE.findall(text)]
               for start, text in rows.items()}
    assert sum(len(t) for t in triples.values()) == len(README_DELTAS), triples  # none unchecked
    for start, index, study, label in README_DELTAS:
        (row,) = [t for s, t in triples.items() if s.startswith(start)]
        expected = study_deltas(study, label)
        assert all(abs(a - b) <= 0.005 + 1e-9 for a, b in zip(row[index], expected)), \
            f"README.md '{start}': {row[index]}; docs/study/{study}/table.md {label}: {expected}"


def test_readme_run_time_figures_are_the_studies():
    rows = which_to_pick()
    (slim,) = [t for s, t in rows.items() if s.startswith("few parameters")]
    (decoding,) = [t for s, t in rows.items() if s.startswith("faster decoding")]
    speed_runs = [ratio(r[1]) for r in markdown_table(
        read("docs/study/runtime_d512/README.md"), ["run", "`anthe_base` training tok/s"])]
    assert len(speed_runs) >= 4
    expected = {
        "parameters": ratio(page_cell("runtime_d512", ["model", "params", "× transformer"],
                                      "anthe_base", 2)),
        "memory": ratio(page_cell("runtime_d512", ["model", "2048-token batches"],
                                  "anthe_base", 1)),
        "speed": f"{min(speed_runs, key=float)}–{max(speed_runs, key=float)}",
        "decoding": ratio(page_cell("skipless_removal", ["A vs B", "train tok/s"],
                                    "skipless_reduced vs skipless_lm", 2)),
    }
    figures = (re.findall(r"(\d+\.\d+(?:–\d+\.\d+)?)×", slim)
               + re.findall(r"(\d+\.\d+)×", decoding))
    assert figures == [expected["parameters"], expected["memory"], expected["speed"],
                       expected["decoding"]], (figures, expected)
