"""Where does anthe_base's incremental decoding differ from its full forward on CUDA fp32?"""
import sys, time, torch
from slim_fairseq_lab import contract, gpu_check

print("torch", torch.__version__, "allow_tf32", torch.backends.cuda.matmul.allow_tf32,
      "cudnn tf32", torch.backends.cudnn.allow_tf32, "prec", torch.get_float32_matmul_precision(), flush=True)
data = gpu_check.prepare_data()
cases = gpu_check.family_cases()
arch, lm, base = cases["Anthe"]
print("anthe overrides", base, flush=True)
T = ["--encoder-layers", "2"]
variants = [
    ("anthe_base", arch, base),
    ("anthe_base materialise", arch, base + ["--tc-forward", "materialise"]),
    ("anthe_base contract", arch, base + ["--tc-forward", "contract"]),
    ("anthe_base no hsoftpos", arch, base + ["--hsoftpos-levels", "0"]),
    ("anthe_base no tc", arch, base + ["--tc-ff", "0", "--tc-patt", "0"]),
    ("anthe_base no gates", arch, base + ["--self-attn-gate", "none", "--cross-attn-gate", "none"]),
]
st = cases["every technique"]
tiny = contract.tiny_overrides("slim_transformer")
for name, extra in [("plain", []), ("qgv+kgv", ["--self-attn-gate", "qgv", "--cross-attn-gate", "kgv"]),
                    ("glu", ["--ffn-glu"]), ("hsoftpos2", ["--hsoftpos-levels", "2"]),
                    ("tc ff .005", ["--tc-ff", "0.005"]), ("tc patt .07", ["--tc-patt", "0.07"]),
                    ("every technique", gpu_check.EVERY_TECHNIQUE)]:
    variants.append(("slim_transformer " + name, "slim_transformer", tiny + extra))

def steps_diff(model, device, dtype):
    model = contract.fresh_copy(model).to(device=device, dtype=dtype).eval()
    net_input, _ = contract.make_batch(TASK, lm, tgt_lens=(7, 7), seed=1, device=device)
    with torch.no_grad():
        full = contract.log_probs(model, net_input)
        steps = contract.incremental_log_probs(model, net_input, lm)
    return [round((s - full[:, t]).abs().max().item(), 9) for t, s in enumerate(steps)], full.abs().max().item()

for name, a, ov in variants:
    try:
        args, TASK, built = contract.build(a, ov, gpu_check.task_argv(lm, data))
        out = []
        for dev, dt in ([("cuda", torch.float32), ("cuda", torch.float64), ("cpu", torch.float32)] if torch.cuda.is_available() else [("cpu", torch.float32), ("cpu", torch.float64)]):
            d, m = steps_diff(built, dev, dt)
            out.append(f"{dev}/{str(dt)[6:]} max {max(d):.2e} steps {d[:3]} |lp|max {m:.1f}")
        print(f"{name}: " + " ; ".join(out), flush=True)
    except Exception as e:
        print(f"{name}: ERROR {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
