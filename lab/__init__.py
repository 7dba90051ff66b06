"""KV Lab: measure, live, why a paged-KV engine (vLLM) outruns static-batch HF generate().

The package is layered so that data flows one way:
config -> engines + workload -> driver -> request records and engine samples -> metrics ->
run record -> plots / files / database. Heavy libraries (torch, transformers, vllm, gradio) are only
imported inside the modules that need them.
"""

__version__ = "0.1.0"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the app, its engine host and the CLI
