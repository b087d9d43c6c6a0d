"""The code blocks of a Markdown document, as the tests that run a document's commands read them."""
import os
import re

from helpers import REPO


def section(path, heading):
    """The text of ``path`` (relative to the repository) under the line ``heading`` (e.g.
    ``"## Bundled data"``), up to the next heading of the same or a higher level outside a
    code block."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert heading in lines, f"{path} has no section {heading!r}"
    level = len(heading.split()[0])
    body, fenced = [], False
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("```"):
            fenced = not fenced
        marks = len(line) - len(line.lstrip("#"))
        if not fenced and 0 < marks <= level and line[marks:marks + 1] == " ":
            break
        body.append(line)
    return "\n".join(body) + "\n"


def code_blocks(text, language="bash"):
    """The contents of the fenced ``language`` blocks of ``text``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def logical_lines(block):
    """The lines of a shell block with continuations joined (a backslash, or a pipe at the end
    of a line) and runs of blanks collapsed; blank lines and comment lines are left out."""
    lines, current = [], ""
    for line in block.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        if line.rstrip().endswith("|"):
            current += line + " "
            continue
        lines.append(" ".join((current + line).split()))
        current = ""
    assert not current, f"a continuation runs past the end of the block: {current!r}"
    return lines


def commands(path, heading):
    """Every logical line of the ``bash`` blocks of one section, in order."""
    return [line for block in code_blocks(section(path, heading)) for line in logical_lines(block)]


def tool(command):
    """The program a command line runs: the script for ``python X`` / ``bash X``, the last
    stage of a pipe."""
    words = command.split("|")[-1].split()
    return words[1] if words[0] in ("python", "bash") else words[0]
