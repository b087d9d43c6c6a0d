"""The downloads of the prepare recipes, and the options every prepare recipe shares.

:meth:`Downloads.fetch` makes a file exist under the work folder's ``orig/`` (download, resume,
verify): a short connect timeout and a stall timeout, so that an offline machine gets a clear
error instead of a hang, and a checksum (``md5:HEX``, ``sha1:HEX``, ``sha256:HEX``; none
published: the sha256 is recorded next to the file and checked on later runs). With
``--raw-dir DIR`` nothing touches the network: the file must already be in DIR. With
``--dry-run`` it only says what it would do.
"""
import fnmatch
import gzip
import hashlib
import os
import shutil
import tarfile
import urllib.parse
import zipfile

from slim_fairseq_lab.recipes import tools
from slim_fairseq_lab.recipes.cli import log, refuse, step_failed
from slim_fairseq_lab.recipes.outputs import refuse_overwrite


def add_options(parser, work_dir=None):
    """The options every prepare recipe shares."""
    parser.value("--raw-dir")
    parser.value("--work-dir", default=work_dir)
    parser.value("--dest-dir")
    parser.flag("--no-verify", default=False)
    parser.flag("--dry-run", default=False)


def add_filter_options(parser, max_len="250", ratio="1.5"):
    """The length filter of the training pairs (:func:`text.clean_corpus`)."""
    parser.value("--max-len", kind="count", default=max_len)
    parser.value("--ratio", kind="positive", default=ratio)


class Folders:
    """Where a preparation works: ``work`` (``--work-dir``), ``dest`` (``--dest-dir``, default
    WORK/data-bin), ``tmp``, ``extracted``, and ``fetched`` (its :class:`Downloads`, into
    WORK/orig). Nothing is created: a dry run lists, a refused run writes nothing."""

    def __init__(self, args, work_dir, raw_dir, inputs=()):
        self.work = os.path.realpath(work_dir)
        self.dest = os.path.abspath(args.dest_dir) if args.dest_dir else os.path.join(self.work, "data-bin")
        # the data-bin replaces DEST as a whole: never a folder holding what the run reads
        refuse_overwrite("--dest-dir", self.dest, [raw_dir, self.work, *inputs], "folder")
        self.tmp, self.extracted = os.path.join(self.work, "tmp"), os.path.join(self.work, "extracted")
        self.fetched = Downloads(raw_dir, os.path.join(self.work, "orig"), args.no_verify, args.dry_run)

    def fresh_text(self):
        """The tmp folder, without the raw.* text of an earlier run (the corpora are appended)."""
        os.makedirs(self.tmp, exist_ok=True)
        for name in os.listdir(self.tmp):
            if name.startswith("raw."):
                os.remove(os.path.join(self.tmp, name))
        return self.tmp


def readable_folder(flag, path):
    """The absolute path of a folder given with ``flag``, or a one-line error."""
    if not (os.path.isdir(path) and os.access(path, os.R_OK | os.X_OK)):
        raise refuse(f"{flag}={path}", "not a readable folder", f"{flag} FOLDER, a folder that exists")
    return os.path.abspath(path)


def readable_file(flag, path):
    """The absolute path of a file given with ``flag``, or a one-line error."""
    if not (os.path.isfile(path) and os.access(path, os.R_OK)):
        raise refuse(f"{flag}={path}", "not a readable file", f"{flag} FILE, a file that exists")
    return os.path.abspath(path)


def checksum(algo, path):
    if algo not in ("md5", "sha1", "sha256"):
        raise ValueError(f"unknown checksum algorithm {algo!r} (md5, sha1 or sha256)")
    digest = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Downloads:
    """The downloads of one run: ``raw_dir`` (``--raw-dir``, absolute, or None), ``orig_dir``
    (where downloads go), ``no_verify``, ``dry_run``."""

    def __init__(self, raw_dir, orig_dir, no_verify=False, dry_run=False):
        self.raw_dir, self.orig_dir = raw_dir, orig_dir
        self.no_verify, self.dry_run = no_verify, dry_run
        self.fetched = {}

    def verify(self, path, spec, given_by=None, url=None):
        """Check ``path`` against ``spec`` (empty: trust on first use); ``given_by``: the option
        that named the file (the user's own copy, not a download to repeat)."""
        name = os.path.basename(path)
        if self.no_verify:
            log(f"not verifying {name} (--no-verify)")
            return
        if not spec:
            record = path + ".sha256"
            if os.path.isfile(record):
                with open(record, encoding="utf-8") as f:
                    spec = "sha256:" + f.read().strip()
            else:
                got = checksum("sha256", path)
                if os.access(os.path.dirname(path) or ".", os.W_OK):
                    with open(record, "w", encoding="utf-8") as f:
                        f.write(got + "\n")
                log(f"{name}: no published checksum; sha256 {got}, size {os.path.getsize(path)} bytes")
                return
        algo, want = spec.split(":", 1)
        got = checksum(algo, path)
        if got != want:
            if given_by:
                raise refuse(f"{given_by}={path}", f"not the published archive ({algo} {got}, expected {want})",
                             f"--no-verify if you trust it, or the archive of {url}")
            raise refuse(path, f"{algo} checksum {got}, not the expected {want}",
                         "delete the file to download it again, or --no-verify if you trust it")
        log(f"{name}: {algo} ok")

    def raw_path(self, name, url=None):
        """Where :meth:`fetch` put (or would put) ``name``."""
        if name in self.fetched:
            return self.fetched[name]
        if self.raw_dir:
            base = os.path.basename(url) if url else None
            if base and not os.path.exists(os.path.join(self.raw_dir, name)) and \
                    os.path.exists(os.path.join(self.raw_dir, base)):
                return os.path.join(self.raw_dir, base)
            return os.path.join(self.raw_dir, name)
        return os.path.join(self.orig_dir, name)

    def fetch(self, url, name, spec=""):
        """Make ``name`` exist (download, resume, verify). ``name`` is the local name; it differs
        from the last part of URL where several datasets publish files of the same name (WMT's
        dev.tgz and test.tgz: wmt16-dev.tgz, wmt17-dev.tgz, ...), so that one --raw-dir folder can
        hold the downloads of every recipe. With --raw-dir, a file under the download name is
        accepted too when its checksum is the expected one."""
        base = os.path.basename(urllib.parse.urlparse(url).path) or name
        if self.dry_run:
            dest = self.raw_path(name, url)
            state = "present" if os.path.exists(dest) else "missing"
            print(f"download {url}\n    -> {dest} ({spec or 'no published checksum'}, {state})", flush=True)
            return
        if self.raw_dir:
            dest = os.path.join(self.raw_dir, name)
            if not os.path.exists(dest) and base != name and os.path.exists(os.path.join(self.raw_dir, base)):
                dest = os.path.join(self.raw_dir, base)
                if spec and not self.no_verify and checksum(spec.split(":")[0], dest) != spec.split(":", 1)[1]:
                    raise refuse(f"--raw-dir={self.raw_dir}", f"{base} is not the file of {url} "
                                 f"({spec.split(':')[0]} differs; another dataset's {base}?)",
                                 f"that download saved as {self.raw_dir}/{name}")
            if not os.path.exists(dest):
                raise refuse(f"--raw-dir={self.raw_dir}", f"no {name}",
                             f"a folder holding {name} (download {url} and save it under that name)")
            self.verify(dest, spec)
            self.fetched[name] = dest
            return
        dest = os.path.join(self.orig_dir, name)
        os.makedirs(self.orig_dir, exist_ok=True)
        if os.path.isfile(dest):
            self.verify(dest, spec)
            self.fetched[name] = dest
            return
        host = urllib.parse.urlparse(url).hostname
        log(f"downloading {url}")
        status = tools.run(["curl", "--fail", "--location", "--continue-at", "-", "--connect-timeout",
                            os.environ.get("CONNECT_TIMEOUT", "15"), "--speed-limit", "1024", "--speed-time", "120",
                            "--retry", "3", "--retry-delay", "5", "--output", dest + ".part", url], check=False)
        if status in (5, 6, 7, 28, 35):
            raise step_failed(f"cannot reach {host} (curl exit {status}: offline, DNS or firewall?). Download {url} "
                              f"by other means into a folder (as {name}) and rerun with --raw-dir FOLDER")
        if status == 22:
            raise step_failed(f"{url} answered with an HTTP error; the source may have moved (pass --raw-dir with "
                              "a copy)")
        if status != 0:
            raise step_failed(f"download of {url} failed (curl exit {status}); rerun to resume ({dest}.part is "
                              "kept)")
        os.replace(dest + ".part", dest)
        self.verify(dest, spec)
        self.fetched[name] = dest

    def stop_if_dry(self):
        """After the downloads were listed, a dry run ends here."""
        if self.dry_run:
            log("dry run: nothing was downloaded, extracted or written")
            return True
        return False


def extract(archive, dest):
    """Extract ARCHIVE (tar, tgz, tar.gz, zip, gz) into DEST; a finished extraction is not redone."""
    stamp = os.path.join(dest, f".extracted.{os.path.basename(archive)}")
    if os.path.isfile(stamp):
        return
    os.makedirs(dest, exist_ok=True)
    log(f"extracting {os.path.basename(archive)}")
    if archive.endswith((".tgz", ".tar.gz", ".tar")):
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    elif archive.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(dest)
    elif archive.endswith(".gz"):
        with gzip.open(archive, "rb") as f, open(os.path.join(dest, os.path.basename(archive)[:-3]), "wb") as out:
            shutil.copyfileobj(f, out)
    else:
        raise ValueError(f"do not know how to extract {archive}")
    open(stamp, "w").close()


def find_one(folder, pattern):
    """The single file called PATTERN (wildcards allowed) anywhere below FOLDER (archives differ
    in whether they keep a leading folder)."""
    hits = sorted(os.path.join(root, name) for root, _, names in os.walk(folder)
                  for name in names if fnmatch.fnmatchcase(name, pattern))
    if not hits:
        raise step_failed(f"expected a file named {pattern} inside {folder} (is the archive complete?)")
    return hits[0]
