"""Reading fairseq's logs: the records of fairseq-train and fairseq-validate in its ``simple`` and
``json`` log formats, and the score and speed lines of fairseq-generate.

Every tool of the lab reads logs through this module: the study (``json`` format, one record
per validation), the shell comparisons' summary table (``simple`` format) and the compression
demo (fairseq-validate).
"""
import json
import re

# The last line each tool prints once all of its work is done (and, for training, saved).
COMPLETION_LINES = {"fairseq-train": r"done training in [\d.]+ seconds",
                    "fairseq-generate": r"^Generate \S+ with beam=\d+: "}

# "| valid | epoch 001 | valid on 'valid' subset | loss 9.34 | ppl 417.14" (simple format)
_PIPE_FIELD = re.compile(r"(\w+) (\S+)")
# "| train_inner | epoch 001:     50 / 100 loss=11.2, nll_loss=11.1, wps=90.5" (simple format)
_EQUALS_FIELD = re.compile(r"(\w+)=([^,\s]+)")


def records(text, kind):
    """Every ``kind`` record (``train_inner``, ``train``, ``valid``) of a fairseq log, in order,
    as a dict of the values as logged (strings, as fairseq writes them). The ``<kind>_`` prefix of
    json records is dropped, so both formats give the same keys: ``loss``, ``nll_loss``, ``ppl``,
    ``wps``, ``ups``, ``num_updates``, ..."""
    marker = f"| {kind} | "
    for line in text.splitlines():
        at = line.find(marker)
        if at < 0:
            continue
        body = line[at + len(marker):].strip()
        if body.startswith("{"):
            try:
                record = json.loads(body)
            except ValueError:
                continue
            prefix = kind + "_"
            yield {key[len(prefix):] if key.startswith(prefix) else key: value
                   for key, value in record.items()}
        else:
            fields = {}
            for part in body.split(" | "):
                match = _PIPE_FIELD.fullmatch(part.strip())
                if match:
                    fields[match.group(1)] = match.group(2)
            fields.update(_EQUALS_FIELD.findall(body))
            yield fields


def valid_points(text):
    """Every validation of a training log: [(updates, loss, nll, ppl)] by update. A resumed run
    validates again after its last checkpoint: the later record of an update wins."""
    points = {}
    for record in records(text, "valid"):
        loss = float(record["loss"])
        nll = float(record.get("nll_loss", loss))
        updates = int(float(record["num_updates"]))
        points[updates] = (updates, loss, nll, float(record["ppl"]))
    return [points[u] for u in sorted(points)]


def train_tokens_per_second(text):
    """Training tokens/s: target tokens over training wall time of the ``train_inner`` records
    (fairseq's own ``wps`` and ``ups`` meters, each record covering ``--log-interval`` updates),
    or None."""
    tokens = seconds = 0.0
    for record in records(text, "train_inner"):
        wps, ups = float(record.get("wps", 0)), float(record.get("ups", 0))
        if wps > 0 and ups > 0:
            tokens += wps / ups  # wps / ups = tokens per update
            seconds += 1.0 / ups
    return tokens / seconds if seconds else None


def parameter_count(text):
    """The model's parameter count fairseq-train logs (shared parameters counted once), or None."""
    match = (re.search(r"num\. shared model params: ([\d,]+)", text)
             or re.search(r"num\. model params: ([\d,]+)", text))
    return int(match.group(1).replace(",", "")) if match else None


def bleu(text):
    """The BLEU score of fairseq-generate's last score line (``BLEU4 = ...`` of its own scorer or
    ``BLEU = ...`` of ``--scoring sacrebleu``), or None."""
    last = re.split(r"Generate \S+ with beam", text)[-1]
    match = re.search(r"BLEU4?\s*=\s*([\d.]+)", last)
    return float(match.group(1)) if match else None


def generation_tokens_per_second(text):
    """fairseq-generate's own speed line (``Translated N sentences (T tokens) in S s (..., X
    tokens/s)``): X, or None."""
    match = re.search(r"tokens\) in [\d.]+s \([\d.]+ sentences/s, ([\d.]+) tokens/s\)", text)
    return float(match.group(1)) if match else None


def completion_line(tool, text):
    """The line of ``tool``'s log that says all of its work is done (:data:`COMPLETION_LINES`),
    or None."""
    marker = COMPLETION_LINES.get(tool)
    match = marker and re.search(marker, text, re.MULTILINE)
    return match.group(0).strip() if match else None


def training_seconds(text):
    """fairseq-train's own training time ("done training in S seconds"), or None."""
    match = re.search(r"done training in ([\d.]+) seconds", text)
    return float(match.group(1)) if match else None


def resumed_from_update(text):
    """The update of the checkpoint a resumed fairseq-train loaded ("Loaded checkpoint ... (epoch
    E @ U updates)", the last one), else 0."""
    loaded = re.findall(r"\(epoch \d+ @ (\d+) updates\)", text)
    return int(loaded[-1]) if loaded else 0


def last_valid_ppl(text):
    """The perplexity of the last validation record (fairseq-train or fairseq-validate), or None."""
    ppl = [record["ppl"] for record in records(text, "valid") if "ppl" in record]
    return float(ppl[-1]) if ppl else None
