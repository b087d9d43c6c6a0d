"""The export's self-check: OUT_DIR loaded by transformers (local files only) scores sentences
of the data's valid split as fairseq scores them, within :data:`GAP_LIMIT` nats (fp32).

Both score the same batch: fairseq's own collation (a language model's blocks right-padded, a
translation's sources left-padded and targets right-padded), transformers given the padding as
its attention mask. FSMT builds no causal mask when it scores a whole target with its cache on,
so every class is called with ``use_cache=False``.
"""
import dataclasses

import torch

from slim_fairseq.option_errors import option_error

# largest difference of a log-probability (nats, float32) that the export accepts
GAP_LIMIT = 1e-4


@dataclasses.dataclass
class CheckResult:
    gap: float          # largest |log p_fairseq - log p_transformers| over the scored tokens
    sentences: int
    tokens: int
    split: str


def valid_batch(src, sentences):
    """fairseq's ``net_input`` of the first ``sentences`` samples of the valid split."""
    split = (getattr(src.cfg.dataset, "valid_subset", None) or "valid").split(",")[0]
    try:
        src.task.load_dataset(split, combine=False, epoch=1)
    except (FileNotFoundError, OSError) as exc:
        raise option_error("DATA_DIR", getattr(src.task.cfg, "data", None), f"has no readable "
                           f"{split} split ({' '.join(str(exc).split())[:200]})", "the data-bin "
                           "the model was trained on, binarized with --validpref") from None
    dataset = src.task.dataset(split)
    count = min(sentences, len(dataset))
    if count == 0:
        raise option_error("DATA_DIR", getattr(src.task.cfg, "data", None), f"its {split} split "
                           "is empty", "a data-bin binarized with a non-empty --validpref")
    return dataset.collater([dataset[i] for i in range(count)])["net_input"], split


@torch.no_grad()
def fairseq_log_probs(model, net_input, lm):
    if lm:
        out = model(net_input["src_tokens"])
    else:
        out = model(net_input["src_tokens"], net_input["src_lengths"],
                    net_input["prev_output_tokens"])
    return model.get_normalized_probs(out, log_probs=True).float()


@torch.no_grad()
def hf_log_probs(hf_model, net_input, lm, pad):
    if lm:
        tokens = net_input["src_tokens"]
        logits = hf_model(input_ids=tokens, attention_mask=tokens.ne(pad).long(),
                          use_cache=False).logits
    else:
        source, prev = net_input["src_tokens"], net_input["prev_output_tokens"]
        logits = hf_model(input_ids=source, attention_mask=source.ne(pad).long(),
                          decoder_input_ids=prev, decoder_attention_mask=prev.ne(pad).long(),
                          use_cache=False).logits
    return logits.float().log_softmax(-1)


def gap(fairseq_model, hf_model, net_input, lm, pad):
    """``(largest log-prob difference, tokens scored)`` on ``net_input``'s unpadded positions."""
    tokens = net_input["src_tokens"] if lm else net_input["prev_output_tokens"]
    keep = tokens.ne(pad)
    a = fairseq_log_probs(fairseq_model, net_input, lm)
    b = hf_log_probs(hf_model, net_input, lm, pad)
    return (a - b).abs()[keep].max().item(), int(keep.sum())


def load(layout, out_dir):
    """The exported model, loaded as a user would: the Auto class, local files only (custom
    code with ``trust_remote_code``)."""
    import transformers
    auto = getattr(transformers, layout.AUTO)
    custom = dict(trust_remote_code=True) if getattr(layout, "CUSTOM", False) else {}
    return auto.from_pretrained(out_dir, local_files_only=True, **custom).eval()


def run(src, layout, out_dir, sentences):
    net_input, split = valid_batch(src, sentences)
    hf_model = load(layout, out_dir)
    largest, tokens = gap(src.original, hf_model, net_input, src.lm, src.dictionary.pad())
    return CheckResult(gap=largest, sentences=net_input["src_tokens"].size(0), tokens=tokens,
                       split=split)


def verify(src, layout, out_dir, sentences):
    """:func:`run`, refused in one line when the gap is over :data:`GAP_LIMIT`."""
    result = run(src, layout, out_dir, sentences)
    if not result.gap <= GAP_LIMIT:
        raise option_error("CHECKPOINT", src.path, f"the export's log-probabilities differ "
                           f"from fairseq's by {result.gap:.2e} nats (over {GAP_LIMIT:g}), "
                           "nothing written", "none (a defect of the export: report it with "
                           "the command)")
    return result
