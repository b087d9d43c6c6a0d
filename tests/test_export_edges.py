"""The export at its edges (slim_fairseq/export_hf/): every exportable family at the combinations
the option table allows for it (output tying x embedding scale x LoRA and shared projections x
positions x norms; heads, biases and input/output widths where its class has them), each scored
by fairseq and by the transformers model up to the model's last position; one test per layout
that fills its whole position range; and the self-check refusing an export wrong at one
position only.

The models are tiny, built in-process and moved off their initial values (no training: a
mapping either gives fairseq's log-probabilities or it does not); the transformers model is
made from the layout's mapping as the export makes it (``export.instantiate``), without
writing a folder. A family whose full product has more than :data:`PER_FAMILY` combinations is
scored pairwise: the all-default and the all-on combination, then, in a seeded order, enough
others that every two values of two axes are scored together. Every combination here is one
the plugin's rules allow (a refusal fails the test: the axes are wrong).
"""
import importlib
import itertools
import random

import pytest
import torch

from helpers import build
from hf_export_fixtures import TINY_LM, TINY_MT, data_of, perturb_, tiny_checkpoint
from slim_fairseq.option_errors import OptionError

export_module = importlib.import_module("slim_fairseq.export_hf.export")

TOLERANCE = 1e-5
PER_FAMILY = 12  # a larger product is scored pairwise (every two values of two axes together)
MT_POSITIONS = ["--max-source-positions", "40", "--max-target-positions", "40"]
LM_POSITIONS = ["--tokens-per-sample", "48"]  # a language model's positions: its block

LLAMA_BLOCK = ["--norm", "rmsnorm", "--decoder-normalize-before", "--ffn-glu", "--rope-theta",
               "10000", "--no-token-positional-embeddings"]
LM_SHARING = {"plain": [], "lora": ["--decoder-layers", "4", "--tie-ffn", "0", "--ffn-lora-rank",
                                    "2", "--ffn-lora-alpha", "6"],
              "proj": ["--decoder-layers", "4", "--tie-attn-proj", "0"]}
MT_SHARING = {"plain": [], "lora": ["--encoder-layers", "4", "--decoder-layers", "4", "--tie-ffn",
                                    "0", "--ffn-lora-rank", "2", "--ffn-lora-alpha", "6"],
              "proj": ["--encoder-layers", "4", "--decoder-layers", "4", "--tie-attn-proj", "0"],
              "sandwich": ["--encoder-layers", "3", "--decoder-layers", "3", "--sandwich",
                           "--sandwich-heads", "4"]}
TYING = {"untied": [], "tied": ["--share-decoder-input-output-embed"]}
SCALE = {"scaled": [], "unscaled": ["--no-scale-embedding"]}

# family -> (layout class, language model?, base options, {axis: {value name: options}})
FAMILIES = {
    "llama": ("LlamaForCausalLM", True, LLAMA_BLOCK, {
        "tying": TYING, "scale": SCALE, "sharing": LM_SHARING,
        "heads": {"mha": [], "gqa": ["--kv-heads", "2"], "head_dim": ["--head-dim", "16"]},
        "bias": {"bias": [], "no_bias": ["--no-linear-bias"]}}),
    "xglm": ("XGLMForCausalLM", True, ["--decoder-normalize-before"], {
        "tying": TYING, "scale": SCALE, "sharing": LM_SHARING,
        "bias": {"bias": [], "no_bias": ["--no-linear-bias"]}}),
    "opt": ("OPTForCausalLM", True, [], {
        "tying": TYING, "scale": SCALE, "sharing": LM_SHARING,
        "positions": {"sinusoidal": [], "learned": ["--decoder-learned-pos"]},
        # pre-norm with a final norm and sinusoids is XGLM's: here with learned positions
        "norms": {"post": ["--no-decoder-normalize-before"],
                  "pre_no_final": ["--decoder-normalize-before", "--no-decoder-final-norm"],
                  "pre_learned": ["--decoder-normalize-before", "--decoder-learned-pos"]},
        "widths": {"same": [], "projected": ["--decoder-input-dim", "16",
                                             "--decoder-output-dim", "16"]}}),
    "fsmt": ("FSMTForConditionalGeneration", False, [], {
        "tying": {"untied": [], "tied": ["--share-decoder-input-output-embed"],
                  "all": ["--share-all-embeddings"]},
        "scale": SCALE, "sharing": MT_SHARING}),
    "m2m100": ("M2M100ForConditionalGeneration", False,
               ["--encoder-normalize-before", "--decoder-normalize-before",
                "--share-all-embeddings"], {"scale": SCALE, "sharing": MT_SHARING}),
}


def combinations(family):
    """``[(name, options)]``: the family's full product when it has at most
    :data:`PER_FAMILY` combinations, else the all-default and the all-on combination and then,
    in a seeded order, each combination that holds a pair of values of two axes not held yet,
    until every pair is held (a mapping wrong only for two options together is scored)."""
    _, _, base, axes = FAMILIES[family]
    product = list(itertools.product(*[list(values.items()) for values in axes.values()]))
    if len(product) > PER_FAMILY:
        def pairs(combo):
            names = [name for name, _ in combo]
            return set(itertools.combinations(enumerate(names), 2))
        rest = product[1:-1]
        random.Random(family).shuffle(rest)
        chosen = [product[0], product[-1]]
        held = pairs(product[0]) | pairs(product[-1])
        wanted = set().union(*(pairs(combo) for combo in product))
        while held != wanted:
            best = max(rest, key=lambda combo: len(pairs(combo) - held))
            rest.remove(best)
            chosen.append(best)
            held |= pairs(best)
        product = chosen
    return [("-".join(name for name, _ in combo),
             base + [flag for _, options in combo for flag in options]) for combo in product]


CASES = [(family, name, options) for family in FAMILIES for name, options in combinations(family)]


def in_process(lm, argv, arch=None, seed=0, positions=None):
    """``(src, layout, transformers model)`` of a tiny model built from ``argv`` (and the
    position options ``positions``, by default the combinations' short ranges), mapped as the
    export maps it."""
    from slim_fairseq.export_hf import source, support
    from slim_fairseq.models.slim_options import set_slim_defaults
    arch = arch or ("slim_lm" if lm else "slim_transformer")
    args, task, model = build(arch, (TINY_LM if lm else TINY_MT) + list(argv), lm,
                              (LM_POSITIONS if lm else MT_POSITIONS) if positions is None
                              else positions)
    set_slim_defaults(args)
    perturb_(model, seed, scale=0.1)
    model = model.float().eval()
    src = source.Source(path="", cfg=None, state=None, args=args, arch=arch,
                        model_name="slim_lm" if lm else "slim_transformer", task=task,
                        model=model, original=model, densified=False)
    layout = support.choose(src)
    reader = source.Reader(model)
    config, weights = layout.build(src, reader)
    assert not reader.left(), reader.left()
    return src, layout, export_module.instantiate(layout, config, weights)


def full_range_batch(src, lengths=None):
    """fairseq's ``net_input`` of two samples: one filling every position the model has, one
    shorter (padded as fairseq pads)."""
    from fairseq.data import data_utils
    d = src.dictionary
    g = torch.Generator().manual_seed(0)
    decoder = src.model.decoder.max_positions()
    rows = [torch.randint(d.nspecial, len(d), (n,), generator=g) for n in (decoder, decoder // 3)]
    prev = data_utils.collate_tokens([torch.cat([torch.tensor([d.eos()]), r[:-1]]) for r in rows],
                                     d.pad(), left_pad=False)
    if src.lm:
        return {"src_tokens": prev, "src_lengths": prev.ne(d.pad()).sum(1)}
    s = src.source_dictionary
    encoder = src.model.encoder.max_positions()
    sources = [torch.cat([torch.randint(s.nspecial, len(s), (n - 1,), generator=g),
                          torch.tensor([s.eos()])]) for n in (encoder, encoder // 2)]
    tokens = data_utils.collate_tokens(sources, s.pad(), left_pad=True)
    return {"src_tokens": tokens, "src_lengths": tokens.ne(s.pad()).sum(1),
            "prev_output_tokens": prev}


def position_gaps(src, hf_model, net_input):
    """The largest log-probability gap at each target position (over the batch's unpadded
    tokens), fairseq against transformers."""
    from slim_fairseq.export_hf import check
    pad = src.dictionary.pad()
    a = check.fairseq_log_probs(src.original, net_input, src.lm)
    b = check.hf_log_probs(hf_model, net_input, src.lm, pad)
    tokens = net_input["src_tokens"] if src.lm else net_input["prev_output_tokens"]
    gaps = (a - b).abs().amax(-1).masked_fill(tokens.eq(pad), 0)
    return gaps.amax(0)


def assert_scores_alike_to_the_last_position(src, hf_model, what):
    net_input = full_range_batch(src)
    gaps = position_gaps(src, hf_model, net_input)
    assert gaps.numel() == src.model.decoder.max_positions()
    worst = int(gaps.argmax())
    assert gaps.max() <= TOLERANCE, (f"{what}: log-probabilities differ by {gaps.max():.2e} at "
                                     f"position {worst} of {gaps.numel()}")


@pytest.mark.parametrize("family,name,options", CASES,
                         ids=[f"{family}-{name}" for family, name, _ in CASES])
def test_every_exportable_combination_scores_alike_to_the_last_position(family, name, options):
    expected, lm, _, _ = FAMILIES[family]
    try:
        src, layout, hf_model = in_process(lm, options)
    except OptionError as error:
        if getattr(error, "rule", None) is None:  # a refusal of the export, not of the table
            raise
        pytest.fail(f"{' '.join(options)}: refused by the plugin ({error}); the family's axes "
                    "must be combinations the option table allows")
    assert layout.CLASS == expected
    assert_scores_alike_to_the_last_position(src, hf_model, f"{family} {name}")


def test_the_families_cover_every_layout_and_every_pair_of_values():
    """Each layout is a family; each family's cases hold the all-default and the all-on
    combination and every pair of values of two of its axes (the tied and scaled embedding)."""
    from slim_fairseq.export_hf import fsmt, llama, m2m100, opt, xglm
    assert {FAMILIES[f][0] for f in FAMILIES} == {m.CLASS for m in (llama, xglm, opt, fsmt, m2m100)}
    for family, (_, _, _, axes) in FAMILIES.items():
        names = [name.split("-") for name, _ in combinations(family)]
        assert names[0] == [next(iter(v)) for v in axes.values()]
        assert [list(v)[-1] for v in axes.values()] in names
        values = list(axes.values())
        for (i, a), (j, b) in itertools.combinations(enumerate(values), 2):
            for x, y in itertools.product(a, b):
                assert any(n[i] == x and n[j] == y for n in names), (family, x, y)



# one model per layout at fairseq's own position ranges (a translation model's 1024)
LAYOUTS = {
    "llama": (True, LLAMA_BLOCK + ["--share-decoder-input-output-embed"]),
    "xglm": (True, ["--decoder-normalize-before"]),
    "opt": (True, ["--decoder-learned-pos"]),
    "fsmt": (False, []),
    "m2m100": (False, ["--encoder-normalize-before", "--decoder-normalize-before",
                       "--share-all-embeddings"]),
}


@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_each_layout_fills_its_full_position_range(layout_name):
    lm, options = LAYOUTS[layout_name]
    # a translation model at fairseq's default range, not the combinations' shorter one
    src, layout, hf_model = in_process(lm, options, positions=None if lm else [])
    assert layout.__name__.endswith(layout_name)
    positions = src.model.decoder.max_positions()
    assert positions == (48 if lm else 1024)
    config_positions = getattr(hf_model.config, "max_position_embeddings", None)
    assert config_positions is not None and config_positions >= positions
    assert_scores_alike_to_the_last_position(src, hf_model, layout_name)
    if not lm:
        assert src.model.encoder.max_positions() == 1024


# ------------------------------------------------------------------ the self-check can fail

def _corrupt_last_position(weights, rows, size):
    """OPT's learned position table with the row of the last position moved by ``size``."""
    key = "model.decoder.embed_positions.weight"
    table = weights[key].clone()
    table[rows - 1] += size * torch.linspace(-1, 1, table.size(1))
    weights[key] = table


def test_self_check_refuses_an_export_wrong_at_one_position(tmp_path, monkeypatch):
    """An export whose last position alone is off by a few times the limit: the self-check's gap
    is the largest over the tokens (not a mean, which such an error hides), and the export
    refuses it, writing nothing."""
    from slim_fairseq.export_hf import check, export, opt, source
    path = tiny_checkpoint(tmp_path, "slim_lm", ["--decoder-learned-pos"], True)
    src = source.load(path, data_of(True))
    net_input, _ = check.valid_batch(src, 4)
    rows = src.model.decoder.max_positions() + 2
    assert net_input["src_tokens"].size(1) == src.model.decoder.max_positions()  # reaches it
    build = opt.build

    def scored(size):
        config, weights = build(src, source.Reader(src.model))
        _corrupt_last_position(weights, rows, size)
        hf_model = export_module.instantiate(opt, config, weights)
        return check.gap(src.original, hf_model, net_input, True, src.dictionary.pad()), \
            position_gaps(src, hf_model, net_input)

    size = 1e-3
    for _ in range(3):  # the corruption at about 5 times the limit
        (largest, _), _ = scored(size)
        size *= 5 * check.GAP_LIMIT / largest
    (largest, tokens), gaps = scored(size)
    assert gaps[:-1].max() <= TOLERANCE < check.GAP_LIMIT < gaps[-1]  # the last position only
    assert largest == pytest.approx(gaps.max().item(), rel=1e-6)
    assert TOLERANCE + gaps[-1].item() * 4 / tokens < check.GAP_LIMIT  # a mean would pass it

    def corrupted_build(src_, reader):
        config, weights = build(src_, reader)
        _corrupt_last_position(weights, rows, size)
        return config, weights

    monkeypatch.setattr(opt, "build", corrupted_build)
    out = tmp_path / "corrupted-hf"
    with pytest.raises(OptionError, match=r"^CHECKPOINT=.*: the export's log-probabilities "
                                          r"differ from fairseq's by .* nothing written"):
        export(path, data_of(True), str(out), sentences=4)
    assert not out.exists()
