"""Subformer (docs/TECHNIQUES.md#subformer): SAFE embeddings, sandwich sharing, presets.

Models are built through fairseq's own parser with a synthetic dictionary, so these tests need
no data. Parameter counts are always taken from built models.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import parse_train_args

JOINED_TYPES = 32768

# arXiv:2101.00234 App. B: (arch, paper count in millions as printed, exact count by formula)
PAPER_COUNTS = [
    ("sandwich_base", 38, 38_861_824),
    ("sandwich_big", 122, 121_763_840),
    ("subformer_small", 38, 38_646_272),
    ("subformer_base", 52, 51_961_024),
    ("subformer_mid", 63, 63_152_042),
    ("subformer_large", 197, 197_362_176),
]

# a shrunk subformer_small: SAFE d_e 16, d_m 32, middle 48 / 64, 8 layers per side
SHRINK = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
          "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
          "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
          "--safe-embed-dim", "16", "--sandwich-dim", "48", "--sandwich-ffn-dim", "64",
          "--sandwich-heads", "4"]


def synthetic_dictionary(size):
    from fairseq.data import Dictionary
    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}")
    return d


def build_translation(arch, extra=(), vocab=60, device=None, seed=1):
    """(model, dictionary) of a slim_transformer arch with a joined synthetic dictionary."""
    from fairseq.tasks.translation import TranslationTask
    args = parse_train_args(["unused-data", "--task", "translation", "-s", "src", "-t", "tgt",
                             "--arch", arch, "--cpu", *extra])
    dictionary = synthetic_dictionary(vocab)
    task = TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(seed)
    if device is not None:
        with torch.device(device):
            return task.build_model(args), dictionary
    return task.build_model(args), dictionary


def build_lm(arch, extra=(), vocab=100, device=None, seed=1):
    from fairseq.tasks.language_modeling import LanguageModelingTask
    if arch.startswith("subformer_lm") and "--criterion" not in extra:
        extra = [*extra, "--criterion", "adaptive_loss"]  # its adaptive softmax needs it
    args = parse_train_args(["unused-data", "--task", "language_modeling", "--arch", arch,
                             "--cpu", *extra])
    dictionary = synthetic_dictionary(vocab)
    task = LanguageModelingTask(args, dictionary, dictionary)
    torch.manual_seed(seed)
    if device is not None:
        with torch.device(device):
            return task.build_model(args), dictionary
    return task.build_model(args), dictionary


def count(model):
    return sum(p.numel() for p in model.parameters())  # each shared tensor once


def random_tokens(dictionary, batch, length, generator):
    low = dictionary.nspecial
    return torch.randint(low, len(dictionary), (batch, length), generator=generator)


def left_pad(rows, pad):
    width = max(len(r) for r in rows)
    return torch.stack([torch.cat([torch.full((width - len(r),), pad, dtype=torch.long), r])
                        for r in rows])


def decoder_inputs(dictionary, batch=3, length=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    tgt = random_tokens(dictionary, batch, length, g)
    prev = torch.cat([torch.full((batch, 1), dictionary.eos()), tgt[:, :-1]], dim=1)
    return prev


def encoder_inputs(dictionary, lengths=(6, 4, 5), seed=1):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.cat([random_tokens(dictionary, 1, n - 1, g)[0],
                       torch.tensor([dictionary.eos()])]) for n in lengths]
    src = left_pad(rows, dictionary.pad())
    return src, torch.tensor(lengths)


def step_by_step_logits(model, src, src_lengths, prev):
    """Decoder logits computed one position at a time through fairseq's incremental state."""
    enc = model.encoder(src, src_lengths=src_lengths) if src is not None else None
    state = {}
    steps = []
    for t in range(prev.size(1)):
        out, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
        steps.append(out)
    return torch.cat(steps, dim=1)


def full_logits(model, src, src_lengths, prev):
    enc = model.encoder(src, src_lengths=src_lengths) if src is not None else None
    out, _ = model.decoder(prev, encoder_out=enc)
    return out


# --------------------------------------------------------------------------------------------
# parameter counts (docs/TECHNIQUES.md#subformer-presets-and-parameter-counts)

@pytest.mark.parametrize("arch,paper_millions,exact", PAPER_COUNTS)
def test_parameter_counts_match_paper(arch, paper_millions, exact):
    model, _ = build_translation(arch, vocab=JOINED_TYPES, device="meta")
    n = count(model)
    assert abs(n - exact) <= 0.01 * exact, (arch, n, exact)
    # the paper prints whole millions (sandwich_base's 38.86M is printed "38M"): allow 2% around
    # the interval that the printed number stands for
    low, high = (paper_millions - 0.5) * 1e6, (paper_millions + 0.5) * 1e6
    distance = max(low - n, n - high, 0.0)
    assert distance <= 0.02 * paper_millions * 1e6, (arch, n, paper_millions)


def test_enro_presets_are_smaller_than_their_en_de_counterparts():
    small, _ = build_translation("subformer_enro_small", vocab=35000, device="meta")
    base, _ = build_translation("subformer_enro_base", vocab=35000, device="meta")
    # App. B: paper 20M and 48M
    assert abs(count(small) - 20e6) <= 0.05 * 20e6
    assert count(small) < count(base) < 48e6


def _lm_count_by_formula(vocab, d, f, ds, fs, layers, cutoffs=(20000, 60000), factor=4):
    """Adaptive input bands + tied adaptive softmax + sandwich stack (docs/TECHNIQUES.md#subformer-presets-and-parameter-counts)."""
    edges = [0, *cutoffs, vocab]
    adaptive_input = sum((edges[i + 1] - edges[i]) * (d // factor ** i) + (d // factor ** i) * d
                         for i in range(len(edges) - 1))  # band table + projection to d
    softmax_cluster_logits = d * len(cutoffs)  # words and tail projections are tied
    attention = lambda w: 4 * w * w + 4 * w
    ffn = lambda w, h: 2 * w * h + h + w
    own_layers = 2 * (attention(d) + ffn(d, f) + 4 * d)
    middle = attention(ds) + ffn(ds, fs) + (layers - 2) * 4 * ds  # shared once, LayerNorms per layer
    up_down = (d * ds + ds + 2 * ds) + (ds * d + d + 2 * d)
    final_norm = 2 * d
    return adaptive_input + softmax_cluster_logits + own_layers + middle + up_down + final_norm


@pytest.mark.parametrize("arch,dims,paper_millions", [
    ("subformer_lm_wiki103_83m", (768, 3072, 1536, 6144), 83),
    ("subformer_lm_wiki103_96m", (768, 4096, 2048, 6144), 96),
    ("subformer_lm_wiki103_122m", (1024, 4096, 2048, 6144), 122),
])
def test_lm_preset_counts(arch, dims, paper_millions):
    vocab = 267744  # Wikitext-103 word vocabulary
    model, dictionary = build_lm(arch, vocab=vocab, device="meta")
    n = count(model)
    assert n == _lm_count_by_formula(len(dictionary), *dims, layers=12)
    assert abs(n - paper_millions * 1e6) <= 0.06 * paper_millions * 1e6


# --------------------------------------------------------------------------------------------
# sharing is real

def _middle(layers):
    return list(layers)[1:-1]


def test_middle_layers_share_one_set_of_tensors_with_own_layer_norms():
    model, _ = build_translation("subformer_small", SHRINK)
    for side, names in ((model.encoder, ["self_attn", "fc1", "fc2"]),
                        (model.decoder, ["self_attn", "fc1", "fc2", "encoder_attn"])):
        middle = _middle(side.layers)
        assert len(middle) == 6
        first = middle[0]
        for layer in middle[1:]:
            assert layer is not first
            for name in names:
                mine, theirs = getattr(layer, name), getattr(first, name)
                assert mine is not theirs  # separate module objects (own incremental state)
                for (pn, p), (qn, q) in zip(mine.named_parameters(), theirs.named_parameters()):
                    assert pn == qn and p is q, (name, pn)
            assert layer.self_attn_layer_norm.weight is not first.self_attn_layer_norm.weight
            assert layer.final_layer_norm.weight is not first.final_layer_norm.weight
            assert (layer.self_attn._incremental_state_id
                    != first.self_attn._incremental_state_id)
        # own first/last layers at d_m with their own weights
        assert side.layers[0].self_attn.q_proj.weight.shape == (32, 32)
        assert first.self_attn.q_proj.weight.shape == (48, 48)
        assert side.layers[0].self_attn.q_proj.weight is not side.layers[-1].self_attn.q_proj.weight
    # middle decoder layers attend at d_m through d_s -> d_m -> d_s projections
    cross = _middle(model.decoder.layers)[0].encoder_attn
    assert cross.attention.q_proj.weight.shape == (32, 32)
    assert cross.to_model.weight.shape == (32, 48) and cross.to_middle.weight.shape == (48, 32)


def test_one_optimizer_state_for_shared_tensors():
    from fairseq import optim
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    model, _ = build_translation("subformer_small", SHRINK)
    all_uses = list(model.named_parameters(remove_duplicate=False))
    unique = list(model.parameters())
    assert len(all_uses) > len(unique)
    assert len({id(p) for p in unique}) == len(unique)
    args = parse_train_args(["unused", "--arch", "subformer_small", "--optimizer", "adam",
                             "--lr", "1e-3"])
    optimizer = optim.build_optimizer(convert_namespace_to_omegaconf(args).optimizer, unique)
    held = [p for group in optimizer.optimizer.param_groups for p in group["params"]]
    assert len(held) == len(unique)


def _untie_middle(model):
    """Deep copy of ``model`` whose middle layers own independent copies of the shared tensors."""
    clone = copy.deepcopy(model)
    for side in (clone.encoder, clone.decoder):
        for layer in _middle(side.layers):
            for module in layer.modules():
                for name, p in list(module._parameters.items()):
                    if p is not None:
                        setattr(module, name, nn.Parameter(p.detach().clone()))
    return clone


def test_gradients_from_every_depth_accumulate_into_shared_tensors():
    model, dictionary = build_translation("subformer_small", SHRINK)
    model.eval()  # no dropout: both passes see the same function
    untied = _untie_middle(model)
    assert count(untied) > count(model)
    src, src_lengths = encoder_inputs(dictionary)
    prev = decoder_inputs(dictionary)
    for m in (model, untied):
        m.zero_grad()
        out, _ = m(src, src_lengths, prev)
        out.log_softmax(-1).sum().backward()
    for side, side_untied in ((model.encoder, untied.encoder), (model.decoder, untied.decoder)):
        shared = _middle(side.layers)
        copies = _middle(side_untied.layers)
        params = dict(shared[0].named_parameters())
        for name, p in params.items():
            if p is not shared[1].get_parameter(name):
                continue  # per-layer LayerNorm
            per_depth = [c.get_parameter(name).grad for c in copies]
            assert all(g is not None and g.abs().sum() > 0 for g in per_depth), name
            torch.testing.assert_close(p.grad, sum(per_depth), rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------------------------
# incremental decoding == full forward (the reference's shared-incremental-state bug)

@pytest.mark.parametrize("extra", [
    [],
    ["--encoder-normalize-before", "--decoder-normalize-before"],
    ["--sandwich-dim", "32"],  # d_s = d_m: no projections
    ["--safe-output", "mlp"],
    ["--self-attn-gate", "qgv", "--cross-attn-gate", "kgv", "--ffn-glu", "--tc-ff", "0.5"],
    ["--sandwich-cross-norm", "none", "--decoder-normalize-before"],
], ids=["post-ln", "pre-norm", "same-width", "safe-mlp", "with-anthe-options", "no-cross-norm"])
def test_incremental_decoding_equals_full_forward(extra):
    model, dictionary = build_translation("subformer_small", SHRINK + extra)
    model.eval()
    src, src_lengths = encoder_inputs(dictionary)
    prev = decoder_inputs(dictionary, length=6)
    with torch.no_grad():
        full = full_logits(model, src, src_lengths, prev)
        steps = step_by_step_logits(model, src, src_lengths, prev)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-5)


def test_one_module_object_at_several_depths_decodes_wrongly():
    """The reference's layout (one module object reused at every middle depth) makes the step-
    by-step decoder diverge from the full forward; separate objects holding the same
    Parameters, as built here, do not."""
    model, dictionary = build_translation("subformer_small", SHRINK)
    model.eval()
    src, src_lengths = encoder_inputs(dictionary)
    prev = decoder_inputs(dictionary, length=6)
    with torch.no_grad():
        ours = (step_by_step_logits(model, src, src_lengths, prev)
                - full_logits(model, src, src_lengths, prev)).abs().max()
        reference_style = copy.deepcopy(model)
        layers = reference_style.decoder.layers
        for i in range(2, len(layers) - 1):
            layers[i] = layers[1]
        bug = (step_by_step_logits(reference_style, src, src_lengths, prev)
               - full_logits(reference_style, src, src_lengths, prev)).abs().max()
    assert ours < 1e-5
    assert bug > 1e-3


def test_lm_incremental_decoding_equals_full_forward():
    model, dictionary = build_lm(
        "subformer_lm_wiki103_83m",
        ["--decoder-embed-dim", "32", "--decoder-input-dim", "32", "--decoder-output-dim", "32",
         "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4", "--decoder-layers", "5",
         "--sandwich-dim", "48", "--sandwich-ffn-dim", "64", "--sandwich-heads", "4",
         "--adaptive-input-cutoff", "20,60", "--adaptive-softmax-cutoff", "20,60"])
    model.eval()
    prev = decoder_inputs(dictionary, length=6)
    with torch.no_grad():
        full = full_logits(model, None, None, prev)
        steps = step_by_step_logits(model, None, None, prev)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------
# beam search scores exactly what a full forward scores

def test_sequence_generator_scores_equal_teacher_forced_log_probs():
    from fairseq.sequence_generator import SequenceGenerator
    model, dictionary = build_translation("subformer_small", SHRINK, seed=3)
    model.eval()
    src, src_lengths = encoder_inputs(dictionary, lengths=(7, 4, 6, 5))
    generator = SequenceGenerator([model], dictionary, beam_size=4, max_len_a=0, max_len_b=9)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths},
              "id": torch.arange(src.size(0))}
    with torch.no_grad():
        hypos = generator.forward(sample)
    checked = 0
    for i, beams in enumerate(hypos):
        assert len(beams) == 4
        for hypo in beams:
            tokens = hypo["tokens"].unsqueeze(0)
            prev = torch.cat([torch.tensor([[dictionary.eos()]]), tokens[:, :-1]], dim=1)
            with torch.no_grad():
                net_output = model(src[i: i + 1], src_lengths[i: i + 1], prev)
                lprobs = model.get_normalized_probs(net_output, log_probs=True)
            teacher_forced = lprobs[0].gather(-1, tokens[0].unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(hypo["positional_scores"], teacher_forced,
                                       rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked == 16


# --------------------------------------------------------------------------------------------
# SAFE (docs/TECHNIQUES.md#safe-embeddings)

def test_safe_parameters_and_tying():
    model, dictionary = build_translation("subformer_small", SHRINK)
    d_e, d_m = 16, 32
    enc_safe, dec_safe = model.encoder.embed_tokens, model.decoder.embed_tokens
    assert enc_safe.table is dec_safe.table  # --share-all-embeddings: one table E(V, d_e)
    assert enc_safe.self_attn is not dec_safe.self_attn
    assert enc_safe.weight.shape == (len(dictionary), d_e)
    own = count(enc_safe) - enc_safe.table.weight.numel()
    assert own == (4 * d_e * d_e + 4 * d_e) + 2 * d_e + (d_e * d_e + d_e) + (d_e * d_m + d_m) + 2 * d_m
    out = model.decoder.output_projection
    assert out.table.weight is enc_safe.table.weight
    assert count(out) - out.table.weight.numel() == d_m * d_e + d_e


def test_safe_encoder_is_left_pad_invariant():
    model, dictionary = build_translation("subformer_small", SHRINK)
    model.eval()
    src, src_lengths = encoder_inputs(dictionary, lengths=(7, 3))
    with torch.no_grad():
        batched = model.encoder(src, src_lengths=src_lengths)["encoder_out"][0]
        alone = model.encoder(src[1:, -3:], src_lengths=src_lengths[1:])["encoder_out"][0]
    torch.testing.assert_close(batched[-3:, 1], alone[:, 0], rtol=1e-4, atol=1e-5)


def test_safe_decoder_scale_and_positions():
    model, dictionary = build_translation("subformer_small", SHRINK)
    safe = model.decoder.embed_tokens
    assert safe.embed_scale == pytest.approx(16 ** 0.5)  # sqrt(d_e), not sqrt(d_m)
    model.eval()
    same_token = torch.full((1, 4), dictionary.nspecial + 3)
    with torch.no_grad():
        out = safe(same_token)
    # positions are added: one token repeated gives different vectors at each position
    assert (out[0, 1] - out[0, 2]).abs().max() > 1e-3


def test_safe_output_mlp_is_a_different_function():
    linear, dictionary = build_translation("subformer_small", SHRINK)
    mlp, _ = build_translation("subformer_small", SHRINK + ["--safe-output", "mlp"])
    mlp.load_state_dict(linear.state_dict())
    h = torch.randn(2, 3, 32)
    with torch.no_grad():
        a, b = linear.decoder.output_projection(h), mlp.decoder.output_projection(h)
    assert a.shape == b.shape == (2, 3, len(dictionary))
    assert (a - b).abs().max() > 1e-4


def test_safe_in_the_language_model():
    model, dictionary = build_lm(
        "slim_lm",
        ["--decoder-embed-dim", "32", "--decoder-input-dim", "32", "--decoder-output-dim", "32",
         "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4", "--decoder-layers", "3",
         "--safe-embed-dim", "16", "--share-decoder-input-output-embed", "--sandwich",
         "--sandwich-dim", "48", "--sandwich-heads", "4", "--decoder-normalize-before"])
    model.eval()
    prev = decoder_inputs(dictionary, length=5)
    with torch.no_grad():
        full = full_logits(model, None, None, prev)
        steps = step_by_step_logits(model, None, None, prev)
    assert full.shape == (3, 5, len(dictionary))
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------
# no unused parameters, init, validation

def test_lm_preset_has_no_unused_parameters():
    model, dictionary = build_lm(
        "subformer_lm_wiki103_96m",
        ["--decoder-embed-dim", "32", "--decoder-input-dim", "32", "--decoder-output-dim", "32",
         "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4", "--decoder-layers", "4",
         "--sandwich-dim", "48", "--sandwich-ffn-dim", "64", "--sandwich-heads", "4",
         "--adaptive-input-cutoff", "20,60", "--adaptive-softmax-cutoff", "20,60"])
    assert model.decoder.layers[0].encoder_attn is None
    tokens = torch.arange(dictionary.nspecial, len(dictionary)).view(4, -1)  # every band
    prev, target = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    features = model(prev)[0]
    logits, targets = model.decoder.adaptive_softmax(features, target.view(-1))
    loss = sum(F.cross_entropy(l, t, reduction="sum")
               for l, t in zip(logits, targets) if t is not None)
    loss.backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert unused == []


def test_bert_init():
    model, dictionary = build_translation("subformer_small", SHRINK + ["--bert-init"],
                                          vocab=2000)
    table = model.encoder.embed_tokens.table.weight
    assert table[dictionary.pad()].abs().sum() == 0
    assert table.std().item() == pytest.approx(0.02, rel=0.1)
    fc1 = model.decoder.layers[0].fc1
    assert fc1.bias.abs().sum() == 0 and fc1.weight.std().item() == pytest.approx(0.02, rel=0.2)
    plain, _ = build_translation("subformer_small", SHRINK, vocab=2000)
    assert plain.decoder.layers[0].fc1.weight.std().item() > 0.05


@pytest.mark.parametrize("extra,flag", [
    (["--checkpoint-activations"], "--checkpoint-activations"),
    (["--ddp-backend", "fully_sharded"], "--ddp-backend"),
    (["--encoder-layers", "2"], "--encoder-layers"),
    (["--sandwich-heads", "5"], "--sandwich-heads"),
    (["--encoder-layerdrop", "0.1"], "--encoder-layerdrop"),
    (["--sandwich-cross-norm", "rms"], "--sandwich-cross-norm"),
    (["--sandwich-cross-norm", "none", "--sandwich-dim", "32"], "--sandwich-cross-norm"),
])
def test_bad_combinations_are_one_line_errors(extra, flag):
    with pytest.raises(ValueError) as err:
        build_translation("subformer_small", SHRINK + extra)
    message = str(err.value)
    assert flag in message and "\n" not in message


def test_sandwich_cross_norm_needs_a_wide_encoder_decoder_sandwich():
    """--sandwich-cross-norm is never silently ignored: not without --sandwich, not in an LM."""
    with pytest.raises(ValueError) as err:
        build_translation("slim_transformer", ["--sandwich-cross-norm", "none"])
    assert "--sandwich-cross-norm" in str(err.value) and "--sandwich" in str(err.value)
    with pytest.raises(ValueError) as err:
        build_lm("slim_lm", ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
                             "--decoder-attention-heads", "4", "--decoder-layers", "3", "--sandwich",
                             "--sandwich-dim", "48", "--sandwich-heads", "4",
                             "--sandwich-cross-norm", "none"])
    assert "--sandwich-cross-norm" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("extra, message", [
    (["--sandwich-dim", "64"], "--sandwich-dim=64: shapes the shared middle layers of --sandwich, which is off"),
    (["--sandwich-ffn-dim", "64"], "--sandwich-ffn-dim=64: shapes"),
    (["--sandwich-heads", "2"], "--sandwich-heads=2: shapes"),
    (["--safe-output", "mlp"], "--safe-output=mlp: shapes SAFE, which is off"),
    (["--glu-hidden", "full"], "--glu-hidden=full: shapes the GLU feed-forward, which is off"),
    (["--tc-length", "3"], "--tc-length=3: shapes a Tensor Chain, which is off"),
])
@pytest.mark.parametrize("lm", [False, True], ids=["slim_transformer", "slim_lm"])
def test_options_of_a_technique_that_is_off_are_refused(extra, message, lm):
    """An option that only shapes a technique which is off used to build the same model as
    without it; it is now a one-line error naming the flag and what to add."""
    if lm:
        shape = ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4",
                 "--decoder-layers", "3"]
        build = lambda options: build_lm("slim_lm", options)  # noqa: E731
    else:
        shape = SHRINK[:8] + ["--encoder-layers", "3", "--decoder-layers", "3"]  # no SAFE, no sandwich
        build = lambda options: build_translation("slim_transformer", options)  # noqa: E731
    build(shape)
    with pytest.raises(ValueError) as err:
        build(shape + extra)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ["slim_lm", "anthe_lm_gpt2_small"])
def test_language_model_refuses_cross_attention_gates(arch):
    """--cross-attn-gate has nothing to act on in a language model: refused in one line, not
    silently ignored (it used to build the same model as without it)."""
    shape = ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4",
             "--decoder-layers", "2"]
    build_lm(arch, shape)  # the preset itself builds
    with pytest.raises(ValueError) as err:
        build_lm(arch, shape + ["--cross-attn-gate", "kgv"])
    message = str(err.value)
    assert message.startswith("--cross-attn-gate=kgv: not available in slim_lm: it acts on "
                              "cross-attention") and "\n" not in message


def middle_cross_attention_rms(model, dictionary):
    """RMS of what the first middle decoder layer's cross-attention adds to its residual stream."""
    seen = []
    hook = model.decoder.layers[1].encoder_attn.register_forward_hook(
        lambda module, inputs, output: seen.append(output[0].pow(2).mean().sqrt().item()))
    src, src_lengths = encoder_inputs(dictionary)
    with torch.no_grad():
        model(src, src_lengths, decoder_inputs(dictionary, length=6))
    hook.remove()
    return seen[0]


def test_sandwich_cross_norm_none_drops_only_the_closing_layer_norm():
    """Reference form: the middle decoder layers' cross-attention ends in LN(d_s), so at init it
    adds a unit-RMS vector whatever the attention reads; ``none`` removes that LN (2 d_s
    parameters, shared by the middle layers) and nothing else."""
    extra = ["--decoder-normalize-before", "--encoder-normalize-before"]
    ref, dictionary = build_translation("subformer_small", SHRINK + extra)
    bare, _ = build_translation("subformer_small", SHRINK + extra + ["--sandwich-cross-norm", "none"])
    middle_dim = ref.decoder.layers[1].encoder_attn.to_middle.out_features
    assert count(ref) - count(bare) == 2 * middle_dim
    assert bare.decoder.layers[1].encoder_attn.to_middle_norm is None
    assert bare.decoder.layers[1].encoder_attn.to_middle.weight is \
        bare.decoder.layers[2].encoder_attn.to_middle.weight
    ref.eval(), bare.eval()
    assert middle_cross_attention_rms(ref, dictionary) == pytest.approx(1.0, abs=0.02)
    assert middle_cross_attention_rms(bare, dictionary) < 0.8


def test_checkpoint_activations_allowed_under_legacy_ddp():
    model, _ = build_translation("subformer_small", SHRINK + ["--checkpoint-activations",
                                                                 "--ddp-backend", "legacy_ddp"])
    assert count(model) > 0


@pytest.mark.parametrize("arch, width, expected", [
    # the paper's d_s, f_s and d_e scaled with the width (512 -> 128: a quarter)
    ("subformer_base", 128, dict(sandwich_dim=256, sandwich_ffn_dim=768, safe_embed_dim=80,
                                 encoder_ffn_embed_dim=512, encoder_attention_heads=2)),
    ("subformer_small", 256, dict(sandwich_dim=384, sandwich_ffn_dim=1024, safe_embed_dim=128,
                                  encoder_ffn_embed_dim=1024, encoder_attention_heads=4)),
    ("subformer_base", 512, dict(sandwich_dim=1024, sandwich_ffn_dim=3072, safe_embed_dim=320,
                                 encoder_ffn_embed_dim=2048, encoder_attention_heads=8)),
])
def test_a_narrower_preset_is_proportionally_smaller(arch, width, expected):
    """A preset's derived widths follow --encoder-embed-dim unless given: subformer_base at
    width 128 has a 256-wide middle, not the paper's 1024 (it trained a 23M-parameter model at
    width 128 before); an explicit value still wins; slim-fairseq-help shows the result."""
    from slim_fairseq.arch_help import describe, preset_values

    args = preset_values(arch, ["--encoder-embed-dim", str(width)])
    assert {key: getattr(args, key) for key in expected} == expected
    assert args.decoder_embed_dim == width
    given = preset_values(arch, ["--encoder-embed-dim", str(width), "--sandwich-dim", "512"])
    assert given.sandwich_dim == 512 and given.safe_embed_dim == expected["safe_embed_dim"]
    text = describe(arch, ["--encoder-embed-dim", str(width)], vocab=1000)
    assert f"--sandwich-dim {expected['sandwich_dim']}" in text and "parameters at a vocabulary" in text


def test_narrower_presets_of_every_family_build_and_shrink():
    """Every preset at a quarter of its width has fewer parameters than at its own width (no
    derived width stays at the paper's size), and builds."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    from slim_fairseq.arch_help import parameter_count, preset_values

    for arch in ("anthe_base", "subformer_base", "sandwich_base", "subformer_lm_wiki103_83m",
                 "anthe_lm_gpt2_small", "stlm_tied", "stlm_ffn_lora_all_wide", "skipless_lm_mistral_7b"):
        lm = arch.startswith(("stlm", "skipless", "subformer_lm", "anthe_lm"))
        side = "decoder" if lm else "encoder"
        full = preset_values(arch, [])
        width = getattr(full, f"{side}_embed_dim")
        small = preset_values(arch, [f"--{side}-embed-dim", str(width // 4)])
        vocab = 267_744 if getattr(full, "adaptive_input", False) else 1000
        big_count, small_count = parameter_count(arch, full, vocab), parameter_count(arch, small, vocab)
        ratio = small_count / big_count
        assert ratio < 0.2, (arch, big_count, small_count)
        assert ARCH_MODEL_REGISTRY[arch]


def test_safe_decoder_steps_equal_its_full_pass_in_float64():
    """Step by step, the decoder's SAFE embedding gives its full pass to float64 rounding: one
    softmax in the model's dtype both ways (fairseq's attention runs a step's softmax in
    float32, 1e-7 off in float64, which the combination test's float64 re-check took for a bug
    once a skipless GLU stack amplified it)."""
    from slim_fairseq.modules.safe import SAFEInputEmbedding
    torch.manual_seed(0)
    table = nn.Embedding(50, 16, padding_idx=1)
    embedding = SAFEInputEmbedding(table, 32, causal=True, max_positions=64).double().eval()
    tokens = torch.randint(2, 50, (2, 7))
    with torch.no_grad():
        full = embedding(tokens)
        state = {}
        steps = torch.cat([embedding(tokens[:, :t + 1], incremental_state=state)
                           for t in range(tokens.size(1))], dim=1)
    assert (full - steps).abs().max().item() < 1e-12
