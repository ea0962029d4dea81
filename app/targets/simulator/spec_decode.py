"""The simulator's speculative decoding (``SimConfig.spec_decode_draft_len`` > 0), counted as
vLLM counts it: after the first token (the prefill's), each decoding step drafts ``k``
tokens and the target model accepts a leading run of them, each with probability ``p``
(seeded draws: the same seed and request give the same steps); the step then yields the
accepted tokens plus one of its own (the bonus token), until the request's output is
generated. ``/metrics`` shows vLLM's counters ``vllm:spec_decode_num_drafts_total``,
``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and
``..._num_accepted_tokens_per_pos_total{position}``, summed when a request ends whole; the
ground truth keeps each request's counts (``SpecCounts.to_json``).

Timing is not changed by it: the stream's tokens keep the configured inter-token latency.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.targets.simulator.plan import unit


@dataclass(slots=True)
class SpecCounts:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def add(self, other: SpecCounts) -> None:
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted
        if len(self.accepted_per_pos) < len(other.accepted_per_pos):
            self.accepted_per_pos += [0] * (
                len(other.accepted_per_pos) - len(self.accepted_per_pos)
            )
        for i, n in enumerate(other.accepted_per_pos):
            self.accepted_per_pos[i] += n

    def to_json(self) -> dict[str, object]:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted,
            "accepted_per_pos": list(self.accepted_per_pos),
        }


def request_counts(seed: int, seq: int, output_tokens: int, k: int, p: float) -> SpecCounts:
    """The draft steps of the ``seq``-th request generating ``output_tokens`` tokens."""
    out = SpecCounts(accepted_per_pos=[0] * k)
    if k <= 0:
        return out
    produced = 1  # the first token comes out of the prefill
    step = 0
    while produced < output_tokens:
        accepted = 0
        while accepted < k and unit(seed, "spec", seq, step, accepted) < p:
            out.accepted_per_pos[accepted] += 1
            accepted += 1
        out.drafts += 1
        out.draft_tokens += k
        out.accepted += accepted
        produced += accepted + 1
        step += 1
    return out
