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
    result.engine_args = {"vllm": found["engine_args"]}  # this experiment's own engine, not the session's
    result.series = {"steps": found["steps"]}
    result.fields.update(summarize(found), source=SOURCE)
    result.rows = [{"step": s["step"], "request": r, "blocks": " ".join(map(str, ids))}
                   for s in found["steps"] for r, ids in s["tables"].items()]
    notify(result)


def shared_prefix(requests: list, tokens: int) -> list:
    """The requests with the same ``tokens`` prompt tokens in front of each prompt: exactly that many, taken from
    the prompts in turn."""
    from dataclasses import replace
    from itertools import cycle, islice

    head = tuple(islice(cycle(t for r in requests for t in r.prompt_token_ids), tokens))
    return [replace(r, prompt_token_ids=head + tuple(r.prompt_token_ids)) for r in requests]


def summarize(found: dict) -> dict:
    """What the ids show: the most requests at once, requests whose ids are not contiguous, blocks that served
    requests one after the other (freed, then reused), blocks held by several at once (shared: each block's most
    holders at one step) and the most requests that held one block at once (``most_holders``, over every step)."""
    steps = found["steps"]
    owners, shared = holders_in_order(steps), most_refs(steps)
    final = {r: ids for s in steps for r, ids in s["tables"].items()}  # each request's last table
    scattered = {r: ids for r, ids in final.items() if any(b != a + 1 for a, b in zip(ids, ids[1:], strict=False))}
    return {"num_blocks": found["num_blocks"], "block_size": found["block_size"],
            "most_at_once": max((len(s["tables"]) for s in steps), default=0), "steps": len(steps),
            "tables": final, "non_contiguous": scattered,
            "reused": {b: rs for b, rs in owners.items() if len(rs) > 1 and b not in shared}, "shared": shared,
            "most_holders": most_holders(steps)}


def refs_at(step: dict) -> dict[int, int]:
    """Each block held after ``step`` -> its reference count (vLLM's, where above 1; 1 for a block one holds)."""
    shared = {int(b): n for b, n in step["shared"].items()}
    return {b: shared.get(b, 1) for ids in step["tables"].values() for b in ids}


def most_refs(steps: list[dict]) -> dict[int, int]:
    """Each block that was ever shared -> the most requests that held it at one step."""
    most: dict[int, int] = {}
    for step in steps:
        for block, refs in step["shared"].items():
            most[int(block)] = max(refs, most.get(int(block), 0))
    return most


def most_holders(steps: list[dict]) -> dict:
    """The most requests that held one block at once, over every step: {"holders", "block", "step"} at the first
    step it happened (holders 1 where no block was shared; an empty dict where no step held a block)."""
    best: dict = {}
    for step in steps:
        for block, refs in refs_at(step).items():
            if refs > best.get("holders", 0):
                best = {"holders": refs, "block": block, "step": step["step"]}
    return best


def default_step(steps: list[dict]) -> int:
    """The step a view opens at: the last where most requests held one block at once (by then blocks were freed
    and reused), else the first where most blocks were held."""
    most = most_holders(steps).get("holders", 0)
    if most > 1:
        return max(i for i, s in enumerate(steps) if max(refs_at(s).values(), default=0) == most)
    return max(range(len(steps)), key=lambda i: len(refs_at(steps[i])), default=0)


def step_view(steps: list[dict], step: int) -> dict:
    """What vLLM's block table held after engine step ``step``, and what the steps before left on the free list.

    Returns:
        {"step", "tables": {request: [ids]}, "tokens": {request: tokens} or None (older results), "refs":
        {block: holders}, "freed": ids held before and free now, "reused": ids held now that another request
        held before, "free": vLLM's free blocks or None, "logical": {shared block: its logical indices}, "most":
        the run's most_holders}.

    Raises:
        ValueError: a step the run does not have, naming the range.
    """
    if not 0 <= step < len(steps):
        raise ValueError(f"step {step} is not one of this run's engine steps: choose 0 to {len(steps) - 1}")
    now = steps[step]
    refs, before = refs_at(now), holders_in_order(steps[:step])
    holders = {b: {r for r, ids in now["tables"].items() if b in ids} for b in refs}
    return {"step": now["step"], "tables": now["tables"], "tokens": now.get("tokens"), "refs": refs,
            "freed": sorted(b for b in before if b not in refs),
            "reused": sorted(b for b in refs if set(before.get(b, ())) - holders[b]), "free": now.get("free"),
            "logical": {b: sorted({ids.index(b) for ids in now["tables"].values() if b in ids})
                        for b, n in refs.items() if n > 1}, "most": most_holders(steps)}


def holders_in_order(steps: list[dict]) -> dict[int, list[str]]:
    """Each block held at any of ``steps`` -> the requests that held it, in the order they first did."""
    held: dict[int, list[str]] = {}
    for step in steps:
        for request, ids in step["tables"].items():
            for block in ids:
                if request not in held.setdefault(block, []):
                    held[block].append(request)
    return held
