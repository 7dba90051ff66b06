"""bench.notebook_kernel's reading of an executed notebook: every line its cells show, and which are engine noise
(lab.notebook.noise: anything on stderr, any other line shaped like a log record, a warning or a progress bar)."""

from types import SimpleNamespace

from bench.notebook_kernel import noise, outputs_text

BAR = "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  7.4it/s]"
INFO = "INFO 11-28 engine.py: started"
TRITON = "Triton is installed, but doesn't include CPU backend. Disabling Triton."  # vLLM's, printed bare on stderr


def test_every_shown_line_is_read_and_only_engine_log_lines_and_progress_bars_count_as_noise():
    notebook = SimpleNamespace(cells=[
        {"cell_type": "markdown"},
        {"outputs": [{"output_type": "stream", "name": "stdout", "text": f"ratio 2.3x\n{INFO}\n"}]},
        {"outputs": [{"output_type": "stream", "name": "stdout", "text": f"{BAR}\n"}]},
        {"outputs": [{"output_type": "stream", "name": "stderr", "text": f"{TRITON}\n"}]},
        {"outputs": [{"output_type": "execute_result", "data": {"text/plain": "<Answer: vLLM wasted more here>"}}]},
        {"outputs": [{"output_type": "error", "traceback": ["Traceback", "WARNING force killing"]}]},
    ])
    out, err = outputs_text(notebook)
    assert out.startswith("ratio 2.3x") and "<Answer: vLLM wasted more here>" in out and "Traceback" in out
    assert noise(out, err) == [TRITON, INFO, BAR, "WARNING force killing"]
    assert noise("The information you asked for\nHF kept 22% holding tokens") == []
