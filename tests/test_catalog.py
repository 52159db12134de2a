"""Catalog models added for issue 26: their parameter counts against the figures their model
cards / reports publish (independent of the shapes typed here), and long context plans."""

import pytest

from cli_helpers import run
from planner.catalog import get_model

# (model, published parameters in billions, source)
PUBLISHED_B = [
    ("llama3.1-8b", 8.03, "Llama-3.1-8B card: 8.03B (safetensors)"),
    ("llama3.1-70b", 70.6, "Llama-3.1-70B card: 70.6B"),
    ("llama3.1-405b", 405.9, "Llama-3.1-405B card: 406B"),
    ("llama3.2-1b", 1.24, "Llama-3.2-1B card: 1.23B (safetensors 1.24B)"),
    ("llama3.2-3b", 3.21, "Llama-3.2-3B card: 3.21B"),
    ("llama3.3-70b", 70.6, "Llama-3.3-70B-Instruct card: 70.6B"),
    ("qwen2.5-0.5b", 0.49, "Qwen2.5-0.5B card: 0.49B"),
    ("qwen2.5-1.5b", 1.54, "Qwen2.5-1.5B card: 1.54B"),
    ("qwen2.5-3b", 3.09, "Qwen2.5-3B card: 3.09B"),
    ("qwen2.5-7b", 7.61, "Qwen2.5-7B card: 7.61B"),
    ("qwen2.5-14b", 14.7, "Qwen2.5-14B card: 14.7B"),
    ("qwen2.5-72b", 72.7, "Qwen2.5-72B card: 72.7B"),
    ("qwen3-0.6b", 0.6, "Qwen3-0.6B card: 0.6B"),
    ("qwen3-1.7b", 1.7, "Qwen3-1.7B card: 1.7B"),
    ("qwen3-4b", 4.0, "Qwen3-4B card: 4.0B"),
    ("qwen3-8b", 8.2, "Qwen3-8B card: 8.2B"),
    ("qwen3-14b", 14.8, "Qwen3-14B card: 14.8B"),
    ("qwen3-32b", 32.8, "Qwen3-32B card: 32.8B"),
    ("deepseek-v2-lite", 15.7, "DeepSeek-V2-Lite card: 15.7B total"),
]


@pytest.mark.parametrize("name,billions,source", PUBLISHED_B)
def test_parameter_count_matches_the_published_figure(name, billions, source):
    got = get_model(name).num_params() / 1e9
    decimals = len(repr(billions).split(".")[1])
    # the cards round or truncate to the digits they show (Qwen2.5-7B: 7,615,616,512 in its
    # safetensors, "7.61B" on its card)
    assert abs(got - billions) < 10 ** -decimals, (source, got)


def test_llama31_reaches_128k_and_the_old_names_stay():
    assert get_model("llama3.1-70b").max_seq_len == 131072
    assert get_model("llama70b").name == "llama3-70b"
    assert get_model("llama3-70b").max_seq_len == 8192


def test_llama31_70b_plans_at_128k_on_64_h100s(capsys):
    code, out, err = run(capsys, "--model", "llama3.1-70b", "--cluster", "h100x64",
                         "--seq-len", "131072", limit_s=30)
    assert code == 0, err
    assert "seq_len=131072" in out
