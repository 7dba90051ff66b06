"""bench.notebook_kernel's reading of an executed notebook: every line its cells show, and which are engine noise."""

from types import SimpleNamespace

from bench.notebook_kernel import noise, outputs_text

BAR = "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  7.4it/s]"


def test_every_shown_line_is_read_and_only_engine_log_lines_and_progress_bars_count_as_noise():
    notebook = SimpleNamespace(cells=[
        {"cell_type": "markdown"},
        {"outputs": [{"output_type": "stream", "text": "ratio 2.3x\nINFO 11-28 engine.py: started\n"}]},
        {"outputs": [{"output_type": "stream", "text": f"{BAR}\n"}]},
        {"outputs": [{"output_type": "execute_result", "data": {"text/plain": "<Answer: vLLM wasted more here>"}}]},
        {"outputs": [{"output_type": "error", "traceback": ["Traceback", "WARNING force killing"]}]},
    ])
    lines = outputs_text(notebook)
    assert lines[0] == "ratio 2.3x" and "<Answer: vLLM wasted more here>" in lines and "Traceback" in lines
    assert noise(lines) == ["INFO 11-28 engine.py: started", BAR, "WARNING force killing"]
    assert noise(["The information you asked for", "HF kept 22% holding tokens"]) == []
