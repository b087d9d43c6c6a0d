"""``slim-fairseq-export-hf CHECKPOINT DATA_DIR OUT_DIR``: a fairseq checkpoint to a Hugging
Face transformers folder (config.json, model.safetensors, generation_config.json, the
tokenizer, a README.md model card), checked against fairseq before it is kept."""
import argparse
import sys


def get_parser():
    parser = argparse.ArgumentParser(
        prog="slim-fairseq-export-hf", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Tokenizer options as fairseq's hub takes them; none: whitespace-separated words "
               "(the language-model quick start).")
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint of fairseq-train "
                        "(slim_lm, slim_transformer, transformer_lm or transformer)")
    parser.add_argument("data", metavar="DATA_DIR", help="the data-bin it was trained on (its "
                        "dictionaries; its valid split for the self-check)")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write (new or empty)")
    parser.add_argument("--bpe", choices=["gpt2", "sentencepiece", "subword_nmt"],
                        help="the BPE the data was encoded with")
    parser.add_argument("--bpe-codes", help="subword-nmt's codes (--bpe subword_nmt)")
    parser.add_argument("--sentencepiece-model", help="the .model file (--bpe sentencepiece)")
    parser.add_argument("--gpt2-encoder-json", help="GPT-2's encoder.json (--bpe gpt2)")
    parser.add_argument("--gpt2-vocab-bpe", help="GPT-2's vocab.bpe (--bpe gpt2)")
    parser.add_argument("--tokenizer", choices=["moses"], help="Moses tokenization before "
                        "--bpe subword_nmt (FSMT's tokenizer)")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT_DIR "
                        "(after the new one has passed its check)")
    parser.add_argument("--valid-text", metavar="FILE", help="the valid split's text before "
                        "tokenization, one sample a line, for the tokenizer check (a "
                        "translation model's source side; for a FILE ending .SRC, the one "
                        "ending .TGT beside it is the target side); default: what the data-bin "
                        "names (valid.raw.LANG, or fairseq-preprocess's --validpref for "
                        "whitespace words)")
    parser.add_argument("--check-sentences", type=int, default=16, metavar="N",
                        help="valid samples the self-check scores (default 16)")
    return parser


def interruptible(prog, run, left):
    """``run()``'s exit status; an interrupt (Ctrl-C, SIGINT) prints the one line ``PROG:
    interrupted; LEFT`` instead of a traceback and gives 130, the shell's status for it."""
    try:
        return run()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; {left}", file=sys.stderr)
        return 130


def main(argv=None):
    args = get_parser().parse_args(argv)
    return interruptible("slim-fairseq-export-hf", lambda: _run(args),
                         f"{args.out_dir} left as it was found")


def _run(args):
    import logging
    logging.basicConfig(level=logging.WARNING)
    import slim_fairseq  # noqa: F401  (registers the plugin's models with fairseq)
    from slim_fairseq.export_hf import export
    from slim_fairseq.option_errors import OptionError, print_refusal

    def log(message):
        print(f"[export-hf] {message}", file=sys.stderr, flush=True)

    try:
        result = export(args.checkpoint, args.data, args.out_dir, bpe=args.bpe,
                        bpe_codes=args.bpe_codes, sentencepiece_model=args.sentencepiece_model,
                        gpt2_encoder_json=args.gpt2_encoder_json,
                        gpt2_vocab_bpe=args.gpt2_vocab_bpe, tokenizer_name=args.tokenizer,
                        force=args.force, sentences=args.check_sentences, log=log,
                        valid_text=args.valid_text)
    except OptionError as error:
        return print_refusal(str(error), "slim-fairseq-export-hf")
    print(result.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
