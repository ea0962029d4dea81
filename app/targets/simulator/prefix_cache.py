"""The simulator's prefix cache (``SimConfig.prefix_cache_block`` > 0), as vLLM's automatic
prefix caching counts it: a prompt is cut into blocks of ``block`` tokens (built-in
tokenizer; a chat message's tokens follow a marker of its role), each full block named by a
hash chained over every block before it, so a block hits only when the whole prompt up to
its end was seen before (a surface's handler gives the prompt's tokens,
``app.targets.simulator.surfaces``). A request's cached tokens are its leading blocks found
in the cache; then its full blocks are remembered, least recently used ones forgotten past
``capacity`` blocks. The TTFT charges ``per_input_token_ms`` for the uncached tokens only,
usage reports ``prompt_tokens_details.cached_tokens`` and ``/metrics`` vLLM's
``prefix_cache_queries_total`` / ``prefix_cache_hits_total`` (tokens)."""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    """Block hashes of the prompts seen, least recently used first."""

    def __init__(self, block: int, capacity: int) -> None:
        self.block = block
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # of them, found cached
        self.resets = 0  # times emptied (``reset``)

    def reset(self) -> None:
        """Forget every block (POST /reset_prefix_cache): the next prompts miss. The
        counters go on, as vLLM's do."""
        self._blocks.clear()
        self.resets += 1

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, tokens: list[str], counted: int) -> int:
        """Cached tokens of a prompt of ``tokens`` (``counted`` tokens by the server's
        usage count); its full blocks are then remembered."""
        b = self.block
        blocks = self._blocks
        h = 0
        cached = 0
        missed = False
        for i in range(0, len(tokens) - b + 1, b):
            h = hash((h, *tokens[i : i + b]))
            if h in blocks:  # still there after a miss (its parent forgotten): no hit
                blocks.move_to_end(h)
                if not missed:
                    cached += b
                continue
            missed = True
            blocks[h] = None
            if len(blocks) > self.capacity:
                blocks.popitem(last=False)
        cached = min(cached, counted)
        self.queries += counted
        self.hits += cached
        return cached
