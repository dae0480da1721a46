"""compute=azureml passes the compute contract suite, through the real azure-ai-ml SDK against the
loopback workspace (ddlkit_azure.testing.azureml), whose jobs run on this machine."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from ddlkit.testing.contracts import ComputeTargetContract
from ddlkit_azure.azureml import AzureMLConfig, AzureMLTarget
from ddlkit_azure.testing.azureml import LoopbackWorkspace


def azureml_target(workspace: LoopbackWorkspace, **changes: object) -> AzureMLTarget:
    """A target on the loopback workspace, as the launcher builds it (the derived keys given)."""
    cfg = AzureMLConfig(
        subscription_id=workspace.subscription,
        resource_group=workspace.resource_group,
        workspace=workspace.workspace,
        cluster="gpu-cluster",
        poll_interval_s=0.2,
        framework="pytorch",
        dist="none",
        data_root=None,
        storage="local",
    )
    return AzureMLTarget(OmegaConf.merge(OmegaConf.structured(cfg), changes))


class TestAzureMLContract(ComputeTargetContract):
    timeout_s = 90.0
    cancel_timeout_s = 30.0

    @pytest.fixture
    def target(self, azureml_workspace: LoopbackWorkspace) -> AzureMLTarget:
        return azureml_target(azureml_workspace)

    @pytest.fixture
    def multi_rank_target(self, azureml_workspace: LoopbackWorkspace) -> AzureMLTarget:
        return azureml_target(azureml_workspace, dist="native", procs_per_node=2)
