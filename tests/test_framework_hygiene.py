"""The plugin works with fairseq, torch and argparse through their public ways, and the two
packages are plain Python packages; checked on the source (Python's ``ast``):

* no writes behind ``nn.Module``'s back in ``slim_fairseq/``: no item assignment or deletion
  on an object's ``_modules``, ``_parameters``, ``_buffers`` or ``__dict__`` (nor ``vars(x)``),
  no mutating call on them (``pop``, ``update``, ...), no ``object.__setattr__``;
* no rewritten argparse actions in either package: no attribute of an action taken from a
  parser's ``_actions`` or ``_option_string_actions`` is assigned or mutated;
* no stack inspection in ``slim_fairseq/`` (``sys._getframe``, ``inspect.stack``,
  ``inspect.currentframe``, ``f_back``, ``traceback.extract_stack``, ...): what a function
  needs is passed to it;
* no exception class of either package is a ``SystemExit``, or a ``BaseException`` other than
  through ``Exception`` (the classes' MRO, as imported; a class defined inside a function by
  the names of its bases);
* no import cycle among the modules of ``slim_fairseq/``, nor among those of
  ``slim_fairseq_lab/``: the graph holds the imports a module runs when it is imported (its
  top level, class bodies and ``if``/``try`` blocks included; imports inside functions are not
  counted).

Each checker takes source text, so the self-tests below show it catches its offence.
:data:`ALLOWED` names the sites that stay, each with its reason.
"""
import ast
import importlib
import os

import pytest
import torch
import torch.nn as nn

from helpers import REPO
from slim_fairseq.modules.feed_forward import FeedForwardHolder

PLUGIN, LAB = "slim_fairseq", "slim_fairseq_lab"

# (path, function, offence kind) -> why the site stays
ALLOWED = {
    ("slim_fairseq/data_record.py", "checkpoint_being_loaded", "stack"):
        "fairseq's loaders (the trainer's, load_model_ensemble) give the model no file name, and "
        "the one-line refusal of another dictionary names the checkpoint file",
}

MODULE_STORES = {"_modules", "_parameters", "_buffers", "__dict__"}
MUTATORS = {"pop", "popitem", "update", "setdefault", "clear", "__setitem__", "__delitem__"}
PARSER_STORES = {"_actions", "_option_string_actions"}
STACK_NAMES = {"_getframe", "currentframe", "getouterframes", "getinnerframes", "f_back",
               "extract_stack", "walk_stack", "format_stack", "print_stack", "stack"}
STACK_MODULES = {"sys", "inspect", "traceback"}


def package_files(package):
    """(path relative to the repository, module name) of every module of ``package``."""
    found = []
    for folder, dirs, files in os.walk(os.path.join(REPO, package)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.relpath(os.path.join(folder, name), REPO)
                parts = path[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found.append((path.replace(os.sep, "/"), ".".join(parts)))
    return found


# the transformers custom code the export writes into OUT_DIR (slim_fairseq/export_hf/remote/)
REMOTE_CODE = "slim_fairseq/export_hf/remote/"


def read(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


class _Sites(ast.NodeVisitor):
    """Walks a module, knowing the function each node is in."""

    def __init__(self, path):
        self.path, self.scope, self.found = path, [], []

    @classmethod
    def sites(cls, source, path="<snippet>"):
        """What this walk notes in ``source``."""
        visitor = cls(path)
        visitor.visit(ast.parse(source))
        return visitor.found

    def visit_FunctionDef(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def note(self, node, kind, what):
        function = self.scope[-1] if self.scope else "<module>"
        if (self.path, function, kind) not in ALLOWED:
            self.found.append(f"{self.path}:{node.lineno} ({function}): {what}")


def _is_store(node, names):
    """``node`` is ``x.NAME`` for one of ``names``, or ``vars(x)``."""
    if isinstance(node, ast.Attribute):
        return node.attr in names
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "vars"


def _targets(node):
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    else:
        return []
    flat = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        else:
            flat.append(target)
    return flat


class _ModuleWrites(_Sites):
    def generic_visit(self, node):
        for target in _targets(node):
            if isinstance(target, ast.Subscript) and _is_store(target.value, MODULE_STORES):
                self.note(node, "module", f"writes {ast.unparse(target)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in MUTATORS and _is_store(node.func.value, MODULE_STORES):
                self.note(node, "module", f"mutates {ast.unparse(node.func.value)}")
            if (node.func.attr == "__setattr__" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "object"):
                self.note(node, "module", "object.__setattr__ passes by the class's own")
        super().generic_visit(node)


def module_writes(source, path="<snippet>"):
    """Writes into a module's own stores (``_modules``, ``__dict__``, ...) in ``source``."""
    return _ModuleWrites.sites(source, path)


def _reads_parser_store(node):
    return any(isinstance(n, ast.Attribute) and n.attr in PARSER_STORES for n in ast.walk(node))


def _names(target):
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


class _ActionRewrites(_Sites):
    """In each function: the names bound to an action of a parser's ``_actions`` /
    ``_option_string_actions`` (a loop, a comprehension, an assignment), then any assignment to
    or mutating call on an attribute of one of them (or of such an expression itself)."""

    def __init__(self, path):
        super().__init__(path)
        self.actions_stack = []

    def visit_FunctionDef(self, node):
        actions = set()
        for inner in ast.walk(node):
            if isinstance(inner, (ast.For, ast.comprehension)) and _reads_parser_store(inner.iter):
                actions |= _names(inner.target)
            elif isinstance(inner, ast.Assign) and _reads_parser_store(inner.value):
                for target in inner.targets:
                    actions |= _names(target)
            elif isinstance(inner, ast.NamedExpr) and _reads_parser_store(inner.value):
                actions |= _names(inner.target)
        self.actions_stack.append(actions)
        super().visit_FunctionDef(node)
        self.actions_stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def is_action(self, node):
        if isinstance(node, ast.Name):
            return any(node.id in actions for actions in self.actions_stack)
        return _reads_parser_store(node)

    def generic_visit(self, node):
        for target in _targets(node):
            owner = target.value if isinstance(target, (ast.Attribute, ast.Subscript)) else None
            while isinstance(owner, (ast.Attribute, ast.Subscript)) and not self.is_action(owner):
                owner = owner.value
            if owner is not None and self.is_action(owner):
                self.note(node, "parser", f"rewrites a parser's action: {ast.unparse(target)}")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args \
                    and self.is_action(node.args[0]):
                self.note(node, "parser", f"rewrites a parser's action: {ast.unparse(node)}")
            elif (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
                  and self.is_action(func.value.value)
                  and func.attr in MUTATORS | {"append", "extend", "remove", "insert"}):
                self.note(node, "parser", f"rewrites a parser's action: {ast.unparse(node)}")
        super().generic_visit(node)


def action_rewrites(source, path="<snippet>"):
    """Assignments to (or mutations of) actions of an argparse parser in ``source``."""
    return _ActionRewrites.sites(source, path)


class _StackReads(_Sites):
    def generic_visit(self, node):
        if isinstance(node, ast.Attribute) and node.attr in STACK_NAMES and (
                node.attr != "stack" or (isinstance(node.value, ast.Name) and node.value.id == "inspect")):
            self.note(node, "stack", f"inspects the call stack: {ast.unparse(node)}")
        if isinstance(node, ast.ImportFrom) and node.module in STACK_MODULES:
            for alias in node.names:
                if alias.name in STACK_NAMES:
                    self.note(node, "stack", f"inspects the call stack: {node.module}.{alias.name}")
        super().generic_visit(node)


def stack_reads(source, path="<snippet>"):
    """Stack inspection in ``source``."""
    return _StackReads.sites(source, path)


def _base_names(node):
    return [ast.unparse(base) for base in node.bases]


def nested_exception_bases(source, path="<snippet>"):
    """Classes defined inside functions of ``source`` (not importable) whose bases name
    ``SystemExit``, ``BaseException``, ``KeyboardInterrupt`` or ``GeneratorExit``."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, ast.ClassDef):
                    bad = [name for name in _base_names(node) if name.split(".")[-1] in
                           ("SystemExit", "BaseException", "KeyboardInterrupt", "GeneratorExit")]
                    if bad:
                        found.append(f"{path}:{node.lineno}: {node.name}({', '.join(bad)})")
    return found


def exits_instead_of_raising(cls):
    """Whether exception class ``cls`` is a ``SystemExit``, or a ``BaseException`` that is no
    ``Exception`` (an ``except Exception`` would not catch it)."""
    return issubclass(cls, SystemExit) or (issubclass(cls, BaseException) and not issubclass(cls, Exception))


def module_imports(source, module, is_package, modules):
    """The modules of ``modules`` that ``module`` imports when it is imported (not inside a
    function); ``from P import name`` counts as P.name when that is a module, else P."""
    found = set()
    package = module if is_package else module.rpartition(".")[0]

    def resolve(name, level):
        if not level:
            return name
        base = package.split(".")
        base = base[:len(base) - level + 1]
        return ".".join(base + ([name] if name else []))

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                source_module = resolve(node.module, node.level)
                for alias in node.names:
                    full = f"{source_module}.{alias.name}"
                    found.add(full if full in modules else source_module)
            visit(ast.iter_child_nodes(node))

    visit(ast.parse(source).body)
    return sorted(name for name in found if name in modules and name != module)


def import_cycles(graph):
    """The cycles of ``graph`` ({module: imported modules}), one per strongly connected
    component (Tarjan), each as ``a -> b -> ... -> a``."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    cycles = []
    for component in components:
        members, path, node = set(component), [component[0]], component[0]
        while True:  # follow edges inside the component until a module repeats
            node = next(other for other in graph[node] if other in members)
            if node in path:
                cycles.append(" -> ".join(path[path.index(node):] + [node]))
                break
            path.append(node)
    return cycles


def package_graph(package):
    files = package_files(package)
    modules = {name for _, name in files}
    return {name: module_imports(read(path), name, path.endswith("__init__.py"), modules)
            for path, name in files}


# ------------------------------------------------------------------ the checks on the packages

def _plugin_sources():
    return [(path, read(path)) for path, _ in package_files(PLUGIN)]


def _all_sources():
    return [(path, read(path)) for package in (PLUGIN, LAB) for path, _ in package_files(package)]


def test_no_writes_into_a_modules_own_stores():
    found = [line for path, source in _plugin_sources() for line in module_writes(source, path)]
    assert not found, "\n".join(found)


def test_no_rewritten_parser_actions():
    found = [line for path, source in _all_sources() for line in action_rewrites(source, path)]
    assert not found, "\n".join(found)


def test_no_stack_inspection():
    found = [line for path, source in _plugin_sources() for line in stack_reads(source, path)]
    assert not found, "\n".join(found)


def test_every_allowed_site_is_still_there():
    """The allow-list names sites that exist (a site that left it leaves the list too)."""
    checkers = {"module": module_writes, "parser": action_rewrites, "stack": stack_reads}
    for path, function, kind in ALLOWED:
        source = read(path)
        tree = ast.parse(source)
        body = next(node for node in ast.walk(tree)
                    if isinstance(node, ast.FunctionDef) and node.name == function)
        assert checkers[kind](ast.unparse(body)), (path, function, kind)


def test_no_exception_class_exits():
    found = []
    for package in (PLUGIN, LAB):
        for path, name in package_files(package):
            source = read(path)
            found += nested_exception_bases(source, path)
            classes = [node.name for node in ast.parse(source).body if isinstance(node, ast.ClassDef)]
            if path.startswith(REMOTE_CODE):
                # the export's custom code imports the files copied beside it in OUT_DIR, so it
                # runs there, not here: its classes' bases are read from the source
                found += [f"{path}:{node.lineno}: {node.name}" for node in ast.parse(source).body
                          if isinstance(node, ast.ClassDef) and any(
                              name.split(".")[-1] in ("SystemExit", "BaseException")
                              for name in _base_names(node))]
                continue
            if not classes:
                continue
            module = importlib.import_module(name)
            for class_name in classes:
                cls = getattr(module, class_name)
                if isinstance(cls, type) and exits_instead_of_raising(cls):
                    found.append(f"{path}: {class_name} {[c.__name__ for c in cls.__mro__]}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("package", [PLUGIN, LAB])
def test_no_import_cycle(package):
    cycles = import_cycles(package_graph(package))
    assert not cycles, "\n".join(cycles)


# ------------------------------------------------------------------ each checker catches its offence

@pytest.mark.parametrize("snippet", [
    "def mount(block, ff):\n    ff.__dict__['_modules'] = block._modules\n",
    "def put(block, ff):\n    block._modules['fc1'] = ff\n",
    "def put(self, x):\n    self.__dict__['cache'] = x\n",
    "def put(self, x):\n    vars(self)['cache'] = x\n",
    "def put(self, x):\n    a, self._parameters['w'] = x\n",
    "def drop(self):\n    del self._buffers['mask']\n",
    "def drop(self):\n    self.__dict__.pop('cache', None)\n",
    "def put(self, x):\n    self._modules.update(fc1=x)\n",
    "def put(self, x):\n    object.__setattr__(self, 'ff', x)\n",
])
def test_module_writes_are_caught(snippet):
    assert module_writes(snippet)


def test_module_reads_and_plain_attributes_pass():
    assert not module_writes("def f(self, x):\n    self.cache = x\n    return self.__dict__.get('cache')\n")


@pytest.mark.parametrize("snippet", [
    "def f(parser):\n    for action in parser._actions:\n        action.choices = ['a']\n",
    "def f(parser):\n    action = parser._option_string_actions['--x']\n    action.default = 3\n",
    "def f(parser):\n    parser._option_string_actions['--x'].help = 'h'\n",
    "def f(parser):\n    for a in parser._actions:\n        a.option_strings.append('--y')\n",
    "def f(parser):\n    [setattr(a, 'required', False) for a in parser._actions]\n",
    "def f(parser):\n    for a in parser._actions:\n        a.option_strings[0] = '--y'\n",
])
def test_action_rewrites_are_caught(snippet):
    assert action_rewrites(snippet)


def test_reading_actions_passes():
    assert not action_rewrites("def f(parser):\n    for a in parser._actions:\n        x = a.choices\n"
                               "    return x\n")


@pytest.mark.parametrize("snippet", [
    "import sys\ndef f():\n    return sys._getframe(1).f_globals\n",
    "import inspect\ndef f():\n    return inspect.stack()\n",
    "import inspect\ndef f():\n    return inspect.currentframe()\n",
    "def f(frame):\n    return frame.f_back\n",
    "import traceback\ndef f():\n    return traceback.extract_stack()\n",
    "from sys import _getframe\n",
    "from inspect import stack\n",
])
def test_stack_inspection_is_caught(snippet):
    assert stack_reads(snippet)


def test_exiting_exception_classes_are_caught():
    class Refusal(ValueError, SystemExit):
        pass

    class Stop(BaseException):
        pass

    class Fine(ValueError):
        pass

    assert exits_instead_of_raising(Refusal) and exits_instead_of_raising(Stop)
    assert not exits_instead_of_raising(Fine)
    assert nested_exception_bases("def f():\n    class E(ValueError, SystemExit):\n        pass\n")
    assert not nested_exception_bases("def f():\n    class E(Exception):\n        pass\n")


def test_import_cycles_are_caught():
    modules = {"p", "p.a", "p.b", "p.c"}
    sources = {
        "p.a": "from p.b import thing\n",
        "p.b": "from . import c\n",
        "p.c": "import os\nif True:\n    from p import a\n",
    }
    graph = {name: module_imports(source, name, False, modules) for name, source in sources.items()}
    assert graph == {"p.a": ["p.b"], "p.b": ["p.c"], "p.c": ["p.a"]}
    assert import_cycles(graph) == ["p.a -> p.b -> p.c -> p.a"]
    # an import inside a function is not counted
    graph["p.c"] = module_imports("def f():\n    from p import a\n", "p.c", False, modules)
    assert graph["p.c"] == [] and import_cycles(graph) == []


# ------------------------------------------------------------------ what the fixes keep

class _TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.fc2(self.fc1(x))


class _Block(FeedForwardHolder, nn.Module):
    def __init__(self):
        super().__init__()
        self.mount_feed_forward(_TwoLinears())


def test_a_part_replaced_on_the_block_is_the_part_the_feed_forward_runs():
    """A block holds its feed-forward's parts as its own children (fairseq's parameter names),
    not the feed-forward itself; replacing or deleting a part on the block (tying, LoRA, a dense
    export) does it on the feed-forward too."""
    block = _Block()
    assert list(block.state_dict()) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert block.feed_forward.fc1 is block.fc1 and "feed_forward" not in dict(block.named_children())
    block.fc1 = nn.Identity()
    x = torch.randn(2, 4)
    assert block.feed_forward.fc1 is block.fc1 and torch.equal(block.feed_forward(x), block.fc2(x))
    del block.fc2
    assert not hasattr(block.feed_forward, "fc2") and not hasattr(block, "fc2")


def test_a_parsed_command_line_is_marked_for_the_architecture_only():
    """fairseq's parser marks the namespace it parses for the plugin's architecture function,
    which takes the mark off: the options fairseq returns (and saves in a checkpoint) hold no
    trace of it, and a namespace built otherwise (a checkpoint's options) has none."""
    from fairseq import options

    from slim_fairseq import run_checks

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        "data", "--task", "language_modeling", "--arch", "slim_lm", "--user-dir",
        os.path.join(REPO, "slim_fairseq")])
    assert not hasattr(args, run_checks.COMMAND_LINE)
    assert run_checks.take_command_line_mark(args) is False
    setattr(args, run_checks.COMMAND_LINE, True)
    assert run_checks.take_command_line_mark(args) is True and not hasattr(args, run_checks.COMMAND_LINE)
