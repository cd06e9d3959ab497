"""The machine a benchmark runs on: is it a Raspberry Pi 5, its CPU governor, its throttling
state, and its power draw (the Pi 5 PMIC through ``vcgencmd pmic_read_adc``, or an external meter
through a command that prints watts).

Nothing here needs root. Every reader returns ``None`` where the source does not exist, so the
same code runs (and records "absent") on a workstation.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

DEVICE_TREE_MODEL = Path("/proc/device-tree/model")
GOVERNOR = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")


def board_model(path: Path = DEVICE_TREE_MODEL) -> str | None:
    try:
        return path.read_bytes().rstrip(b"\0").decode(errors="replace").strip() or None
    except OSError:
        return None


def is_pi5(path: Path = DEVICE_TREE_MODEL) -> bool:
    return (board_model(path) or "").startswith("Raspberry Pi 5")


def cpu_governor(path: Path = GOVERNOR) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _vcgencmd(*args: str, timeout: float = 5.0) -> str | None:
    exe = shutil.which("vcgencmd")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


# bits of `vcgencmd get_throttled` (Raspberry Pi documentation)
THROTTLE_BITS = {
    0: "under-voltage now", 1: "ARM frequency capped now", 2: "throttled now",
    3: "soft temperature limit now", 16: "under-voltage has occurred",
    17: "ARM frequency capping has occurred", 18: "throttling has occurred",
    19: "soft temperature limit has occurred",
}


def parse_throttled(text: str) -> int | None:
    m = re.search(r"throttled=(0x[0-9a-fA-F]+)", text or "")
    return int(m.group(1), 16) if m else None


def throttled() -> int | None:
    """The ``get_throttled`` bit mask, or None off a Pi."""
    return parse_throttled(_vcgencmd("get_throttled") or "")


def describe_throttled(mask: int | None) -> str:
    if mask is None:
        return "unknown (no vcgencmd)"
    if mask == 0:
        return "0x0 (never throttled)"
    return f"{mask:#x} ({', '.join(v for b, v in THROTTLE_BITS.items() if mask >> b & 1)})"


_ADC_LINE = re.compile(r"^\s*(\S+)_([AV])\s+(?:current|volt)\(\d+\)=([0-9.]+)[AV]\s*$")


def parse_pmic_adc(text: str) -> float | None:
    """Total power in watts from ``vcgencmd pmic_read_adc``: each rail's current (``X_A``) times
    its voltage (``X_V``), summed over the rails that report both."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in (text or "").splitlines():
        m = _ADC_LINE.match(line)
        if m:
            (amps if m.group(2) == "A" else volts)[m.group(1)] = float(m.group(3))
    rails = amps.keys() & volts.keys()
    return sum(amps[r] * volts[r] for r in rails) if rails else None


def pmic_watts() -> float | None:
    return parse_pmic_adc(_vcgencmd("pmic_read_adc") or "")


def meter_watts(command: str) -> float | None:
    """An external meter: ``command`` (run by the shell) prints the current draw in watts."""
    try:
        out = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=5)
        return float(out.stdout.strip().split()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


@dataclass
class PowerSampler:
    """Samples watts in a background thread; ``joules`` integrates them (trapezoid) over the run."""

    read: object  # () -> float | None
    interval_s: float = 0.1
    samples: list[tuple[float, float]] = field(default_factory=list)

    def __enter__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            w = self.read()
            if w is not None:
                self.samples.append((time.perf_counter(), w))
            self._stop.wait(self.interval_s)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        w = self.read()
        if w is not None:
            self.samples.append((time.perf_counter(), w))

    @property
    def joules(self) -> float | None:
        if len(self.samples) < 2:
            return None
        return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(self.samples, self.samples[1:]))

    @property
    def mean_watts(self) -> float | None:
        if len(self.samples) < 2:
            return None
        return self.joules / (self.samples[-1][0] - self.samples[0][0])


def power_source(meter_command: str | None = None):
    """The best power reader here: an external meter if given, else the Pi 5 PMIC, else None."""
    if meter_command:
        return lambda: meter_watts(meter_command)
    if pmic_watts() is not None:
        return pmic_watts
    return None
