"""The mutation check's own logic (slim_fairseq_lab/mutation.py; docs/DESIGN.md, "Tests of the
maths"), on a tiny repository of its own, and its list against today's tree: every mutation's
text is in its file exactly once and every test it names exists, so that a change of the code
that moves a mutated line fails here, not months later when the check runs."""
import os
import subprocess

from helpers import REPO
from slim_fairseq_lab import mutation
from slim_fairseq_lab.mutation import Mutation


def test_the_list_applies_to_todays_tree():
    assert mutation.stale(REPO) == []


def test_the_list_covers_every_technique():
    techniques = {m.technique for m in mutation.MUTATIONS}
    assert {"RoPE", "RMSNorm", "GLU", "GQA", "LoRA", "FFN tying", "projection tying", "gates",
            "H-SoftPOS", "Tensor Chain", "SAFE", "sandwich", "shaped attention",
            "Q/P removal"} <= techniques
    assert len(mutation.MUTATIONS) >= 25
    assert len({m.name for m in mutation.MUTATIONS}) == len(mutation.MUTATIONS)
    names = {m.name for m in mutation.MUTATIONS}
    assert {"rope-sign", "lora-scaling-dropped"} <= names  # the RoPE sign flip, LoRA's alpha/r


def test_caught_missed_and_stale_mutations(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\ndef one():\n    return 1\n")
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    test = ("tests/test_calc.py::test_add",)
    mutations = [Mutation("sign", "calc", "sign", "calc.py", "a + b", "a - b", test),
                 Mutation("untested", "calc", "off-by-one", "calc.py", "return 1", "return 2", test),
                 Mutation("gone", "calc", "scale", "calc.py", "a * b", "2 * a * b", test),
                 Mutation("no-such-test", "calc", "sign", "calc.py", "a + b", "a - b",
                          ("tests/test_calc.py::test_sub",))]
    before = (repo / "calc.py").read_text()
    results = mutation.check(str(repo), mutations, log=lambda line: None, package="calc")
    assert [r.status for r in results] == ["caught", "missed", "error", "error"]
    assert results[2].detail == "calc.py holds the text 0 times"
    assert results[0].failed == ["tests/test_calc.py::test_add"]
    assert (repo / "calc.py").read_text() == before  # the checkout itself is never changed
    assert mutation.stale(str(repo), mutations) == [
        "gone: calc.py holds the text 0 times", "no-such-test: no test tests/test_calc.py::test_sub"]
    table = mutation.markdown(results, "python scripts/mutation_check.py")
    assert table.startswith("1 of 4 mutations caught") and "| sign | calc | sign |" in table
    assert os.path.exists(repo / "calc.py")
