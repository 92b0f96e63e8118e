import torch, sys
from graphrt.models import ops
from graphrt.models.skinny import skinny_linear
from cuda.bindings import runtime as rt

x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) * 0.02
norm = torch.ones(2048, device="cuda", dtype=torch.bfloat16)
for _ in range(2):
    y = ops.rms_norm(skinny_linear(skinny_linear(x, w), w), norm, 1e-6)
try:
    g = torch.cuda.CUDAGraph(keep_graph=True)
except TypeError as e:
    print("no keep_graph", e)
    g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = ops.rms_norm(skinny_linear(skinny_linear(x, w), w), norm, 1e-6)
h = g.raw_cuda_graph()
print("raw", h)
graph = rt.cudaGraph_t(init_value=h)
for fn in ("cudaGraphGetEdges_v2", "cudaGraphGetEdges"):
    f = getattr(rt, fn, None)
    if f is None:
        print("missing", fn)
        continue
    try:
        r = f(graph, 0) if fn.endswith("v2") else f(graph, 0)
        print(fn, "count", r)
        n = r[-1]
        r = f(graph, n)
        print(fn, r)
        if fn.endswith("v2"):
            for d in r[3]:
                print(" edge", d.type, d.from_port, d.to_port)
    except Exception as e:
        print(fn, "err", repr(e))
from cuda.bindings import driver as drv

err, nodes, n = rt.cudaGraphGetNodes(graph, 0)
err, nodes, n = rt.cudaGraphGetNodes(graph, n)
for node in nodes:
    err, t = rt.cudaGraphNodeGetType(node)
    line = [t]
    if t == rt.cudaGraphNodeType.cudaGraphNodeTypeKernel:
        dn = drv.CUgraphNode(init_value=int(node))
        try:
            e, p = drv.cuGraphKernelNodeGetParams(dn)
            line += [e, "func", p.func, "kern", getattr(p, "kern", None)]
            e2, name = drv.cuFuncGetName(p.func)
            line += [e2, name[:80] if name else name]
        except Exception as ex:
            line.append(repr(ex)[:200])
    print("node", line)
