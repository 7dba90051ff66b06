"""The preemption experiment in words (notebook 06): a pool too small for the load against the normal one:
failures, waits, preemptions and tok/s (measured).
"""

from __future__ import annotations


def preemption_answer(fields: dict, guess) -> list[str]:
    """The reader's guess, then the small pool against the normal one (preemption_lines)."""
    first, *rest = preemption_lines(fields)
    return [f"You guessed {guess!r}. {first}", *rest]


def preemption_lines(fields: dict) -> list[str]:
    """The small pool against the normal one: failures, waits, preemptions in each pool and tok/s (measured)."""
    small, normal = fields["small"], fields["normal"]
    lines = [f"Small pool ({small['kv_blocks']} blocks): {small['completed']} completed, "
             f"{small['errors']} errors, {small['preemptions']} preemption(s), {small['output_tok_s']:.1f} tok/s. "
             f"Normal pool ({normal['kv_blocks']} blocks): {normal['preemptions']} preemptions, "
             f"{normal['output_tok_s']:.1f} tok/s (measured)."]
    said = "No request failed: " if not small["errors"] else f"{small['errors']} request(s) failed: "
    said += f"requests waited (up to {small['peak_waiting']} at once) " + _preempted_words(small, normal)
    return lines + [said + _tok_s_words(small, normal), f"Preemption mode: {fields['preemption_mode']}."]


def _preempted_words(small: dict, normal: dict) -> str:
    """Which pools preempted: the small one alone, both (the load filled the normal pool too), or neither."""
    why = "a running request needed a block the pool did not have, so vLLM preempted one (the lowest-priority " \
          "running request) to make room"
    if small["preemptions"] and normal["preemptions"]:
        return (f"and both pools ran out: {why}, {small['preemptions']} time(s) in the small pool and "
                f"{normal['preemptions']} in the normal one. This load filled the normal pool too, so preemption "
                f"is not the small pool's alone. ")
    if small["preemptions"]:
        return f"and {small['preemptions']} time(s) {why}; the normal pool never preempted. "
    if normal["preemptions"]:
        return (f"and the small pool preempted nothing, while the normal one preempted {normal['preemptions']} "
                f"time(s): which requests ran together decided it, not the pool's size alone. ")
    return ("and every running request found its next block, so nothing was preempted this time (more users or "
            "longer answers would). ")


def _tok_s_words(small: dict, normal: dict) -> str:
    """The small pool's tok/s against the normal pool's, and how many requests ran at once in each where measured."""
    if not normal["output_tok_s"]:
        return "The normal pool made no tokens to compare with."
    ratio = small["output_tok_s"] / normal["output_tok_s"]
    said = f"The small pool made {ratio:.2f}x the normal pool's tok/s"
    if ratio >= 1:
        return said + ": no slower here."
    running = (small.get("mean_running"), normal.get("mean_running"))
    if None in running:
        return said + ": with fewer blocks, fewer requests could run at once."
    if running[0] < running[1]:
        return said + (f": {running[0]} requests ran in its average step against {running[1]} in the normal pool's "
                       f"(measured), so each step made fewer tokens.")
    return said + (f", though as many requests ran in its average step ({running[0]} against {running[1]}, "
                   f"measured): fewer running does not explain it, and this run does not say what does.")
