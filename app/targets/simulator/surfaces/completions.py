"""The simulator's ``completions`` surface: ``prompt`` in (a string, strings or token ids),
text completion chunks out (``choices[].text``), or one ``text_completion``."""

from __future__ import annotations

from typing import Any

from app.client.endpoints.completions import COMPLETIONS
from app.client.tokenizer import PRETOKEN
from app.targets.sim_config import SimConfig
from app.targets.simulator.plan import Plan, count_prompt, generation_plan


class CompletionsShape:
    ident = "cmpl"
    chunk_object = b"text_completion"
    answer_object = "text_completion"
    content_open = b'"text":"'
    reasoning_open = b'"text":"'
    close = b'","logprobs":null,"finish_reason":null}]}\n\n'
    role_chunk = False
    reasoning = False

    def finish_choice(self, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}

    def whole_choice(self, content: str, reasoning: str, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "text": content, "logprobs": None, "finish_reason": finish_reason}


class CompletionsSurface:
    endpoint = COMPLETIONS.name
    shape = CompletionsShape()

    def plan(self, body: dict[str, Any], path: str, config: SimConfig) -> Plan:
        source = body.get("prompt", "")
        return generation_plan(
            body, self.endpoint, self.shape, source, count_prompt(source), config
        )

    def prompt_tokens(self, body: dict[str, Any]) -> list[str] | None:
        prompt = body.get("prompt", "")
        if isinstance(prompt, str):
            return PRETOKEN.findall(prompt)
        if isinstance(prompt, list) and all(isinstance(p, int) for p in prompt):
            return [str(p) for p in prompt]
        return [t for p in prompt if isinstance(p, str) for t in PRETOKEN.findall(p)]


COMPLETIONS_SURFACE = CompletionsSurface()
