"""The maths of gated pre-attention ``AgB`` (Anthe, arXiv:2305.10991;
docs/TECHNIQUES.md#gated-pre-attention): with W_A, W_B, W_C the pre-attention projections
(None: the identity, ``--no-patt``) and C the third of q, k, v,

    B_s = W_B(B * sigmoid(W_A A))      A_s = A      C_s = W_C C

Plain torch (no fairseq): the plugin's attention
(:class:`~slim_fairseq.modules.attention.SlimMultiheadAttention`) and the transformers code an
export writes both run this file.
"""
import torch


def gated(proj, x, gate):
    """``proj(x * gate)`` (None: the identity)."""
    return x * gate if proj is None else proj(x * gate)


def gated_inputs(gate, query, key, value, project, project_gated):
    """(Q_s, K_s, V_s) for ``gate`` ("none" or ``AgB``). ``project(name, x)``: W_name x (the
    identity for a missing projection); ``project_gated(name, x, g)``: W_name (x * g), e.g.
    :func:`gated` of its layer. ``key``/``value`` None: cached (static) keys and values."""
    if gate == "none":
        if key is None:
            return project("q", query), None, None
        return project("q", query), project("k", key), project("v", value)
    inputs = {"q": query, "k": key, "v": value}
    source, target = gate[0], gate[2]
    out = {}
    for name in ("q", "k", "v"):
        if inputs[name] is None:
            out[name] = None
        elif name == source:
            out[name] = inputs[name]
        elif name == target:
            gate_values = torch.sigmoid(project(source, inputs[source]))
            out[name] = project_gated(name, inputs[name], gate_values)
        else:
            out[name] = project(name, inputs[name])
    return out["q"], out["k"], out["v"]
