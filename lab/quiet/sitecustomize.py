"""Run by Python at the start of every process a notebook's engines start (lab.notebook.quiet_engines puts this
folder on their PYTHONPATH; Python imports ``sitecustomize`` from it before anything else).

vLLM logs a few warnings while it is being imported (on a CPU build: "Triton is installed, but doesn't include CPU
backend"), before it has set up its logging, so VLLM_LOGGING_LEVEL does not reach them and Python prints them bare
on stderr: into a learner's cell, from the engine-core process vLLM spawns. Its logger's level set here, first,
keeps them out, as quiet_engines does in the notebook's own process. Not a package: nothing imports it by name.
"""

import logging

logging.getLogger("vllm").setLevel(logging.ERROR)
