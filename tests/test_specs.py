"""Catalog and config parsing."""
import json

import pytest

from planner.catalog import get_cluster, get_gpu, get_model
from planner.catalog.gpus import GPUS
from planner.catalog.models import ALIASES, MODELS
from planner.errors import BadInput
from planner.catalog.hf import model_from_hf_config


@pytest.mark.parametrize("name, billions", [
    ("llama2-7b", 6.74), ("llama2-13b", 13.02), ("llama2-70b", 68.98), ("llama3-8b", 8.03),
    ("llama3-70b", 70.55), ("llama3-405b", 405.85), ("gpt3-175b", 174.6)])
def test_catalog_parameter_counts_match_published(name, billions):
    assert get_model(name).num_params() / 1e9 == pytest.approx(billions, abs=0.05)


def test_aliases():
    for alias, target in ALIASES.items():
        assert get_model(alias) is MODELS[target]
    assert get_model("LLAMA70B").name == "llama3-70b"


def test_clusters_by_name():
    c = get_cluster("h100x32")
    assert (c.num_gpus, c.gpus_per_node, c.gpu.name, c.num_nodes) == (32, 8, "h100", 4)
    assert get_cluster("cpux2").gpus_per_node == 2
    for g in ("a100", "a100-40g", "h100", "h200", "b200", "cpu"):
        assert get_cluster(f"{g}x8").gpu is GPUS[g]
    assert get_gpu("a100").memory_gib == 80 and get_gpu("a100-40g").memory_gib == 40


@pytest.mark.parametrize("bad", ["h100", "h100x0", "tpux8", "x8"])
def test_bad_cluster_names(bad):
    with pytest.raises(BadInput):
        get_cluster(bad)


def test_unknown_model_lists_known():
    with pytest.raises(BadInput, match="llama70b"):
        get_model("gpt5")


HF = {
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 688,
              "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 512, "tie_word_embeddings": True, "hidden_act": "silu"},
    "mistral": {"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512,
                "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000},
    "qwen2": {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512,
              "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 1000},
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 1000,
             "n_positions": 256},
    "gpt_neox": {"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 128,
                 "intermediate_size": 512, "num_attention_heads": 4, "vocab_size": 1000},
    "bloom": {"model_type": "bloom", "n_layer": 2, "hidden_size": 128, "n_head": 4, "vocab_size": 1000},
    "nemotron": {"model_type": "nemotron", "num_hidden_layers": 2, "hidden_size": 128,
                 "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "vocab_size": 1000, "hidden_act": "relu2"},
}


def test_hf_configs_map_architecture():
    m = {k: model_from_hf_config(v, k) for k, v in HF.items()}
    assert m["llama"].gated_mlp and m["llama"].num_kv_heads == 2 and m["llama"].tied_embeddings
    assert m["qwen2"].attn_bias and not m["llama"].attn_bias
    assert not m["gpt2"].gated_mlp and m["gpt2"].activation == "gelu" and m["gpt2"].norm == "layernorm"
    assert m["gpt2"].ffn_hidden == 4 * 128 and m["gpt2"].position == "learned" and m["gpt2"].tied_embeddings
    assert m["gpt_neox"].parallel_residual and m["gpt_neox"].position == "rope"
    assert m["bloom"].position == "alibi"
    assert m["nemotron"].activation == "relu2" and not m["nemotron"].gated_mlp


def test_config_file_paths(tmp_path):
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(HF["llama"]))
    assert get_model(str(p)).num_layers == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(BadInput, match="not valid JSON"):
        get_model(str(bad))
    other = tmp_path / "t5.json"
    other.write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(BadInput, match="not supported"):
        get_model(str(other))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**HF["llama"], "num_attention_heads": 7}))
    with pytest.raises(BadInput, match="divisible"):
        get_model(str(broken))
    with pytest.raises(BadInput, match="no such file"):
        get_model(str(tmp_path / "missing.json"))


def test_cluster_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"name": "mine", "gpu": "h100", "num_gpus": 16, "gpus_per_node": 4,
                             "internode_gbps_per_gpu": 25.0}))
    c = get_cluster(str(p))
    assert (c.num_gpus, c.gpus_per_node, c.gpu.internode_gbps_per_gpu) == (16, 4, 25.0)
    assert c.gpu.peak_tflops == GPUS["h100"].peak_tflops
    p.write_text(json.dumps({"gpu": "h100"}))
    with pytest.raises(BadInput, match="missing field"):
        get_cluster(str(p))


# ---- the base modules import nothing above them ----------------------------------------------

# a module: the planner modules it may import, at the top or inside a function (an import in a
# function hides a loop, it does not remove it)
BASE_IMPORTS = {
    "planner/vocab.py": set(),
    "planner/layout.py": {"planner.errors"},
    "planner/power.py": {"planner.errors"},
    "planner/specs.py": {"planner.limits", "planner.filecheck", "planner.errors", "planner.power"},
    "planner/cost/__init__.py": set(),
}


@pytest.mark.parametrize("path", sorted(BASE_IMPORTS))
def test_base_modules_import_nothing_that_imports_them(path):
    """specs (the types), vocab (the plan's vocabularies), layout (stages) and the cost package
    import no catalog, plan or cost module: nothing that imports them back."""
    import ast
    from pathlib import Path
    tree = ast.parse((Path(__file__).parent.parent / path).read_text())
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            named |= ({f"{node.module}.{a.name}" for a in node.names} if node.module == "planner"
                      else {node.module})
    assert {m for m in named if m.split(".")[0] == "planner"} == BASE_IMPORTS[path]


def test_a_cost_module_loads_without_the_stage_model():
    """`planner.cost.comm` loads the types it prices, not cost.stage and the whole model."""
    import subprocess
    import sys
    code = ("import sys, planner.cost.comm; "
            "print(' '.join(m for m in sys.modules if m.startswith('planner.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(out.stdout.split()) == {"planner.cost", "planner.cost.comm", "planner.specs",
                                       "planner.filecheck", "planner.limits", "planner.errors",
                                       "planner.power"}


def test_every_hf_model_type_has_one_family_reader():
    from planner.catalog.hf import FAMILIES, HF_MODEL_TYPES
    types = [t for family in FAMILIES for t in family.MODEL_TYPES]
    assert sorted(types) == sorted(HF_MODEL_TYPES) and len(set(types)) == len(types)
