"""The tensor-core peak of a GPU under a board power limit (planner.specs Gpu.power_limit_w,
`nvidia-smi -pl`), from the datasheet ratings of its silicon. A base module: it imports only
planner.errors, so planner.specs may use it."""
import functools

from planner.errors import BadInput

# NVIDIA rates one silicon at several board powers: the Blackwell B200 die as HGX B100 at 700 W
# (1750 TFLOP/s bf16 dense, FP8 3500), HGX B200 at 1000 W (2250, FP8 4500) and the GPU of GB200
# NVL72 at 1200 W (2500, FP8 5000), each with the same 148 SMs and 8 TB/s of HBM3e (NVIDIA
# Blackwell datasheets: HGX B100 / HGX B200 / GB200 NVL72 tables). Every precision's peak moves
# in the same ratio (the tensor clock); the HBM bandwidth does not move. Between two ratings the
# peak is taken linearly, an interpolation of the datasheets, not a measurement; below the
# lowest rating or above the part's own NVIDIA gives no figure, and nvidia-smi -pl refuses a
# limit above the board's maximum.
BLACKWELL_POWER_RATINGS = ((700.0, 1750.0), (1000.0, 2250.0), (1200.0, 2500.0))
# catalog GPU -> (its silicon's ratings, (watts, peak)), the rated power of the catalog part
POWER_RATINGS = {"b200": (BLACKWELL_POWER_RATINGS, 1000.0),
                 "gb200": (BLACKWELL_POWER_RATINGS, 1200.0)}


def _rated_peak(ratings, watts: float) -> float:
    for (w0, p0), (w1, p1) in zip(ratings, ratings[1:]):
        if w0 <= watts <= w1:
            return p0 + (p1 - p0) * (watts - w0) / (w1 - w0)
    raise AssertionError(watts)


@functools.lru_cache(maxsize=None)   # every GEMM the search prices reads it
def power_scale(name: str, watts: float) -> float:
    """The tensor-core peak of catalog GPU `name` at a board power limit of `watts`, as a
    fraction of the rated part's (POWER_RATINGS); a limit no datasheet rates is bad input."""
    if name not in POWER_RATINGS:
        rated = ", ".join(POWER_RATINGS)
        raise BadInput(f"gpu {name!r}: no datasheet rates its silicon at another power, so a "
                       f"power limit ({watts:g} W) cannot be priced; give its peak_tflops at "
                       f"that limit instead, without power_limit_w (power limits are priced "
                       f"for {rated})")
    ratings, rated_w = POWER_RATINGS[name]
    low = ratings[0][0]
    if not low <= watts <= rated_w:
        raise BadInput(f"gpu {name!r}: power limit {watts:g} W is outside {low:g}-{rated_w:g} W "
                       f"(the lowest rating of its silicon to the part's own); give its "
                       f"peak_tflops at that limit instead, without power_limit_w")
    return _rated_peak(ratings, watts) / _rated_peak(ratings, rated_w)


def at_rated_power(name: str, watts: float) -> bool:
    """Whether a limit of `watts` leaves catalog GPU `name` as rated: none (0), or its own
    rated power."""
    return not watts or (name in POWER_RATINGS and watts == POWER_RATINGS[name][1])


def limit_suffix(name: str, watts: float) -> str:
    """What names a GPU's power limit after its name: " at 750 W" under a limit below the
    part's rating, "" at its rated power."""
    return "" if at_rated_power(name, watts) else f" at {watts:g} W"


def limited_name(gpu) -> str:
    """A GPU's name with its power limit ("b200 at 750 W"; "b200" at its rated power)."""
    return gpu.name + limit_suffix(gpu.name, gpu.power_limit_w)
