"""What the lab says about a stored experiment (``lab report``, the KV experiments tab): each experiment's words
helper by name, called on the result's own fields and params.
"""

from __future__ import annotations

from lab.experiments.cache_words import cache_answer
from lab.experiments.memory_words import plan_lines
from lab.experiments.phases_words import phases_answer
from lab.experiments.preemption_words import preemption_lines
from lab.experiments.prefix_words import prefix_answer
from lab.experiments.sharing_words import sharing_answer
from lab.experiments.table_words import table_answer
from lab.experiments.waste_words import ROW_LABELS, block_size_answer, kinds_answer, waste_answer
from lab.experiments.why_words import why_caption
from lab.words import held

EXPERIMENT_ANSWERS = {  # experiment -> (its fields, its params) -> lines; every argument is the result's own
    "cache": lambda f, p: cache_answer(f),
    "waste": lambda f, p: waste_answer(f) + (kinds_answer(f) if any("kinds_pct" in (f.get(e) or {})
                                                                    for e in ROW_LABELS) else []) +
    block_size_answer(f),
    "table": lambda f, p: table_answer(f),
    "prefix": lambda f, p: prefix_answer(f, p["shared_tokens"]),
    "phases": lambda f, p: phases_answer(f, max(p["users"])),
    "sharing": lambda f, p: sharing_answer(f, p["n"]),
    "preemption": lambda f, p: preemption_lines(f),
    "memory": lambda f, p: plan_lines(f),  # a stored plan keeps its device's name, not its kind: no budget_line
    "why": lambda f, p: [line.removeprefix("- ") for line in why_caption(f).splitlines()],
}


def experiment_answer(name: str, fields: dict, params: dict) -> list[str]:
    """What the lab says about a stored experiment, from its fields and params (none where it has no helper)."""
    answer = EXPERIMENT_ANSWERS.get(name)
    return held(answer, fields, params) if answer else []
