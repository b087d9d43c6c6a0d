"""The model card (``README.md``) written with an export: where the model comes from, its
parameters in fairseq and in the export, the self-check's measured gap, how it was trained
(what the checkpoint says), and how to load it."""
import os

from slim_fairseq.export_hf import custom

TASKS = {"AutoModelForCausalLM": "text-generation", "AutoModelForSeq2SeqLM": "translation"}


def _training(src):
    state, cfg = src.state, src.cfg
    history = (state.get("optimizer_history") or [{}])[-1]
    lines = []
    updates = history.get("num_updates")
    if updates is not None:
        lines.append(f"- updates: {updates:,}")
    for label, section, key in (("optimizer", "optimizer", "_name"), ("learning rate",
                                "optimization", "lr"), ("criterion", "criterion", "_name"),
                                ("max tokens per batch", "dataset", "max_tokens"),
                                ("data", "task", "data")):
        holder = cfg.get(section) if hasattr(cfg, "get") else None
        value = holder.get(key) if holder is not None and hasattr(holder, "get") else None
        if value not in (None, ""):
            if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
                value = ", ".join(str(v) for v in value)
            lines.append(f"- {label}: {value}")
    return lines


def write(out_dir, name, src, layout, result, tokenizer_kind, counts, flags, words=None):
    """Write ``out_dir/README.md`` of the model called ``name``. ``counts``: {"fairseq": n,
    "dense": n or None, "export": n, "file": n}; ``flags``: the fairseq-train model options of
    the source."""
    task = TASKS[layout.AUTO]
    auto = layout.AUTO
    lines = ["---", "library_name: transformers", f"pipeline_tag: {task}",
             "tags:", "- fairseq", "- slim_fairseq", "---", "",
             f"# {name}", "",
             f"`{layout.CLASS}` exported by `slim-fairseq-export-hf` from the fairseq checkpoint "
             f"`{os.path.basename(src.path)}` (architecture `{src.arch}`, model "
             f"`{src.model_name}`).", "", "## Source", "",
             "fairseq-train model options: `" + " ".join(flags) + "`", ""]
    if src.densified:
        lines += ["Its Tensor Chains were materialised into dense weights before the export.", ""]
    if getattr(src.args, "adaptive_input", False):
        lines += ["Its adaptive input (a table and a projection per frequency band) was written "
                  "as the one table it computes.", ""]
    lines += ["## Parameters", "",
              f"- fairseq: {counts['fairseq']:,}"
              + (" (with Tensor Chains)" if counts.get("dense") else "")]
    if counts.get("dense"):
        lines.append(f"- dense, before the mapping: {counts['dense']:,}")
    lines += [f"- transformers ({layout.CLASS}): {counts['export']:,}; in model.safetensors: "
              f"{counts['file']:,}", "",
              "Weights that fairseq shares (STLM's tied feed-forwards and attention projections, "
              "a sandwich's middle layers) are written once per layer; a LoRA adapter is folded "
              "into its weight.", "", "## Check", "",
              f"On the first {result.sentences} samples of the `{result.split}` split "
              f"({result.tokens:,} tokens), the largest difference between fairseq's and this "
              f"model's log-probabilities was {result.gap:.2e} nats (float32); the export "
              "refuses more than 1e-4."]
    if words is not None:
        lines += ["", "Tokenizer: given the text of the valid split ("
                  + ", ".join(f"`{os.path.basename(p)}`" for p in words.files)
                  + f"; its first {words.lines} non-empty lines each), this folder's tokenizer "
                  f"gave exactly the ids binarized in the data-bin, on {words.compared:,} lines."
                  + (f" {words.skipped:,} lines were not compared: FSMT's tokenizer normalises "
                     "their punctuation (e.g. `’` to `'`) before Moses, where the data's "
                     "preprocessing did not, so they get other ids than in training."
                     if words.skipped else "")]
    if getattr(layout, "CUSTOM", False):
        lines += ["", "## Custom code", "",
                  f"No class of transformers computes this model: `{layout.CLASS}` is defined by "
                  "the Python files of this folder (`modeling_slim.py`, `configuration_slim.py` "
                  "and the plugin's own module files they import: "
                  + ", ".join(f"`{os.path.basename(p)}`" for p in custom.module_files())
                  + "; torch and transformers only). Loading it runs that code: pass "
                  "`trust_remote_code=True` to `from_pretrained` (the tokenizer's too, which "
                  "reads the same config.json), after reading the files. Engines that take only "
                  "transformers' own classes (CTranslate2, llama.cpp, vLLM's stock models) do "
                  "not load it."]
    lines += ["", "## Training", ""]
    lines += _training(src) or ["(the checkpoint records nothing)"]
    trust = ", trust_remote_code=True" if getattr(layout, "CUSTOM", False) else ""
    lines += ["", "## Use", "", f"Tokenizer: {tokenizer_kind} (the ids fairseq reads for the "
              "same text).", "", "```python",
              f"from transformers import AutoTokenizer, {auto}, pipeline",
              f'tokenizer = AutoTokenizer.from_pretrained("PATH"{trust})',
              f'model = {auto}.from_pretrained("PATH"{trust})']
    if task == "text-generation":
        lines += ['print(pipeline("text-generation", model=model, tokenizer=tokenizer)'
                  '("the house", max_new_tokens=10, do_sample=False))']
    else:
        lines += ['batch = tokenizer(["The house is small ."], return_tensors="pt")',
                  "print(tokenizer.batch_decode(model.generate(**batch), "
                  "skip_special_tokens=True))"]
    lines += ["```", ""]
    if task == "translation":
        lines += ["`generate` decodes as fairseq-generate does by default: beam 5, finished when "
                  "5 hypotheses end (`early_stopping=True`), scores divided by length, at most "
                  "200 tokens and `</s>` (`max_length` counts the decoder start token).", ""]
    else:
        lines += ["`generate` is greedy, as fairseq's hub decodes by default, and stops at "
                  f"the model's {src.model.decoder.max_positions()} positions (`max_length`: the "
                  "prompt with its leading `</s>` and the continuation; an explicit "
                  "`max_new_tokens` replaces it); the tokenizer decodes each word with the space "
                  "before it, `<unk>` as a word.", ""]
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
