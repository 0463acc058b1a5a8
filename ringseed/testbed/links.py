"""Link shaping parameters for the testbed: ``tc tbf`` arguments and what a link really carries.

Owns the numbers, not the commands: pure functions, no I/O. Rules:

- ``tbf`` counts layer-2 bytes, so TCP goodput on a shaped link is the rate times
  ``goodput_fraction(mtu)`` (about 0.957 at MTU 1500, 0.993 at MTU 9000). The testbed uses
  jumbo frames (MTU 9000, as GPU clusters do) so that the link rate is close to what an
  application can use; benchmarks state the nominal rate and the MTU.
- The bucket holds at least 10 ms of traffic and never less than 64 KiB, so that the kernel
  timer granularity never caps the rate; the queue holds up to ``latency_ms`` of traffic.
"""

from __future__ import annotations

DEFAULT_MTU = 9000
_ETHERNET = 14  # counted by tbf, not part of the MTU
_IP_TCP = 20 + 32  # IPv4, TCP with timestamps


def burst_bytes(*, rate_bps: float) -> int:
    """Token-bucket size for a link of ``rate_bps`` bit/s."""
    return max(64 << 10, int(rate_bps / 8 * 0.010))


def tbf_args(*, rate_bps: float, latency_ms: float = 50.0) -> list[str]:
    """The ``tc qdisc add ... root`` arguments that limit a device to ``rate_bps`` bit/s."""
    if rate_bps <= 0:
        raise ValueError(f"rate must be positive, got {rate_bps}")
    burst = burst_bytes(rate_bps=rate_bps)
    return ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", f"{latency_ms:g}ms"]


def goodput_fraction(*, mtu: int = DEFAULT_MTU) -> float:
    """Share of a shaped link's rate that TCP payload can use at this MTU."""
    return (mtu - _IP_TCP) / (mtu + _ETHERNET)


def parse_rate(text: str) -> float:
    """``'100mbit'``, ``'1gbit'``, ``'500kbit'`` or plain bit/s -> bit/s."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    lowered = text.strip().lower()
    for suffix, factor in units.items():
        if lowered.endswith(suffix):
            return float(lowered[: -len(suffix)]) * factor
    return float(lowered)
