"""LoRA merging (`vidax.models.lora`) on tiny random transformers, with LoRA files written here:
the scaling, the key formats agreeing with each other, un-merging, stacking, and bad files.

Parity with diffusers' own LoRA loading is in tests/reference/test_lora_parity.py.
"""

import dataclasses
import json

import numpy as np
import pytest
from flax import nnx

from vidax.checkpoint import CheckpointError, export_state, save_file
from vidax.models import hunyuan, registry, wan
from vidax.models.lora import LoraSpec, merge_loras, unmerge_loras

WAN = wan.WanConfig(
    dim=32,
    num_layers=2,
    num_heads=2,
    ffn_dim=48,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    text_len=5,
    freq_dim=16,
    dtype="float32",
    param_dtype="float32",
)
HUNYUAN = hunyuan.HunyuanVideoConfig(
    num_heads=2,
    head_dim=8,
    num_layers=2,
    num_single_layers=2,
    num_refiner_layers=2,
    mlp_ratio=2.0,
    refiner_mlp_ratio=2.0,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    text_len=5,
    pooled_dim=12,
    freq_dim=16,
    rope_axes_dims=(2, 2, 4),
    dtype="float32",
    param_dtype="float32",
)
RANK, ALPHA = 4, 8.0

# Diffusers module -> the Wan reference / ComfyUI name (written out here, independently of
# vidax.models.lora; diffusers' own conversion checks it in the parity test).
WAN_ORIGINAL = {
    "blocks.{i}.attn1.to_q": "blocks.{i}.self_attn.q",
    "blocks.{i}.attn1.to_out.0": "blocks.{i}.self_attn.o",
    "blocks.{i}.attn2.to_k": "blocks.{i}.cross_attn.k",
    "blocks.{i}.attn2.to_v": "blocks.{i}.cross_attn.v",
    "blocks.{i}.ffn.net.0.proj": "blocks.{i}.ffn.0",
    "blocks.{i}.ffn.net.2": "blocks.{i}.ffn.2",
    "condition_embedder.time_proj": "time_projection.1",
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "patch_embedding": "patch_embedding",
    "proj_out": "head.head",
}
# HunyuanVideo reference name -> the diffusers modules it holds (fused: split by output rows).
HUNYUAN_ORIGINAL = {
    "img_in.proj": ["x_embedder.proj"],
    "vector_in.in_layer": ["time_text_embed.text_embedder.linear_1"],
    "txt_in.t_embedder.mlp.0": ["context_embedder.time_text_embed.timestep_embedder.linear_1"],
    "txt_in.individual_token_refiner.blocks.{i}.self_attn_qkv": [
        f"context_embedder.token_refiner.refiner_blocks.{{i}}.attn.{p}"
        for p in ("to_q", "to_k", "to_v")
    ],
    "txt_in.individual_token_refiner.blocks.{i}.adaLN_modulation.1": [
        "context_embedder.token_refiner.refiner_blocks.{i}.norm_out.linear"
    ],
    "double_blocks.{i}.img_attn_qkv": [
        f"transformer_blocks.{{i}}.attn.{p}" for p in ("to_q", "to_k", "to_v")
    ],
    "double_blocks.{i}.txt_attn_qkv": [
        f"transformer_blocks.{{i}}.attn.{p}" for p in ("add_q_proj", "add_k_proj", "add_v_proj")
    ],
    "double_blocks.{i}.txt_attn_proj": ["transformer_blocks.{i}.attn.to_add_out"],
    "double_blocks.{i}.img_mod.linear": ["transformer_blocks.{i}.norm1.linear"],
    "double_blocks.{i}.txt_mlp.fc2": ["transformer_blocks.{i}.ff_context.net.2"],
    "single_blocks.{i}.linear1": [
        f"single_transformer_blocks.{{i}}.{p}"
        for p in ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
    ],
    "single_blocks.{i}.linear2": ["single_transformer_blocks.{i}.proj_out"],
    "single_blocks.{i}.modulation.linear": ["single_transformer_blocks.{i}.norm.linear"],
    "final_layer.adaLN_modulation.1": ["norm_out.linear"],  # (shift, scale) vs (scale, shift)
}


def _spec(family):
    if family == "wan":
        return dataclasses.replace(registry.get("wan2.1-1.3b"), config=WAN)
    return dataclasses.replace(registry.get("hunyuanvideo"), config=HUNYUAN)


def _key_map(spec):
    return (wan if spec.family == "wan" else hunyuan).key_map(spec.config)


def _weights(model) -> dict[str, np.ndarray]:
    return {
        ".".join(str(k) for k in path): np.array(v.get_value())
        for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
    }


def _checkpoint_shapes(spec, model) -> dict[str, tuple]:
    """Diffusers parameter name -> shape, from the model's own export."""
    exported = export_state(nnx.state(model, nnx.Param), _key_map(spec))
    return {k: v.shape for k, v in exported.items()}


def _factors(shapes, modules, seed=0, rank=RANK):
    """Random (A, B) for each diffusers module of `modules` (every layer of "{i}" ones)."""
    rng = np.random.default_rng(seed)
    out = {}
    for template in modules:
        layers = range(2) if "{i}" in template else [None]
        for i in layers:
            module = template.format(i=i)
            shape = shapes[f"{module}.weight"]
            a = rng.standard_normal((rank, *shape[1:])).astype(np.float32) * 0.3
            b = rng.standard_normal((shape[0], rank) + (1,) * (len(shape) - 2)) * 0.3
            out[module] = (a, b.astype(np.float32))
    return out


def _diffusers_file(path, factors, alpha=ALPHA, metadata=None):
    tensors = {}
    for module, (a, b) in factors.items():
        tensors[f"transformer.{module}.lora_A.weight"] = a
        tensors[f"transformer.{module}.lora_B.weight"] = b
        if alpha is not None:
            tensors[f"transformer.{module}.alpha"] = np.array(alpha, np.float32)
    save_file(tensors, path, metadata)
    return path


def _layered(template, module):
    """("blocks.{i}.x", "blocks.1.x") -> 1; None if `module` is not of `template`."""
    if "{i}" not in template:
        return None if template != module else -1
    head, tail = template.split("{i}")
    if module.startswith(head) and module.endswith(tail):
        middle = module[len(head) : len(module) - len(tail)]
        return int(middle) if middle.isdigit() else None
    return None


def _wan_comfy_file(path, factors, underscore=False):
    tensors = {}
    for module, (a, b) in factors.items():
        for template, original in WAN_ORIGINAL.items():
            i = _layered(template, module)
            if i is not None:
                name = original.format(i=i)
                break
        name = "lora_unet_" + name.replace(".", "_") if underscore else "diffusion_model." + name
        tensors[f"{name}.lora_down.weight"] = a
        tensors[f"{name}.lora_up.weight"] = b
        tensors[f"{name}.alpha"] = np.array(ALPHA, np.float32)
    save_file(tensors, path)
    return path


def _hunyuan_original_file(path, factors, prefix="diffusion_model."):
    """The diffusers-named `factors` as one reference-named LoRA: a fused projection's factors
    become A = [A_q; A_k; A_v], B = blockdiag(B_q, B_k, B_v) and alpha x 3, the same delta."""
    tensors = {}
    for original, parts in HUNYUAN_ORIGINAL.items():
        for i in range(2) if "{i}" in original else [None]:
            names = [p.format(i=i) for p in parts]
            if names[0] not in factors:
                continue
            a = np.concatenate([factors[n][0] for n in names])
            bs = [factors[n][1] for n in names]
            b = np.zeros((sum(x.shape[0] for x in bs), a.shape[0], *bs[0].shape[2:]), np.float32)
            row = 0
            for k, x in enumerate(bs):
                b[row : row + x.shape[0], k * RANK : (k + 1) * RANK] = x
                row += x.shape[0]
            if original.startswith("final_layer.adaLN"):
                b = np.concatenate(np.split(b, 2)[::-1])
            name = prefix + original.format(i=i)
            if prefix == "lora_unet_":
                name = prefix + original.format(i=i).replace(".", "_")
            tensors[f"{name}.lora_A.weight"] = a
            tensors[f"{name}.lora_B.weight"] = b
            tensors[f"{name}.alpha"] = np.array(ALPHA * len(names), np.float32)
    save_file(tensors, path)
    return path


def _merged(spec, loras) -> dict[str, np.ndarray]:
    model = spec.build(seed=0)
    merge_loras(model, spec, loras)
    return _weights(model)


def _assert_same(got, want, atol=1e-6):
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=atol, rtol=0, err_msg=key)


@pytest.fixture(scope="module")
def wan_setup():
    spec = _spec("wan")
    model = spec.build(seed=0)
    return spec, _weights(model), _checkpoint_shapes(spec, model)


@pytest.fixture(scope="module")
def hunyuan_setup():
    spec = _spec("hunyuanvideo")
    model = spec.build(seed=0)
    return spec, _weights(model), _checkpoint_shapes(spec, model)


def test_parse():
    assert LoraSpec.parse("style.safetensors") == LoraSpec("style.safetensors", 1.0)
    assert LoraSpec.parse("dir/style.safetensors:0.5") == LoraSpec("dir/style.safetensors", 0.5)
    assert LoraSpec.parse("a.safetensors:-1e-1").scale == -0.1
    # A colon inside the path (no number after it) is part of the path.
    assert LoraSpec.parse("C:/lora/a.safetensors") == LoraSpec("C:/lora/a.safetensors")
    with pytest.raises(ValueError, match="not a finite number"):
        LoraSpec.parse("a.safetensors:nan")


def test_parse_rejects_a_bad_scale(tmp_path):
    (tmp_path / "a.safetensors").touch()
    with pytest.raises(ValueError, match="scale 'x' is not a number"):
        LoraSpec.parse(f"{tmp_path / 'a.safetensors'}:x")


def test_merge_adds_scale_times_alpha_over_rank_times_b_a(wan_setup, tmp_path):
    """W' = W + scale * alpha / rank * B @ A, in vidax's (in, out) kernel layout; the alpha of
    the file, or the rank where it has none."""
    spec, before, shapes = wan_setup
    factors = _factors(shapes, ["blocks.{i}.attn1.to_q", "proj_out"])
    with_alpha = _diffusers_file(tmp_path / "alpha.safetensors", factors)
    no_alpha = _diffusers_file(tmp_path / "plain.safetensors", factors, alpha=None)
    for path, factor in ((with_alpha, ALPHA / RANK), (no_alpha, 1.0)):
        got = _merged(spec, [LoraSpec(path, 0.5)])
        want = before["blocks.attn1.to_q.kernel"].copy()
        for layer in (0, 1):
            a, b = factors[f"blocks.{layer}.attn1.to_q"]
            want[layer] += 0.5 * factor * (b @ a).T
        np.testing.assert_allclose(got["blocks.attn1.to_q.kernel"], want, rtol=1e-6, atol=1e-6)
        a, b = factors["proj_out"]
        want = before["proj_out.kernel"] + 0.5 * factor * (b @ a).T
        np.testing.assert_allclose(got["proj_out.kernel"], want, rtol=1e-6, atol=1e-6)
        untouched = {k for k in before if "to_q" not in k and "proj_out.kernel" not in k}
        for key in untouched:
            np.testing.assert_array_equal(got[key], before[key], err_msg=key)


def test_alpha_from_diffusers_metadata(wan_setup, tmp_path):
    """Without alpha tensors, PEFT's lora_alpha / r (and alpha_pattern) from the metadata."""
    spec, before, shapes = wan_setup
    factors = _factors(shapes, ["blocks.{i}.attn1.to_q", "proj_out"])
    peft = {"r": RANK, "lora_alpha": 8, "alpha_pattern": {"proj_out": 2}, "use_dora": False}
    metadata = {f"transformer.{k}": v for k, v in peft.items()}
    path = _diffusers_file(
        tmp_path / "lora.safetensors",
        factors,
        alpha=None,
        metadata={"lora_adapter_metadata": json.dumps(metadata)},
    )
    got = _merged(spec, [path])
    a, b = factors["proj_out"]
    np.testing.assert_allclose(
        got["proj_out.kernel"], before["proj_out.kernel"] + 2 / RANK * (b @ a).T, atol=1e-6
    )
    a, b = factors["blocks.0.attn1.to_q"]
    want = before["blocks.attn1.to_q.kernel"][0] + 8 / RANK * (b @ a).T
    np.testing.assert_allclose(got["blocks.attn1.to_q.kernel"][0], want, atol=1e-6)


@pytest.mark.parametrize(
    "prefix, down, up",
    [
        ("", "lora_A", "lora_B"),
        ("base_model.model.", "lora_A", "lora_B"),
        ("transformer.", "lora_down", "lora_up"),
        ("transformer.", "lora.down", "lora.up"),
    ],
)
def test_diffusers_name_spellings_give_the_same_weights(wan_setup, tmp_path, prefix, down, up):
    spec, _, shapes = wan_setup
    factors = _factors(shapes, WAN_ORIGINAL)
    want = _merged(spec, [_diffusers_file(tmp_path / "diffusers.safetensors", factors)])
    tensors = {}
    for module, (a, b) in factors.items():
        tensors |= {f"{prefix}{module}.{down}.weight": a, f"{prefix}{module}.{up}.weight": b}
        tensors[f"{prefix}{module}.alpha"] = np.array(ALPHA, np.float32)
    save_file(tensors, tmp_path / "spelled.safetensors")
    _assert_same(_merged(spec, [tmp_path / "spelled.safetensors"]), want)


@pytest.mark.parametrize("underscore", [False, True], ids=["comfyui", "kohya"])
def test_wan_original_names_give_the_same_weights(wan_setup, tmp_path, underscore):
    spec, _, shapes = wan_setup
    factors = _factors(shapes, WAN_ORIGINAL)
    want = _merged(spec, [_diffusers_file(tmp_path / "diffusers.safetensors", factors)])
    comfy = _wan_comfy_file(tmp_path / "comfy.safetensors", factors, underscore)
    _assert_same(_merged(spec, [comfy]), want)


@pytest.mark.parametrize("prefix", ["diffusion_model.", "lora_unet_"])
def test_hunyuan_original_names_give_the_same_weights(hunyuan_setup, tmp_path, prefix):
    """Fused qkv / linear1 projections split by rows, the head's modulation halves swapped."""
    spec, before, shapes = hunyuan_setup
    modules = sorted({m for parts in HUNYUAN_ORIGINAL.values() for m in parts})
    factors = _factors(shapes, modules)
    want = _merged(spec, [_diffusers_file(tmp_path / "diffusers.safetensors", factors)])
    original = _hunyuan_original_file(tmp_path / "original.safetensors", factors, prefix)
    got = _merged(spec, [original])
    _assert_same(got, want)
    changed = [k for k in before if not np.array_equal(want[k], before[k])]
    assert {"single_blocks.to_q.kernel", "single_blocks.proj_mlp.kernel", "norm_out.kernel"} <= {
        *changed
    }


def test_merge_then_unmerge_restores_the_weights(wan_setup, tmp_path):
    spec, before, shapes = wan_setup
    loras = [
        LoraSpec(_diffusers_file(tmp_path / "a.safetensors", _factors(shapes, WAN_ORIGINAL)), 0.8),
        LoraSpec(_wan_comfy_file(tmp_path / "b.safetensors", _factors(shapes, WAN_ORIGINAL, 1))),
    ]
    model = spec.build(seed=0)
    merge_loras(model, spec, loras)
    merged = _weights(model)
    assert not np.allclose(merged["blocks.ffn.proj_in.kernel"], before["blocks.ffn.proj_in.kernel"])
    unmerge_loras(model, spec, loras)
    _assert_same(_weights(model), before, atol=1e-5)


def test_two_loras_add_up(wan_setup, tmp_path):
    spec, before, shapes = wan_setup
    a = _diffusers_file(tmp_path / "a.safetensors", _factors(shapes, WAN_ORIGINAL, seed=1))
    b = _diffusers_file(tmp_path / "b.safetensors", _factors(shapes, ["proj_out"], seed=2))
    both = _merged(spec, [LoraSpec(a, 0.7), f"{b}:-1.5"])
    only_a, only_b = _merged(spec, [LoraSpec(a, 0.7)]), _merged(spec, [LoraSpec(b, -1.5)])
    _assert_same(both, {k: only_a[k] + only_b[k] - before[k] for k in before}, atol=1e-5)
    assert not np.allclose(both["proj_out.kernel"], only_a["proj_out.kernel"])


def test_full_deltas(wan_setup, tmp_path):
    """ComfyUI's `.diff` / `.diff_b`: weight and bias deltas added times the scale, no alpha;
    the reference's norm3 is diffusers' norm2, its per-block modulation the scale_shift_table."""
    spec, before, shapes = wan_setup
    rng = np.random.default_rng(0)
    tensors = {
        "diffusion_model.blocks.1.self_attn.q.diff": rng.standard_normal((32, 32)),
        "diffusion_model.blocks.1.self_attn.q.diff_b": rng.standard_normal(32),
        "diffusion_model.blocks.0.norm3.diff": rng.standard_normal(32),
        "diffusion_model.blocks.0.cross_attn.norm_k.diff": rng.standard_normal(32),
        "diffusion_model.blocks.0.modulation.diff": rng.standard_normal((1, 6, 32)),
        "diffusion_model.head.head.diff_b": rng.standard_normal(shapes["proj_out.bias"]),
    }
    tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
    save_file(tensors, tmp_path / "diff.safetensors")
    got = _merged(spec, [LoraSpec(tmp_path / "diff.safetensors", 2.0)])
    d = {k.removeprefix("diffusion_model."): 2 * v for k, v in tensors.items()}
    expected = {
        ("blocks.attn1.to_q.kernel", 1): d["blocks.1.self_attn.q.diff"].T,
        ("blocks.attn1.to_q.bias", 1): d["blocks.1.self_attn.q.diff_b"],
        ("blocks.norm2.scale", 0): d["blocks.0.norm3.diff"],
        ("blocks.attn2.norm_k.scale", 0): d["blocks.0.cross_attn.norm_k.diff"],
        ("blocks.scale_shift_table", 0): d["blocks.0.modulation.diff"][0],
        ("proj_out.bias", None): d["head.head.diff_b"],
    }
    for (name, layer), delta in expected.items():
        want = before[name].copy()
        if layer is None:
            want += delta
        else:
            want[layer] += delta
        np.testing.assert_allclose(got[name], want, atol=1e-6, err_msg=name)


def test_bfloat16_weights_stay_bfloat16(tmp_path):
    spec = dataclasses.replace(
        _spec("wan"), config=dataclasses.replace(WAN, param_dtype="bfloat16")
    )
    model = spec.build(seed=0)
    before = _weights(model)
    factors = _factors(_checkpoint_shapes(spec, model), ["proj_out"])
    merge_loras(model, spec, [_diffusers_file(tmp_path / "a.safetensors", factors)])
    got = _weights(model)["proj_out.kernel"]
    assert got.dtype == before["proj_out.kernel"].dtype
    a, b = factors["proj_out"]
    want = before["proj_out.kernel"].astype(np.float32) + ALPHA / RANK * (b @ a).T
    np.testing.assert_array_equal(got, want.astype(got.dtype))  # one rounding, from float32


def _bad(tensors):
    return {k: np.asarray(v, np.float32) for k, v in tensors.items()}


A, B = np.ones((4, 32)), np.ones((32, 4))
BAD_FILES = {
    "no weight": (
        {
            "transformer.blocks.0.attn1.to_x.lora_A.weight": A,
            "transformer.blocks.0.attn1.to_x.lora_B.weight": B,
        },
        r"'transformer.blocks.0.attn1.to_x.lora_\w.weight' maps to no weight of the wan",
    ),
    "layer out of range": (
        {
            "diffusion_model.blocks.7.self_attn.q.lora_down.weight": A,
            "diffusion_model.blocks.7.self_attn.q.lora_up.weight": B,
        },
        r"maps to 'blocks.7.attn1.to_q.weight', no weight of the wan transformer",
    ),
    "image-to-video key": (
        {
            "diffusion_model.blocks.0.cross_attn.k_img.lora_down.weight": A,
            "diffusion_model.blocks.0.cross_attn.k_img.lora_up.weight": B,
        },
        r"k_img.lora_\w+.weight' maps to no weight",
    ),
    "shape": (
        {"transformer.proj_out.lora_A.weight": A, "transformer.proj_out.lora_B.weight": B},
        r"'transformer.proj_out.lora_B.weight' gives a \(32, 32\) delta for 'proj_out.weight' of "
        r"shape \(16, 32\)",
    ),
    "rank": (
        {
            "transformer.proj_out.lora_A.weight": A,
            "transformer.proj_out.lora_B.weight": np.ones((16, 3)),
        },
        r"rank mismatch: 'transformer.proj_out.lora_A.weight' \(4, 32\) and .* \(16, 3\)",
    ),
    "non-finite": (
        {
            "transformer.blocks.0.attn1.to_q.lora_A.weight": A * np.nan,
            "transformer.blocks.0.attn1.to_q.lora_B.weight": B,
        },
        r"'transformer.blocks.0.attn1.to_q.lora_A.weight' has non-finite values",
    ),
    "unknown format": (
        {"blocks.0.attn1.to_q.weight": np.ones((32, 32))},
        r"not a LoRA file in a known format .*first key 'blocks.0.attn1.to_q.weight'",
    ),
    "DoRA": (
        {
            "transformer.blocks.0.attn1.to_q.lora_A.weight": A,
            "transformer.blocks.0.attn1.to_q.lora_B.weight": B,
            "transformer.blocks.0.attn1.to_q.lora_magnitude_vector": np.ones(32),
        },
        r"unsupported LoRA keys \['transformer.blocks.0.attn1.to_q.lora_magnitude_vector'\]",
    ),
    "A without B": (
        {"transformer.blocks.0.attn1.to_q.lora_A.weight": A},
        r"'transformer.blocks.0.attn1.to_q.lora_A.weight' without its lora_B/lora_up tensor",
    ),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_files_are_one_line_errors_and_change_nothing(wan_setup, tmp_path, case):
    spec, before, shapes = wan_setup
    tensors, message = BAD_FILES[case]
    save_file(_bad(tensors), tmp_path / "bad.safetensors")
    good = _diffusers_file(tmp_path / "good.safetensors", _factors(shapes, WAN_ORIGINAL))
    model = spec.build(seed=0)
    with pytest.raises(CheckpointError, match=message) as error:
        merge_loras(model, spec, [good, tmp_path / "bad.safetensors"])
    assert "\n" not in str(error.value)
    assert str(tmp_path / "bad.safetensors") in str(error.value)
    _assert_same(_weights(model), before, atol=0)  # the good file was not merged either


def test_missing_file(wan_setup, tmp_path):
    spec = wan_setup[0]
    with pytest.raises(FileNotFoundError, match="LoRA not found"):
        merge_loras(spec.build(), spec, [tmp_path / "nope.safetensors"])


def test_unsupported_peft_options(wan_setup, tmp_path):
    spec, _, shapes = wan_setup
    metadata = {"transformer.r": RANK, "transformer.lora_alpha": 8, "transformer.use_dora": True}
    path = _diffusers_file(
        tmp_path / "dora.safetensors",
        _factors(shapes, ["proj_out"]),
        alpha=None,
        metadata={"lora_adapter_metadata": json.dumps(metadata)},
    )
    with pytest.raises(CheckpointError, match="PEFT option use_dora=True is not supported"):
        merge_loras(spec.build(), spec, [path])
