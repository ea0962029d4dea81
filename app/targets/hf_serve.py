"""Hugging Face ``transformers serve`` as a target, on a local safetensors folder.

``export_safetensors`` turns the SmolLM2 GGUF (``app.targets.llamacpp.find_gguf``) into such
a folder: transformers loads a GGUF with ``from_pretrained(dir, gguf_file=name)`` (needs the
``gguf`` and ``accelerate`` packages, dequantizing to float32), but refuses to save a model
it still marks as GGUF-quantized, so the weights are copied into a fresh model built from the
same config without its quantization entry. ``start_transformers_serve`` runs
``transformers serve FOLDER`` (needs ``transformers[serving]``) on loopback.

Its streams end without ``[DONE]`` and carry usage on the last chunk (the client handles
both); it refuses ``ignore_eos``/``min_tokens``, so specs for it set ``ignore_eos=False``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from app.targets.llamacpp import free_port


def export_safetensors(gguf: Path, out_dir: Path) -> Path:
    """Write ``gguf`` as a transformers model folder (config, safetensors, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    plain.load_state_dict(model.state_dict())
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    return out_dir


@dataclass
class ServeProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    model_dir: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_transformers_serve(
    model_dir: Path, *, port: int | None = None, ready_timeout_s: float = 180.0
) -> ServeProcess:
    beside = Path(sys.executable).parent / "transformers"  # this environment's first
    exe = str(beside) if beside.is_file() else shutil.which("transformers")
    if exe is None:
        raise RuntimeError("the `transformers` command is not installed")
    port = port or free_port()
    fd, log_name = tempfile.mkstemp(prefix="tokentrace-tserve-", suffix=".log")
    os.close(fd)
    log_path = Path(log_name)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [exe, "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    handle = ServeProcess(proc, port, log_path, model_dir)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"transformers serve exited ({proc.returncode}): {tail}")
        try:
            if httpx.get(f"{handle.base_url}/health", timeout=2.0).status_code == 200:
                return handle
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    handle.stop()
    raise RuntimeError(f"transformers serve not ready in {ready_timeout_s:g} s")
