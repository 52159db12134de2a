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
    8-GPU hosts (fewer GPUs: one host); NVL72 racks, or up to 72 GPUs of one rack in whole
    trays. BadInput when no such system holds `count`."""
    if gpu_name not in SYSTEMS:
        g = min(HOST_GPUS, count)
        return g, g
    host, rack = SYSTEMS[gpu_name]
    if count <= host:
        return count, count
    if count <= rack and count % host == 0:
        return host, count
    if count % rack == 0:
        return host, rack
    raise BadInput(f"{count} {gpu_name} GPUs are neither whole NVL{rack} racks ({rack}, "
                   f"{2 * rack}, ...) nor whole {host}-GPU trays of one rack (at most {rack})")
