"""`vidax.models.pretrained`: what a checkpoint's configs say is used, and what vidax does not
implement is a one-line error (no torch needed: the configs are written by hand)."""

import json

import pytest
from typer.testing import CliRunner

from vidax.checkpoint import CheckpointError
from vidax.cli import app
from vidax.models import hunyuan, pretrained, wan, wan_vae
from vidax.models.registry import get

TINY_WAN = wan.WanConfig(
    dim=32, num_layers=2, num_heads=2, ffn_dim=48, in_channels=4, out_channels=4, text_dim=24
)


def _write(path, config: dict, name: str = "config.json"):
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(json.dumps(config))


def _wan_pipeline(root, *, pipeline="WanPipeline", scheduler=None, **index):
    _write(
        root,
        {"_class_name": pipeline, "transformer": ["diffusers", "WanTransformer3DModel"], **index},
        "model_index.json",
    )
    _write(
        root / "transformer",
        {"_class_name": "WanTransformer3DModel", **wan.to_diffusers_config(TINY_WAN)},
    )
    _write(
        root / "vae",
        {"_class_name": "AutoencoderKLWan", **wan_vae.to_diffusers_config(wan_vae.PRESETS["tiny"])},
    )
    scheduler = scheduler or {
        "_class_name": "UniPCMultistepScheduler",
        "prediction_type": "flow_prediction",
        "use_flow_sigmas": True,
        "flow_shift": 5.0,
        "solver_order": 3,
    }
    _write(root / "scheduler", scheduler, "scheduler_config.json")
    return root


def test_pipeline_configs_make_the_spec(tmp_path):
    spec = pretrained.spec_from_checkpoint(_wan_pipeline(tmp_path / "p"))
    # Numerics come from the stored weights (none here: the base preset's bfloat16).
    assert spec.config == TINY_WAN
    assert spec.family == "wan" and spec.weights is None
    assert spec.vae_spec.config.z_dim == 4 and spec.vae_spec.path == tmp_path / "p" / "vae"
    d = spec.defaults
    assert (d.sampler, d.shift) == ("unipc", 5.0)
    assert dict(d.solver_options) == {"order": 3, "solver_type": "bh2", "lower_order_final": True}
    assert d.solver(steps=4).order == 3
    # What the configs do not say comes from the base preset.
    assert d.num_frames == get("wan2.1-1.3b").defaults.num_frames


def test_pipeline_index_sets_task_experts_and_image_encoder(tmp_path):
    # Wan 2.2 A14B: two experts switched at boundary_ratio.
    spec = pretrained.spec_from_checkpoint(
        _wan_pipeline(
            tmp_path / "a",
            transformer_2=["diffusers", "WanTransformer3DModel"],
            boundary_ratio=0.875,
        )
    )
    assert (spec.task, spec.boundary_ratio, spec.image_encoder) == ("t2v", 0.875, None)
    # Wan 2.2 TI2V: the pipeline's expand_timesteps is part of the transformer config.
    spec = pretrained.spec_from_checkpoint(_wan_pipeline(tmp_path / "b", expand_timesteps=True))
    assert spec.task == "ti2v" and spec.config.expand_timesteps
    # Wan 2.1 I2V: an image encoder beside the transformer.
    spec = pretrained.spec_from_checkpoint(
        _wan_pipeline(
            tmp_path / "c",
            pipeline="WanImageToVideoPipeline",
            image_encoder=["transformers", "CLIPVisionModel"],
        )
    )
    assert (spec.task, spec.image_encoder, spec.boundary_ratio) == ("i2v", "clip-vit-h-14", None)


def test_transformer_folder_alone(tmp_path):
    folder = _wan_pipeline(tmp_path / "p") / "transformer"
    spec = pretrained.spec_from_checkpoint(folder)
    assert spec.config == TINY_WAN and spec.vae == "wan2.1"  # the base preset's VAE


def test_hunyuan_transformer_config_round_trips():
    config = hunyuan.PRESETS["hunyuanvideo"]
    assert hunyuan.from_diffusers_config(hunyuan.to_diffusers_config(config)) == config


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(pipeline="WanVACEPipeline"), "Wan VACE"),
        (dict(pipeline="FluxPipeline"), "pipeline 'FluxPipeline' is not one vidax runs"),
        (
            dict(transformer_2=["diffusers", "WanTransformer3DModel"]),
            "a second transformer without boundary_ratio",
        ),
        (
            dict(scheduler={"_class_name": "DDIMScheduler"}),
            "scheduler 'DDIMScheduler' is not supported",
        ),
        (
            dict(
                scheduler={
                    "_class_name": "FlowMatchEulerDiscreteScheduler",
                    "use_dynamic_shifting": True,
                }
            ),
            "use_dynamic_shifting=True is not supported",
        ),
        (
            dict(scheduler={"_class_name": "FlowMatchEulerDiscreteScheduler", "new_knob": 1}),
            "unknown FlowMatchEulerDiscreteScheduler config keys ['new_knob']",
        ),
    ],
)
def test_what_vidax_does_not_run_is_an_error(tmp_path, change, message):
    root = _wan_pipeline(tmp_path / "p", **change)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace("[", r"\[")):
        pretrained.spec_from_checkpoint(root)


def test_unknown_or_unsupported_transformer_options(tmp_path):
    root = _wan_pipeline(tmp_path / "p")
    config = json.loads((root / "transformer" / "config.json").read_text())
    _write(root / "transformer", {**config, "qk_norm": "rms_norm"})
    with pytest.raises(ValueError, match="qk_norm='rms_norm' is not supported"):
        pretrained.spec_from_checkpoint(root)
    _write(root / "transformer", {**config, "image_dim": 1280})  # I2V without added k/v
    with pytest.raises(ValueError, match="image_dim and added_kv_proj_dim go together"):
        pretrained.spec_from_checkpoint(root)
    _write(root / "transformer", {**config, "mystery": 3})
    with pytest.raises(
        ValueError, match=r"unknown WanTransformer3DModel config keys \['mystery'\]"
    ):
        pretrained.spec_from_checkpoint(root)


def test_cli_errors_are_one_line(tmp_path):
    root = _wan_pipeline(tmp_path / "p", pipeline="WanVACEPipeline")
    args = ["generate", "--prompt", "x", "--out", str(tmp_path / "o.mp4")]
    result = CliRunner().invoke(app, [*args, "--checkpoint", str(root)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {root}: Wan VACE (WanVACEPipeline) is not supported yet"
    ]
    # A checkpoint of one family with a preset of another.
    root = _wan_pipeline(tmp_path / "q")
    result = CliRunner().invoke(app, [*args, "--checkpoint", str(root), "--model", "hunyuanvideo"])
    assert result.exit_code == 2
    assert "holds a wan transformer but model 'hunyuanvideo' is a hunyuanvideo model" in (
        result.output
    )
    # --vae with the wrong number of latent channels for the transformer.
    vae = tmp_path / "vae"
    _write(
        vae,
        {
            "_class_name": "AutoencoderKLWan",
            **wan_vae.to_diffusers_config(wan_vae.PRESETS["shapes"]),
        },
    )
    result = CliRunner().invoke(app, [*args, "--checkpoint", str(root), "--vae", str(vae)])
    assert result.exit_code == 2
    assert "has 8 latent channels but the transformer denoises 4" in result.output
