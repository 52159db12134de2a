"""Resolve Megatron-Bridge WorkloadBaseConfig presets (replace() chains / aliases) by AST, with line numbers."""
import ast, subprocess, functools
G = ["git", "--git-dir=/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo"]

@functools.lru_cache(None)
def show(rev, path):
    return subprocess.run(G + ["show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout

@functools.lru_cache(None)
def parse(rev, path):
    src = show(rev, path)
    tree = ast.parse(src)
    defs = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            v = node.value
            if isinstance(v, ast.Name):
                defs[name] = ("alias", v.id, {}, node.lineno)
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("replace", "WorkloadBaseConfig"):
                kws = {}
                for k in v.keywords:
                    try:
                        val = ast.literal_eval(k.value)
                    except Exception:
                        val = ast.get_source_segment(src, k.value)
                    kws[k.arg] = (val, k.value.lineno)
                if v.func.id == "replace":
                    defs[name] = ("replace", v.args[0].id, kws, node.lineno)
                else:
                    defs[name] = ("base", None, kws, node.lineno)
    return defs

@functools.lru_cache(None)
def defaults(rev):
    src = show(rev, "scripts/performance/utils/utils.py")
    tree = ast.parse(src)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "WorkloadBaseConfig":
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and st.value is not None:
                    try:
                        val = ast.literal_eval(st.value)
                    except Exception:
                        val = ast.get_source_segment(src, st.value)
                    out[st.target.id] = (val, st.lineno)
    return out

def resolve(rev, path, name):
    """{field: (value, 'path@rev:line', where)}; chain list."""
    defs = parse(rev, path)
    chain = []
    n = name
    while n is not None:
        kind, parent, kws, ln = defs[n]
        chain.append((n, kind, ln))
        n = parent
    out = {}
    for f, (val, ln) in defaults(rev).items():
        out[f] = (val, f"scripts/performance/utils/utils.py@{rev}:{ln}", "WorkloadBaseConfig default")
    for n, kind, ln in reversed(chain):
        for f, (val, fl) in defs[n][2].items():
            out[f] = (val, f"{path}@{rev}:{fl}", n)
    return out, chain

if __name__ == "__main__":
    import sys
    rev, path, name = sys.argv[1:4]
    out, chain = resolve(rev, path, name)
    print(" <- ".join(f"{n}({k}@{ln})" for n, k, ln in chain))
    for f in ("num_gpus","tensor_model_parallel_size","pipeline_model_parallel_size","virtual_pipeline_model_parallel_size","expert_model_parallel_size","micro_batch_size","global_batch_size","pp_layout","recompute_modules","recompute_num_layers","cpu_offloading_num_layers","moe_flex_dispatcher_backend","moe_a2a_overlap","cutedsl_fused_grouped_mlp","cuda_graph_impl","cuda_graph_scope"):
        if f in out:
            v, src, where = out[f]
            print(f"  {f} = {v!r}   [{where}; {src.split('@')[1]}]")
