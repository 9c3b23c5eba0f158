# PyTorch matmul GFLOP/s at 2 threads, f32 and bf16, at 1,024^3 and the standard shape's products
# (4,096 tokens x d 384 / d_ff 1,536): best of 3 timings of a loop of products.
#   ~/.cache/ember/torch-venv/bin/python torch-matmul.py
import torch, time
torch.set_num_threads(2)
def rate(m,k,n,dt,reps=None):
    a=torch.randn(m,k).to(dt); b=torch.randn(k,n).to(dt)
    reps = reps or max(1,int(2e9/(2*m*k*n)))
    best=1e9
    for _ in range(3):
        t=time.perf_counter()
        for _ in range(reps): a@b
        best=min(best,(time.perf_counter()-t)/reps)
    return 2*m*k*n/best/1e9
for (m,k,n) in [(1024,1024,1024),(4096,384,1536),(4096,1536,384),(4096,384,384)]:
    print(m,k,n,"f32 %.1f"%rate(m,k,n,torch.float32), "bf16 %.1f"%rate(m,k,n,torch.bfloat16,reps=1))
