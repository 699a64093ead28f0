"""LoRA merged into vidax's weights vs diffusers running the same LoRA file through PEFT.

Each LoRA is trained-shaped but random: PEFT adds it to a tiny diffusers transformer, its
factors are randomised (PEFT starts B at zero, a LoRA that changes nothing), and diffusers'
`save_lora_weights` writes it (with its PEFT config as metadata). diffusers then loads that file
into the reference model with `load_lora_adapter`; vidax merges it into the same base weights.
"""

import copy
import dataclasses

import jax
import numpy as np
import pytest

from tests.reference import test_hunyuan15_parity as hunyuan15_ref
from tests.reference import test_hunyuan_parity as hunyuan_ref
from tests.reference import test_wan_parity as wan_ref
from tests.reference._torch import assert_close, to_numpy

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
peft = pytest.importorskip("peft")

from peft import LoraConfig  # noqa: E402
from peft.utils import get_peft_model_state_dict  # noqa: E402

from vidax.checkpoint import save_file  # noqa: E402
from vidax.models import hunyuan, hunyuan15, registry, wan  # noqa: E402
from vidax.models.lora import LoraSpec, merge_loras  # noqa: E402

pytestmark = [
    pytest.mark.reference,
    # PEFT on a LoRA with lora_bias (a 1-D B bias it takes for an unsharded tensor), and on a
    # second adapter added to one model: expected here.
    pytest.mark.filterwarnings("ignore:Adapter 'new'.*invalid shape"),
    pytest.mark.filterwarnings("ignore:Already found a `peft_config` attribute"),
]

WAN_SPEC = dataclasses.replace(registry.get("wan2.1-1.3b"), config=wan_ref.CONFIG)
HUNYUAN_SPEC = dataclasses.replace(registry.get("hunyuanvideo"), config=hunyuan_ref.CONFIG)
HUNYUAN15_SPEC = dataclasses.replace(registry.get("hunyuanvideo1.5"), config=hunyuan15_ref.CONFIG)
# Every Linear of the blocks and the embedders; a rank and an alpha of their own for two.
WAN_LORA = LoraConfig(
    r=4,
    lora_alpha=8,
    rank_pattern={"attn2.to_v": 2},
    alpha_pattern={"proj_out": 2},
    target_modules=[
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "net.0.proj",
        "net.2",
        "proj_out",
        "time_proj",
        "linear_1",
        "linear_2",
    ],
)
# The patch-embedding Conv3d and PEFT's lora_bias (B with a bias), at another rank and alpha.
WAN_LORA_2 = LoraConfig(
    r=2,
    lora_alpha=3,
    lora_bias=True,
    target_modules=["patch_embedding", "attn2.to_k", "ffn.net.2"],
)
HUNYUAN_LORA = LoraConfig(
    r=4,
    lora_alpha=8,
    target_modules=[
        "proj",  # x_embedder's Conv3d
        "proj_in",
        "linear_1",
        "linear_2",
        "linear",  # every adaLN modulation
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_add_out",
        "proj_mlp",
        "proj_out",
        "net.0.proj",
        "net.2",
    ],
)


def _lora_file(reference_model, pipeline, config: LoraConfig, path, seed: int):
    """A random LoRA of `config` for a fresh `reference_model()`, as `pipeline` saves it."""
    model = reference_model()
    model.add_adapter(copy.deepcopy(config), adapter_name="new")
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".new." in name:
                p.copy_(torch.randn_like(p) * 0.2)
    state = get_peft_model_state_dict(model, adapter_name="new")
    pipeline.save_lora_weights(
        path,
        transformer_lora_layers=state,
        transformer_lora_adapter_metadata=model.peft_config["new"].to_dict(),
    )
    return path / "pytorch_lora_weights.safetensors"


@pytest.fixture(scope="module")
def wan_models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wan_lora")
    make = lambda: wan_ref._reference_model(wan_ref.CONFIG)
    ref = make()
    ref.save_pretrained(tmp / "base", safe_serialization=True)
    files = {
        "a": _lora_file(make, diffusers.WanPipeline, WAN_LORA, tmp / "a", 1),
        "b": _lora_file(make, diffusers.WanPipeline, WAN_LORA_2, tmp / "b", 2),
    }
    for name, path in files.items():
        _load_lora(ref, diffusers.WanPipeline, path, name)
    files["comfy"] = _wan_comfy_file(ref, "a", files["a"], tmp / "comfy.safetensors")
    _load_lora(ref, diffusers.WanPipeline, files["comfy"], "comfy")  # diffusers converts it
    return ref, tmp / "base", files


def _load_lora(ref, pipeline, path, name: str) -> None:
    """What `pipeline.load_lora_weights(path, adapter_name=name)` does to its transformer `ref`
    (`ref.load_lora_adapter(path)` would drop the PEFT config saved with the file)."""
    state, metadata = pipeline.lora_state_dict(path, return_lora_metadata=True)
    pipeline.load_lora_into_transformer(
        state, transformer=ref, adapter_name=name, metadata=metadata
    )


def _wan_comfy_file(ref, adapter: str, path, out):
    """The diffusers-format LoRA at `path` in the Wan reference's (ComfyUI) names, with alpha
    tensors in the blocks (elsewhere diffusers' converter takes none: B carries alpha / rank)."""
    import safetensors.torch

    renames = [
        ("attn1.to_out.0", "self_attn.o"),
        ("attn2.to_out.0", "cross_attn.o"),
        ("attn1.to_", "self_attn."),
        ("attn2.to_", "cross_attn."),
        ("ffn.net.0.proj", "ffn.0"),
        ("ffn.net.2", "ffn.2"),
        ("condition_embedder.time_proj", "time_projection.1"),
        ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
        ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
        ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
        ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
        ("proj_out", "head.head"),
    ]
    tensors = {}
    for key, value in safetensors.torch.load_file(path).items():
        module, kind = key.removeprefix("transformer.").split(".lora_")
        scaling = ref.get_submodule(module).scaling[adapter]  # PEFT's alpha / r of the module
        name = module
        for ours, theirs in renames:
            name = name.replace(ours, theirs)
        up = "up" if kind.startswith("B") else "down"
        if module.startswith("blocks.") and up == "down":  # alpha = scaling * rank
            tensors[f"diffusion_model.{name}.alpha"] = np.array(
                scaling * value.shape[0], np.float32
            )
        elif not module.startswith("blocks.") and up == "up":
            value = value * scaling
        tensors[f"diffusion_model.{name}.lora_{up}.weight"] = value.numpy()
    save_file(tensors, out)
    return out


def _wan_reference(ref, x, ts, ctx):
    with torch.no_grad():
        out = ref(
            torch.from_numpy(x).permute(0, 4, 1, 2, 3),
            torch.from_numpy(ts),
            torch.from_numpy(ctx),
            return_dict=False,
        )[0]
    return to_numpy(out.permute(0, 2, 3, 4, 1))


def _compare(forward, want, base, what):
    got = np.asarray(jax.jit(forward)())
    # The LoRA changes the output a lot: a merge that did nothing could not pass.
    assert np.abs(want - base).max() > 0.3 * np.abs(want).max(), what
    assert_close(got, want, 1e-4, what)


@pytest.mark.parametrize(
    "adapters",
    [{"a": 1.0}, {"a": 0.5}, {"b": 1.0}, {"a": 1.0, "b": -0.7}, {"comfy": 0.8}],
    ids=["a", "a-half", "b-conv-bias", "a+b", "comfyui"],
)
def test_wan_lora_matches_diffusers(wan_models, adapters):
    ref, base_dir, files = wan_models
    x, ts, ctx = wan_ref._inputs(0)
    model = wan.load(base_dir, wan_ref.CONFIG)
    base = np.asarray(model(x, ts, ctx))
    merge_loras(model, WAN_SPEC, [LoraSpec(files[n], s) for n, s in adapters.items()])
    ref.set_adapters(list(adapters), list(adapters.values()))
    want = _wan_reference(ref, x, ts, ctx)
    _compare(lambda: model(x, ts, ctx), want, base, f"wan with LoRA {adapters}")


@pytest.fixture(scope="module")
def hunyuan_models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hunyuan_lora")
    make = lambda: hunyuan_ref._reference_model(hunyuan_ref.CONFIG)
    ref = make()
    ref.save_pretrained(tmp / "base", safe_serialization=True)
    path = _lora_file(make, diffusers.HunyuanVideoPipeline, HUNYUAN_LORA, tmp / "a", 3)
    _load_lora(ref, diffusers.HunyuanVideoPipeline, path, "a")
    return ref, tmp / "base", path


@pytest.mark.parametrize("scale", [1.0, 0.6])
def test_hunyuan_lora_matches_diffusers(hunyuan_models, scale):
    ref, base_dir, path = hunyuan_models
    inputs = hunyuan_ref._inputs(0)
    model = hunyuan.load(base_dir, hunyuan_ref.CONFIG)
    base = np.asarray(model(*inputs))
    merge_loras(model, HUNYUAN_SPEC, [f"{path}:{scale}"])
    ref.set_adapters(["a"], [scale])
    want = hunyuan_ref._reference(ref, *inputs)
    _compare(lambda: model(*inputs), want, base, f"hunyuanvideo with LoRA x{scale}")


def test_hunyuan15_lora_matches_diffusers(tmp_path):
    """HunyuanVideo-1.5 LoRAs in diffusers' names (diffusers has no pipeline loader for them:
    the PEFT model that wrote the file is the reference)."""
    ref = hunyuan15_ref._reference_model(hunyuan15_ref.CONFIG)
    ref.save_pretrained(tmp_path / "base", safe_serialization=True)
    path = _lora_file(lambda: ref, diffusers.WanPipeline, HUNYUAN_LORA, tmp_path / "a", 4)
    inputs = hunyuan15_ref._inputs(0)
    model = hunyuan15.load(tmp_path / "base", hunyuan15_ref.CONFIG)
    forward = lambda: model(**inputs)
    base = np.asarray(forward())
    merge_loras(model, HUNYUAN15_SPEC, [path])
    want = hunyuan15_ref._reference(ref, inputs)
    _compare(forward, want, base, "hunyuanvideo-1.5 with LoRA")
