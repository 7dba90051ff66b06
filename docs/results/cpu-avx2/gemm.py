"""One decode-sized GEMM (64 tokens x SmolLM2's 576-wide projection) per dtype, the torch of the CPU stack."""
import time

import torch

a, b = torch.randn(576, 576), torch.randn(64, 576)
print(torch.__version__, "threads", torch.get_num_threads(), "capability", torch.backends.cpu.get_cpu_capability())
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    x, y = a.to(dtype), b.to(dtype)
    y @ x
    began, n = time.perf_counter(), 20
    for _ in range(n):
        y @ x
    print(dtype, f"{2 * 64 * 576 * 576 * n / (time.perf_counter() - began) / 1e9:.2f} GFLOP/s")
