"""A server's /metrics text as engine samples (lab.engines.prometheus), on text shaped like vLLM's."""

from lab.engines.prometheus import parse_metrics, to_sample

VLLM_TEXT = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="91"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.79e+09
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 900.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
"""


def test_vllm_metrics_become_a_sample_with_blocks_and_deltas():
    before = parse_metrics(VLLM_TEXT.replace("900.0", "600.0"))
    scrape = parse_metrics(VLLM_TEXT)
    assert scrape.has_vllm and (scrape.num_blocks, scrape.block_size) == (91, 128)
    sample = to_sample("openai", 1.0, scrape, before)
    assert (sample.running, sample.waiting, sample.kv_usage) == (3, 2, 0.25)
    assert sample.preemptions_total == 4  # the _created timestamp is not counted
    assert (sample.prefix_queries_total, sample.prefix_hits_total) == (900, 300)
    assert sample.prefix_queries == 300 and sample.kv_total_blocks == 91


def test_a_server_without_vllm_metrics_gives_no_kv():
    scrape = parse_metrics("# TYPE http_requests counter\nhttp_requests_total 3.0\n")
    assert not scrape.has_vllm and scrape.num_blocks is None
