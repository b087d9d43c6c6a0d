"""The one idiom of the architecture presets (``archs_*.py``): a preset only fills options the
command line left unset (:func:`fill`), then calls its model's base preset. Dimensions a preset
derives from its width (FFN, heads, the Subformer's middle and SAFE widths, ...) follow a width
given on the command line (:func:`width_of`, :func:`scaled`), so overriding
``--encoder-embed-dim``/``--decoder-embed-dim`` gives a proportionally smaller (or larger)
model; ``slim-fairseq-help ARCH --decoder-embed-dim N`` shows what it yields.

Heads: :func:`heads_for` (width // 64, lowered until it divides) where the paper's heads are 64
channels wide; :func:`scaled_heads` where the paper fixes a head count at its own width (the
STLM block's 16 heads at 528). docs/DESIGN.md, "Presets", says why both stay."""
from slim_fairseq.modules.attention import heads_for  # noqa: F401  (the presets' head rule)


def fill(args, **values):
    """Set every option of ``values`` that the command line (or a more specific preset) left
    unset (absent or None)."""
    for name, value in values.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def width_of(args, own, sides=("encoder", "decoder")):
    """The model width: the first of ``--{side}-embed-dim`` given, else the preset's ``own``."""
    for side in sides:
        value = getattr(args, f"{side}_embed_dim", None)
        if value:
            return value
    return own


def scaled(value, width, own):
    """``value`` of the preset at its width ``own``, at width ``width`` (rounded, at least 1)."""
    return max(1, round(value * width / own))


def scaled_heads(heads, width, own):
    """The preset's ``heads`` at its width ``own``, at width ``width``: as many per channel,
    lowered until they divide the width (at least 1)."""
    count = scaled(heads, width, own)
    while width % count:
        count -= 1
    return count


def scaled_kv_heads(kv_heads, heads, own_heads):
    """Key/value heads in the preset's proportion to the query heads (dividing them)."""
    count = max(1, kv_heads * heads // own_heads)
    while heads % count:
        count -= 1
    return count
