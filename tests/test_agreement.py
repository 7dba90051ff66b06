"""Cross-engine agreement: matched leading tokens, first divergence, and the early-divergence verdict."""

from lab.agreement import (
    EARLY_TOKENS,
    NEAR_TIE_NATS,
    PROMPTS,
    Agreement,
    AgreementReport,
    check_pair,
    compare,
    skipped,
    with_tie_gaps,
)


def decode(ids):
    return " ".join(f"t{i}" for i in ids)


def test_identical_answers_have_no_divergence():
    result = compare("q", [1, 2, 3], [1, 2, 3], decode)
    assert (result.matched_tokens, result.total_tokens, result.diverged_at) == (3, 3, None)
    assert result.ok and result.other_token == ""


def test_first_divergence_names_position_and_both_tokens():
    result = compare("q", [1, 2, 3, 4], [1, 2, 9], decode)
    assert (result.matched_tokens, result.total_tokens, result.diverged_at) == (2, 4, 2)
    assert (result.reference_token, result.other_token) == ("t3", "t9")
    assert not result.ok  # token 2 < EARLY_TOKENS


def test_one_answer_ending_early_is_a_divergence_at_its_end():
    result = compare("q", [1, 2], [1, 2, 3], decode)
    assert result.diverged_at == 2 and result.reference_token == "<end>" and result.other_token == "t3"


def test_late_divergence_is_not_a_finding():
    same = list(range(EARLY_TOKENS))
    assert compare("q", same + [1], same + [2], decode).ok


def answers_with(early_divergences: int) -> dict:
    ref = [list(range(10)) for _ in PROMPTS]
    other = [list(r) for r in ref]
    for i in range(early_divergences):
        other[i][0] = 99
    return {"hf": ref, "vllm": other}


def test_one_early_divergence_without_a_near_tie_is_a_finding():
    assert check_pair("hf", "vllm", answers_with(0), decode).ok is True
    broken = check_pair("hf", "vllm", answers_with(1), decode)
    assert broken.ok is False
    verdict = broken.verdict()
    assert verdict.startswith("WARNING") and "vllm" in verdict and "--dtype" in verdict and "token 0" in verdict


def test_an_early_near_tie_is_explained_and_reported():
    pair = check_pair("hf", "vllm", answers_with(1), decode)
    tie = with_tie_gaps(pair, lambda i, p: NEAR_TIE_NATS / 4)
    assert tie.ok is True and tie.prompts[0].near_tie and "near-tie" in tie.verdict()
    far = with_tie_gaps(pair, lambda i, p: NEAR_TIE_NATS * 5)
    assert far.ok is False and "nats below hf's choice" in far.verdict()


def test_skipped_check_says_why_and_is_neither_ok_nor_failed():
    report = AgreementReport([skipped("hf", "vllm", "skipped: dummy weights")])
    assert report.ok is None and "dummy" in report.verdicts()[0]
    assert report.to_dict()[0]["ok"] is None


def test_to_dict_holds_what_summary_json_promises():
    data = check_pair("hf", "vllm", answers_with(1), decode).to_dict()
    assert {"reference", "other", "ok", "prompts", "early_tokens"} <= set(data)
    prompt = data["prompts"][0]
    assert {"prompt", "matched_tokens", "total_tokens", "diverged_at", "ok"} <= set(prompt)
    assert isinstance(Agreement("hf", "vllm").to_dict()["prompts"], list)
