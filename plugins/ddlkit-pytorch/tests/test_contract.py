"""framework=pytorch against the test kit's FrameworkContract: what every framework plugin owes
the core (results through the Run, hooks at each logging step and epoch, max_steps, and a resumed
run that ends with the weights of an uninterrupted one)."""

from __future__ import annotations

import pytest

from ddlkit.testing.contracts import FrameworkContract

pytest.importorskip("torch")

pytestmark = pytest.mark.slow


class TestPytorchFramework(FrameworkContract):
    framework = "pytorch"
    plugin = "ddlkit_pytorch.plugin"
    model_file = "model.pt"
    # device_name on a GPU; loss_scale with fp16; with data=imagefolder the decoder and, with
    # data.decoder=gpu, how many images the GPU and the CPU decoded
    extra_result_keys = frozenset(
        {"device_name", "loss_scale", "model_state_mib", "decoder", "gpu_decoded_images", "cpu_decoded_images"}
    )
    overrides = (*FrameworkContract.overrides, "model=resnet18", "framework.num_threads=1")
