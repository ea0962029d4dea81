"""What a probe job asks for: kind, device and parameters. Plain pydantic, no torch, so the
server validates specs without the ``probes`` extra."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ProbeKind = Literal["ceilings", "linear", "batch_scaling"]
ProbeDevice = Literal["cuda", "cpu"]
MatmulDtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
ModelDtype = Literal["fp32", "bf16", "fp16"]
PROBE_KINDS: tuple[ProbeKind, ...] = ("ceilings", "linear", "batch_scaling")
RANDOM_TINY_LLAMA = "random:tiny-llama"


class _P(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CeilingsParams(_P):
    """Copy sizes (MiB) and matmul shapes; None picks defaults for the device."""

    copy_mib: list[int] | None = Field(None, min_length=1)
    square: list[int] | None = Field(None, min_length=1)
    llm_shapes: list[tuple[int, int, int]] | None = None  # (M, K, N)
    dtypes: list[MatmulDtype] | None = None
    warmup: int = Field(3, ge=0, le=1000)
    iters: int = Field(10, ge=1, le=10000)

    @field_validator("copy_mib", "square")
    @classmethod
    def _positive(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(x < 1 for x in v):
            raise ValueError("sizes must be >= 1")
        return v


class LinearParams(_P):
    """Weight [width, 4 x width]; prefill M = batch x seq, decode M = batch; a sweep of M
    over powers of two from 1 to ``sweep_max``."""

    width: int | None = Field(None, ge=1, le=65536, description="cuda 4096, cpu 256")
    batch: int | None = Field(None, ge=1, le=4096, description="cuda 8, cpu 4")
    seq: int | None = Field(None, ge=1, le=131072, description="cuda 512, cpu 64")
    dtype: ModelDtype = "bf16"
    sweep_max: int | None = Field(None, ge=1, le=65536, description="cuda 4096, cpu 256")
    warmup: int = Field(3, ge=0, le=1000)
    iters: int = Field(20, ge=1, le=10000)
    trace: bool = True


class BatchScalingParams(_P):
    """A causal LM from a local path (a Hugging Face folder or a .gguf file), or
    ``random:tiny-llama`` (a tiny random-weight Llama built from a config)."""

    model_path: str = Field(min_length=1)
    input_len: int = Field(128, ge=1, le=131072)
    output_len: int = Field(64, ge=2, le=65536)
    batches: list[int] = Field(default_factory=lambda: [1, 4, 8, 16, 32], min_length=1)
    dtype: ModelDtype = "bf16"
    seed: int = 0

    @field_validator("batches")
    @classmethod
    def _batches(cls, v: list[int]) -> list[int]:
        if any(b < 1 for b in v) or sorted(set(v)) != v:
            raise ValueError("batches must be distinct positive integers in increasing order")
        return v


PARAMS: dict[str, type[_P]] = {
    "ceilings": CeilingsParams,
    "linear": LinearParams,
    "batch_scaling": BatchScalingParams,
}


class ProbeSpec(_P):
    kind: ProbeKind
    device: ProbeDevice = "cuda"
    device_index: int = Field(0, ge=0)
    name: str | None = Field(None, max_length=255)
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _params(self) -> ProbeSpec:
        self.params = PARAMS[self.kind].model_validate(self.params).model_dump(mode="json")
        return self

    def typed_params(self) -> Any:
        return PARAMS[self.kind].model_validate(self.params)
