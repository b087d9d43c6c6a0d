"""The mutation check: realistic one-line bugs in the techniques' maths, each applied to a scratch
copy of the repository, and the fast tests that must fail on it (docs/DESIGN.md, "Tests of the
maths"). A test suite that passes with a sign flipped, a scale dropped or an axis swapped does not
test the maths; this finds out which bugs it would let through.

:data:`MUTATIONS` lists the bugs: the file, the exact text it replaces (found exactly once, or the
mutation is an error: the list cannot go stale without saying so), the new text, and the tests
that must catch it. :func:`check` copies the repository once (tracked and untracked files git
does not ignore; ``build/`` linked, for the tests' data), runs every named test on the unchanged
copy (all must pass), then applies each mutation alone, runs its tests, and restores the file.
``scripts/mutation_check.py`` is the command line.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

MODULES = "slim_fairseq/modules/"


@dataclass(frozen=True)
class Mutation:
    """One bug: ``old`` (exact text, once in ``path``) becomes ``new``; ``tests`` (pytest node
    ids, relative to the repository) must fail on it."""
    name: str
    technique: str
    kind: str
    path: str
    old: str
    new: str
    tests: tuple


def _m(name, technique, kind, path, old, new, *tests):
    return Mutation(name, technique, kind, path if "/" in path else MODULES + path, old, new,
                    tuple(tests))


REF = "tests/test_references.py::"
REACH = "tests/test_option_reach.py::"
EDGES = "tests/test_export_edges.py::"

MUTATIONS = (
    # RoPE (arXiv:2104.09864)
    _m("rope-sign", "RoPE", "sign", "rope.py",
       "sign = torch.cat((-torch.ones(half, dtype=work), torch.ones(half, dtype=work)))",
       "sign = torch.cat((torch.ones(half, dtype=work), -torch.ones(half, dtype=work)))",
       REF + "test_rope_rotates_each_channel_pair_by_its_angle"),
    _m("rope-frequencies", "RoPE", "off-by-one", "rope.py",
       "torch.arange(0, self.head_dim, 2, dtype=work)",
       "torch.arange(1, self.head_dim + 1, 2, dtype=work)",
       REF + "test_rope_rotates_each_channel_pair_by_its_angle"),
    _m("rope-offset", "RoPE", "dropped term", "rope.py",
       "return cos[offset: offset + seq_len], signed_sin[offset: offset + seq_len]",
       "return cos[:seq_len], signed_sin[:seq_len]",
       REF + "test_each_decoding_step_is_its_row_of_the_reference"),
    _m("rope-queries-only", "RoPE", "dropped term", "attention.py",
       "q, k = rope.rotate(q, *rows), rope.rotate(k, *rows)",
       "q, k = rope.rotate(q, *rows), k",
       REF + "test_grouped_query_attention_with_rope"),
    _m("rope-one-op-more", "RoPE", "one kernel more (same values)", "rope.py",
       "return torch.addcmul(x * cos, x.roll(self.head_dim // 2, dims=-1), signed_sin)",
       "return x * cos + x.roll(self.head_dim // 2, dims=-1) * signed_sin",
       "tests/test_op_counts.py::test_ops_per_step"),
    # RMSNorm (arXiv:1910.07467)
    _m("rmsnorm-gain", "RMSNorm", "dropped term", "rmsnorm.py",
       "return F.rms_norm(x, (self.dim,), self.weight, self.eps)",
       "return F.rms_norm(x, (self.dim,), None, self.eps)",
       REF + "test_rmsnorm", REF + "test_stlm_model_with_tying_and_lora"),
    _m("rmsnorm-eps", "RMSNorm", "dropped term", "rmsnorm.py",
       "return F.rms_norm(x, (self.dim,), self.weight, self.eps)",
       "return F.rms_norm(x, (self.dim,), self.weight)",
       REF + "test_rmsnorm"),
    # GLU feed-forward (arXiv:2002.05202; Anthe)
    _m("glu-gate-swapped", "GLU", "wrong operand", "glu_function.py",
       "return act(w1(x)) * w3(x)", "return act(w3(x)) * w1(x)",
       REF + "test_glu_feed_forward"),
    _m("glu-stacked-halves", "GLU", "wrong axis", "glu.py",
       "h1, h3 = F.linear(x, weight, bias).chunk(2, dim=-1)",
       "h3, h1 = F.linear(x, weight, bias).chunk(2, dim=-1)",
       REF + "test_glu_feed_forward"),
    _m("glu-silu-as-sigmoid", "GLU", "wrong function", "glu_function.py",
       'GLU_ACTIVATIONS = {"silu": F.silu,', 'GLU_ACTIVATIONS = {"silu": F.sigmoid,',
       REF + "test_glu_feed_forward"),
    _m("glu-hidden-width", "GLU", "off-by-one", "glu.py",
       "else (2 * ffn_dim) // 3", "else (2 * ffn_dim + 2) // 3",
       "tests/test_anthe_modules.py::test_glu_projection_formula_and_width"),
    # grouped-query attention (arXiv:2305.13245)
    _m("attention-scale", "GQA", "scale", "attention.py",
       "self.scaling = self.head_dim ** -0.5", "self.scaling = self.embed_dim ** -0.5",
       REF + "test_grouped_query_attention_with_rope"),
    _m("gqa-head-groups", "GQA", "wrong axis", "attention.py",
       "attn = attn.view(*grouped, head_dim).permute(4, 0, 3, 1, 2, 5)",
       "attn = attn.view(*grouped, head_dim).permute(4, 0, 3, 2, 1, 5)",
       REF + "test_grouped_query_attention_with_rope"),
    _m("padding-mask-inverted", "attention", "sign", "attention.py",
       "mask = ~pads if attn_mask is None", "mask = pads if attn_mask is None",
       REF + "test_the_six_gates"),
    _m("attention-stacked-order", "attention", "wrong operand", "attention.py",
       "return self.q_proj(query), out[0], out[1]", "return self.q_proj(query), out[1], out[0]",
       "tests/test_lean_attention.py::test_stacked_projections_give_the_losses_and_gradients_of_three"),
    # LoRA (arXiv:2106.09685) and STLM tying (arXiv:2405.14159)
    _m("lora-scaling-dropped", "LoRA", "scale", "lora.py",
       "return base + self.scaling * update", "return base + update",
       REF + "test_lora_scales_its_update_by_alpha_over_r"),
    _m("lora-scaling-inverted", "LoRA", "scale", "lora.py",
       "self.scaling = self.alpha / rank", "self.scaling = rank / self.alpha",
       REF + "test_stlm_model_with_tying_and_lora"),
    _m("ffn-tying-range", "FFN tying", "off-by-one", "weight_tying.py",
       "return list(range(1 + k, num_layers - k))", "return list(range(1 + k, num_layers - k - 1))",
       REF + "test_stlm_model_with_tying_and_lora"),
    _m("projection-tying-owner", "projection tying", "off-by-one", "weight_tying.py",
       "owner_proj = attn_out_proj(layers[proj_range[0]])",
       "owner_proj = attn_out_proj(layers[0])",
       REF + "test_stlm_model_with_tying_and_lora"),
    # gated pre-attention (Anthe)
    _m("gate-matrix", "gates", "wrong operand", "gate_function.py",
       "gate_values = torch.sigmoid(project(source, inputs[source]))",
       "gate_values = torch.sigmoid(project(target, inputs[source]))",
       REF + "test_the_six_gates"),
    _m("gate-dropped-in-training", "gates", "dropped term", "gated_attention.py",
       "return F.linear(x * gate, w.t(), bias)", "return F.linear(x, w.t(), bias)",
       REF + "test_the_six_gates"),
    # H-SoftPOS (Anthe)
    _m("softpos-axis", "H-SoftPOS", "wrong axis", "hsoftpos_function.py",
       "torch.softmax(x, dim=-1) @ weight", "torch.softmax(x, dim=-2) @ weight",
       REF + "test_hsoftpos"),
    _m("hsoftpos-dilation", "H-SoftPOS", "off-by-one", "hsoftpos_function.py",
       "return [2 ** (i - 2) for", "return [2 ** (i - 1) for",
       REF + "test_hsoftpos"),
    _m("causal-conv-reach", "H-SoftPOS", "off-by-one", "hsoftpos_function.py",
       "reach = (KERNEL_SIZE - 1) * dilation", "reach = KERNEL_SIZE * dilation",
       REF + "test_hsoftpos"),
    _m("hsoftpos-scale", "H-SoftPOS", "scale", "hsoftpos.py",
       "self.embed_scale = math.sqrt(self.d_emb) if scale", "self.embed_scale = math.sqrt(model_dim) if scale",
       REF + "test_hsoftpos"),
    # Tensor Chain (Anthe)
    _m("chain-weight-layout", "Tensor Chain", "wrong axis", "tc_contraction.py",
       "return product.view(a1, c1, a2, c2).transpose(1, 2).reshape(a1 * a2, c1 * c2)",
       "return product.view(a1, c1, a2, c2).reshape(a1 * a2, c1 * c2)",
       REF + "test_tensor_chain_linear_is_x_times_w_of_its_cores"),
    _m("chain-contraction-axis", "Tensor Chain", "wrong axis", "tc_contraction.py",
       "u = torch.matmul(x2d.reshape(m, a1, a2).transpose(1, 2),",
       "u = torch.matmul(x2d.reshape(m, a2, a1),",
       REF + "test_tensor_chain_linear_is_x_times_w_of_its_cores"),
    _m("chain-middle-bonds", "Tensor Chain", "wrong axis", "tc_contraction.py",
       'acc = torch.einsum("ACb,abec->AaCce", acc, core)',
       'acc = torch.einsum("ACb,aebc->AaCce", acc, core)',
       REF + "test_tensor_chain_linear_is_x_times_w_of_its_cores"),
    _m("chain-embedding-digits", "Tensor Chain", "wrong axis", "tensor_chain.py",
       "for a in reversed(self.in_factors):", "for a in self.in_factors:",
       REF + "test_tensor_chain_embedding_rows"),
    # SAFE (Subformer, arXiv:2101.00234)
    _m("safe-scale", "SAFE", "scale", "safe.py",
       "self.embed_scale = math.sqrt(token_dim) if scale", "self.embed_scale = math.sqrt(model_dim) if scale",
       REF + "test_safe_input_embedding"),
    _m("safe-residual", "SAFE", "dropped term", "safe_function.py",
       "x = residual + dropout(attend(x))", "x = dropout(attend(x))",
       REF + "test_safe_input_embedding"),
    _m("safe-relu", "SAFE", "dropped term", "safe_function.py",
       "return output_norm(dropout(fc2(F.relu(fc1(x)))))",
       "return output_norm(dropout(fc2(fc1(x))))", REF + "test_safe_input_embedding"),
    # sandwich sharing (Subformer)
    _m("sandwich-projection-norm", "sandwich", "dropped term", "sandwich.py",
       "return self.layer_norm(self.dropout_module(self.linear(x)))",
       "return self.dropout_module(self.linear(x))",
       REF + "test_sandwich_projections_and_cross_attention"),
    _m("sandwich-cross-norm", "sandwich", "dropped term", "sandwich.py",
       "query = self.to_model_norm(self.to_model(query))", "query = self.to_model(query)",
       REF + "test_sandwich_projections_and_cross_attention"),
    _m("sandwich-shared-norms", "sandwich", "wrong sharing", "sandwich.py",
       "return _is_norm(module)", "return False",
       "tests/test_subformer.py::test_middle_layers_share_one_set_of_tensors_with_own_layer_norms"),
    # skipless shaped attention (arXiv:2311.01906)
    _m("shaped-uniform-not-causal", "shaped attention", "wrong axis", "shaped_attention.py",
       "mean = v.cumsum(dim=2) / counts", "mean = v.cumsum(dim=2) / k_len",
       REF + "test_skipless_model"),
    _m("shaped-uniform-sign", "shaped attention", "sign", "shaped_attention.py",
       "out = torch.addcmul(out, gamma.view(per_head), mean, value=-1)",
       "out = torch.addcmul(out, gamma.view(per_head), mean, value=1)",
       REF + "test_skipless_model"),
    _m("shaped-identity-position", "shaped attention", "off-by-one", "shaped_attention.py",
       "current = v[:, :, k_len - q_len:]\n", "current = v[:, :, :q_len]\n",
       REF + "test_skipless_model"),
    _m("shaped-padded-uniform", "shaped attention", "wrong axis", "shaped_attention.py",
       "uniform = visible / visible.sum(dim=-1, keepdim=True)",
       "uniform = visible / visible.sum(dim=-2, keepdim=True)",
       REF + "test_shaped_attention_with_padding"),
    # exact weight removal (arXiv:2404.12362)
    _m("removal-inverse-transposed", "Q/P removal", "wrong axis", "slim_fairseq/weight_removal.py",
       'mat = _row(sd, f"{attn}{name}_proj.weight")\n            reduced = torch.linalg.solve(dmat, mat)',
       'mat = _row(sd, f"{attn}{name}_proj.weight")\n            reduced = torch.linalg.solve(dmat.t(), mat)',
       REF + "test_weight_removal_follows_the_table_of_the_paper"),
    _m("removal-embedding-bias-scale", "Q/P removal", "scale", "slim_fairseq/weight_removal.py",
       "new[embed_key] = embedding @ dmat + b_d / scale", "new[embed_key] = embedding @ dmat + b_d",
       REF + "test_weight_removal_follows_the_table_of_the_paper"),
    _m("removal-p-bias-dropped", "Q/P removal", "dropped term", "slim_fairseq/weight_removal.py",
       'mat.shape[1]) + b_p @ mat)', 'mat.shape[1]))',
       REF + "test_weight_removal_follows_the_table_of_the_paper"),
    # an option's value on its way to the module (docs/DESIGN.md, "From a flag to the code")
    _m("lora-alpha-not-passed", "option plumbing", "value not passed",
       "slim_fairseq/models/slim_options.py",
       "lora_alpha=float(alpha) if alpha is not None else float(rank))",
       "lora_alpha=float(rank))",
       REACH + "test_every_option_reaches_its_module"),
    _m("rms-norm-eps-not-passed", "option plumbing", "value not passed",
       "slim_fairseq/models/slim_options.py",
       "return NormSpec(kind=self.norm, eps=float(self.rms_norm_eps), export=bool(export))",
       "return NormSpec(kind=self.norm, export=bool(export))",
       REACH + "test_every_option_reaches_its_module"),
    # the export to transformers (docs/DESIGN.md, "Export to transformers")
    _m("export-tied-scaled-head", "export", "wrong for one combination",
       "slim_fairseq/export_hf/llama.py",
       'out["lm_head.weight"] = output if (scaled or not tied) else out["model.embed_tokens.weight"]',
       'out["lm_head.weight"] = out["model.embed_tokens.weight"] if tied else output',
       EDGES + "test_every_exportable_combination_scores_alike_to_the_last_position"),
    _m("export-positions-row-short", "export", "off-by-one (last position)",
       "slim_fairseq/export_hf/opt.py",
       "positions = reader.take(embedding.positions_table)",
       "positions = reader.take(embedding.positions_table)[:-1]",
       EDGES + "test_each_layout_fills_its_full_position_range"),
    _m("export-sinusoid-rows-short", "export", "off-by-one (last position)",
       "slim_fairseq/export_hf/opt.py",
       "rows = decoder.max_positions() + embedding.padding_idx + 1",
       "rows = decoder.max_positions() + embedding.padding_idx",
       EDGES + "test_every_exportable_combination_scores_alike_to_the_last_position"),
    _m("export-custom-future-mask", "export", "off-by-one",
       "slim_fairseq/export_hf/remote/modeling_slim.py",
       "device=q.device).triu(past + 1)", "device=q.device).triu(past)",
       "tests/test_export_custom.py::test_custom_code_scores_and_decodes_as_fairseq_without_fairseq"),
    _m("self-check-mean-gap", "export", "weaker check", "slim_fairseq/export_hf/check.py",
       "return (a - b).abs()[keep].max().item(), int(keep.sum())",
       "return (a - b).abs()[keep].mean().item(), int(keep.sum())",
       EDGES + "test_self_check_refuses_an_export_wrong_at_one_position"),
)


@dataclass
class Result:
    """What one mutation did: ``status`` caught (a named test failed), missed (all passed) or
    error (the old text is not found exactly once, or the tests did not run)."""
    mutation: Mutation
    status: str
    detail: str = ""
    seconds: float = 0.0
    failed: list = field(default_factory=list)


def repository_files(repo):
    """Tracked files and untracked ones git does not ignore (paths relative to ``repo``)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         cwd=repo, capture_output=True, check=True).stdout
    return sorted(p for p in out.decode().split("\0") if p and os.path.isfile(os.path.join(repo, p)))


def scratch_copy(repo, dest, linked=("build",)):
    """Copy the repository's files into ``dest``; the ignored folders ``linked`` (the tests'
    data cache) are linked, not copied."""
    for path in repository_files(repo):
        target = os.path.join(dest, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(repo, path), target)
    for name in linked:
        if os.path.isdir(os.path.join(repo, name)) and not os.path.exists(os.path.join(dest, name)):
            os.symlink(os.path.join(os.path.abspath(repo), name), os.path.join(dest, name))
    return dest


def apply(root, mutation):
    """Write ``mutation`` into the copy at ``root``; returns the file's original text."""
    path = os.path.join(root, mutation.path)
    if not os.path.isfile(path):
        raise RuntimeError(f"{mutation.path}: no such file")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    count = text.count(mutation.old)
    if count != 1:
        raise RuntimeError(f"{mutation.path}: the text to replace is found {count} times, not "
                           f"once: {mutation.old.strip()!r}")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(mutation.old, mutation.new))
    return text


def restore(root, mutation, text):
    with open(os.path.join(root, mutation.path), "w", encoding="utf-8") as f:
        f.write(text)


def _env(root):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_tests(root, tests, timeout=900):
    """Run the pytest node ids ``tests`` in the copy ``root``, stopping at the first failure:
    (pytest's exit status, the names of the failed tests, the last line of its output)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:warnings",
           "-o", "addopts=", *tests]
    try:
        proc = subprocess.run(cmd, cwd=root, env=_env(root), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, [], f"timed out after {timeout} s"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    failed = [line.split()[1] for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return proc.returncode, failed, lines[-1] if lines else ""


def imports_the_copy(root, package="slim_fairseq"):
    """Whether Python started in the copy imports ``package`` from it (not from the checkout
    the virtual environment's editable install points to)."""
    proc = subprocess.run([sys.executable, "-c", f"import {package}; print({package}.__file__)"],
                          cwd=root, env=_env(root), capture_output=True, text=True, timeout=300)
    return proc.returncode == 0 and os.path.realpath(proc.stdout.strip()).startswith(
        os.path.realpath(root) + os.sep)


def check(repo, mutations=MUTATIONS, runner=run_tests, log=print, keep=False,
          package="slim_fairseq"):
    """Apply each of ``mutations`` alone to one scratch copy of ``repo`` and run its tests
    (after all of them pass on the unchanged copy; Python started in the copy must import
    ``package`` from it). Returns a list of :class:`Result`."""
    root = tempfile.mkdtemp(prefix="slim-mutation-")
    try:
        scratch_copy(repo, root)
        if keep:
            log(f"scratch copy: {root}")
        if not imports_the_copy(root, package):
            raise RuntimeError(f"{root}: Python started there does not import the copy's "
                               f"{package}; allowed: a checkout whose packages are importable "
                               "from its root")
        broken = {}
        for problem in stale(root, mutations):
            name, _, why = problem.partition(": ")
            broken.setdefault(name, why)
        runnable = [m for m in mutations if m.name not in broken]
        every = sorted({test for m in runnable for test in m.tests})
        code, failed, last = runner(root, every) if every else (0, [], "")
        if code != 0:
            raise RuntimeError(f"the named tests fail on the unchanged copy ({last}): "
                               f"{', '.join(failed) or 'no test ran'}; allowed: a checkout whose "
                               "tests pass")
        results = []
        for mutation in mutations:
            if mutation.name in broken:
                results.append(Result(mutation, "error", broken[mutation.name]))
                log(f"error   {mutation.name}: {broken[mutation.name]}")
                continue
            start = time.monotonic()
            text = apply(root, mutation)
            try:
                code, failed, last = runner(root, list(mutation.tests))
            finally:
                restore(root, mutation, text)
            if code == 1 or code is None:  # tests failed (or hung on the bug)
                status, detail = "caught", ", ".join(failed) or last
            elif code == 0:
                status, detail = "missed", last
            else:  # 2-5: interrupted, usage, no such test, nothing collected
                status, detail = "error", f"pytest exit status {code}: {last}"
            results.append(Result(mutation, status, detail, time.monotonic() - start, failed))
            log(f"{status:7} {mutation.name} ({results[-1].seconds:.0f} s)")
        return results
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def markdown(results, command):
    """The table of ``results`` as Markdown, with the command that produced it."""
    caught = sum(r.status == "caught" for r in results)
    techniques = sorted({r.mutation.technique for r in results})
    lines = [f"{caught} of {len(results)} mutations caught, covering {len(techniques)} "
             f"techniques ({', '.join(techniques)}).", "", f"Command: `{command}`", "",
             "| mutation | technique | kind | file | the bug | tests | result |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        m = r.mutation
        bug = f"`{_cell(m.old)}` → `{_cell(m.new)}`"
        tests = "<br>".join(f"`{t.split('::', 1)[-1]}`" if "::" in t else f"`{t}`" for t in m.tests)
        if r.status == "caught" and r.failed:
            outcome = f"caught: `{r.failed[0].split('::', 1)[-1]}`"
        else:
            outcome = r.status if r.status != "error" else f"error: {_cell(r.detail)}"
        lines.append(f"| {m.name} | {m.technique} | {m.kind} | `{m.path}` | {bug} | {tests} | "
                     f"{outcome} |")
    return "\n".join(lines)


def stale(root, mutations=MUTATIONS):
    """The mutations of ``mutations`` that cannot be applied to the tree at ``root`` (text not
    found exactly once) or name a test function that is not in its file: ["name: why"]."""
    import re
    problems = []
    for m in mutations:
        path = os.path.join(root, m.path)
        text = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
        if text.count(m.old) != 1:
            problems.append(f"{m.name}: {m.path} holds the text {text.count(m.old)} times")
        for test in m.tests:
            file, _, name = test.partition("::")
            source = os.path.join(root, file)
            body = open(source, encoding="utf-8").read() if os.path.isfile(source) else ""
            if not body or name and not re.search(rf"^def {re.escape(name)}\(", body, re.M):
                problems.append(f"{m.name}: no test {test}")
    return problems


def _cell(text):
    return " ".join(text.split()).replace("|", "\\|")
