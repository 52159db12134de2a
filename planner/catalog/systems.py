"""How a catalog GPU's systems are built: GPUs per host and per NVLink domain."""
from planner.errors import BadInput

# How a catalog GPU's systems are built: (GPUs per host, GPUs per NVLink domain). Not listed:
# 8-GPU hosts (HGX / DGX boards, the MI300X platform), each its own NVLink/xGMI domain.
# GB200 / GB300 NVL72: 18 compute trays of 2 Grace CPUs and 4 GPUs, joined by 9 NVLink switch
# trays into one 72-GPU domain (NVIDIA GB200 NVL72 and GB300 NVL72 product pages and
# datasheets).
SYSTEMS = {"gb200": (4, 72), "gb300": (4, 72)}
HOST_GPUS = 8


def host_size(gpu_name: str, count: int) -> int:
    """GPUs per host of a `count`-GPU cluster of a catalog GPU (8 for GPUs not in SYSTEMS)."""
    return min(SYSTEMS.get(gpu_name, (HOST_GPUS, HOST_GPUS))[0], count)


def system_layout(gpu_name: str, count: int) -> tuple:
    """(gpus_per_node, nvlink_domain) of `count` GPUs of a catalog GPU built as its system:
    8-GPU hosts (fewer GPUs: one host); on NVL72 systems whole 4-GPU trays, the NVLink domain
    being the GPUs the job uses in each rack: the largest multiple of 4 up to 72 that divides
    `count` (128 GPUs: two racks of 64; 512: eight of 64; 144: two whole racks), as a
    scheduler hands a job the same number of trays in each rack it spans (Slurm's
    topology/block plugin). A cluster JSON's `nvlink_domain` overrides it. BadInput when
    `count` is not whole trays."""
    if gpu_name not in SYSTEMS:
        g = min(HOST_GPUS, count)
        return g, g
    host, rack = SYSTEMS[gpu_name]
    if count <= host:
        return count, count
    if count % host:
        raise BadInput(f"{count} {gpu_name} GPUs are not whole {host}-GPU trays of NVL{rack} "
                       f"racks (a multiple of {host}: {count - count % host} or "
                       f"{count + host - count % host})")
    domain = max(d for d in range(host, min(rack, count) + 1, host) if count % d == 0)
    return host, domain
