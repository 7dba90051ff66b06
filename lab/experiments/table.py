"""table: vLLM's real block table, the physical block ids each request holds, read from vLLM's KV cache manager.

The blocks experiment derives a grid from token counts; this one reads vLLM's own ids (lab.engines.vllm_blocks:
an in-process engine core in a child process, blocks of 32 tokens in a small pool). Closed-loop users send
requests whose answers differ in length, all starting with the same shared block of tokens: requests end at
different steps and their blocks go back to the pool for the next request, a request's blocks need not be
contiguous, and the shared first blocks are held by several requests at once (prefix caching: reference count
above 1). Fields say which of these the run shows, with the ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.load.workloads import make_requests

ENGINES = ("vllm",)  # the engines this experiment needs loaded (for the tokenizer; it starts its own vLLM)
BLOCK, POOL_BLOCKS, MAX_LEN = 32, 48, 256  # small blocks in a small pool: each request spans several, ids recur
SOURCE = "vLLM KVCacheManager.get_block_ids after every engine step (in-process engine core in a child process)"


@dataclass(frozen=True)
class Params:
    """requests and users (closed loop); shared_tokens: a prefix every prompt starts with (0: none)."""

    requests: int = 8
    users: int = 4
    shared_tokens: int = 64

    def __post_init__(self) -> None:
        if not 1 <= self.users <= self.requests <= 32:
            raise ValueError(f"users and requests: 1 <= users <= requests <= 32, not users={self.users}, "
                             f"requests={self.requests}")
        if not 0 <= self.shared_tokens <= 128:
            raise ValueError(f"shared_tokens must be from 0 to 128, not {self.shared_tokens}")


def check(params: Params, config) -> None:
    """Nothing depends on the session's config: the experiment's own vLLM takes its small pool."""


async def run(session, params: Params, result, notify) -> None:
    """Requests with the shared prefix and spread answers through the child's in-process vLLM; what it shows."""
    from lab.engines.vllm_blocks import block_tables

    config = session.config.with_overrides(block_size=BLOCK, num_kv_blocks=POOL_BLOCKS, max_model_len=MAX_LEN,
                                           kv_cache_gib=None)
    requests = shared_prefix(make_requests(session.tokenizer, "spread", params.requests, 17, prefix="table"),
                             params.shared_tokens)
    result.message = f"starting an in-process vLLM with {POOL_BLOCKS} blocks of {BLOCK} (about 30 s on 2 cores)"
    notify(result)
    found = await block_tables(config, session.check.model_path, requests, params.users)
    result.series = {"steps": found["steps"]}
    result.fields.update(summarize(found), source=SOURCE)
    result.rows = [{"step": s["step"], "request": r, "blocks": " ".join(map(str, ids))}
                   for s in found["steps"] for r, ids in s["tables"].items()]
    notify(result)


def shared_prefix(requests: list, tokens: int) -> list:
    """The requests with the first request's first ``tokens`` prompt tokens in front of each prompt."""
    from dataclasses import replace

    head = requests[0].prompt_token_ids[:tokens] if tokens else ()
    return [replace(r, prompt_token_ids=tuple(head) + r.prompt_token_ids) for r in requests]


def summarize(found: dict) -> dict:
    """What the ids show: the most requests at once, requests whose ids are not contiguous, blocks that served
    requests one after the other (freed, then reused), blocks held by several at once (shared)."""
    steps, owners = found["steps"], {}
    for step in steps:
        for request, ids in step["tables"].items():
            for block in ids:
                holders = owners.setdefault(block, [])
                if request not in holders:
                    holders.append(request)
    shared = {int(b): n for s in steps for b, n in s["shared"].items()}
    final = {r: ids for s in steps for r, ids in s["tables"].items()}  # each request's last table
    scattered = {r: ids for r, ids in final.items() if any(b != a + 1 for a, b in zip(ids, ids[1:], strict=False))}
    return {"num_blocks": found["num_blocks"], "block_size": found["block_size"],
            "most_at_once": max((len(s["tables"]) for s in steps), default=0), "steps": len(steps),
            "tables": final, "non_contiguous": scattered,
            "reused": {b: rs for b, rs in owners.items() if len(rs) > 1 and b not in shared}, "shared": shared}
