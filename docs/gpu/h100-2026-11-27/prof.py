"""Why does slim_lm (stlm_tied --tie-ffn none) train/generate slower than fairseq's transformer_lm?"""
import sys, time, torch
from slim_fairseq_lab import contract, gpu_check
from torch.profiler import profile, ProfilerActivity
dev = "cuda" if torch.cuda.is_available() else "cpu"
data = gpu_check.prepare_data()
shape = ["--decoder-embed-dim", "512", "--decoder-ffn-embed-dim", "2048", "--decoder-layers", "6",
         "--decoder-attention-heads", "8", "--decoder-input-dim", "512", "--decoder-output-dim", "512"]
task_argv = [data[1], "--task", "language_modeling", "--sample-break-mode", "none", "--tokens-per-sample", "256"]
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
for name, arch, extra in [("transformer_lm", "transformer_lm", []), ("slim_lm plain", "stlm_tied", ["--tie-ffn", "none"])]:
    args, task, model = contract.build(arch, shape + extra, task_argv)
    model = model.to(dev).train()
    x = torch.randint(4, 2000, (16, 256), device=dev)
    opt = torch.optim.Adam(model.parameters(), 1e-4)
    def step():
        with torch.autocast(dev, dtype=torch.float16 if dev == "cuda" else torch.bfloat16):
            out = model(x, src_lengths=None)[0]
            loss = out.float().logsumexp(-1).mean()
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    for _ in range(3): step()
    if dev == "cuda": torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5): step()
    if dev == "cuda": torch.cuda.synchronize()
    print(f"== {name}: train step {1000*(time.perf_counter()-t)/5:.2f} ms", flush=True)
    with profile(activities=acts) as p:
        step()
        if dev == "cuda": torch.cuda.synchronize()
    ev = p.key_averages()
    ncuda = sum(e.count for e in ev if e.device_type.name == "CUDA") if dev == "cuda" else 0
    nops = sum(e.count for e in ev if e.key.startswith("aten::"))
    print(f"   aten ops {nops}, cuda kernels {ncuda}")
    print(ev.table(sort_by="self_cuda_time_total" if dev == "cuda" else "self_cpu_time_total", row_limit=14, max_name_column_width=48))
    # generation: 12 incremental steps at batch 64, fp16 model
    m = model.half().eval() if dev == "cuda" else model.eval()
    with torch.no_grad():
        for rep in range(2):
            state = {}; toks = torch.full((64, 1), 2, device=dev)
            if dev == "cuda": torch.cuda.synchronize()
            t = time.perf_counter()
            for i in range(12):
                out = m.decoder(toks, incremental_state=state)[0]
                toks = torch.cat([toks, out[:, -1:].argmax(-1)], 1)
            if dev == "cuda": torch.cuda.synchronize()
        print(f"   generation b64 greedy: {1000*(time.perf_counter()-t)/12:.2f} ms/step", flush=True)
        with profile(activities=acts) as p:
            state = {}; toks = torch.full((64, 1), 2, device=dev)
            for i in range(4):
                out = m.decoder(toks, incremental_state=state)[0]
                toks = torch.cat([toks, out[:, -1:].argmax(-1)], 1)
        ev = p.key_averages()
        print(f"   gen 4 steps: aten ops {sum(e.count for e in ev if e.key.startswith('aten::'))}")
        print(ev.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=48))
