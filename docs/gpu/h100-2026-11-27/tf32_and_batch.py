"""Is the CUDA fp32 H-SoftPOS mismatch cuDNN's TF32? And does the LM gap close at a larger batch?"""
import sys, time, torch
from slim_fairseq_lab import contract, gpu_check
dev = "cuda" if torch.cuda.is_available() else "cpu"
data = gpu_check.prepare_data()
cases = gpu_check.family_cases()
arch, lm, base = cases["Anthe"]
tiny = contract.tiny_overrides("slim_transformer")
def worst(built, lm_):
    m = contract.fresh_copy(built).to(device=dev, dtype=torch.float32).eval()
    net_input, _ = contract.make_batch(TASK, lm_, tgt_lens=(7, 7), seed=1, device=dev)
    with torch.no_grad():
        full = contract.log_probs(m, net_input)
        steps = contract.incremental_log_probs(m, net_input, lm_)
    return max((s - full[:, t]).abs().max().item() for t, s in enumerate(steps))
for name, a, ov in [("anthe_base", arch, base), ("slim_transformer hsoftpos2", "slim_transformer", tiny + ["--hsoftpos-levels", "2"])]:
    args, TASK, built = contract.build(a, ov, gpu_check.task_argv(lm, data))
    out = []
    for tf32 in (True, False):
        torch.backends.cudnn.allow_tf32 = tf32
        out.append(f"cudnn.allow_tf32={tf32}: {worst(built, lm):.2e}")
    print(name, "; ".join(out), flush=True)
torch.backends.cudnn.allow_tf32 = True
shape = ["--decoder-embed-dim", "512", "--decoder-ffn-embed-dim", "2048", "--decoder-layers", "6",
         "--decoder-attention-heads", "8", "--decoder-input-dim", "512", "--decoder-output-dim", "512"]
task_argv = [data[1], "--task", "language_modeling", "--sample-break-mode", "none", "--tokens-per-sample", "512"]
for rows in (16, 64):
    res = {}
    for name, a, extra in [("transformer_lm", "transformer_lm", []), ("stlm_tied", "stlm_tied", [])]:
        args, task, model = contract.build(a, shape + extra, task_argv)
        model = model.to(dev).train(); opt = torch.optim.Adam(model.parameters(), 1e-4)
        x = torch.randint(4, 2000, (rows, 512), device=dev)
        def step():
            with torch.autocast(dev, dtype=torch.float16 if dev == "cuda" else torch.bfloat16):
                loss = model(x, src_lengths=None)[0].float().logsumexp(-1).mean()
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        for _ in range(3): step()
        if dev == "cuda": torch.cuda.synchronize()
        t = time.perf_counter(); n = 5 if dev == "cuda" else 1
        for _ in range(n): step()
        if dev == "cuda": torch.cuda.synchronize()
        res[name] = (time.perf_counter() - t) / n
        del model, opt
    print(f"tokens/step {rows*512}: transformer_lm {1000*res['transformer_lm']:.1f} ms, stlm_tied {1000*res['stlm_tied']:.1f} ms, speed ratio {res['transformer_lm']/res['stlm_tied']:.2f}", flush=True)
