"""Datasheet ceilings of known devices: leads only. A roofline draws them dashed, after the
ceilings measured on the device by a ``ceilings`` probe (SPEC section 5).

FLOP/s are dense (no 2:4 sparsity) tensor-core peaks with FP32 accumulation, from NVIDIA's
datasheets (``source``); ``fp32`` is the non-tensor FP32 peak. ``memory_mib`` is the total
NVML reports on such a device (``nvidia-smi``), which is what a serving engine's memory
utilization fraction multiplies.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

T = 1e12


class DevicePreset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    label: str
    memory_mib: int = Field(gt=0)
    bandwidth_bps: float = Field(gt=0, description="memory bandwidth, bytes/s")
    flops: dict[str, float] = Field(description="dtype -> dense peak FLOP/s")
    source: str

    def peak(self, dtype: str) -> float | None:
        return self.flops.get(dtype)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    def balance(self, dtype: str) -> float | None:
        """Machine balance: peak FLOP/s / bandwidth (FLOP per byte)."""
        p = self.peak(dtype)
        return None if p is None else p / self.bandwidth_bps


DEVICE_PRESETS: dict[str, DevicePreset] = {
    d.name: d
    for d in (
        DevicePreset(
            name="h100-sxm",
            label="NVIDIA H100 SXM5 80GB",
            memory_mib=81559,
            bandwidth_bps=3.35e12,
            flops={
                "fp32": 67 * T,
                "tf32": 494.7 * T,
                "bf16": 989.4 * T,
                "fp16": 989.4 * T,
                "fp8": 1978.9 * T,
            },
            source="NVIDIA H100 Tensor Core GPU datasheet (SXM5 column; sparsity figures halved)",
        ),
        DevicePreset(
            name="h200",
            label="NVIDIA H200 SXM 141GB",
            memory_mib=143771,
            bandwidth_bps=4.8e12,
            flops={
                "fp32": 67 * T,
                "tf32": 494.7 * T,
                "bf16": 989.4 * T,
                "fp16": 989.4 * T,
                "fp8": 1978.9 * T,
            },
            source="NVIDIA H200 Tensor Core GPU datasheet (SXM column; sparsity figures halved)",
        ),
        DevicePreset(
            name="a100-80gb",
            label="NVIDIA A100 80GB SXM",
            memory_mib=81920,
            bandwidth_bps=2.039e12,
            flops={"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
            source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column; dense)",
        ),
        DevicePreset(
            name="l40s",
            label="NVIDIA L40S 48GB",
            memory_mib=46068,
            bandwidth_bps=864e9,
            flops={
                "fp32": 91.6 * T,
                "tf32": 183 * T,
                "bf16": 362.05 * T,
                "fp16": 362.05 * T,
                "fp8": 733 * T,
            },
            source="NVIDIA L40S datasheet (sparsity figures halved)",
        ),
        DevicePreset(
            name="rtx-4090",
            label="NVIDIA GeForce RTX 4090 24GB",
            memory_mib=24564,
            bandwidth_bps=1008e9,
            flops={
                "fp32": 82.6 * T,
                "tf32": 82.6 * T,
                "bf16": 165.2 * T,
                "fp16": 165.2 * T,
                "fp8": 330.3 * T,
            },
            source="NVIDIA Ada Lovelace architecture whitepaper, appendix (RTX 4090; FP32 "
            "accumulate, dense; FP16 with FP16 accumulate is 330.3 TFLOP/s)",
        ),
    )
}

# substrings of NVML device names -> preset, to pair a probe's device with its datasheet
_NAME_HINTS: tuple[tuple[str, str], ...] = (
    ("h200", "h200"),
    ("h100", "h100-sxm"),
    ("a100", "a100-80gb"),
    ("l40s", "l40s"),
    ("4090", "rtx-4090"),
)


def device_preset(name: str) -> DevicePreset:
    try:
        return DEVICE_PRESETS[name.lower()]
    except KeyError:
        known = ", ".join(DEVICE_PRESETS)
        raise ValueError(f"unknown device preset {name!r} (known: {known})") from None


def preset_for_device_name(device_name: str | None) -> DevicePreset | None:
    """The datasheet preset matching a device name as NVML reports it, if any."""
    if not device_name:
        return None
    low = device_name.lower()
    for hint, preset in _NAME_HINTS:
        if hint in low:
            return DEVICE_PRESETS[preset]
    return None
