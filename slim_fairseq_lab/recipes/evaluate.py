"""
Evaluate a translation model trained with train-anthe.sh / train-subformer.sh on data made by
a prepare script, or by scripts/binarize_bundled.py (the bundled en-de); it reads the languages
and the segmentation from DATA_BIN/recipe.info.

1. checkpoint: CKPT is a file, or a checkpoint folder: its checkpoint_best.pt, or with
   --avg N the average of its last N checkpoints (scripts/average_checkpoints.py; update
   checkpoints when there are enough, else epoch checkpoints, picked by number; the averaged
   files are named in the log and in the results)
2. length penalty: beam search (--beam 5) on valid with every value of --lenpens; the best
   score on valid wins: tokenized BLEU, or for a Chinese or Japanese target (which the Moses
   tokenizer does not segment) sacreBLEU with the language's tokenizer (zh, ja-mecab).
   A single value (--lenpens 1.0) is used as it is: valid is not translated at all.
3. test with that length penalty, reporting
   - tokenized BLEU: hypotheses and references in Moses tokens (references only tokenized,
     not punctuation-normalised, as fairseq's scripts/compound_split_bleu.sh scores them;
     data that ships tokenized references, like Google's WMT14, is scored against those),
     with compound splitting ("a-b" -> "a ##AT##-##AT## b") only when the target is German
     (the WMT14 en-de convention); the report names the tokenization used. Not computed for
     Chinese and Japanese targets;
   - detokenized sacreBLEU against the untokenized references (signature printed; tokenizer
     zh / ja-mecab for those targets, else 13a);
   - fairseq's valid and test perplexity (fairseq-validate: 2^nll per target token, padding
     excluded), the Anthe paper's metric. The paper's own perplexities averaged over padding
     positions too, so they are not comparable with these.
   The table per target language is in examples/translation/README.md ("Evaluate").
Outputs go to OUT_DIR/NAME/ (NAME: the checkpoint's file name without .pt; OUT_DIR: --out-dir,
default the checkpoint folder's eval/), the report to OUT_DIR/NAME/results.txt, written only
when every step succeeded: a refused or failed run leaves the outputs of an earlier one as
they were (a failed run's logs stay in the temporary folder its error names). Translation
logs its progress.
Refused before anything is translated: references that are not UTF-8, or whose lines are not
the sentences of the binarized subset (a line deleted or added would score every later
hypothesis against another sentence: each line is compared with the target sentence
fairseq-generate reads, after the same BPE removal, and the first that differs is named), a checkpoint that is not complete, a language model,
a model trained to translate other languages than recipe.info names, and options that
fairseq-generate does not know.

Paper protocols: the Subformer paper scores the best checkpoint (no averaging) with beam 5
and a length penalty tuned on valid over 0.0-2.0 (--paper: --lenpens 0.0 0.2 ... 2.0, no
--avg). The Anthe paper reports perplexity only. The defaults (5 length penalties 0.6-1.4)
are the cheaper fairseq-style sweep.

usage: evaluate.sh DATA_BIN CKPT [--avg N] [--lenpens "0.6 0.8 1.0 1.2 1.4"] [--beam 5]
           [--batch-size N] [--out-dir DIR] [--paper] [--cpu] [fairseq-generate options]
       (--name=VALUE is the same as --name VALUE; --lenpen, --gen-subset, --path,
       --source-lang and --target-lang are the script's own and refused)
"""
import os
import re
import shutil
import sys

from slim_fairseq_lab import checkpoints
from slim_fairseq_lab.recipes import cli, evaluation, text, tools
from slim_fairseq_lab.recipes.cli import log, refuse, step_failed
from slim_fairseq_lab.recipes.outputs import Staged

PROG = "evaluate.sh"
PAPER_LENPENS = "0.0 0.2 0.4 0.6 0.8 1.0 1.2 1.4 1.6 1.8 2.0"
DEFAULT_LENPENS = "0.6 0.8 1.0 1.2 1.4"


def parser():
    p = cli.Parser(PROG)
    p.value("--avg", kind="count", default="1")
    p.value("--lenpens")
    p.value("--beam", kind="count", default="5")
    p.value("--batch-size", kind="count", default="128")
    p.value("--out-dir")
    p.flag("--paper", default=False)
    p.flag("--cpu", default=False)
    p.refused("--lenpen", "the length penalty is chosen on valid among --lenpens",
              "--lenpens with one value (e.g. --lenpens 1.0), which is used as it is")
    p.refused("--gen-subset", "evaluate.sh chooses the length penalty on valid and scores test",
              "no --gen-subset (fairseq-generate itself scores another subset)")
    languages = ("the languages are read from DATA_BIN/recipe.info",
                 "no language option (the data-bin prepared for the direction to score)")
    p.refused("--path", "the checkpoint is CKPT, the second argument", "evaluate.sh DATA_BIN CKPT")
    p.refused("--source-lang", *languages)
    p.refused("--target-lang", *languages)
    return p


def read_info(data):
    """DATA_BIN/recipe.info as a dict (languages, segmentation, notes)."""
    info = {}
    with open(os.path.join(data, "recipe.info"), encoding="utf-8") as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition("=")
            info.setdefault(key, value)
    return info


class Evaluation:
    """One run: the checked settings, then :meth:`run`."""

    def __init__(self, argv):
        args, extra = cli.split(parser(), argv, ("DATA_BIN", "CKPT"), pass_through=True)
        if not (args.data_bin and args.ckpt):
            raise refuse("DATA_BIN and CKPT", "required", "evaluate.sh DATA_BIN CKPT (see --help)")
        data, ckpt = args.data_bin, args.ckpt
        self.data, self.extra, self.beam, self.batch_size = data, extra, args.beam, args.batch_size
        self.cpu = ["--cpu"] if args.cpu else []
        if not os.path.isfile(os.path.join(data, "recipe.info")):
            raise refuse(f"DATA_BIN={data}", "no recipe.info (its languages and segmentation)",
                         "a data-bin written by a prepare script or scripts/binarize_bundled.py")
        lenpens = args.lenpens
        if args.paper:
            if args.avg != "1":
                raise refuse(f"--avg={args.avg}", "--paper scores the best checkpoint, as the Subformer "
                             "paper", "no --avg, or no --paper")
            if lenpens:
                raise refuse(f"--lenpens={lenpens}", "--paper tunes over 0.0 0.2 ... 2.0, as the "
                             "Subformer paper", "no --lenpens, or no --paper")
            lenpens = PAPER_LENPENS
        self.lenpens_text = lenpens or DEFAULT_LENPENS
        self.lenpens = self.lenpens_text.split()
        if not self.lenpens:
            raise refuse("--lenpens", "no value", "numbers >= 0 separated by spaces, e.g. "
                         "--lenpens '1.0 1.2'")
        for lenpen in self.lenpens:
            if not re.fullmatch(r"[0-9]*\.?[0-9]+", lenpen):
                raise refuse(f"--lenpens={self.lenpens_text}", f"'{lenpen}' is not a number >= 0",
                             "numbers >= 0 separated by spaces, e.g. --lenpens '1.0 1.2'")
        info = read_info(data)
        self.src, self.tgt, self.scheme = info.get("SRC", ""), info.get("TGT", ""), info.get("SCHEME", "")
        postprocess = {"moses-bpe": ["--remove-bpe"], "sentencepiece": ["--post-process", "sentencepiece"]}
        if self.scheme not in postprocess:
            raise refuse(f"{data}/recipe.info", f"unknown SCHEME '{self.scheme}'",
                         "SCHEME=moses-bpe or SCHEME=sentencepiece, as the prepare scripts write")
        self.postprocess = postprocess[self.scheme]
        self.sacre_tok = text.sacrebleu_tokenizer(self.tgt)
        text.check_sacrebleu_tokenizer(self.tgt)
        if text.moses_segments(self.tgt):
            self.criterion = "tokenized BLEU"
            if os.path.isfile(os.path.join(data, f"test.tok.{self.tgt}")):
                refs = info.get("REF_TOKENS") or f"the tokens of the data's test.tok.{self.tgt}"
                self.tokenization = text.bleu_tokenization_name(self.tgt, refs)
            else:
                self.tokenization = text.bleu_tokenization_name(self.tgt)
        else:
            self.criterion = f"sacreBLEU (-tok {self.sacre_tok})"
            self.tokenization = ""
        for tool in ("fairseq-generate", "fairseq-validate", "sacrebleu", "sacremoses"):
            tools.find(tool)
        # the references sacreBLEU reads (valid only to choose among several penalties): UTF-8,
        # one line per sentence of the binarized subset
        self.subsets = ["test"] if len(self.lenpens) == 1 else ["valid", "test"]
        self.counts = {}
        for subset in self.subsets:
            ref = os.path.join(data, f"{subset}.raw.{self.tgt}")
            if not (os.path.isfile(ref) and os.path.getsize(ref) > 0):
                raise refuse(ref, f"missing or empty: the untokenized {subset} references",
                             "a data-bin of a prepare script or scripts/binarize_bundled.py, which "
                             "write them next to it")
            text.check_utf8(ref)
            self.counts[subset] = self.check_alignment(subset, ref)
        self.ref_note = info.get("REF_NOTE", "")
        self.out_dir = args.out_dir or os.path.join(evaluation.folder_of(ckpt), "eval")
        name = os.path.basename(evaluation.checkpoint_name(ckpt, int(args.avg), self.out_dir))
        self.work = os.path.join(self.out_dir, name[:-len(".pt")] if name.endswith(".pt") else name)
        # 1. the checkpoint, checked before anything is written
        self.model = evaluation.resolve(ckpt, args.avg, self.out_dir)
        self.check_model()
        # the references read through the data-bin's dictionary: after the check that it is the
        # checkpoint's (another one would make every line differ, and hide the reason)
        for subset in self.subsets:
            self.check_references(subset, os.path.join(data, f"{subset}.raw.{self.tgt}"),
                                  text.pair_index(self.data, subset, self.src, self.tgt))
        self.check_options()

    def check_alignment(self, subset, ref):
        """The reference lines against the sentences of the binarized subset."""
        count = text.line_count(ref)
        index = text.pair_index(self.data, subset, self.src, self.tgt)
        if index is None:
            raise refuse(f"DATA_BIN={self.data}", f"no binarized {subset} split of {self.src}-{self.tgt} "
                         f"({subset}.{self.src}-{self.tgt}.{self.src}.idx)", "the data-bin a prepare script wrote")
        sentences = len(text.index_sizes(index))
        if sentences != count:
            raise refuse(ref, f"{count} lines, and the binarized {subset} split holds {sentences} sentences: "
                         "its hypotheses would be scored against other sentences' references",
                         f"the {os.path.basename(ref)} written with the data-bin (one line per sentence)")
        return count

    def check_references(self, subset, ref, source_index):
        """Each reference line is the target sentence fairseq-generate reads from the data-bin
        (its ``T-`` line after the same BPE removal), compared word by word
        (:func:`text.same_sentence`): a line deleted and another added elsewhere keep the count
        and would score every hypothesis between them against another sentence."""
        index = source_index[:-len(f".{self.src}.idx")] + f".{self.tgt}.idx"
        dictionary = os.path.join(self.data, f"dict.{self.tgt}.txt")
        if not (os.path.isfile(index) and os.path.isfile(dictionary)):
            return  # no target side: fairseq-generate prints no T- lines either
        targets = text.binarized_lines(index, dictionary)
        for number, (words, line) in enumerate(zip(targets, text.read_lines(ref)), 1):
            target = text.post_processed(words, self.scheme)
            if not text.same_sentence(target, line):
                raise refuse(ref, f"line {number} is not the target sentence {number} of the binarized {subset} "
                             f"split ('{_short(line)}', and the data-bin holds '{_short(target)}'): the "
                             "references are not the test set's", f"the {os.path.basename(ref)} written with the "
                             "data-bin (one line per sentence, in its order)")

    def check_model(self):
        state = self.model.state
        where = self.model.averaged[-1] if self.model.averaged else self.model.path
        if checkpoints.task_name(state) == "language_modeling":
            raise refuse(f"CKPT={where}", f"a language model ({evaluation.describe(state)}), and evaluate.sh "
                         "scores translation models", "examples/lm/evaluate-lm.sh DATA_BIN CKPT")
        src, tgt = checkpoints.languages(state)
        if src and tgt and (src, tgt) != (self.src, self.tgt):
            raise refuse(f"CKPT={where}", f"the model translates {src} -> {tgt}, and {self.data}/recipe.info "
                         f"says {self.src} -> {self.tgt}", f"a data-bin of {src} -> {tgt} (a prepare script's "
                         f"--src {src} --tgt {tgt})")
        evaluation.check_data(self.model, self.data)

    def check_options(self):
        """The options passed on to fairseq-generate are ones it knows (else it would stop with
        its usage at the first subset it translates)."""
        from fairseq import options
        unknown = tools.unknown_fairseq_options(options.get_generation_parser(),
                                                self.generate_argv("test", self.lenpens[0], self.model.path)[1:])
        if unknown:
            raise tools.not_options(unknown, "fairseq-generate", " with --task translation")

    def generate_argv(self, subset, lenpen, model):
        return ["fairseq-generate", self.data, "--user-dir", tools.user_dir(), "--path", model, "--task",
                "translation", "--source-lang", self.src, "--target-lang", self.tgt, "--gen-subset", subset,
                "--beam", self.beam, "--lenpen", lenpen, "--batch-size", self.batch_size,
                "--required-batch-size-multiple", "1", *self.postprocess, *self.cpu, *self.extra]

    # -----------------------------------------------------------------------------------------

    def run(self):
        with Staged(PROG) as stage:
            self.stage = stage
            model = self.model.path
            if self.model.averaged:
                model = stage.path(os.path.basename(self.model.path))
                self.model.write_average(model)
            self.fairseq_model = model
            os.makedirs(stage.path("work"))
            self.staged = stage.path("work")
            log(f"evaluating {self.model.path} ({self.src} -> {self.tgt}, {self.scheme}; length penalty chosen by "
                f"{self.criterion}; tokenized BLEU: {self.tokenization or f'not computed for {self.tgt}'}); "
                f"outputs in {self.work}")
            results = self.evaluate()
            with open(os.path.join(self.staged, "results.txt"), "w", encoding="utf-8") as f:
                f.write(results)
            if self.model.averaged:
                stage.install(os.path.basename(self.model.path), self.model.path)
            stage.install("work", self.work)
        sys.stdout.write(results)
        return 0

    def out(self, name):
        return os.path.join(self.staged, name)

    def evaluate(self):
        # 2. length penalty on valid
        if len(self.lenpens) == 1:
            best = self.lenpens[0]
            choice = "the only value of --lenpens: valid not translated"
            print(f"length penalty: {best} ({choice})", flush=True)
        else:
            best, best_score = None, -1.0
            for lenpen in self.lenpens:
                out = self.out(f"valid.lenpen{lenpen}")
                self.generate("valid", lenpen, out)
                if text.moses_segments(self.tgt):
                    score = self.tokenized_bleu("valid", out)
                else:
                    score = self.sacre_bleu("valid", out, "-b")
                print(f"valid lenpen {lenpen}: {self.criterion} {score}", flush=True)
                if float(score) > best_score:
                    best, best_score = lenpen, float(score)
                    best_text = score
            choice = f"best valid {self.criterion} ({best_text}) of {self.lenpens_text}"
            print(f"best length penalty on valid: {best} ({self.criterion} {best_text})", flush=True)
        # 3. test
        test = self.out(f"test.lenpen{best}")
        self.generate("test", best, test)
        if text.moses_segments(self.tgt):
            tok_bleu = f"BLEU (tokenized) = {self.tokenized_bleu('test', test)}"
        else:
            tok_bleu = (f"BLEU (tokenized): not computed: the Moses tokenizer does not segment {self.tgt}; "
                        f"see sacreBLEU (tok {self.sacre_tok})")
        sacre = self.sacre_bleu("test", test, "-f", "text")
        ppl = self.perplexities(self.out("validate"))
        if "valid" not in ppl or "test" not in ppl:
            raise step_failed(f"fairseq-validate reported no perplexity (see {self.out('validate.log')})")
        lines = [f"model: {self.model.path}"]
        if self.model.averaged:
            lines.append(f"average of: {' '.join(self.model.averaged)}")
        lines.append(f"test ({self.src} -> {self.tgt}), beam {self.beam}, lenpen {best} ({choice})")
        if self.tokenization:
            lines.append(f"tokenization of tokenized BLEU: {self.tokenization}")
        lines += [tok_bleu, f"sacreBLEU (detokenized): {sacre}"]
        if self.ref_note:
            lines.append(f"references: {self.ref_note}")
        lines.append(f"perplexity (fairseq, per target token, padding excluded): valid {ppl['valid']}, "
                     f"test {ppl['test']}")
        return "".join(line + "\n" for line in lines)

    def generate(self, subset, lenpen, out):
        """Beam search; OUT.hyp holds one hypothesis per sentence of the subset, in corpus order
        (a sentence fairseq-generate skipped counts as an empty translation).
        --required-batch-size-multiple 1: with the default 8, this fairseq build's batch_by_size
        silently drops the last (size mod 8) sentences of the subset."""
        count = self.counts[subset]
        log(f"translating {subset} ({count} sentences), length penalty {lenpen}")

        def progress():
            with open(out + ".log", encoding="utf-8", errors="replace") as f:
                done = sum(line.startswith("H-") for line in f)
            log(f"{subset}, length penalty {lenpen}: sentences translated: {done} of {count}")

        tools.run(self.generate_argv(subset, lenpen, self.fairseq_model), stdout=out + ".log", stderr=out + ".err",
                  env={"PYTHONUNBUFFERED": "1"}, progress=progress)
        hyps = {}
        with open(out + ".log", encoding="utf-8") as f:
            for line in f:
                if line.startswith("H-"):
                    head, _score, *words = line.rstrip("\n").split("\t")
                    hyps[int(head[2:])] = words[0] if words else ""
        if not hyps:
            raise step_failed(f"fairseq-generate produced no hypotheses (see {out}.log)")
        beyond = [i for i in hyps if i >= count]
        if beyond:
            raise step_failed(f"fairseq-generate translated sentence {beyond[0]} of {subset}, which has {count} "
                              f"references: hypotheses and references are not aligned (see {out}.log)")
        missing = [i for i in range(count) if i not in hyps]
        if missing:
            print(f"warning: {len(missing)} of {count} sentences got no hypothesis (scored as empty), "
                  f"ids {missing[:10]}", file=sys.stderr)
        text.write_lines(out + ".hyp", [hyps.get(i, "") for i in range(count)])

    def tokenized_bleu(self, subset, out):
        """Tokenized BLEU of OUT.hyp (:func:`text.bleu_tokenize`); the references are the subset's
        Moses tokens shipped with the data (SUBSET.tok.TGT) or else its untokenized text,
        tokenized here."""
        if self.scheme == "sentencepiece":
            text.bleu_tokenize(self.tgt, out + ".hyp", out + ".hyp.tok")
        else:
            text.bleu_split(self.tgt, out + ".hyp", out + ".hyp.tok")
        shipped = os.path.join(self.data, f"{subset}.tok.{self.tgt}")
        if os.path.isfile(shipped):
            text.bleu_split(self.tgt, shipped, out + ".ref.tok")
        else:
            text.bleu_tokenize(self.tgt, os.path.join(self.data, f"{subset}.raw.{self.tgt}"), out + ".ref.tok")
        same_lines(out + ".ref.tok", out + ".hyp.tok")
        return tools.output(["sacrebleu", out + ".ref.tok", "-i", out + ".hyp.tok", "-m", "bleu", "-tok", "none",
                             "-b", "-w", "2"]).strip()

    def sacre_bleu(self, subset, out, *options):
        """Detokenized sacreBLEU of OUT.hyp."""
        if self.scheme == "sentencepiece":
            shutil.copyfile(out + ".hyp", out + ".detok")
        else:
            text.moses_detokenize(self.tgt, out + ".hyp", out + ".detok")
        ref = os.path.join(self.data, f"{subset}.raw.{self.tgt}")
        same_lines(ref, out + ".detok")
        return tools.output(["sacrebleu", ref, "-i", out + ".detok", "-m", "bleu", "-w", "2", "-tok",
                             self.sacre_tok, *options]).strip()

    def perplexities(self, out):
        """fairseq-validate on valid and test: {subset: ppl}."""
        log("fairseq-validate: perplexity of valid and test")
        tools.run(["fairseq-validate", self.data, "--user-dir", tools.user_dir(), "--path", self.fairseq_model,
                   "--task", "translation", "--source-lang", self.src, "--target-lang", self.tgt,
                   "--valid-subset", "valid,test", "--batch-size", self.batch_size, "--required-batch-size-multiple",
                   "1", "--log-format", "simple", *self.cpu], log=out + ".log",
                  progress=lambda: log("fairseq-validate: running"))
        found = {}
        with open(out + ".log", encoding="utf-8", errors="replace") as f:
            for line in f:
                match = re.search(r"valid on '([a-z]+)' subset.*\| ppl ([0-9.]+)", line)
                if match:
                    found[match.group(1)] = match.group(2)
        return found


def _short(line, most=60):
    return line if len(line) <= most else line[:most - 3] + "..."


def same_lines(ref, hyp):
    """References and hypotheses line up before they are scored."""
    refs, hyps = text.line_count(ref), text.line_count(hyp)
    if refs != hyps:
        raise step_failed(f"{hyp}: {hyps} hypotheses for the {refs} references of {ref}: not scored")


def main(argv=None):
    return cli.run(PROG, __doc__, lambda words: Evaluation(words).run(), argv)


if __name__ == "__main__":
    sys.exit(main())
