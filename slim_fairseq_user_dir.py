"""Console script ``slim-fairseq-user-dir``: prints the path to pass as ``fairseq-* --user-dir``.

Kept outside the package so that printing the path does not import fairseq.
"""
import os


def user_dir():
    """Absolute path of the installed ``slim_fairseq`` plugin directory."""
    import importlib.util
    spec = importlib.util.find_spec("slim_fairseq")
    return os.path.dirname(os.path.abspath(spec.origin))


def main():
    print(user_dir())


if __name__ == "__main__":
    main()
