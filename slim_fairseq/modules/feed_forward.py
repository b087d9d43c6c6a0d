"""The feed-forward a block owns, one module built from its
:class:`~slim_fairseq.specs.FeedForwardSpec` (docs/DESIGN.md, "Layers" and "Adding a
technique"): the dense ``fc2(act(fc1 x))`` (fairseq's linears, or Tensor Chains, with or
without biases) and the GLU ``w2(act(w1 x) * w3 x)`` (:mod:`~slim_fairseq.modules.glu`).

A feed-forward module is called with the block's input ``x`` and returns its output; it computes
:meth:`FeedForward.hidden` (the activations after the activation dropout) then
:meth:`FeedForward.output` (fairseq's NormFormer option ``--scale-fc`` normalises between the
two). Its parts are named as fairseq's layer names them (``fc1``, ``fc2``), and the block holds
them as its own children too (:class:`FeedForwardHolder`), so that a checkpoint's parameter
names are fairseq's (``layers.N.fc1.weight``) whatever the variant, and tying and LoRA, which
replace parts of a layer, replace the parts the feed-forward runs.
"""
import torch.nn as nn
import torch.nn.functional as F
from fairseq.modules.quant_noise import quant_noise as fairseq_quant_noise

from slim_fairseq.modules.activations import activation_function
from slim_fairseq.modules.glu import GLUProjection, build_linear, glu_hidden_dim
from slim_fairseq.modules.skipless import init_skipless_feed_forward
from slim_fairseq.modules.tc_autograd import rebuildable_relu
from slim_fairseq.modules.tensor_chain import TensorChainLinear
from slim_fairseq.specs import FeedForwardSpec


class FeedForward(nn.Module):
    """The dense feed-forward ``fc2(dropout(act(fc1 x)))`` of width ``dim`` and hidden width
    ``hidden_dim``: fairseq's two linears (with fairseq's quant noise ``quant_noise`` = (p,
    block size)), Tensor-Chain linears (``spec.chain``) or linears without biases.

    Every feed-forward variant takes these arguments: its spec, the widths, and ``dropout``, the
    block's activation dropout (a module, applied to the hidden activations)."""

    def __init__(self, spec: FeedForwardSpec, dim, hidden_dim, dropout, quant_noise=(0.0, 8)):
        super().__init__()
        self.spec = spec
        self.activation_fn = activation_function(spec.activation)
        self.activation_dropout_module = dropout
        self.fc1 = self.build_linear(dim, hidden_dim, quant_noise)
        self.fc2 = self.build_linear(hidden_dim, dim, quant_noise)
        if (self.activation_fn is F.relu and isinstance(self.fc1, TensorChainLinear)
                and isinstance(self.fc2, TensorChainLinear)):
            # two ReLU-joined chains keep fc1's input for backward, not the hidden layer: fc1
            # marks its output, the ReLU keeps a one-byte mask, fc2 rebuilds its input
            self.fc1.rebuildable_output = True
            self.activation_fn = rebuildable_relu

    def build_linear(self, in_features, out_features, quant_noise):
        spec = self.spec
        if spec.chain.ratio or not spec.bias:
            return build_linear(in_features, out_features, spec.chain, bias=spec.bias)
        return fairseq_quant_noise(nn.Linear(in_features, out_features), *quant_noise)

    def hidden(self, x):
        return self.activation_dropout_module(self.activation_fn(self.fc1(x)))

    def output(self, h):
        return self.fc2(h)

    def forward(self, x):
        return self.output(self.hidden(x))

    def reset_skipless_parameters(self):
        """The signal-preserving init of a skipless block (:mod:`~slim_fairseq.modules.skipless`)."""
        init_skipless_feed_forward(self.fc1, self.fc2, self.spec.activation)


class GLUFeedForward(FeedForward):
    """The GLU feed-forward ``fc2(dropout(act(w1 x) * w3 x))`` (Anthe, arXiv:2305.10991;
    docs/TECHNIQUES.md#glu-feed-forward): ``fc1`` is the :class:`GLUProjection` holding w1 and
    w3, whose hidden width is ``spec.variant.glu_hidden``'s rule of ``hidden_dim``; ``fc2``
    rebuilds its input for backward (a dense one is a ``RebuildingLinear``)."""

    def __init__(self, spec: FeedForwardSpec, dim, hidden_dim, dropout, quant_noise=(0.0, 8)):
        nn.Module.__init__(self)
        self.spec = spec
        hidden_dim = glu_hidden_dim(hidden_dim, spec.variant.glu_hidden)
        self.activation_dropout_module = dropout
        self.fc1 = GLUProjection(dim, hidden_dim, activation=spec.activation, chain=spec.chain,
                                 bias=spec.bias)
        self.fc2 = build_linear(hidden_dim, dim, spec.chain, bias=spec.bias, rebuild_input=True)

    @property
    def activation_fn(self):
        """The gate's activation (``fc1`` applies it)."""
        return activation_function(self.fc1.activation)

    def hidden(self, x):
        return self.activation_dropout_module(self.fc1(x))


class Unowned:
    """Holds a module that an ``nn.Module`` runs but does not own: an attribute holding this
    (no Module itself) is no child, so nothing of the module is named twice."""

    def __init__(self, module):
        self.module = module


class FeedForwardHolder:
    """A block that holds one feed-forward (:meth:`mount_feed_forward`): the feed-forward's
    parts (``fc1``, ``fc2``, its dropout) are children of the block under their own names, so
    that a checkpoint's parameter names are fairseq's (``layers.N.fc1.weight``), and stay the
    feed-forward's own children too; the feed-forward itself is no child of the block
    (:attr:`feed_forward`). A part replaced on the block (tying, LoRA, a dense export) is
    replaced on the feed-forward as well, so the feed-forward runs the block's parts."""

    _feed_forward = None

    def mount_feed_forward(self, feed_forward):
        for name, part in feed_forward.named_children():
            self.add_module(name, part)
        self._feed_forward = Unowned(feed_forward)
        return feed_forward

    @property
    def feed_forward(self):
        """The block's feed-forward module (called with the block's input)."""
        return self._feed_forward.module

    def _part(self, name):
        """The feed-forward of which ``name`` is a part, or None."""
        mounted = self._feed_forward
        if mounted is not None and name in dict(mounted.module.named_children()):
            return mounted.module
        return None

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        owner = self._part(name)
        if owner is not None:
            setattr(owner, name, value)

    def __delattr__(self, name):
        super().__delattr__(name)
        owner = self._part(name)
        if owner is not None:
            delattr(owner, name)
