"""The sharing experiment in words (notebook 06): the blocks n answers to one prompt held, in one request and as
separate requests (measured), against n unshared copies (computed).
"""

from __future__ import annotations


def sharing_answer(fields: dict, n: int) -> list[str]:
    """Peak blocks of one answer, n answers in one request and n separate requests (measured), against n
    unshared copies (computed), and whether the prompt's blocks were shared."""
    one, many = fields["one"]["peak_blocks"], fields[f"n={n} in one request"]["peak_blocks"]
    unshared = fields["unshared_blocks_estimate"]
    lines = [f"Peak blocks: {one} for one answer, {many} for n={n} in one request (measured); {n} unshared copies "
             f"would hold {unshared} ({n} x {one}, computed)."]
    if many < unshared:
        lines.append(f"The {n} answers held {unshared - many} fewer blocks than unshared copies: the prompt's full "
                     f"blocks were computed once and held once, and each answer added only its own partly filled last "
                     f"block and its output.")
    else:
        lines.append(f"The {n} answers held as many blocks as unshared copies: nothing was shared here (a prompt "
                     f"shorter than one block has no full block to share).")
    return lines + [fanout_answer(fields[f"{n} separate requests"])]


def more_answers(fewer: dict, more: dict, counts: tuple[int, int]) -> list[str]:
    """The exercise: what each extra answer cost in blocks (measured), against an unshared copy (measured)."""
    a, b = (f[f"n={k} in one request"]["peak_blocks"] for f, k in ((fewer, counts[0]), (more, counts[1])))
    each, copy = (b - a) / (counts[1] - counts[0]), more["one"]["peak_blocks"]
    lines = [f"Peak blocks: {a} with n={counts[0]}, {b} with n={counts[1]} (measured); unshared, n={counts[1]} would "
             f"hold {more['unshared_blocks_estimate']} (computed)."]
    if each < copy:
        lines.append(f"Each extra answer added {each:.1f} blocks against {copy} for a whole copy of one answer: it "
                     f"added only its own last block and output; the prompt's full blocks stayed held once.")
    else:
        lines.append(f"Each extra answer added {each:.1f} blocks, as many as a whole copy ({copy}): no sharing "
                     f"showed here.")
    return lines


def fanout_answer(separate: dict) -> str:
    """Whether four separate requests of one prompt found its blocks in the prefix cache (measured)."""
    hit = separate["prefix_hit_tokens"]
    if hit:
        return (f"Four separate requests of the same prompt shared too: {hit} prompt tokens hit the prefix cache "
                f"(in this vLLM, n=4 fans out into four requests that find the prompt's blocks there).")
    return ("Four separate requests of the same prompt found nothing in the prefix cache here: each computed and held "
            "the prompt's blocks itself.")
