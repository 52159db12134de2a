"""Launch commands for our runtime: torchrun lines, or a SLURM batch script.

Pure text: a `Plan` and where it is saved in, the commands out. The runtime is started as
`python -m runtime --plan PLAN` under torchrun, one process per GPU; torchrun's c10d rendezvous
assigns node ranks, so every node runs the same line.

Nothing a user typed reaches a line unchecked or unquoted: names and paths with control
characters are refused (planner.filecheck.check_name), the plan path and extra arguments are
shlex-quoted, the names in comment lines are printed escaped, the SLURM job name is reduced to
plain characters.
"""
from __future__ import annotations

import re
import shlex

from planner.errors import BadInput
from planner.plan import Plan
from planner.filecheck import MAX_PATH, check_name
from planner.rules import runner_problems

RDZV_PORT = 29500


def _check(plan: Plan, nnodes, gpus_per_node) -> int:
    p = plan.parallelism
    world = p.tp * p.pp * p.dp * p.cp
    for name, v in (("--nnodes", nnodes), ("GPUs per node", gpus_per_node)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise BadInput(f"{name} must be a positive integer, got {v!r}")
    if nnodes * gpus_per_node != world:
        if world % gpus_per_node == 0:
            fix = f"use --nnodes {world // gpus_per_node}"
        else:
            fix = (f"no whole number of {gpus_per_node}-GPU nodes gives {world} GPUs; "
                   f"use nodes whose GPU count divides {world}")
        raise BadInput(f"{nnodes} node(s) x {gpus_per_node} GPUs = {nnodes * gpus_per_node} "
                       f"processes, but the plan needs tp*pp*dp = {p.tp}*{p.pp}*{p.dp} = "
                       f"{world}; {fix}")
    return world


def _comment(s: str) -> str:
    """A name for a `#` comment line: one line whatever it holds (checked names have no
    control characters; this is the second guard)."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(s))


def torchrun_command(nnodes: int, gpus_per_node: int, plan_path: str, endpoint: str,
                     rdzv_id: str = None, extra_args=()) -> str:
    """One torchrun line starting the runtime (`endpoint` is inserted as written, unquoted,
    so that it may hold shell variables)."""
    check_name(str(plan_path), "the plan path", MAX_PATH)
    for a in extra_args:
        check_name(str(a), "a runtime argument", MAX_PATH)
    parts = ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(gpus_per_node)]
    if rdzv_id is not None:
        parts += ["--rdzv-id", rdzv_id]
    parts += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
              "-m", "runtime", "--plan", shlex.quote(str(plan_path))]
    parts += [shlex.quote(str(a)) for a in extra_args]
    return " ".join(parts)


def launch_commands(plan: Plan, plan_path, nnodes: int, *, gpus_per_node: int = None,
                    slurm: bool = False, port: int = RDZV_PORT, job_name: str = None,
                    extra_args=()) -> str:
    """Commands that start the runtime on `nnodes` nodes for this plan.

    gpus_per_node defaults to the plan's cluster. Raises BadInput unless
    nnodes * gpus_per_node == tp * pp * dp. With `slurm`, a batch script for `sbatch`
    (one task per node, each running torchrun for all that node's GPUs).
    """
    plan.validate(whole_cluster=True)
    refused = runner_problems(plan, "runtime")     # the rules the runtime's pre-flight asks
    if refused and refused[0].rule == "priced_for_engine":
        raise BadInput(f"plan launch starts our runtime, but the plan was priced for "
                       f"{plan.engine}: {refused[0].fix}")
    if refused:
        raise BadInput(f"plan launch: the runtime cannot run this plan: {refused[0].line}")
    check_name(str(plan_path), "the plan path", MAX_PATH)
    for what, v in (("model name", plan.model.name), ("cluster name", plan.cluster.name)):
        check_name(v, f"the plan's {what}")
    if job_name is not None:
        check_name(job_name, "the job name")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise BadInput(f"rendezvous port must be in 1..65535, got {port!r}")
    if getattr(plan.cluster, "pipeline", None):
        return _mixed_launch(plan, plan_path, nnodes, gpus_per_node, port, slurm, extra_args)
    g = plan.cluster.gpus_per_node if gpus_per_node is None else gpus_per_node
    world = _check(plan, nnodes, g)
    p = plan.parallelism
    summary = (f"# plan {_comment(plan.model.name)} on {_comment(plan.cluster.name)}: tp={p.tp} "
               f"pp={p.pp} dp={p.dp} -> {world} GPUs = {nnodes} node(s) x {g}")
    if slurm:
        # sbatch reads #SBATCH lines itself, without a shell: keep the name to plain characters
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", job_name or f"plan-{plan.model.name}")[:100]
        cmd = torchrun_command(nnodes, g, plan_path, f'"$MASTER_ADDR:{port}"',
                               rdzv_id='"$SLURM_JOB_ID"', extra_args=extra_args)
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={name}",
            f"#SBATCH --nodes={nnodes}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --gpus-per-node={g}",
            summary,
            "# the plan file must be readable at this path on every node",
            "set -euo pipefail",
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "export MASTER_ADDR",
            f"srun {cmd}",
        ]
        return "\n".join(lines) + "\n"
    if nnodes == 1:
        cmd = torchrun_command(1, g, plan_path, f"localhost:{port}", extra_args=extra_args)
        return "\n".join([summary, cmd]) + "\n"
    cmd = torchrun_command(nnodes, g, plan_path, f"$MASTER_ADDR:{port}", extra_args=extra_args)
    return "\n".join([
        summary,
        f"# run this same line on each of the {nnodes} nodes, with MASTER_ADDR set to the "
        f"address of one of them (port {port} open) and the plan file at this path on all:",
        cmd,
    ]) + "\n"


def _mixed_launch(plan: Plan, plan_path, nnodes: int, gpus_per_node, port: int, slurm: bool,
                  extra_args) -> str:
    """A plan over GPU groups (planner.specs.MixedCluster): its pipeline ranks must land on
    their groups' hosts, so node ranks are given (torchrun's static rendezvous, --node-rank),
    never assigned by c10d in the order nodes join. pp is the outermost rank dimension, so the
    pipeline's groups hold consecutive global ranks; each host runs its group's GPUs a node
    (torchrun numbers an agent's ranks after those of the agents before it, by each one's own
    --nproc-per-node: torch/distributed/elastic/agent/server/api.py
    SimpleElasticAgent._assign_worker_ranks), so groups of different host sizes launch too."""
    cl, p = plan.cluster, plan.parallelism
    if slurm:
        raise BadInput("plan launch --slurm: a mixed cluster's hosts need node ranks in the "
                       "pipeline's group order; use the torchrun lines (plan launch without "
                       "--slurm)")
    if gpus_per_node is not None:
        raise BadInput("plan launch --gpus-per-node: a mixed cluster's groups give their own "
                       "hosts' sizes (the plan's cluster groups)")
    per_rank = p.tp * p.cp * p.dp
    segments, node = [], 0       # (group, first pipeline rank, last, first node, nodes)
    for grp, first, last in cl.segments():
        g = cl.groups[grp].gpus_per_node
        gpus = (last + 1 - first) * per_rank
        if gpus % g:
            raise BadInput(f"plan launch: pipeline ranks {first}-{last} take {gpus} GPUs of "
                           f"group {cl.groups[grp].name}, not whole hosts of {g}")
        segments.append((grp, first, last, node, gpus // g))
        node += gpus // g
    if not isinstance(nnodes, int) or isinstance(nnodes, bool) or nnodes != node:
        raise BadInput(f"--nnodes {nnodes}: the plan's groups take {node} host(s) "
                       f"({' + '.join(str(s[4]) for s in segments)}); use --nnodes {node}")
    sizes = {cl.groups[s[0]].gpus_per_node for s in segments}
    world = per_rank * p.pp
    summary = (f"# plan {_comment(plan.model.name)} on {_comment(cl.name)}: tp={p.tp} "
               f"pp={p.pp} dp={p.dp} -> {world} GPUs = {nnodes} node(s) of "
               f"{' or '.join(map(str, sorted(sizes)))}")
    nproc = str(sizes.pop()) if len(sizes) == 1 else '"$NPROC_PER_NODE"'
    lines = [summary, "# a mixed cluster: run on each host with NODE_RANK its place below"
                      + (", NPROC_PER_NODE its GPUs" if nproc.startswith('"') else "")
                      + f" and MASTER_ADDR the address of node rank 0 (port {port} open), the "
                      "plan file at this path on all:"]
    for grp, first, last, at, n in segments:
        g = cl.groups[grp]
        lines.append(f"#   NODE_RANK {at}..{at + n - 1}: hosts of group {_comment(g.name)}"
                     + (f", NPROC_PER_NODE {g.gpus_per_node}" if nproc.startswith('"') else "")
                     + f" (pipeline ranks {first}-{last})")
    check_name(str(plan_path), "the plan path", MAX_PATH)
    parts = ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", nproc,
             "--node-rank", '"$NODE_RANK"', "--master-addr", '"$MASTER_ADDR"',
             "--master-port", str(port), "-m", "runtime", "--plan", shlex.quote(str(plan_path))]
    for a in extra_args:
        check_name(str(a), "a runtime argument", MAX_PATH)
    parts += [shlex.quote(str(a)) for a in extra_args]
    lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"
