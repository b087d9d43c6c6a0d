"""Batch-1 greedy decoding of one language model three ways: fairseq (its SequenceGenerator,
beam 1, what ``fairseq-generate``/the hub run), transformers' ``generate`` on the export of
``slim-fairseq-export-hf``, and CTranslate2 on that export converted (Llama layout). The same
prompt, the same number of new tokens (the padding symbol never chosen, as fairseq does); the
tokens of the three are compared and each one's tokens/s reported with the ratios to fairseq.
A translation model: fairseq and transformers at several batch and beam sizes
(:func:`measure_translation`)."""
import time

import torch


def ct2_refusal(hf_dir):
    """Why CTranslate2 cannot decode the export in ``hf_dir`` (its problem; allowed: ...), or
    None: CTranslate2 4.8.5 converts a Llama whose heads are not width / heads channels wide
    (``--head-dim``) but fails when it decodes it."""
    import json
    import os
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    width, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or width // heads
    if head_dim * heads == width:
        return None
    return (f"CTranslate2 cannot decode {heads} heads of {head_dim} channels in a width of {width} "
            f"(it converts them, then fails); allowed: no --ct2-dir, or a model whose --head-dim "
            f"is {width} / {heads}")


def is_translation(hf_dir):
    """Whether the export in ``hf_dir`` is an encoder-decoder (a translation model)."""
    import json
    import os
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        return bool(json.load(f).get("is_encoder_decoder"))


def tokens_refusal(hf_dir, prompt, tokens):
    """Why ``tokens`` new tokens after ``prompt`` cannot be decoded by the export in ``hf_dir``
    (its problem; allowed: ...), or None. The prompt's ids (with the leading ``</s>``) and the
    new tokens must fit the model's positions (``max_position_embeddings``, the fairseq model's
    ``max_positions``): fairseq's generator stops with an AssertionError past them and
    transformers goes on with positions the model never learned."""
    import json
    import os
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        positions = json.load(f).get("max_position_embeddings")
    if not positions:
        return None
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    used = len(tokenizer(prompt)["input_ids"])
    room = positions - used
    if 1 <= tokens <= room:
        return None
    problem = ("not a number of new tokens" if tokens < 1 else f"with the prompt's {used} tokens "
               f"goes past the model's {positions} positions")
    allowed = f"1 to {room}" if room >= 1 else "a shorter --prompt"
    return f"{problem}; allowed: {allowed}"


def _best(run, repeats):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return min(times), out


@torch.no_grad()
def measure(checkpoint, data, hf_dir, prompt, tokens=64, repeats=3, ct2_dir=None):
    """A dict: tokens/s of fairseq, transformers and (with ``ct2_dir``, converted if missing)
    CTranslate2, the speed ratios to fairseq, and whether the greedy tokens agree."""
    import os

    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator
    from transformers import AutoModelForCausalLM, AutoTokenizer
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": data})
    model = models[0].float().eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True,
                                                    trust_remote_code=True).eval()
    ids = tokenizer(prompt)["input_ids"]
    prompt_ids = torch.tensor([ids])
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=1, max_len_a=0,
                                  max_len_b=len(ids) - 1 + tokens, min_len=len(ids) - 1 + tokens)
    sample = {"net_input": {"src_tokens": prompt_ids, "src_lengths": torch.tensor([len(ids)])}}
    seconds, hypos = _best(lambda: task.inference_step(generator, [model], sample), repeats)
    results = {"tokens": tokens, "prompt_tokens": len(ids)}
    outputs = {"fairseq": hypos[0][0]["tokens"].tolist()[len(ids) - 1:][:tokens]}
    results["fairseq_tokens_per_s"] = tokens / seconds
    seconds, out = _best(lambda: hf_model.generate(
        input_ids=prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=tokens,
        min_new_tokens=tokens), repeats)
    outputs["transformers"] = out[0].tolist()[len(ids):]
    results["transformers_tokens_per_s"] = tokens / seconds
    if ct2_dir:
        import ctranslate2
        if not os.path.isdir(ct2_dir):
            from ctranslate2.converters import TransformersConverter
            TransformersConverter(hf_dir).convert(ct2_dir)
        ct2 = ctranslate2.Generator(ct2_dir, device="cpu", intra_threads=torch.get_num_threads())
        pieces = tokenizer.convert_ids_to_tokens(ids)
        seconds, out = _best(lambda: ct2.generate_batch(
            [pieces], max_length=tokens, min_length=tokens, sampling_topk=1,
            include_prompt_in_result=False, suppress_sequences=[["<pad>"]]), repeats)
        outputs["ctranslate2"] = out[0].sequences_ids[0]
        results["ctranslate2_tokens_per_s"] = tokens / seconds
    for name in ("transformers", "ctranslate2"):
        if f"{name}_tokens_per_s" in results:
            results[f"{name}_vs_fairseq"] = (results[f"{name}_tokens_per_s"]
                                             / results["fairseq_tokens_per_s"])
    results["same_tokens"] = all(o == outputs["fairseq"] for o in outputs.values())
    results["outputs"] = outputs
    return results


def _valid_sources(task, count):
    """The first ``count`` source sentences of the valid split, as fairseq reads them."""
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    return [dataset[i]["source"] for i in range(min(count, len(dataset)))]


@torch.no_grad()
def measure_translation(checkpoint, data, hf_dir, batch_sizes=(1,), beams=(1,), tokens=20,
                        repeats=3):
    """A dict per ``(batch size, beam)``: target tokens/s of fairseq's SequenceGenerator (what
    ``fairseq-generate`` runs) and of transformers' ``generate`` on the export, on the same
    source sentences of DATA's valid split, each hypothesis held to ``tokens`` tokens (fairseq's
    ``min_len`` and ``max_len``, transformers' ``min_new_tokens`` and ``max_new_tokens``) so the
    two do the same work; the ratio, and whether the best hypotheses agree. fairseq's last step
    also scores the ``</s>`` it forces, which transformers does not need."""
    from fairseq import checkpoint_utils
    from fairseq.data import data_utils
    from fairseq.sequence_generator import SequenceGenerator
    from transformers import AutoModelForSeq2SeqLM
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": data})
    model = models[0].float().eval()
    hf_model = AutoModelForSeq2SeqLM.from_pretrained(hf_dir, local_files_only=True,
                                                     trust_remote_code=True).eval()
    pad, eos = task.source_dictionary.pad(), task.source_dictionary.eos()
    sources = _valid_sources(task, max(batch_sizes))
    results = []
    for batch in batch_sizes:
        chosen = [sources[i % len(sources)] for i in range(batch)]
        src = data_utils.collate_tokens(chosen, pad, eos)  # right-padded, as fairseq batches
        lengths = src.ne(pad).sum(1)
        for beam in beams:
            generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam,
                                          max_len_a=0, max_len_b=tokens, min_len=tokens)
            sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
            seconds, hypos = _best(lambda: generator.generate([model], sample), repeats)
            fairseq_out = [h[0]["tokens"].tolist()[:tokens] for h in hypos]
            row = {"batch": batch, "beam": beam, "tokens": tokens,
                   "fairseq_tokens_per_s": batch * tokens / seconds}
            seconds, out = _best(lambda: hf_model.generate(
                input_ids=src, attention_mask=src.ne(pad).long(), num_beams=beam,
                max_new_tokens=tokens, min_new_tokens=tokens, early_stopping=True), repeats)
            hf_out = [o[1:tokens + 1] for o in out.tolist()]
            row["transformers_tokens_per_s"] = batch * tokens / seconds
            row["transformers_vs_fairseq"] = (row["transformers_tokens_per_s"]
                                              / row["fairseq_tokens_per_s"])
            row["same_tokens"] = sum(a == b for a, b in zip(fairseq_out, hf_out)) / batch
            results.append(row)
    return results
