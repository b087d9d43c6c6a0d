"""The tokenizer of an export: ``AutoTokenizer.from_pretrained(OUT_DIR)`` gives the ids fairseq
reads for the same text (fairseq's hub: ``--bpe`` and ``--tokenizer``, then its dictionary).

* whitespace words (no ``--bpe``): the dictionary as a word-level vocabulary;
* ``--bpe gpt2``: GPT-2's byte-level BPE with each piece at its index in ``dict.txt``
  (fairseq's dictionary holds GPT-2's ids as strings, ordered by frequency);
* ``--bpe sentencepiece``: the SentencePiece model's pieces at their ``dict.txt`` indices;
* ``--tokenizer moses --bpe subword_nmt`` (translation models): FSMT's tokenizer, Moses plus
  subword-nmt's merges, its vocabularies being the dictionaries written FSMT's way (``@@`` of
  a piece inside a word dropped, ``</w>`` on a piece that ends one).

A language model's ids start with ``</s>`` (index 2), as fairseq's LM inputs do; a translation
source ends with ``</s>``. A BPE piece missing from ``dict.txt`` is refused: fairseq reads it as
``<unk>``, which a BPE vocabulary cannot say.
"""
import json
import os

from slim_fairseq.option_errors import option_error

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
KINDS = ("words", "gpt2", "sentencepiece", "moses+subword_nmt")


def kind_of(options):
    """The tokenizer kind the options name (``options``: bpe, tokenizer and their files), or a
    one-line refusal of a combination that has none."""
    bpe, tokenizer = options.get("bpe"), options.get("tokenizer")
    if tokenizer not in (None, "moses"):
        raise option_error("--tokenizer", tokenizer, "not a tokenizer the export converts",
                           "--tokenizer moses with --bpe subword_nmt, or none")
    if tokenizer == "moses" and bpe != "subword_nmt":
        raise option_error("--tokenizer", "moses", "converted only with subword-nmt's BPE (FSMT's "
                           "tokenizer)", "--tokenizer moses --bpe subword_nmt --bpe-codes CODES")
    if bpe == "subword_nmt" and tokenizer != "moses":
        raise option_error("--bpe", "subword_nmt", "converted only after Moses (FSMT's tokenizer)",
                           "--tokenizer moses --bpe subword_nmt --bpe-codes CODES")
    files = {"gpt2": ("--gpt2-encoder-json", "--gpt2-vocab-bpe"),
             "sentencepiece": ("--sentencepiece-model",), "subword_nmt": ("--bpe-codes",)}
    if bpe is not None and bpe not in files:
        raise option_error("--bpe", bpe, "not a BPE the export converts",
                           "--bpe gpt2|sentencepiece|subword_nmt, or none")
    for flag in files.get(bpe, ()):
        path = options.get(flag[2:].replace("-", "_"))
        if not path or not os.path.isfile(path):
            raise option_error(flag, path, f"--bpe {bpe} needs this local file", f"{flag} FILE, "
                               "the file the data was encoded with")
    if bpe == "subword_nmt":
        check_codes(options["bpe_codes"])
    return {None: "words", "gpt2": "gpt2", "sentencepiece": "sentencepiece",
            "subword_nmt": "moses+subword_nmt"}[bpe]


def check_codes(path):
    """Refuse a ``--bpe-codes`` file that is not subword-nmt's codes (``#version`` then one merge
    of two symbols a line): a dictionary (``piece count`` lines) would split every word into
    characters."""
    with open(path, encoding="utf-8", errors="replace") as f:
        rows = [line.split() for line in f.read(1 << 20).split("\n")[:2000]]
    rows = [r for r in rows if r and not r[0].startswith("#version")]
    counts = sum(1 for r in rows if len(r) == 2 and r[1].isdigit())
    if not rows or any(len(r) != 2 for r in rows) or counts > len(rows) // 2:
        what = ("lines of a piece and a count, as a dictionary has" if rows and counts >
                len(rows) // 2 else "not one merge of two symbols a line")
        raise option_error("--bpe-codes", path, f"not subword-nmt's codes ({what})", "the codes "
                           "file of subword-nmt learn-bpe the data was encoded with")


def _symbols(dictionary):
    """``{symbol: index}`` as fairseq encodes (its ``indices``)."""
    return dict(dictionary.indices)


def _missing(flag, path, pieces, dictionary):
    missing = [p for p in pieces if p not in dictionary.indices]
    if missing:
        shown = ", ".join(repr(p) for p in missing[:3])
        raise option_error(flag, path, f"{len(missing)} of its pieces are not in the "
                           f"dictionary ({shown}...), and fairseq reads them as <unk>",
                           "the dictionary of every piece (fairseq-preprocess --srcdict with "
                           "each piece of the BPE listed)")


def _gpt2_files(options, dictionary):
    with open(options["gpt2_encoder_json"], encoding="utf-8") as f:
        encoder = json.load(f)
    with open(options["gpt2_vocab_bpe"], encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n")[1:] if line.strip()]
    # fairseq's encoder never emits a special piece such as <|endoftext|> from text
    pieces = {token: str(i) for token, i in encoder.items()
              if not (token.startswith("<|") and token.endswith("|>"))}
    _missing("--gpt2-encoder-json", options["gpt2_encoder_json"], pieces.values(), dictionary)
    return pieces, merges


def _sentencepiece_proto(options, dictionary):
    """The SentencePiece model with its pieces in ``dict.txt``'s order (the specials at
    fairseq's 0-3, a dictionary symbol that is no piece as an unused piece)."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2
    proto = model_pb2.ModelProto()
    with open(options["sentencepiece_model"], "rb") as f:
        proto.ParseFromString(f.read())
    if proto.trainer_spec.model_type not in (1, 2):  # unigram, bpe
        raise option_error("--sentencepiece-model", options["sentencepiece_model"], "a "
                           "SentencePiece model of another type than unigram or BPE",
                           "a unigram or BPE model (spm_train --model_type unigram|bpe)")
    normal = {1, 4, 6}  # normal, user-defined, byte pieces: what encoding emits
    by_piece = {p.piece: p for p in proto.pieces}
    _missing("--sentencepiece-model", options["sentencepiece_model"],
             [p.piece for p in proto.pieces if p.type in normal], dictionary)
    rows = []
    for index, symbol in enumerate(dictionary.symbols):
        piece = model_pb2.ModelProto.SentencePiece()
        known = by_piece.get(symbol)
        piece.piece = symbol
        if symbol in SPECIALS[:3]:
            piece.type, piece.score = 3, 0.0       # control
        elif symbol == "<unk>":
            piece.type, piece.score = 2, 0.0       # unknown
        elif known is not None and known.type in normal:
            piece.type, piece.score = known.type, known.score
        else:
            piece.type, piece.score = 5, -1e9      # unused: never chosen
        rows.append(piece)
    del proto.pieces[:]
    proto.pieces.extend(rows)
    proto.trainer_spec.unk_id = dictionary.unk()
    return proto


def build_fast(kind, dictionary, options, lm):
    """The ``tokenizers.Tokenizer`` of ``kind`` over ``dictionary``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    if kind == "words":
        from tokenizers import Regex
        tokenizer = Tokenizer(models.WordLevel(vocab=_symbols(dictionary), unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # words joined by spaces
        # each word decodes with the space before it (as GPT-2's pieces do), so a continuation
        # decoded alone joins its prompt as the words are: "the house" + " is"
        tokenizer.decoder = decoders.Replace(Regex("^"), " ")
    elif kind == "gpt2":
        pieces, merges = _gpt2_files(options, dictionary)
        vocab = {token: dictionary.index(gpt2_id) for token, gpt2_id in pieces.items()}
        ids = set(pieces.values())
        # the specials and padding symbols of the dictionary, each id once
        vocab.update({symbol: index for symbol, index in _symbols(dictionary).items()
                      if symbol not in ids and symbol not in vocab})
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
    else:
        from transformers.convert_slow_tokenizer import SpmConverter
        proto = _sentencepiece_proto(options, dictionary)
        if proto.trainer_spec.model_type == 1:
            vocab = [(p.piece, p.score) for p in proto.pieces]
        else:
            vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
        tokenizer = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    eos = dictionary.eos()
    template = "</s> $A" if lm else "$A </s>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, pair=f"{template} $B </s>" if lm else "$A </s> $B </s>",
        special_tokens=[("</s>", eos)])
    return tokenizer


def check(src, options):
    """Refuse, before anything is written, a tokenizer that cannot give fairseq's ids for
    ``src``; returns its kind."""
    kind = kind_of(options)
    if kind == "moses+subword_nmt" and src.lm:
        raise option_error("--bpe", "subword_nmt", "FSMT's tokenizer (Moses, subword-nmt) ends "
                           "a text with </s> where a language model starts with it",
                           "--bpe gpt2|sentencepiece, or none (whitespace words)")
    if kind != "moses+subword_nmt" and not src.lm \
            and src.source_dictionary.symbols != src.dictionary.symbols:
        raise option_error("--bpe", options.get("bpe") or "none", "a model with two "
                           "dictionaries takes FSMT's tokenizer, which encodes each with its own",
                           "--tokenizer moses --bpe subword_nmt --bpe-codes CODES")
    if kind == "words":
        pieces = [s for s in src.dictionary.symbols if s.endswith("@@")]
        if pieces:
            raise option_error("--bpe", "none", f"the dictionary holds BPE pieces ({len(pieces)} "
                               f"entries ending in @@, e.g. {pieces[0]!r}): split into "
                               "whitespace words, a word the BPE splits becomes <unk>",
                               "--tokenizer moses --bpe subword_nmt --bpe-codes CODES (the codes "
                               "the data was encoded with)")
    if kind == "gpt2":
        _gpt2_files(options, src.dictionary)
    elif kind == "sentencepiece":
        _sentencepiece_proto(options, src.dictionary)
    return kind


def write(out_dir, src, options, max_length):
    """Write the tokenizer files of ``options``'s kind into ``out_dir``; returns the kind."""
    kind = check(src, options)
    if kind == "moses+subword_nmt":
        return _write_fsmt(out_dir, src, options, max_length)
    from transformers import PreTrainedTokenizerFast
    # a word-level <unk> is a word of the text (fairseq prints it), not a control token that
    # decode(skip_special_tokens=True) drops; the model still maps an unknown word to it
    words = dict(clean_up_tokenization_spaces=False) if kind == "words" else \
        dict(unk_token="<unk>")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=build_fast(kind, src.dictionary, options, src.lm),
        bos_token="</s>" if src.lm else "<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=max_length, **words)
    tokenizer.save_pretrained(out_dir)
    return kind


def fsmt_vocabulary(dictionary):
    """FSMT's vocabulary of a subword-nmt dictionary: ``lo@@`` -> ``lo``, ``lo`` -> ``lo</w>``."""
    vocab = {}
    for symbol, index in _symbols(dictionary).items():
        if symbol in SPECIALS:
            vocab[symbol] = index
        elif symbol.endswith("@@"):
            vocab[symbol[:-2]] = index
        else:
            vocab[symbol + "</w>"] = index
    return vocab


def _write_fsmt(out_dir, src, options, max_length):
    import tempfile
    from transformers import FSMTTokenizer
    with tempfile.TemporaryDirectory() as work:
        files = {}
        for name, dictionary in (("src", src.source_dictionary), ("tgt", src.dictionary)):
            files[name] = os.path.join(work, f"vocab-{name}.json")
            with open(files[name], "w", encoding="utf-8") as f:
                json.dump(fsmt_vocabulary(dictionary), f, ensure_ascii=False)
        files["merges"] = os.path.join(work, "merges.txt")
        with open(options["bpe_codes"], encoding="utf-8") as codes, \
                open(files["merges"], "w", encoding="utf-8") as merges:
            for line in codes:
                if line.strip() and not line.startswith("#version"):
                    merges.write(" ".join(line.split()[:2]) + "\n")
        cfg = src.task.cfg
        tokenizer = FSMTTokenizer(langs=[cfg.source_lang, cfg.target_lang],
                                  src_vocab_file=files["src"], tgt_vocab_file=files["tgt"],
                                  merges_file=files["merges"], model_max_length=max_length)
        tokenizer.save_pretrained(out_dir)
    return "moses+subword_nmt"
