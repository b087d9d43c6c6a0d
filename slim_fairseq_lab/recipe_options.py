"""The recipes' command lines (examples/*/*.sh): one parser, in Python, behind ``parse_options``
of examples/common.sh, which hands it the recipe's declarations and arguments and evaluates the
shell assignments it prints.

A declaration is one string (a recipe keeps them in an array)::

    "--name value VAR [TYPE]"   --name V: VAR=V
    "--name append VAR [TYPE]"  the same, repeatable: V is appended to the array VAR
    "--name flag VAR"           --name: VAR=1
    "--name set VAR VALUE"      --name: VAR=VALUE
    "--name one VAR VALUE"      as set; VAR may be set by one of its options only
    "--name refuse WHY"         an error "--name: WHY", whatever the spelling
    "@positional VAR[:NAME]..." the arguments that are not options fill VAR... in order (NAME:
                                how the usage names it, in errors)
    "@unknown pass ARRAY"       undeclared options, and arguments beyond the @positional ones,
                                are appended to ARRAY as written (for the fairseq tool the
                                recipe runs); without it they are an error
    "@help FUNCTION"            what -h / --help runs before exiting 0 (default: usage)

``--name=V`` and ``--name V`` are the same everywhere. TYPE checks a value when it is read, so a
wrong number stops the recipe before it downloads or trains anything: ``count`` (a whole number
>= 1), ``whole`` (>= 0), ``positive`` (a number > 0), ``fraction`` (a number in (0, 1]),
``size`` (a number of bytes with an optional K, M, G or T), or ``choice:a|b|c``.

An undeclared option written before the positional arguments are all given is refused: its
value and the next positional argument cannot be told apart (``--dropout 0.2 DATA`` would read
0.2 as DATA). Every error is one line, ``PROGRAM: error: ...``, with exit status 2.
"""
import re
import shlex
import sys

KINDS = ("value", "append", "flag", "set", "one", "refuse")
SIZE = re.compile(r"^([0-9]+)([KkMmGgTt]?)$")


class RecipeOptionError(Exception):
    """A bad command line; the message is the one line to print."""


def check_value(flag, value, kind):
    """``value`` of ``flag`` against the TYPE ``kind`` (None: any non-empty string)."""
    if not kind:
        return value
    if kind.startswith("choice:"):
        choices = kind.split(":", 1)[1].split("|")
        if value not in choices:
            raise RecipeOptionError(f"{flag}={value}: not one of the choices; allowed: "
                                    + "|".join(choices))
        return value
    if kind in ("count", "whole"):
        least = 1 if kind == "count" else 0
        if not re.fullmatch(r"[0-9]+", value) or int(value) < least:
            raise RecipeOptionError(f"{flag}={value}: not a whole number >= {least}; allowed: "
                                    f"a whole number >= {least}")
        return value
    if kind in ("positive", "fraction"):
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        ok = number > 0 and (kind == "positive" or number <= 1)
        if not ok:
            allowed = "a number > 0" if kind == "positive" else "a number in (0, 1]"
            raise RecipeOptionError(f"{flag}={value}: not {allowed}; allowed: {allowed}")
        return value
    if kind == "size":
        if not SIZE.fullmatch(value):
            raise RecipeOptionError(f"{flag}={value}: not a size; allowed: a number of bytes with "
                                    "an optional K, M, G or T (e.g. 500M, 9G)")
        return value
    raise ValueError(f"parse_options: unknown type {kind!r} of {flag}")


def parse_declarations(declarations):
    """(options {flag: (kind, fields)}, positional variables, pass array, help function)."""
    options, positional, passed, help_function = {}, [], None, "usage"
    for line in declarations:
        words = line.split()
        if not words:
            raise ValueError("parse_options: an empty declaration")
        name, rest = words[0], words[1:]
        if name == "@positional":
            positional = rest
        elif name == "@unknown":
            if len(rest) != 2 or rest[0] != "pass":
                raise ValueError(f"parse_options: bad declaration {line!r}")
            passed = rest[1]
        elif name == "@help":
            help_function = rest[0]
        elif name.startswith("--") and rest and rest[0] in KINDS:
            if rest[0] == "refuse":
                options[name] = ("refuse", [line.split(None, 2)[2] if len(words) > 2 else ""])
            else:
                options[name] = (rest[0], rest[1:])
        else:
            raise ValueError(f"parse_options: bad declaration {line!r}")
    return options, positional, passed, help_function


def shell_code(assigned, arrays):
    lines = [f"{variable}={shlex.quote(value)}" for variable, value in assigned.items()]
    lines += [f"{array}+=({' '.join(shlex.quote(v) for v in values)})"
              for array, values in arrays.items()]
    return "\n".join(lines) + "\n" if lines else ""


def parse(declarations, argv, partial=None):
    """The shell code that assigns what ``argv`` says, per ``declarations``. On an error,
    ``partial["code"]`` (when given) holds the code of what was read before it."""
    options, slots, passed, help_function = parse_declarations(declarations)
    slots = list(slots)
    assigned, arrays, set_by = {}, {}, {}
    try:
        return _parse(options, slots, passed, help_function, argv, assigned, arrays, set_by)
    finally:
        if partial is not None:
            partial["code"] = shell_code(assigned, arrays)


def _parse(options, slots, passed, help_function, argv, assigned, arrays, set_by):
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word in ("-h", "--help"):
            return f"{help_function}\nexit 0\n"
        if not word.startswith("-") or word == "-":
            if slots:
                assigned[slots.pop(0).split(":")[0]] = word
            elif passed:
                arrays.setdefault(passed, []).append(word)
            else:
                raise RecipeOptionError(f"unexpected argument {word!r}; allowed: the arguments "
                                        "and options of --help")
            continue
        name, has_value, value = word, False, None
        if word.startswith("--") and "=" in word:
            name, value = word.split("=", 1)
            has_value = True
        if name not in options:
            if not passed:
                raise RecipeOptionError(f"{name}: not an option of this recipe; allowed: the "
                                        "options of --help")
            if slots:
                names = [slot.split(":")[-1] for slot in slots]
                raise RecipeOptionError(
                    f"{name}: an option for the fairseq tool, written before "
                    + " and ".join(names) + "; allowed: " + " ".join(names)
                    + " first, then the options (" + name + " V after them)")
            arrays.setdefault(passed, []).append(word)
            continue
        kind, fields = options[name]
        if kind == "refuse":
            raise RecipeOptionError(f"{name}: {fields[0]}")
        if kind in ("value", "append"):
            if not has_value:
                if i >= len(argv) or argv[i].startswith("--"):
                    raise RecipeOptionError(f"{name}: needs a value; allowed: {name} VALUE")
                value = argv[i]
                i += 1
            if value == "":
                raise RecipeOptionError(f"{name}: needs a value; allowed: {name} VALUE")
            value = check_value(name, value, fields[1] if len(fields) > 1 else None)
            if kind == "value":
                assigned[fields[0]] = value
            else:
                arrays.setdefault(fields[0], []).append(value)
            continue
        if has_value:
            raise RecipeOptionError(f"{word}: {name} takes no value; allowed: {name}")
        variable = fields[0]
        if kind == "one":
            earlier = set_by.get(variable)
            if earlier not in (None, name):
                raise RecipeOptionError(f"{earlier} and {name} exclude each other; allowed: one "
                                        "of them")
            set_by[variable] = name
        assigned[variable] = "1" if kind == "flag" else (fields[1] if len(fields) > 1 else "")
    return shell_code(assigned, arrays)


def main(argv=None):
    """``python -m slim_fairseq_lab.recipe_options [--later] PROGRAM DECLARATION... -- ARGS...``:
    prints the shell assignments, or one error line and exits 2; with ``--later``, the
    assignments of what it could read and ``PARSE_ERROR`` (the line), exit 0."""
    argv = sys.argv[1:] if argv is None else argv
    later = argv[:1] == ["--later"]
    program, rest = argv[int(later)], argv[int(later) + 1:]
    if "--" not in rest:
        raise SystemExit("parse_options: no '--' after the declarations")
    cut = rest.index("--")
    partial = {}
    try:
        sys.stdout.write(parse(rest[:cut], rest[cut + 1:], partial))
    except RecipeOptionError as error:
        line = f"{program}: error: {error}"
        if not later:
            print(line, file=sys.stderr)
            return 2
        sys.stdout.write(partial.get("code", "") + f"PARSE_ERROR={shlex.quote(line)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
