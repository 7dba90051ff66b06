"""A server's Prometheus text as the lab's engine samples (pure: no HTTP here).

vLLM's OpenAI server exports what its in-process stat logger sees: ``vllm:kv_cache_usage_perc`` (a
fraction, 1 - free/total blocks, despite its name), ``vllm:num_requests_running`` / ``waiting``, the
counters ``vllm:num_preemptions``, ``vllm:prefix_cache_queries`` / ``hits``, and ``vllm:cache_config_info``
whose labels carry ``num_gpu_blocks`` and ``block_size``. Parsed with prometheus_client's parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.engines.base import EngineSample

GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "kv_usage": "vllm:kv_cache_usage_perc"}
COUNTERS = {"preemptions": "vllm:num_preemptions", "queries": "vllm:prefix_cache_queries",
            "hits": "vllm:prefix_cache_hits"}


@dataclass(frozen=True)
class Scrape:
    """One read of /metrics: the gauges and counters the lab draws (summed over a server's engines)."""

    values: dict[str, float]
    num_blocks: int | None = None
    block_size: int | None = None

    @property
    def has_vllm(self) -> bool:
        return "kv_usage" in self.values


def parse_metrics(text: str) -> Scrape:
    """Read the lab's figures from Prometheus exposition text; names it lacks are left out."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {name: key for key, name in {**GAUGES, **COUNTERS}.items()}
    values: dict[str, float] = {}
    blocks = size = None
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            labels = family.samples[0].labels if family.samples else {}
            blocks, size = _int(labels.get("num_gpu_blocks")), _int(labels.get("block_size"))
        key = wanted.get(family.name.removesuffix("_total"))  # a counter's family: with or without _total
        if key is None:
            continue
        total = [s.value for s in family.samples if not s.name.endswith("_created")]
        values[key] = sum(total) / (len(total) if key == "kv_usage" and total else 1)
    return Scrape(values, blocks, size)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "", "None") else None
    except ValueError:
        return None


def to_sample(engine: str, time_s: float, scrape: Scrape, before: Scrape | None) -> EngineSample:
    """An EngineSample from one scrape; per-step prefix figures are the change since ``before``."""
    got = scrape.values

    def delta(key: str) -> int:
        return int(got.get(key, 0) - (before.values.get(key, 0) if before else got.get(key, 0)))

    return EngineSample(
        engine=engine, time_s=time_s, running=int(got.get("running", 0)), waiting=int(got.get("waiting", 0)),
        kv_usage=got.get("kv_usage"), kv_total_blocks=scrape.num_blocks, kv_block_size=scrape.block_size,
        preemptions_total=int(got.get("preemptions", 0)), prefix_queries_total=int(got.get("queries", 0)),
        prefix_hits_total=int(got.get("hits", 0)), prefix_queries=delta("queries"), prefix_hits=delta("hits"),
    )
