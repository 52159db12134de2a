"""Attention beyond Llama's and MTP modules travel exactly into the Megatron export (head_dim,
multi-latent attention, sliding windows, sinks, --mtp-num-layers), parsed back with Megatron's
own argument types; what an export cannot write is refused in one line
(planner.engines.runnable)."""
import ast
import dataclasses

from planner.catalog import get_model
from planner.export import export
from tests.test_export import megatron_tokens
from tests.test_moe_export import hand_plan, moe_parser


def tuple_type(x):
    """megatron/training/arguments.py tuple_type: "a,b" -> (a, b)."""
    return tuple(int(v) for v in x.split(","))


def freq_type(x):
    """arguments.py moe_freq_type, also --window-attn-skip-freq's type: an int or a list."""
    try:
        return int(x)
    except ValueError:
        return ast.literal_eval(x)


def attention_parser():
    """The attention flags with Megatron-Core's types and defaults (arguments.py,
    _add_network_size_args and _add_mla_args)."""
    ap = moe_parser()
    a = ap.add_argument
    a("--kv-channels", type=int, default=None)
    a("--multi-latent-attention", action="store_true")
    a("--q-lora-rank", type=int, default=None)
    a("--kv-lora-rank", type=int, default=32)
    a("--qk-head-dim", type=int, default=128)
    a("--qk-pos-emb-head-dim", type=int, default=64)
    a("--v-head-dim", type=int, default=128)
    a("--qk-layernorm", action="store_true")
    a("--window-size", type=tuple_type, default=None)
    a("--window-attn-skip-freq", type=freq_type, default=None)
    a("--softmax-type", type=str, default="vanilla", choices=["vanilla", "off-by-one", "learnable"])
    a("--mtp-num-layers", type=int, default=None)   # _add_network_size_args
    return ap


def parsed(plan):
    return attention_parser().parse_args(megatron_tokens(export(plan, "megatron")))


def megatron_windowed_layers(a, num_layers):
    """Megatron's reading of --window-size / --window-attn-skip-freq (TransformerConfig
    window_attn_skip_freq: an int N puts a full-attention layer after every N-1 windowed ones;
    None windows every layer)."""
    if a.window_size is None:
        return [False] * num_layers
    f = a.window_attn_skip_freq
    if f is None:
        return [True] * num_layers
    if isinstance(f, int):
        return [(i + 1) % f != 0 for i in range(num_layers)]
    return [not x for x in f]


def test_head_dim_is_kv_channels():
    m = get_model("qwen3-30b-a3b")            # 32 heads of 128 on a 2048-wide model
    assert m.head_dim * m.num_heads != m.hidden
    a = parsed(hand_plan(m, "h100x16", tp=2, pp=1, dp=8, ep=8, etp=1))
    assert a.kv_channels == m.head_dim == 128
    assert not a.multi_latent_attention and a.window_size is None


def test_sliding_windows_and_sinks_of_gpt_oss():
    m = get_model("gpt-oss-20b")
    a = parsed(hand_plan(m, "h100x16", tp=1, pp=2, dp=8, ep=8, etp=1))
    assert a.window_size == (m.sliding_window, 0)
    assert megatron_windowed_layers(a, m.num_layers) == [m.sliding_layer(i)
                                                         for i in range(m.num_layers)]
    assert a.softmax_type == "learnable"
    assert a.kv_channels == m.head_dim


def test_multi_latent_attention_of_a_deepseek_shape():
    m = dataclasses.replace(get_model("deepseek-v3"), mtp_layers=0)
    a = parsed(hand_plan(m, "h100x256", tp=1, pp=16, dp=16, ep=16, etp=1))
    assert a.multi_latent_attention and a.qk_layernorm
    assert (a.q_lora_rank, a.kv_lora_rank) == (m.q_lora_rank, m.kv_lora_rank) == (1536, 512)
    assert (a.qk_head_dim, a.qk_pos_emb_head_dim, a.v_head_dim) == (
        m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (128, 64, 128)


def test_mtp_modules_are_written_as_mtp_num_layers():
    m = get_model("deepseek-v3")               # one MTP module
    a = parsed(hand_plan(m, "h100x256", tp=1, pp=16, dp=16, ep=16, etp=1))
    assert a.mtp_num_layers == m.mtp_layers == 1
    no_mtp = parsed(hand_plan(dataclasses.replace(m, mtp_layers=0), "h100x256", tp=1, pp=16,
                              dp=16, ep=16, etp=1))
    assert no_mtp.mtp_num_layers is None       # Megatron's default: no MTP


def test_an_uneven_layout_puts_the_mtp_layers_on_the_last_stage():
    """With --pipeline-model-parallel-layout Megatron builds MTP only where the layout has "m"
    (multi_token_prediction.py get_mtp_num_layers_to_build): the last stage, before the loss."""
    from planner.plan import make_stages
    from tests.test_export import expand_layout
    m = dataclasses.replace(get_model("deepseek-v3"), mtp_layers=2)
    plan = hand_plan(m, "h100x256", tp=1, pp=4, dp=64, ep=16, etp=1)
    plan.stages = make_stages(m.num_layers, 4, 1, [14, 16, 18, 13])
    a = parsed(plan)
    assert a.mtp_num_layers == 2
    layout = a.pipeline_model_parallel_layout
    assert layout is not None and layout.endswith("|t*13m*2L")
    assert [st.count("t") for st in expand_layout(layout.replace("m*2", ""))] == [14, 16, 18, 13]
