"""``export``: a fairseq checkpoint to a transformers folder that scores as fairseq does.

Order: OUT_DIR and the tokenizer options are checked, the checkpoint is loaded (Tensor Chains
materialised), a layout is chosen or the model refused in one line (:mod:`.support`), then the
folder is written next to OUT_DIR under a temporary name, checked (:mod:`.check`) and only then
renamed to OUT_DIR. Any failure removes the temporary folder: OUT_DIR is never left half
written, and an existing OUT_DIR is replaced only with ``force``.
"""
import dataclasses
import logging
import os
import secrets
import shutil


from slim_fairseq import compression
from slim_fairseq.export_hf import (card, check, custom, source, support, tokenizer,
                                    tokenizer_check)
from slim_fairseq.option_errors import option_error


@dataclasses.dataclass
class ExportResult:
    out_dir: str
    hf_class: str
    tokenizer: str
    gap: float
    counts: dict
    tokenizer_check: object = None


def _inside(path, folder):
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_out_dir(out_dir, inputs, force):
    """Refuse an OUT_DIR that holds or is inside an input, or (without ``force``) a non-empty
    one; returns its absolute path."""
    out = os.path.abspath(out_dir)
    for given in inputs:
        if given and (_inside(given, out) or _inside(out, given)):
            raise option_error("OUT_DIR", out_dir, f"holds or lies inside the input {given}, "
                               "which the export must not overwrite", "a directory apart from "
                               "the checkpoint, the data and the tokenizer files")
    if os.path.exists(out) and not os.path.isdir(out):
        raise option_error("OUT_DIR", out_dir, "is a file", "a new or empty directory")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise option_error("OUT_DIR", out_dir, "exists and is not empty", "a new or empty "
                           "directory, or --force to replace it")
    return out


def _quiet_transformers():
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)


def instantiate(layout, config, weights, folder=None):
    """The transformers model of ``config`` holding exactly ``weights`` (float32, eval). A
    custom-code layout's ``config`` is its values, its code written into ``folder`` first."""
    import transformers
    if getattr(layout, "CUSTOM", False):
        custom.write_code(layout, folder)
        config, model_class = custom.instantiate(layout, config, folder)
    else:
        model_class = getattr(transformers, layout.CLASS)
    config.dtype = "float32"
    model = model_class(config).float().eval()
    expected = set(model.state_dict())
    missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or extra:
        raise option_error("CHECKPOINT", None, f"the {layout.CLASS} mapping does not fit the "
                           f"class (missing {missing[:3]}, unexpected {extra[:3]})", "none (a "
                           "defect of the export: report it with the command)")
    model.load_state_dict({k: v.contiguous() for k, v in weights.items()}, strict=True)
    return model


# fairseq-generate's defaults: --beam 5, --max-len-a 0, --max-len-b 200, --lenpen 1
FAIRSEQ_BEAM, FAIRSEQ_MAX_LEN_B = 5, 200


def generation_config(src, layout):
    """fairseq's decoding as transformers' defaults: never the padding symbol. A language model:
    greedy, as fairseq's hub samples, and at most the decoder's positions in all (``max_length``:
    prompt with its leading ``</s>`` and continuation), where fairseq's generator stops too;
    past them the model would read positions it never learned. A translation: fairseq-generate's beam search (5 beams,
    finished when 5 hypotheses end, ``early_stopping=True``; scores divided by length, lenpen 1),
    its first step not ``</s>`` (min_len 1) and its length limit: at most ``max_len_b`` tokens
    before the final ``</s>``, within the decoder's positions; transformers' ``max_length``
    also counts the decoder start token, hence ``+ 2``."""
    from transformers import GenerationConfig
    d = src.dictionary
    values = dict(bos_token_id=d.eos() if src.lm else d.bos(), eos_token_id=d.eos(),
                  pad_token_id=d.pad(), suppress_tokens=[d.pad()], do_sample=False, num_beams=1)
    if src.lm:
        values.update(max_length=src.model.decoder.max_positions())
    else:
        max_len = min(FAIRSEQ_MAX_LEN_B, src.model.decoder.max_positions() - 1)
        values.update(decoder_start_token_id=d.eos(), min_new_tokens=1, max_length=max_len + 2,
                      num_beams=FAIRSEQ_BEAM, early_stopping=True, length_penalty=1.0)
    return GenerationConfig(**values)


def _file_parameters(model):
    seen, total = set(), 0
    for tensor in model.state_dict().values():
        key = (tensor.data_ptr(), tensor.numel())
        if key not in seen:
            seen.add(key)
            total += tensor.numel()
    return total


def _flags(src):
    try:
        return compression.model_flags(src.args, src.model_name)[2:]
    except Exception:  # the card's list of options is informative only
        return [f"--arch {src.arch}"]


def export(checkpoint, data, out_dir, bpe=None, bpe_codes=None, sentencepiece_model=None,
           gpt2_encoder_json=None, gpt2_vocab_bpe=None, tokenizer_name=None, force=False,
           sentences=16, log=None, valid_text=None):
    """Export ``checkpoint`` (its dictionaries in ``data``) to ``out_dir``; see the module
    docstring. Returns an :class:`ExportResult`."""
    say = log or (lambda message: None)
    options = dict(bpe=bpe, bpe_codes=bpe_codes, sentencepiece_model=sentencepiece_model,
                   gpt2_encoder_json=gpt2_encoder_json, gpt2_vocab_bpe=gpt2_vocab_bpe,
                   tokenizer=tokenizer_name)
    if not os.path.isfile(checkpoint):
        raise option_error("CHECKPOINT", checkpoint, "does not exist", "a checkpoint file "
                           "written by fairseq-train")
    if data and not os.path.isdir(data):
        raise option_error("DATA_DIR", data, "does not exist", "the data-bin the model was "
                           "trained on")
    if not isinstance(sentences, int) or sentences < 1:
        raise option_error("--check-sentences", sentences, "not allowed (the self-check needs "
                           "samples to score)", "an integer >= 1")
    out = check_out_dir(out_dir, [checkpoint, data, bpe_codes, sentencepiece_model,
                                  gpt2_encoder_json, gpt2_vocab_bpe, valid_text], force)
    tokenizer.kind_of(options)
    say(f"loading {checkpoint}")
    src = source.load(checkpoint, data)
    layout = support.choose(src)
    kind = tokenizer.check(src, options)
    data_dir = data or str(src.task.cfg.data).split(os.pathsep)[0]
    sides = tokenizer_check.text_sides(src, data_dir, kind, valid_text)
    say(f"{src.arch} -> {layout.CLASS}, tokenizer: {kind}")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    # named before it is made, so that a Ctrl-C from the moment it exists removes it
    work = os.path.join(parent, f".{os.path.basename(out)}.partial-{secrets.token_hex(4)}")
    try:
        os.mkdir(work, 0o700)
        _quiet_transformers()
        reader = source.Reader(src.model)
        config, weights = layout.build(src, reader)
        left = reader.left()
        if left:
            raise option_error("CHECKPOINT", checkpoint, f"{len(left)} of its tensors have no "
                               f"place in {layout.CLASS} ({', '.join(left[:3])})", "none (a "
                               "defect of the export: report it with the command)")
        model = instantiate(layout, config, weights, work)
        config = model.config
        model.generation_config = generation_config(src, layout)
        model.save_pretrained(work)
        max_length = int(getattr(config, "max_position_embeddings", 1024))
        tokenizer.write(work, src, options, max_length)
        words = tokenizer_check.run(src, data_dir, work, kind, sides)
        say(f"tokenizer check: the data-bin's ids on {words.compared} lines of "
            f"{', '.join(words.files)}")
        result = check.verify(src, layout, work, sentences)
        say(f"self-check: largest log-prob gap {result.gap:.2e} nats on {result.sentences} "
            f"{result.split} samples ({result.tokens} tokens)")
        counts = {"fairseq": src.parameters(),
                  "dense": src.parameters(src.model) if src.densified else None,
                  "export": sum(p.numel() for p in model.parameters()),
                  "file": _file_parameters(model)}
        card.write(work, os.path.basename(out), src, layout, result, kind, counts, _flags(src),
                   words)
        _move_into_place(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    say(f"wrote {out}: {layout.CLASS}, {counts['fairseq']:,} parameters in fairseq, "
        f"{counts['export']:,} in the export")
    return ExportResult(out_dir=out, hf_class=layout.CLASS, tokenizer=kind, gap=result.gap,
                        counts=counts, tokenizer_check=words)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _modes_as_umask_says(folder):
    """Files ``0666 & ~umask``, folders ``0777 & ~umask``, as a plain ``open``/``mkdir`` makes
    them (``mkdtemp`` makes 0700 and some writers 0600)."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~mask)


def _move_into_place(work, out):
    """Put the finished ``work`` at ``out``. An existing empty ``out`` is kept (its mode, owner)
    and filled; an existing non-empty one (allowed by ``force``) is replaced, its mode kept,
    and removed only after the new folder is in place."""
    _modes_as_umask_says(work)
    if os.path.isdir(out) and not os.listdir(out):
        moved = []
        try:
            for name in sorted(os.listdir(work)):
                os.rename(os.path.join(work, name), os.path.join(out, name))
                moved.append(name)
        except BaseException:
            for name in moved:  # leave OUT_DIR empty, as it was found
                target = os.path.join(out, name)
                shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
            raise
        os.rmdir(work)
        return
    old = None
    if os.path.exists(out):
        os.chmod(work, os.stat(out).st_mode & 0o7777)
        old = out + ".replaced-" + os.path.basename(work)
        os.rename(out, old)
    os.rename(work, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)
